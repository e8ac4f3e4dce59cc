"""A pytest plugin that makes installed packages absent: ``-p tests.absent_packages``.

``GATEWAY_TEST_ABSENT`` names them, comma-separated (``claude_agent_sdk,opentelemetry``).
Loaded first (``-p`` plugins are imported before the entry points' and before
any conftest), it wraps every finder of :data:`sys.meta_path` so that a
package named there, and its submodules, are found by none:
``importlib.util.find_spec`` gives None and ``import`` raises
``ModuleNotFoundError``, as in an environment that never installed them. What
a fresh clone without an extra sees, without a second environment
(tests/unit/test_extras.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

ABSENT = frozenset(filter(None, os.environ.get("GATEWAY_TEST_ABSENT", "").split(",")))


class Without:
    """One finder of :data:`sys.meta_path`, blind to the absent packages."""

    def __init__(self, finder: Any) -> None:
        self.finder = finder

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] in ABSENT:
            return None
        spec: ModuleSpec | None = self.finder.find_spec(name, path, target)
        return spec

    def __getattr__(self, name: str) -> Any:  # invalidate_caches, find_distributions…
        return getattr(self.finder, name)


if ABSENT:
    if ABSENT & {name.partition(".")[0] for name in sys.modules}:
        raise RuntimeError(f"already imported: {sorted(ABSENT)}")
    sys.meta_path[:] = [Without(finder) for finder in sys.meta_path]
