"""``/readyz`` (readiness) beside ``/healthz`` (liveness), through a graceful shutdown.

The readiness probe answers 200 ``{"status": "ready"}`` while the gateway
accepts work and 503 ``draining`` once a shutdown began; the listener stays
open while the turns in flight are being closed, so a load balancer's probe
gets that 503 on a new connection, while ``/healthz`` still answers 200. The
turn is held in flight by a model that does not let go of its call until the
test says so (a shielded wait): no real sleep, every step waits for the event
that says it happened.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

import httpx
import trio
import trio.testing

from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from gateway.providers.scripted import ScriptedProvider
from tests.conftest import Harness, make_config, running_gateway


class HeldProvider:
    """The scripted model, whose calls first wait, shielded, for ``release``."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.streaming = trio.Event()
        self.release = trio.Event()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        self.streaming.set()
        with trio.CancelScope(shield=True):  # a shutdown's cancel waits for the test
            await self.release.wait()
        async with aclosing(self.inner.stream(request)) as inner:
            async for raw in inner:
                yield raw

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_readyz_is_503_while_draining_and_healthz_stays_200(tmp_path: Path) -> None:
    provider = HeldProvider()
    config = make_config(tmp_path, **{"server.shutdown_grace_s": 30.0})
    with trio.fail_after(30):
        async with running_gateway(config, provider) as gw:
            try:
                await _drain_with_a_turn_in_flight(gw, provider)
            finally:
                provider.release.set()  # whatever failed, the held call lets go


async def _drain_with_a_turn_in_flight(gw: Harness, provider: HeldProvider) -> None:
    r = await gw.http.get("/readyz")
    assert (r.status_code, r.json()) == (200, {"status": "ready"})
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, "hold this")
        await provider.streaming.wait()

        gw.gateway.shutdown()
        await trio.testing.wait_all_tasks_blocked()  # the shutdown began, and waits for the turn
        assert gw.node.shutting_down
        # A new connection, as a load balancer's probe would open; a short
        # cap, since a listener that stopped accepting leaves it hanging.
        with trio.fail_after(5):
            async with httpx.AsyncClient(base_url=gw.base) as probe:
                r = await probe.get("/readyz")
                assert r.status_code == 503
                assert r.json()["error"]["code"] == "draining"
                health = await probe.get("/healthz")
                assert (health.status_code, health.json()) == (200, {"status": "ok"})
                turn = await probe.post(f"/sessions/{sid}/turns", json={"content": "more"})
                assert turn.status_code == 503
                assert turn.json()["error"]["code"] == "shutting_down"
                assert int(turn.headers["retry-after"]) >= 1  # another node, or this one restarted
                # Nor a new session: it would be made on a node about to stop.
                made = await probe.post("/sessions", json={})
                assert made.status_code == 503, made.text
                assert made.json()["error"]["code"] == "shutting_down"
                assert int(made.headers["retry-after"]) >= 1
        assert gw.node.sessions[sid].turn is not None  # still in flight

        provider.release.set()
        events = await client.until_turn_ends()
        assert events[-1].type == "turn.cancelled"
        assert events[-1].payload.reason == "shutdown"


async def test_readyz_needs_no_key_and_is_get_only(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"auth.api_keys": ["k-1"]})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            assert (await gw.http.get("/readyz")).json() == {"status": "ready"}
            assert (await gw.http.get("/healthz")).status_code == 200
            assert (await gw.http.get("/sessions")).status_code == 401  # the rest needs it
            r = await gw.http.post("/readyz")
            assert r.status_code == 405
            assert r.headers["allow"] == "GET, HEAD"
            head = await gw.http.head("/readyz")
            assert head.status_code == 200 and head.content == b""
