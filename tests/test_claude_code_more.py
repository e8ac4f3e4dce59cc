"""``runtime = "claude-code"``, continued: processes, failures, MCP servers, sub-agents, compaction.

Offline as :mod:`tests.test_claude_code`: the real CLI, the fake Anthropic
API, every request it made a model call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from gateway.runtimes import slots
from tests.conftest import Harness, running_gateway
from tests.provider_support import server as server
from tests.test_claude_code import alive, decide, gateway, only_model_calls, pytestmark, run_turn

__all__ = ["pytestmark", "server"]


def runtime_of(gw: Harness, sid: str) -> Any:
    runtime = gw.node.sessions[sid].agent.runtime  # type: ignore[union-attr]
    assert runtime is not None
    return runtime


async def test_max_processes_an_idle_process_makes_room_a_busy_one_is_a_503_after_a_bounded_wait(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``max_processes = 1``: B's turn stops A's idle CLI; A's turn while B's runs waits, then 503.

    Once B is idle again, A's turn stops B's CLI and A's new CLI resumes A's conversation.
    """
    server.enqueue(
        Replay(transcript("anthropic/text.sse")),  # A's first turn
        Replay(transcript("claude-code/bash_touch.sse")),  # B's, which asks to run Bash
        Replay(transcript("anthropic/text.sse")),  # B's, once allowed
        Replay(transcript("anthropic/text.sse")),  # A's second turn
    )
    config, providers = await gateway(tmp_path, server, monkeypatch, max_processes="1")
    async with running_gateway(config, providers) as gw:
        slots_ = gw.node.process_slots
        a, b = await gw.create_session(), await gw.create_session()
        await run_turn(gw, a, "first words APPLE")
        a_pid = runtime_of(gw, a).transport.pid
        assert slots_.held("default") == 1
        async with gw.client(b) as client:
            await client.subscribe()
            await gw.submit(b, "make the file")  # A is idle: stopped to make room
            assert not alive(a_pid) and runtime_of(gw, a).client is None
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
            # B's turn is in flight: no idle process; A's turn waits, then is refused.
            monkeypatch.setattr(slots, "SLOT_WAIT_S", 0.5)
            started = trio.current_time()
            r = await gw.http.post(f"/sessions/{a}/turns", json={"content": "second words"})
            waited = trio.current_time() - started
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "over_capacity"
            assert r.headers["Retry-After"] == "1"
            assert 0.5 <= waited < 2.0, waited
            assert gw.node.sessions[a].turn is None and not slots_.holds("default", a)
            monkeypatch.setattr(slots, "SLOT_WAIT_S", 10.0)
            await decide(gw, b, asked.payload.perm_id, "allow")
            b_events = await client.until_turn_ends()
        b_pid = runtime_of(gw, b).transport.pid
        resumed = await run_turn(gw, a, "second words BANANA")  # B is idle: stopped
        assert not alive(b_pid) and slots_.held("default") == 1
        assert slots_.holds("default", a)
    await providers.aclose()
    assert b_events[-1].payload.stop_reason == "end_turn"
    assert resumed[-1].payload.stop_reason == "end_turn"
    last = str(server.requests[-1].body["messages"])
    assert "APPLE" in last and "BANANA" in last  # A's new CLI resumed A's transcript
    assert "make the file" not in last
    assert len(server.requests) == 4  # the refused turn never reached the model
    only_model_calls(server)
