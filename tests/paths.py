"""Where the suite and the repository are, for tests at any depth under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
"""``tests/``: its support files, ``mcp_servers/``, ``agui_js/``, ``streaming-conformance/``."""

ROOT = TESTS.parent
"""The repository."""
