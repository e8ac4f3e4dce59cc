"""Context compaction through a running gateway on the scripted model (docs/protocol.md §12).

Each test watches the stream a client gets and what reached the model (a
provider that records every request), never the gateway's internals:

- between turns, above ``context_max_tokens``: ``context.compacting`` then
  ``context.compacted`` before the call, in the turn's stream; the call is
  sent the summary then the turn; the replaced messages stay in ``GET
  .../messages``; the summary's usage is the turn's;
- mid-turn, between tool rounds: the turn in flight is kept whole;
- overflow: the refused call is closed (``llm.call_failed``), compacted once,
  retried on the compacted history; refused again, or with nothing to
  compact, the turn ends as a provider error;
- ``POST .../compact``: 202 and a manual compaction between turns (turn_id
  null); 409 while a turn runs or with nothing to compact; 404 unknown;
- a summary call that fails: ``truncate``, and the model sees no summary;
- a cancel during the summary call: ``turn.cancelled`` (phase ``llm``), no
  context message, the model's view unchanged;
- replay (``since``) and snapshot after a compaction, and a restart: the
  model's view after reloading is still the compacted one.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.protocol.events import Event
from gateway.protocol.frames import Snapshot, SubscribeAck
from gateway.protocol.shapes import CompactionBlock, Message, TextBlock, ToolUseBlock
from gateway.providers.base import ModelRequest
from gateway.providers.history import SUMMARY_PREFIX, rebuild
from gateway.providers.raw import RawEvent
from gateway.providers.scripted import SUMMARY_FAILS, ScriptedProvider
from gateway.session.agent import AgentLoop
from gateway.session.compaction import SUMMARY_SYSTEM
from tests.conftest import Client, Harness, make_config, running_gateway, to_builtins, types


class Recording:
    """The scripted model, recording every request; ``hold_summary`` stalls summary calls."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.requests: list[ModelRequest] = []
        self.hold_summary = False
        self.summary_started = trio.Event()
        self.release = trio.Event()  # ends a held summary call

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        self.requests.append(request)
        if request.system == SUMMARY_SYSTEM:
            self.summary_started.set()
            if self.hold_summary:
                await self.release.wait()
        async for raw in self.inner.stream(request):
            yield raw

    async def aclose(self) -> None:
        pass

    @property
    def calls(self) -> list[ModelRequest]:
        """The conversation's calls (not the summary calls)."""
        return [r for r in self.requests if r.system != SUMMARY_SYSTEM]

    @property
    def summaries(self) -> list[ModelRequest]:
        return [r for r in self.requests if r.system == SUMMARY_SYSTEM]


T1 = "alpha beta gamma delta epsilon"  # 30 chars: 8 tokens; its answer 40: 10 tokens
T2 = "zeta"
# Turn 2's first call is estimated at 8 (reported) + 10 + 1 = 19 tokens.
LIMIT = 15


def config(tmp_path: Path, **overrides: Any) -> Any:
    return make_config(
        tmp_path,
        **{"model.context_max_tokens": LIMIT, "tools.enabled": ["sleep"], **overrides},
    )


async def turn(gw: Harness, client: Client, sid: str, content: Any) -> list[Event]:
    await gw.submit(sid, content)
    with trio.fail_after(10):
        return await client.until_turn_ends()


async def messages(gw: Harness, sid: str) -> list[dict[str, Any]]:
    r = await gw.http.get(f"/sessions/{sid}/messages")
    assert r.status_code == 200
    return list(r.json()["messages"])


def payload(events: list[Event], type_: str) -> Any:
    [found] = [e for e in events if e.type == type_]
    return found.payload


def ids(request: ModelRequest) -> list[str]:
    return [m.id for m in request.messages]


async def test_between_turns_the_older_turn_is_summarised_for_the_model_only(
    tmp_path: Path,
) -> None:
    provider = Recording()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            first = await turn(gw, client, sid, T1)
            before = await messages(gw, sid)
            second = await turn(gw, client, sid, T2)
            after = await messages(gw, sid)

    assert "context.compacting" not in types(first)  # 8 tokens: under the limit
    assert types(second)[:5] == [
        "turn.started",
        "route.decided",
        "context.compacting",
        "context.compacted",
        "llm.call_started",
    ]
    turn_id = second[0].payload.turn_id
    compacting, compacted = second[2], second[3]
    assert compacting.turn_id == compacted.turn_id == turn_id
    assert (compacting.payload.trigger, compacting.payload.pre_tokens) == ("auto", 19)
    # The store keeps everything, the context message after turn 2's user message.
    assert [m["role"] for m in after] == ["user", "assistant", "user", "context", "assistant"]
    assert after[:2] == before
    ctx = after[3]
    u2 = after[2]
    summary = "Summary of 2 messages: user: alpha beta gamma delta; assistant: You said: alpha beta"
    assert ctx["content"] == [
        {"type": "compaction", "summary": summary, "replaces": [m["id"] for m in before]}
    ]
    assert (ctx["turn_id"], ctx["status"]) == (turn_id, "complete")
    assert compacted.payload.trigger == "auto" and compacted.payload.method == "summary"
    assert compacted.payload.summary_message_id == ctx["id"]
    assert compacted.payload.first_kept_message_id == u2["id"]
    assert compacted.payload.pre_tokens == 19
    assert compacted.payload.post_tokens == math.ceil((len(summary) + len(T2)) / 4)
    # The summary call: the agent's model, the summarising prompt, no tools, the two
    # messages rendered; then the call is sent the summary and the turn only.
    [summary_call] = provider.summaries
    assert summary_call.tools == [] and summary_call.model == provider.calls[0].model
    assert f"user: {T1}" in summary_call.messages[0].content[0].text  # type: ignore[union-attr]
    assert ids(provider.calls[1]) == [ctx["id"], u2["id"]]
    [history] = rebuild(provider.calls[1].messages)
    assert history.content == [TextBlock(SUMMARY_PREFIX + summary), TextBlock(T2)]
    # The summary's tokens are the turn's: in turn.completed, as on the context message.
    usage = payload(second, "turn.completed").usage
    assert usage.input_tokens == ctx["usage"]["input_tokens"] + after[4]["usage"]["input_tokens"]
    assert ctx["usage"]["output_tokens"] == math.ceil(len(summary) / 4)


def _thresholds(monkeypatch: pytest.MonkeyPatch, values: list[int]) -> Iterator[int]:
    it = iter(values)
    monkeypatch.setattr(AgentLoop, "context_max_tokens", lambda self: next(it))
    return it


TOOL_ROUNDS = {
    "script": {
        "rounds": [
            [{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}],
            [{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}],
            [{"text": "done"}],
        ]
    }
}


async def test_mid_turn_between_tool_rounds_the_turn_in_flight_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over the limit only before turn 2's second call.
    big = 10**9
    _thresholds(monkeypatch, [big, big, 0, big])
    provider = Recording()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, T1)
            events = await turn(gw, client, sid, TOOL_ROUNDS)
            stored = await messages(gw, sid)

    assert [e.type for e in events if e.type.startswith(("context.", "llm.call_s", "tool.c"))] == [
        "llm.call_started",
        "tool.called",
        "tool.completed",
        "context.compacting",
        "context.compacted",
        "llm.call_started",
        "tool.called",
        "tool.completed",
        "llm.call_started",
    ]
    assert payload(events, "turn.completed").stop_reason == "end_turn"
    turn_id = events[0].payload.turn_id
    roles = [(m["role"], m["turn_id"] == turn_id) for m in stored]
    assert roles == [
        ("user", False),
        ("assistant", False),
        ("user", True),
        ("assistant", True),
        ("user", True),
        ("context", True),
        ("assistant", True),
        ("user", True),
        ("assistant", True),
    ]
    ctx = stored[5]
    assert ctx["content"][0]["replaces"] == [stored[0]["id"], stored[1]["id"]]
    # The second call: the summary, then the whole turn so far (its tool round kept whole).
    assert ids(provider.calls[2]) == [ctx["id"], *(m["id"] for m in stored[2:5])]
    assert ids(provider.calls[3]) == [ctx["id"], *(m["id"] for m in stored[2:5] + stored[6:8])]
    history = rebuild(provider.calls[3].messages)
    assert [h.role for h in history] == ["user", "assistant", "user", "assistant", "user"]
    uses = [b for b in history[1].content if isinstance(b, ToolUseBlock)]
    assert len(uses) == 1  # paired with its result: it was not dropped


def overflow(value: Any = True) -> str:
    return json.dumps({"script": {"overflow": value, "rounds": [[{"text": "fits now"}]]}})


async def test_an_overflow_compacts_once_and_retries_on_the_compacted_history(
    tmp_path: Path,
) -> None:
    provider = Recording()
    async with running_gateway(
        config(tmp_path, **{"model.context_max_tokens": 10**6}), provider
    ) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, T1)
            events = await turn(gw, client, sid, overflow())
            stored = await messages(gw, sid)

    assert types(events)[:8] == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "llm.call_failed",
        "context.compacting",
        "context.compacted",
        "llm.call_started",
        "message.start",
    ]
    failed = events[3].payload
    assert failed.error_class == "invalid_request" and "prompt is too long" in failed.message
    assert failed.call_id == events[2].payload.call_id != events[6].payload.call_id
    assert payload(events, "context.compacted").trigger == "overflow"
    assert payload(events, "turn.completed").stop_reason == "end_turn"
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "context", "assistant"]
    refused, retried = provider.calls[1:]
    assert ids(refused) == [m["id"] for m in stored[:3]]
    assert ids(retried) == [stored[3]["id"], stored[2]["id"]]


async def test_a_second_overflow_or_nothing_to_compact_ends_the_turn_as_a_provider_error(
    tmp_path: Path,
) -> None:
    provider = Recording()
    async with running_gateway(
        config(tmp_path, **{"model.context_max_tokens": 10**6}), provider
    ) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            alone = await turn(gw, client, sid, overflow())  # nothing before it
            twice = await turn(gw, client, sid, overflow("always"))
            after = await turn(gw, client, sid, "still usable")

    assert types(alone) == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "llm.call_failed",
        "turn.completed",
    ]
    assert payload(alone, "turn.completed").stop_reason == "error"
    assert types(twice) == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "llm.call_failed",
        "context.compacting",
        "context.compacted",
        "llm.call_started",
        "llm.call_failed",
        "turn.completed",
    ]
    assert payload(twice, "turn.completed").stop_reason == "error"
    assert payload(after, "turn.completed").stop_reason == "end_turn"


async def test_post_compact_compacts_between_turns_and_refuses_what_it_cannot(
    tmp_path: Path,
) -> None:
    provider = Recording()
    overrides = {"model.context_max_tokens": 10**6, "store.commit_timeout_s": 0.2}
    async with running_gateway(config(tmp_path, **overrides), provider) as gw:
        sid = await gw.create_session()
        r = await gw.http.post("/sessions/sess_nope/compact", json={})
        assert r.status_code == 404
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, T1)
            r = await gw.http.post(f"/sessions/{sid}/compact", json={})
            assert (r.status_code, r.json()["error"]["code"]) == (409, "nothing_to_compact")
            r = await gw.http.post(f"/sessions/{sid}/compact", json={"bogus": 1})
            assert r.status_code == 422
            await turn(gw, client, sid, T2)
            # While a turn runs: 409.
            slow = {
                "script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 30}}}]]}
            }
            turn_id = await gw.submit(sid, slow)
            await client.until(lambda e: e.type == "tool.called")
            r = await gw.http.post(f"/sessions/{sid}/compact", json={})
            assert (r.status_code, r.json()["error"]["code"]) == (409, "turn_in_progress")
            await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
            with trio.fail_after(10):
                await client.until_turn_ends()
            stored = await messages(gw, sid)
            provider.hold_summary = True
            r = await gw.http.post(f"/sessions/{sid}/compact", json={})
            assert r.status_code == 202
            again = await gw.http.post(f"/sessions/{sid}/compact", json={})
            assert again.status_code == 202  # the same compaction, still queued or running
            # A turn submitted meanwhile is answered once the compaction ran and
            # the turn started (durable): not before.
            answered = trio.Event()

            async def submit_after() -> None:
                await gw.submit(sid, "after")
                answered.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(submit_after)
                await provider.summary_started.wait()
                # Past commit_timeout_s (0.2 s here) the turn is still not answered.
                with trio.move_on_after(0.5):
                    await answered.wait()
                assert not answered.is_set()
                provider.hold_summary = False
                provider.release.set()
            with trio.fail_after(10):
                events = await client.until(lambda e: e.type == "context.compacted")
                after = await client.until_turn_ends()
            final = await messages(gw, sid)

    assert types(events) == ["context.compacting", "context.compacted"]
    assert all(e.turn_id is None for e in events)
    assert after[0].type == "turn.started"
    assert len(provider.summaries) == 1
    done = events[1].payload
    assert (done.trigger, done.method) == ("manual", "summary")
    # The latest turn (the cancelled one) is kept; the two before it are replaced.
    latest = stored[-1]["turn_id"]
    replaced = [m["id"] for m in stored if m["turn_id"] != latest]
    assert len(replaced) == 4
    ctx = next(m for m in final if m["role"] == "context")
    assert ctx["turn_id"] is None and ctx["content"][0]["replaces"] == replaced
    assert done.summary_message_id == ctx["id"]
    assert done.first_kept_message_id == next(m["id"] for m in stored if m["turn_id"] == latest)
    assert ids(provider.calls[-1])[0] == ctx["id"]
    assert not set(replaced) & set(ids(provider.calls[-1]))


async def test_a_failing_summary_truncates(tmp_path: Path) -> None:
    provider = Recording()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, f"{T1} {SUMMARY_FAILS}")
            events = await turn(gw, client, sid, T2)
            stored = await messages(gw, sid)

    done = payload(events, "context.compacted")
    assert (done.method, done.trigger) == ("truncate", "auto")
    ctx = stored[3]
    assert ctx["role"] == "context" and done.summary_message_id == ctx["id"]
    assert ctx["content"][0]["summary"] == ""
    assert done.post_tokens == math.ceil(len(T2) / 4)
    assert payload(events, "turn.completed").stop_reason == "end_turn"
    # The model is sent the turn alone: the older turn is gone from its view.
    assert [(h.role, h.content) for h in rebuild(provider.calls[-1].messages)] == [
        ("user", [TextBlock(T2)])
    ]


async def test_a_cancel_during_the_summary_leaves_no_half_compaction(tmp_path: Path) -> None:
    provider = Recording()
    provider.hold_summary = True
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, T1)
            turn_id = await gw.submit(sid, T2)
            with trio.fail_after(10):
                await provider.summary_started.wait()
                await client.until(lambda e: e.type == "context.compacting")
            r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
            assert r.status_code == 202
            with trio.fail_after(10):
                rest = await client.until_turn_ends()
            stored = await messages(gw, sid)
            provider.hold_summary = False
            again = await turn(gw, client, sid, "again")

    assert types(rest) == ["turn.cancelled"]
    assert (rest[0].payload.phase, rest[0].payload.partial) == ("llm", False)
    assert [m["role"] for m in stored] == ["user", "assistant", "user"]
    # The next turn compacts afresh: its first call's view starts with the new summary.
    assert types(again)[2:4] == ["context.compacting", "context.compacted"]
    assert provider.calls[-1].messages[0].role == "context"


async def test_replay_snapshot_and_restart_keep_the_compaction(tmp_path: Path) -> None:
    provider = Recording()
    cfg = config(tmp_path)
    async with running_gateway(cfg, provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            first = await turn(gw, client, sid, T1)
            second = await turn(gw, client, sid, T2)
        async with gw.client(sid) as resumed:
            ack = await resumed.subscribe(since=first[-1].id)
            assert isinstance(ack, SubscribeAck)
            with trio.fail_after(10):
                replayed = await resumed.until(lambda e: e.type == "turn.completed")
        async with gw.client(sid) as late:
            await late.subscribe(snapshot=True)
            snap = await late.recv()
        stored = await messages(gw, sid)
    assert [to_builtins(e) for e in replayed if e.type.startswith("context.")] == [
        to_builtins(e) for e in second if e.type.startswith("context.")
    ]
    assert isinstance(snap, Snapshot)
    assert to_builtins(snap.messages) == stored
    ctx: Message = snap.messages[3]
    assert ctx.role == "context" and isinstance(ctx.content[0], CompactionBlock)

    # After a restart the model is still sent the compacted view (a limit that
    # compacts nothing more, so the request is the reloaded view as it was).
    again = Recording()
    async with running_gateway(
        config(tmp_path, **{"model.context_max_tokens": 10**6}), again
    ) as gw:
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "three")
        final = await messages(gw, sid)
    u3 = final[5]
    assert again.calls[0].messages[0].id == ctx.id
    assert ids(again.calls[0])[1:] == [m["id"] for m in stored[2:] if m["role"] != "context"] + [
        u3["id"]
    ]
