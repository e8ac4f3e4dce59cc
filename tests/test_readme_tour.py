"""The README's short tour, its curl commands as written, against ``gateway serve``.

The front door must work as printed (PROTOCOL section 15 made every POST need
``Content-Type: application/json``, and sessions work in directories of their
own with no ``workspace_path``): each ``curl`` of the tour runs in a shell
against a daemon on the embedded defaults (its port aside), in order, with
``SID`` and ``TURN`` taken from the answers as a reader would.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import trio

from tests.test_cli_serve import gateway_process

README = Path(__file__).resolve().parents[1] / "README.md"


def tour_commands() -> list[str]:
    """Every ``curl`` command of the tour's shell blocks, continuation lines joined."""
    text = README.read_text()
    tour = text[text.index("## A short tour") : text.index("\n## ", text.index("## A short tour"))]
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", tour, re.S):
        for line in block.splitlines():
            if line.startswith("curl "):
                commands.append(line)
            elif line.startswith("  ") and commands:
                commands[-1] += "\n" + line
    return commands


async def run(command: str, port: int, **env: str) -> str:
    """One command of the tour, in bash, with the daemon's port and the reader's variables."""
    command = command.replace("localhost:8421", f"localhost:{port}")
    done = await trio.run_process(
        ["bash", "-c", command],
        capture_stdout=True,
        capture_stderr=True,
        env={"PATH": "/usr/bin:/bin", **env},
        check=False,
    )
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout.decode()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_tour_works_as_written(tmp_path: Path) -> None:
    create, session, echo, script, cancel = tour_commands()
    async with gateway_process(tmp_path, "--port", "0") as (_, port):
        created = json.loads(await run(create, port))
        sid = created["session_id"]
        attach = json.loads(await run(session, port, SID=sid))
        assert attach["ws_url"].startswith(f"ws://localhost:{port}/sessions/{sid}/stream")
        echoed = json.loads(await run(echo, port, SID=sid))
        assert echoed["turn_id"].startswith("turn_")
        turn = None
        with trio.fail_after(20):
            while turn is None:  # the echo turn ends; then the script's is accepted
                answer = json.loads(await run(script, port, SID=sid))
                turn = answer.get("turn_id")
                if turn is None:
                    assert answer["error"]["code"] == "turn_in_progress", answer
                    await trio.sleep(0.1)
        cancelled = await run(cancel, port, SID=sid, TURN=turn)
        assert json.loads(cancelled)["turn_id"] == turn
    assert (tmp_path / "workspaces").is_dir()  # its sessions' own directories, no workspace_path
