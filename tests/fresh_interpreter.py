"""What a daemon imports, seen from a fresh interpreter (tests that keep a heavy SDK out).

:func:`modules_after_a_turn` runs a gateway (:func:`tests.conftest.running_gateway`
on :func:`tests.conftest.make_config`) in a new Python process, a session and
one turn to its end, and gives back the modules it imported under the named
packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.paths import ROOT

_CODE = """
import json, sys, trio
from pathlib import Path
from tests.conftest import make_config, running_gateway

async def main():
    config = make_config(Path(sys.argv[1]))
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "hi"})
            assert r.status_code == 202
            await client.until_turn_ends()

trio.run(main)
roots = tuple(sys.argv[2:])
print(json.dumps(sorted(m for m in sys.modules if m.startswith(roots))))
"""


def modules_after_a_turn(
    workdir: Path, roots: tuple[str, ...], env: Mapping[str, str] | None = None
) -> list[str]:
    """The modules whose names start with one of ``roots`` once a turn ran (``workdir``: its
    store and workspaces; ``env``: the process's environment, this one's by default)."""
    environ = {**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _CODE, str(workdir), *roots],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded
