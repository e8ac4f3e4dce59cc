"""A fork of a ``claude-code`` session (docs/protocol.md §2, "Forks"; §11, "Forks").

The real Claude Code CLI behind a real gateway, on the fake Anthropic API
(tests/claude_code_support.py): what the model is sent is each request the
fake API recorded. A fork made at the end of the source's first turn:

- its CLI is started resuming the source's Claude Code conversation as a
  fork (``--resume`` the source's, ``--fork-session``, ``--session-id`` its
  own, ``--resume-session-at`` the transcript entry of the fork point);
- its first request holds the source's first turn and its own, not the
  source's second turn; the source's next request holds its own turns
  only;
- once its CLI stopped (``idle_process_s``), the next one resumes the fork's
  own transcript, the fork's history with it;
- a fork of an empty session starts a new conversation.

Each reply has an id of its own (the API's are unique; the recorded stream's
one id, repeated, would be one message).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from gateway.runtimes.claude_code.paths import claude_session_id
from tests.claude_code_support import CLAUDE_CODE_MARKS, gateway, only_model_calls, run_turn
from tests.claude_code_support import server as server
from tests.conftest import running_gateway

pytestmark = CLAUDE_CODE_MARKS

RECORDED_ID = b"msg_01XFDUDYJgAACzvnptvVoYEL"


def reply(n: int) -> Replay:
    """``text.sse`` with an id of its own."""
    return Replay(transcript("anthropic/text.sse").replace(RECORDED_ID, b"msg_01Fork%016d" % n))


def said(body: Any) -> str:
    return str(body["messages"])


async def test_a_fork_resumes_the_sources_conversation_at_the_fork_point(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.runtimes import transport  # the SDK's: after the extra's skip

    commands: list[list[str]] = []
    build = transport.cli_command

    def recording(options: Any) -> list[str]:
        commands.append(command := build(options))
        return command

    monkeypatch.setattr(transport, "cli_command", recording)
    server.enqueue(*[reply(n) for n in range(1, 6)])
    config, providers = await gateway(
        tmp_path, server, monkeypatch, sandbox="false", idle_process_s="0.5"
    )
    async with running_gateway(config, providers) as gw:
        source = await gw.create_session()
        await run_turn(gw, source, "first words APPLE")
        await run_turn(gw, source, "second words BANANA")
        rows = (await gw.http.get(f"/sessions/{source}/messages")).json()["messages"]
        first_reply = rows[1]
        assert first_reply["id"] == "msg_01Fork0000000000000001"
        r = await gw.http.post(
            f"/sessions/{source}/fork", json={"at_message_id": first_reply["id"]}
        )
        assert r.status_code == 201, r.text
        fork = r.json()["session_id"]
        await run_turn(gw, fork, "third words CHERRY")
        await run_turn(gw, source, "fourth words DATE")
        runtime = gw.node.sessions[fork].agent.runtime  # type: ignore[union-attr]
        with trio.fail_after(10):  # the fork's CLI stops when idle
            while runtime.client is not None:  # noqa: ASYNC110
                await trio.sleep(0.1)
        await run_turn(gw, fork, "fifth words EGG")
        empty = await gw.create_session()
        r = await gw.http.post(f"/sessions/{empty}/fork", json={})
        assert r.status_code == 201, r.text
    await providers.aclose()
    requests = [said(r.body) for r in server.requests]
    first, second, third, fourth, fifth = requests
    assert "APPLE" in first and "APPLE" in second and "BANANA" in second
    assert "APPLE" in third and "CHERRY" in third and "BANANA" not in third
    assert "DATE" in fourth and "BANANA" in fourth and "CHERRY" not in fourth
    assert "APPLE" in fifth and "CHERRY" in fifth and "EGG" in fifth
    assert "BANANA" not in fifth and "DATE" not in fifth
    # The CLIs' command lines: the source's two turns in one CLI, the fork's first start
    # a fork of the source's conversation, its second a resume of its own.
    mine, theirs = claude_session_id(fork), claude_session_id(source)
    forked = [c for c in commands if f"--session-id={mine}" in c]
    assert len(forked) == 1
    [started] = forked
    assert f"--resume={theirs}" in started and "--fork-session" in started
    assert any(arg.startswith("--resume-session-at=") for arg in started)
    assert any(f"--resume={mine}" in c for c in commands[commands.index(started) + 1 :])
    only_model_calls(server)
