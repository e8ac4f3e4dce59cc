"""The README's tour and docs/agents.md's worked example, as written, against ``gateway serve``.

The front door must work as printed (every POST needs ``Content-Type:
application/json``, docs/protocol.md §15, and sessions work in directories of
their own with no ``workspace_path``): each ``curl`` of the tour runs in a
shell against a daemon on the embedded defaults (its port aside), in order,
with ``SID`` and ``TURN`` taken from the answers as a reader would.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import trio

from tests.files_support import png
from tests.paths import ROOT
from tests.system.cli.test_cli_serve import gateway_process

ROOT = ROOT
README = ROOT / "README.md"
AGENTS_DOC = ROOT / "docs" / "agents.md"


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


async def run(command: str, port: int, cwd: Path | None = None, **env: str) -> str:
    """One command of the tour, in bash, with the daemon's port and the reader's variables."""
    command = command.replace("localhost:8421", f"localhost:{port}")
    done = await trio.run_process(
        ["bash", "-c", command],
        capture_stdout=True,
        capture_stderr=True,
        env={"PATH": "/usr/bin:/bin", **env},
        cwd=cwd,
        check=False,
    )
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout.decode()


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_tour_works_as_written(tmp_path: Path) -> None:
    create, session, echo, script, cancel, upload, look = tour_commands()
    (tmp_path / "shot.png").write_bytes(shot := png(32, 24))
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
        stored = json.loads(await run(upload, port, tmp_path, SID=sid))
        assert stored["size"] == len(shot) and stored["media_type"] == "image/png"
        with trio.fail_after(20):
            while True:  # the cancelled turn ends; then the one with the file is accepted
                answer = json.loads(await run(look, port, SID=sid, FILE=stored["file_id"]))
                if "turn_id" in answer:
                    break
                assert answer["error"]["code"] == "turn_in_progress", answer
                await trio.sleep(0.1)
    assert (tmp_path / "workspaces").is_dir()  # its sessions' own directories, no workspace_path


def agents_example() -> tuple[str, list[str]]:
    """docs/agents.md's MCP example: its config heredoc (bash) and its second terminal's lines."""
    text = AGENTS_DOC.read_text()
    start = text.index("## A worked example")
    part = text[start : text.index("\n## ", start)]
    first, second = re.findall(r"```sh\n(.*?)```", part, re.S)[:2]
    config = first[: first.index("\nEOF\n") + len("\nEOF\n")]
    lines: list[str] = []
    for line in second.splitlines():
        if line.startswith("  ") and lines:
            lines[-1] += "\n" + line
        else:
            lines.append(line)
    return config, lines


@pytest.mark.slow  # a daemon process (gateway serve) and curl
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_agents_example_works_as_written(tmp_path: Path) -> None:
    """The worked example of an agent with an MCP server (docs/agents.md, "A worked example").

    Its heredoc runs as written in the repository (it names the repository's
    venv and examples/mcp_notes.py), but writes notes.toml in a temporary
    directory, where the daemon runs; then each line of the second terminal,
    ``SID`` kept as the reader's shell keeps it.
    """
    config, lines = agents_example()
    repo = ROOT
    venv_python = repo / ".venv" / "bin" / "python"
    if not venv_python.exists():
        pytest.skip("the example names the repository's .venv, which this checkout lacks")
    written = config.replace("cat > notes.toml", f"cat > {tmp_path}/notes.toml")
    await trio.run_process(["bash", "-c", written], cwd=repo, env={"PATH": "/usr/bin:/bin"})
    assert (tmp_path / "notes.toml").exists()
    agents, create, submit, messages = lines
    async with gateway_process(tmp_path, "--config", "notes.toml", "--port", "0") as (_, port):
        listed = json.loads(await run(agents, port))
        assert [a["name"] for a in listed["agents"] if a["default"]] == ["notes"]
        sid = (await run(f"{create}\necho $SID", port)).strip()
        assert sid.startswith("sess_")
        assert json.loads(await run(submit, port, SID=sid))["turn_id"].startswith("turn_")
        with trio.fail_after(30):
            while True:
                page = json.loads(await run(messages.removeprefix("sleep 2; "), port, SID=sid))
                last = page["messages"][-1]
                final = not any(b["type"] == "tool_use" for b in last["content"])
                if last["role"] == "assistant" and last["status"] == "complete" and final:
                    break  # the turn's reply, after its tool's result (not the tool call)
                await trio.sleep(0.2)
    results = [b for m in page["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert [(b["content"], b["is_error"]) for b in results] == [("note 1 added", False)]
    [notes] = list((tmp_path / "workspaces").glob("local/.own/*/notes.json"))
    assert json.loads(notes.read_text()) == ["buy milk"]
