"""A scripted turn end to end over a real WebSocket (docs/protocol.md sections 5 and 7).

Behaviours 11 and 12 of the core issue: every event of a turn arrives in the
order of section 7, each block's deltas add up to ``message.complete``'s
``final_content``, and a provider error mid-stream is an event sequence, not a
broken stream, after which the session takes the next turn.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from gateway.errors import ProviderError
from gateway.protocol.events import Event
from gateway.protocol.frames import SubscribeAck
from gateway.protocol.shapes import TextBlock, ThinkingBlock, ToolUseBlock
from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway, types

# docs/protocol.md §7 as a regular expression over event types.
BLOCK = (
    r"(text\.start (text\.delta )*text\.end "
    r"|thinking\.start (thinking\.delta )*thinking\.end "
    r"|tool\.use_start (tool\.use_input_delta )*tool\.use_end )"
)
CALL = rf"llm\.call_started message\.start {BLOCK}*message\.complete llm\.call_completed "
TOOLS = r"(tool\.called )+((tool\.completed|tool\.failed) )+"
TURN = re.compile(rf"turn\.started route\.decided {CALL}({TOOLS}{CALL})*turn\.completed ")


def sequence(events: list[Event]) -> str:
    return "".join(t + " " for t in types(events))


def rebuild_blocks(events: list[Event], message_id: str) -> list[Any]:
    """Each block of one message rebuilt from its start/delta/end events alone."""
    blocks: dict[int, dict[str, Any]] = {}
    for e in events:
        p = e.payload
        if getattr(p, "message_id", None) != message_id or e.type == "message.complete":
            continue
        if e.type.endswith("start") and e.type != "message.start":
            blocks[p.content_block_index] = {"kind": e.type.split(".")[0], "text": "", "sig": None}
        elif e.type in ("text.delta", "thinking.delta"):
            blocks[p.content_block_index]["text"] += p.text
            if e.type == "thinking.delta" and p.signature:
                blocks[p.content_block_index]["sig"] = p.signature
        elif e.type == "tool.use_input_delta":
            blocks[p.content_block_index]["text"] += p.partial_json
        elif e.type == "tool.use_end":
            blocks[p.content_block_index]["input"] = p.final_input
    return [blocks[i] for i in sorted(blocks)]


async def test_a_tool_turn_follows_section_7_and_deltas_add_up(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        ack = await client.subscribe()
        assert isinstance(ack, SubscribeAck)
        turn_id = await gw.submit(sid, TOOL_SCRIPT)
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    assert TURN.fullmatch(sequence(events)), sequence(events)
    assert all(e.turn_id == turn_id and e.session_id == sid for e in events)
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)

    completes = [e for e in events if e.type == "message.complete"]
    assert [c.payload.stop_reason for c in completes] == ["tool_use", "end_turn"]
    for complete in completes:
        rebuilt = rebuild_blocks(events, complete.payload.message_id)
        final = complete.payload.final_content
        assert len(rebuilt) == len(final)
        for block, content in zip(rebuilt, final, strict=True):
            if isinstance(content, TextBlock):
                assert block == {"kind": "text", "text": content.text, "sig": None}
            elif isinstance(content, ThinkingBlock):
                assert block["text"] == content.thinking and block["sig"] == content.signature
            else:
                assert isinstance(content, ToolUseBlock)
                assert block["input"] == content.input == {"seconds": 0.01}
    tool_completed = next(e for e in events if e.type == "tool.completed")
    assert tool_completed.payload.result == "slept 0.01 s"
    assert tool_completed.payload.duration_ms >= 0
    done = events[-1].payload
    assert done.stop_reason == "end_turn"
    assert done.usage.output_tokens == sum(c.payload.usage.output_tokens for c in completes)


async def test_plain_text_is_echoed_word_by_word(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe("preset:chat")
        await gw.submit(sid, "hello there gateway")
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    deltas = [e.payload.text for e in events if e.type == "text.delta"]
    assert "".join(deltas) == "You said: hello there gateway"
    assert len(deltas) == 5
    # preset:chat leaves out llm.call_started / llm.call_completed
    assert "llm.call_started" not in types(events)


async def test_provider_error_mid_stream_is_events_and_the_session_goes_on(gw: Harness) -> None:
    script = {
        "script": {
            "rounds": [[{"thinking": "hmm"}, {"text": "one two three four five six"}]],
            "fail": {"round": 0, "after_deltas": 4, "error_class": "overloaded"},
        }
    }
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, script)
        with trio.fail_after(10):
            events = await client.until_turn_ends()
        seq = types(events)
        # open blocks closed, then message.complete(error), llm.call_failed, turn.completed(error)
        assert seq[-4:] == ["text.end", "message.complete", "llm.call_failed", "turn.completed"]
        assert seq.count("text.start") == seq.count("text.end") == 1
        complete = events[-3].payload
        assert complete.stop_reason == "error"
        partial = "".join(e.payload.text for e in events if e.type == "text.delta")
        assert [b.text for b in complete.final_content if isinstance(b, TextBlock)] == [partial]
        assert events[-2].payload.error_class == "overloaded"
        assert events[-2].payload.message_id == complete.message_id
        assert events[-1].payload.stop_reason == "error"
        # the session stays usable
        await gw.submit(sid, "again")
        with trio.fail_after(10):
            events = await client.until_turn_ends()
        assert events[-1].payload.stop_reason == "end_turn"
    r = await gw.http.get(f"/sessions/{sid}/messages")
    statuses = [m["status"] for m in r.json()["messages"] if m["role"] == "assistant"]
    assert statuses == ["error", "complete"]


class _DownProvider:
    """A model API that cannot be reached: the call fails before its first event."""

    def stream(self, request: ModelRequest) -> AsyncIterator[RawEvent]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[RawEvent]:
        raise ProviderError("network", "connection refused")
        yield  # an async generator that never yields

    async def aclose(self) -> None:
        pass


async def test_network_failure_before_any_event_has_no_message(tmp_path: Path) -> None:
    """Nothing streamed, so no message: no message.start/complete, none stored (section 7)."""
    async with running_gateway(make_config(tmp_path), _DownProvider()) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await gw.submit(sid, "hello?")
            with trio.fail_after(10):
                events = await client.until_turn_ends()
        assert types(events) == [
            "turn.started",
            "route.decided",
            "llm.call_started",
            "llm.call_failed",
            "turn.completed",
        ]
        failed = events[3].payload
        assert (failed.error_class, failed.message_id) == ("network", None)
        assert events[-1].payload.stop_reason == "error"
        r = await gw.http.get(f"/sessions/{sid}/messages")
        assert [m["role"] for m in r.json()["messages"]] == ["user"]
        assert gw.node.sessions[sid].turn is None


async def test_tool_errors_are_results_and_the_turn_goes_on(gw: Harness, tmp_path: Any) -> None:
    script = {
        "script": {
            "rounds": [
                [
                    {"tool_use": {"name": "no_such_tool", "input": {}}},
                    {"tool_use": {"name": "sleep", "input": {"seconds": "long"}}},
                    {"tool_use": {"name": "read_file", "input": {"path": "../../etc/passwd"}}},
                    {"tool_use": {"name": "read_file", "input": {"path": "missing.txt"}}},
                ],
                [{"text": "ok"}],
            ]
        }
    }
    sid = await gw.create_session(workspace_path="w")
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, script)
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    failed = {
        e.payload.tool_name + str(i): e.payload
        for i, e in enumerate(events)
        if e.type == "tool.failed"
    }
    classes = sorted(p.error_class for p in failed.values())
    assert classes == ["error", "invalid_input", "invalid_input", "unknown_tool"]
    assert events[-1].type == "turn.completed" and events[-1].payload.stop_reason == "end_turn"
    r = await gw.http.get(f"/sessions/{sid}/messages")
    results = [b for m in r.json()["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert len(results) == 4 and all(b["is_error"] for b in results)


async def test_read_file_reads_inside_the_workspace(gw: Harness, tmp_path: Any) -> None:
    sid = await gw.create_session()  # its own workspace, named after it
    own = tmp_path / "workspaces" / "local" / ".own" / sid
    (own / "notes.txt").write_text("hello from the workspace")
    script = {
        "script": {
            "rounds": [
                [{"tool_use": {"name": "read_file", "input": {"path": "notes.txt"}}}],
                [{"text": "read it"}],
            ]
        }
    }
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, script)
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    done = next(e for e in events if e.type == "tool.completed")
    assert done.payload.result == "hello from the workspace"
