"""The npm packages the JS system tests run (tests/system/doors/agui/test_agui_js.py,
test_aisdk_js.py, test_aisdk_browser.py, tests/system/mcp/test_mcp_everything_js.py),
installed once per test run.

:func:`npm_prefix` is a session fixture: one ``npm install --prefix`` of
:data:`PACKAGES` into a temporary directory (its ``node_modules`` beside), so
the modules share one install. A module imports it as ``npm_prefix as
npm_prefix`` (the alias tells ruff the name is there for pytest). Skipped,
saying why, where node or npm is missing or the registry cannot be reached
(.ci/run installs node and npm).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGES = (
    "@ag-ui/client",
    "ai@7",
    "ws",
    "esbuild",
    "@modelcontextprotocol/server-everything",
    "@a2a-js/sdk@1",
)
"""AG-UI's official client; the AI SDK (v7) and the WebSocket its node transport needs;
the bundler that builds the AI SDK's chat for the browser; MCP's reference server
(tests/system/mcp/test_mcp_everything_js.py); the official A2A client
(tests/system/doors/a2a/test_a2a_js.py)."""


@pytest.fixture(scope="session")
def npm_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory :data:`PACKAGES` are installed under (``<prefix>/node_modules``)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(f"node and npm are needed to install and run {', '.join(PACKAGES)}")
    prefix = tmp_path_factory.mktemp("npm")
    install = [npm, "install", "--prefix", str(prefix), "--silent", "--no-audit", "--no-fund"]
    done = subprocess.run(
        [*install, *PACKAGES], capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"npm install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-500:]}")
    return prefix
