"""A session is a failure boundary: nothing that fails in it reaches another, nor the daemon.

Fault injection at every step of a turn (each phase, each component: the agent
loop, the translator, a tool, the provider, the store, the hub), on a real
gateway with two sessions: the faulty one's turn is closed with a terminal
event its client can act on, the other session's turn completes untouched,
the faulty session takes its next turn, the daemon answers ``/healthz``, and
the failure is counted in ``/metrics``. Also: a tool batch whose tools all
failed before running goes on to the next model round (docs/protocol.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.protocol.events import Event
from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from gateway.providers.scripted import ScriptedProvider
from gateway.session.session import Session
from gateway.tools.registry import SessionTools
from gateway.translate import Translator
from tests.conftest import TOOL_SCRIPT, Client, Harness, make_config, running_gateway, types


class FaultyProvider:
    """The scripted model, with a fault to inject into the next stream of one session."""

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.fault: tuple[str, int, BaseException] | None = None  # (session, after n, exc)

    async def stream(self, request: ModelRequest) -> AsyncIterator[RawEvent]:
        fault = self.fault
        if fault is not None and request.messages and request.messages[0].session_id == fault[0]:
            self.fault = None
        else:
            fault = None
        n = 0
        async with aclosing(self.inner.stream(request)) as inner:
            async for raw in inner:
                if fault is not None and n == fault[1]:
                    raise fault[2]
                n += 1
                yield raw

    async def aclose(self) -> None:
        await self.inner.aclose()


def once(predicate: Callable[..., bool], exc: BaseException | None = None) -> Callable[..., None]:
    """A hook that raises ``exc`` the first time ``predicate`` holds, then never again."""
    fired = False

    def hook(*args: Any) -> None:
        nonlocal fired
        if not fired and predicate(*args):
            fired = True
            raise exc or RuntimeError("injected fault")

    return hook


async def failures(gw: Harness) -> float:
    r = await gw.http.get("/metrics")
    total = 0.0
    for line in r.text.splitlines():
        if line.startswith("gateway_session_failures_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def run_both(
    gw: Harness, faulty: Client, healthy: Client, sid_a: str, sid_b: str
) -> tuple[list[Event], list[Event]]:
    """One tool turn on each session at once; the events each client got until its turn ended."""
    got: dict[str, list[Event]] = {}

    async def one(client: Client, sid: str) -> None:
        await gw.submit(sid, TOOL_SCRIPT)
        got[sid] = await client.until_turn_ends()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, faulty, sid_a)
            nursery.start_soon(one, healthy, sid_b)
    return got[sid_a], got[sid_b]


async def check_isolated(gw: Harness, inject: Callable[[Harness, str], None]) -> list[Event]:
    """Run the scenario with ``inject(gw, faulty_session_id)`` armed; the faulty turn's events."""
    sid_a = await gw.create_session()
    sid_b = await gw.create_session()
    before = await failures(gw)
    async with gw.client(sid_a) as a, gw.client(sid_b) as b:
        await a.subscribe()
        await b.subscribe()
        inject(gw, sid_a)
        events_a, events_b = await run_both(gw, a, b, sid_a, sid_b)
        # The healthy session's turn is whole.
        assert events_b[0].type == "turn.started"
        assert events_b[-1].type == "turn.completed"
        assert events_b[-1].payload.stop_reason == "end_turn", types(events_b)
        assert types(events_b).count("tool.completed") == 1
        # The faulty turn was closed with a terminal event a client can act on.
        last = events_a[-1]
        assert last.type == "turn.completed", types(events_a)
        assert last.payload.stop_reason == "error"
        # The daemon is alive, the failure counted, the faulty session usable again.
        assert (await gw.http.get("/healthz")).status_code == 200
        assert await failures(gw) >= before + 1
        await gw.submit(sid_a, "still here?")
        with trio.fail_after(10):
            again = await a.until_turn_ends()
        assert again[-1].payload.stop_reason == "end_turn"
        assert gw.node.sessions[sid_a].turn is None
    return events_a


@pytest.fixture
async def fgw(tmp_path: Path) -> AsyncIterator[Harness]:
    provider = FaultyProvider()
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path), provider) as harness:
            yield harness


STEPS = [
    "turn.started",
    "route.decided",
    "llm.call_started",
    "message.start",
    "thinking.delta",
    "text.end",
    "tool.use_end",
    "message.complete",
    "llm.call_completed",
    "tool.called",
    "tool.completed",
    "turn.completed",
]


@pytest.mark.parametrize("step", STEPS)
async def test_a_failure_at_any_emission_is_contained(
    fgw: Harness, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emission fails at one step (in the agent loop or the translator task, per step)."""
    real_emit = Session.emit

    def inject(gw: Harness, sid: str) -> None:
        fault = once(lambda s, items: s.id == sid and step in {_type(i) for i in items})

        def emit(self: Session, payloads: Any, turn_id: str | None) -> Any:
            items = list(payloads)
            fault(self, items)
            return real_emit(self, items, turn_id)

        monkeypatch.setattr(Session, "emit", emit)

    await check_isolated(fgw, inject)


def _type(item: Any) -> str:
    from gateway.protocol.events import PAYLOAD_TYPE, StreamEvent

    return item.type if isinstance(item, StreamEvent) else PAYLOAD_TYPE[type(item)]


async def test_a_provider_that_raises_before_any_event(fgw: Harness) -> None:
    def inject(gw: Harness, sid: str) -> None:
        gw.gateway.node.provider.fault = (sid, 0, KeyError("a provider bug"))  # type: ignore[attr-defined]

    events = await check_isolated(fgw, inject)
    failed = next(e for e in events if e.type == "llm.call_failed")
    assert failed.payload.error_class == "api_error"
    assert "KeyError" in failed.payload.message


async def test_a_provider_that_raises_mid_stream(fgw: Harness) -> None:
    def inject(gw: Harness, sid: str) -> None:
        gw.gateway.node.provider.fault = (sid, 5, ValueError("a provider bug"))  # type: ignore[attr-defined]

    events = await check_isolated(fgw, inject)
    complete = next(e for e in events if e.type == "message.complete")
    assert complete.payload.stop_reason == "error"
    assert types(events)[-2:] == ["llm.call_failed", "turn.completed"]


async def test_a_translator_that_raises(fgw: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    real_feed = Translator.feed

    def inject(gw: Harness, sid: str) -> None:
        fault = once(lambda tr, raw: tr._session_id == sid and tr.started)

        def feed(self: Translator, raw: RawEvent) -> Any:
            fault(self, raw)
            return real_feed(self, raw)

        monkeypatch.setattr(Translator, "feed", feed)

    await check_isolated(fgw, inject)


async def test_a_tool_registry_that_raises(fgw: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    real_validate = SessionTools.validate  # what the agent loop asks (a session's tools)
    sids: list[str] = []

    def inject(gw: Harness, sid: str) -> None:
        sids.append(sid)

    def validate(self: SessionTools, name: str, raw_input: Any) -> Any:
        if sids and not getattr(validate, "fired", False):
            session = fgw.node.sessions[sids[0]]
            if session.turn is not None and session.turn.phase != "done":
                validate.fired = True  # type: ignore[attr-defined]
                raise LookupError("a registry bug")
        return real_validate(self, name, raw_input)

    monkeypatch.setattr(SessionTools, "validate", validate)
    # Only the faulty session's first tool call raises: run it alone first.
    sid = await fgw.create_session()
    async with fgw.client(sid) as a:
        await a.subscribe()
        inject(fgw, sid)
        await fgw.submit(sid, TOOL_SCRIPT)
        with trio.fail_after(10):
            events = await a.until_turn_ends()
    failed = next(e for e in events if e.type == "tool.failed")
    assert failed.payload.error_class == "error" and "LookupError" in failed.payload.message
    # The batch failed before running: the next round follows, and the turn ends well.
    assert events[-1].payload.stop_reason == "end_turn"
    assert types(events).count("llm.call_started") == 2


async def test_a_store_that_refuses_a_put(fgw: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    def inject(gw: Harness, sid: str) -> None:
        store: Any = gw.node.store
        real_put = store.put_event
        fault = once(lambda ev: ev.session_id == sid and ev.type == "tool.completed")

        def put_event(ev: Any, *pushes: Any) -> None:
            fault(ev)
            real_put(ev, *pushes)

        monkeypatch.setattr(store, "put_event", put_event)

    await check_isolated(fgw, inject)


async def test_a_hub_that_raises_loses_the_session_nothing(
    fgw: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing fan-out is contained in the session: its turn goes on to its end."""
    sid = await fgw.create_session()
    session = fgw.node.sessions[sid]
    real_publish = session.hub.publish
    fault = once(lambda events, now: any(e.type == "tool.called" for e in events))

    def publish(events: Any, now: float, **kw: Any) -> Any:
        fault(events, now)
        return real_publish(events, now, **kw)

    monkeypatch.setattr(session.hub, "publish", publish)
    before = await failures(fgw)
    async with fgw.client(sid) as a:
        await a.subscribe()
        await fgw.submit(sid, TOOL_SCRIPT)
        with trio.fail_after(10):
            events = await a.until_turn_ends()
    assert "tool.called" not in types(events)  # that batch was lost to this client...
    assert events[-1].payload.stop_reason == "end_turn"  # ...and nothing else
    assert await failures(fgw) == before + 1


@pytest.mark.parametrize(
    "tool_use",
    [
        {"name": "nope", "input": {}},
        {"name": "sleep", "input": {"seconds": "soon"}},
    ],
    ids=["unknown-tool", "invalid-input"],
)
async def test_a_batch_whose_tools_all_fail_before_running_goes_on(
    fgw: Harness, tool_use: dict[str, Any]
) -> None:
    """The issue's repro: one made-up tool name ended the whole daemon."""
    script = {"script": {"rounds": [[{"tool_use": tool_use}], [{"text": "ok"}]]}}
    sid = await fgw.create_session()
    async with fgw.client(sid) as client:
        await client.subscribe()
        await fgw.submit(sid, json.dumps(script))
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    assert types(events).count("llm.call_started") == 2
    assert events[-1].type == "turn.completed" and events[-1].payload.stop_reason == "end_turn"
    assert (await fgw.http.get("/healthz")).status_code == 200


@pytest.mark.parametrize("decision", ["deny", "timeout"])
async def test_a_denied_or_expired_permission_goes_on_to_the_next_round(
    tmp_path: Path, decision: str
) -> None:
    config = make_config(
        tmp_path,
        **{"tools.require_approval": ["sleep"], "tools.approval_timeout_s": 0.05},
    )
    script = {
        "script": {
            "rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 1}}}], [{"text": "ok"}]]
        }
    }
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as client:
                await client.subscribe()
                await gw.submit(sid, script)
                requested = await client.until(lambda e: e.type == "permission.requested")
                if decision == "deny":
                    perm = requested[-1].payload.perm_id
                    r = await gw.http.post(
                        f"/sessions/{sid}/permissions/{perm}", json={"decision": "deny"}
                    )
                    assert r.status_code == 202
                events = await client.until_turn_ends()
            resolved = next(e for e in events if e.type == "permission.resolved")
            assert resolved.payload.decision == decision
            failed = next(e for e in events if e.type == "tool.failed")
            assert failed.payload.error_class == "permission_denied"
            assert events[-1].payload.stop_reason == "end_turn"
            assert (await gw.http.get("/healthz")).status_code == 200


class _Broken:
    """A subscriber whose every delivery raises (a connection's bug)."""

    name = "broken"

    def __init__(self) -> None:
        self.overflows = 0

    def deliver(self, batch: Any, now: float) -> bool:
        raise RuntimeError("a connection bug")

    def deliver_short(self, batch: Any, sent: int, now: float) -> bool:
        raise RuntimeError("a connection bug")

    def overflowed(self) -> None:
        self.overflows += 1


async def test_a_subscriber_that_raises_costs_the_others_nothing(fgw: Harness) -> None:
    from gateway.protocol.filters import resolve_filter

    sid = await fgw.create_session()
    broken = _Broken()
    fgw.node.sessions[sid].hub.subscribe(broken, resolve_filter("preset:full")[1])
    async with fgw.client(sid) as client:
        await client.subscribe()
        await fgw.submit(sid, TOOL_SCRIPT)
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    assert events[0].type == "turn.started" and events[-1].payload.stop_reason == "end_turn"
    assert types(events).count("tool.completed") == 1
    assert broken.overflows >= 1  # the slow-client rule took it out
