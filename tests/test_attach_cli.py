"""``gateway attach``: the reference client resumes after a close that says "reconnect"."""

from __future__ import annotations

import io
import json

import trio

from gateway.client.attach import attach
from tests.conftest import Harness


class _Output(io.StringIO):
    """What attach prints, with a way to wait for the next line."""

    def __init__(self) -> None:
        super().__init__()
        self._wrote = trio.Event()

    def write(self, s: str) -> int:
        self._wrote.set()
        return super().write(s)

    async def written(self) -> None:
        await self._wrote.wait()
        self._wrote = trio.Event()


async def test_attach_prints_the_stream_and_resumes_across_a_1001_without_loss(
    gw: Harness,
) -> None:
    sid = await gw.create_session()
    out = _Output()

    def lines() -> list[dict[str, object]]:
        return [json.loads(line) for line in out.getvalue().splitlines()]

    def events() -> list[dict[str, object]]:
        return [f["event"] for f in lines() if f["type"] == "event"]  # type: ignore[misc]

    async def wait_for(predicate: object) -> None:
        while not predicate():  # type: ignore[operator]
            await out.written()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: attach(gw.base, sid, filter="preset:full", out=out))
            await wait_for(lambda: any(f["type"] == "subscribe_ack" for f in lines()))
            await gw.submit(sid, {"script": {"delay_ms": 2, "rounds": [[{"lorem": 200}]]}})
            await wait_for(lambda: len(events()) > 50)
            for conn in list(gw.node.connections):
                conn.request_close("shutdown")  # 1001: the client should come back
            await wait_for(lambda: any(e["type"] == "turn.completed" for e in events()))
            nursery.cancel_scope.cancel()
    acks = [f for f in lines() if f["type"] == "subscribe_ack"]
    assert len(acks) == 2 and acks[1]["since"] is not None
    ids = [e["id"] for e in events()]
    assert ids == sorted(set(ids))  # nothing printed twice, in order
    text = "".join(
        e["payload"]["text"]
        for e in events()
        if e["type"] == "text.delta"  # type: ignore[index]
    )
    complete = next(e for e in events() if e["type"] == "message.complete")
    assert complete["payload"]["final_content"][0]["text"].startswith(text[:20])  # type: ignore[index]
