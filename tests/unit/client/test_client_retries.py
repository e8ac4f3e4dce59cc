"""The client's retries of ``POST /sessions`` and ``POST .../turns`` (docs/clients.md).

Each is sent with a fresh ``Idempotency-Key`` (uuid4) and sent again under the
same key after a lost answer (a dropped connection, a timeout), a 503 with
``Retry-After`` and a 409 ``idempotency_key_in_use``, a bounded number of
times; every other answer is final. On Trio's MockClock: the waits take no
real time and are asserted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import httpx
import pytest
import trio

from gateway.client.api import RETRY_MAX_S, GatewayClient
from gateway.errors import ApiError, ClientError

CREATED = {
    "session_id": "sess_1",
    "agent": "default",
    "active_model": "scripted:x",
    "created_at": 1,
}
Step = Callable[[httpx.Request], httpx.Response]


def error(status: int, code: str, retry_after: str | None = None) -> Step:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}

    def answer(request: httpx.Request) -> httpx.Response:
        body = {"error": {"code": code, "message": code}}
        return httpx.Response(status, json=body, headers=headers)

    return answer


def drop(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadError("connection dropped", request=request)


def timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def created(request: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json=CREATED)


def accepted(request: httpx.Request) -> httpx.Response:
    return httpx.Response(202, json={"turn_id": "turn_1"})


class Gateway:
    """A scripted gateway: one step per request, and what each request carried."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.keys: list[str | None] = []
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.keys.append(request.headers.get("idempotency-key"))
        self.times.append(trio.current_time())
        return self.steps.pop(0)(request)

    def client(self, **kw: int) -> GatewayClient:
        return GatewayClient("http://gw", transport=httpx.MockTransport(self), **kw)


async def test_a_lost_answer_and_a_503_are_sent_again_under_the_same_key(
    autojump_clock: trio.abc.Clock,
) -> None:
    gw = Gateway(drop, timeout, error(503, "shutting_down", "2"), created)
    async with gw.client() as client:
        start = trio.current_time()
        session = await client.create_session()
    assert session.session_id == "sess_1"
    assert len(set(gw.keys)) == 1 and gw.keys[0] is not None
    assert uuid.UUID(gw.keys[0]).version == 4
    waits = [round(b - a, 3) for a, b in zip([start, *gw.times], gw.times, strict=False)][1:]
    assert waits == [0.25, 0.5, 2.0]  # backoff, backoff, then Retry-After


async def test_a_key_in_use_is_waited_for_then_the_first_answer_comes(
    autojump_clock: trio.abc.Clock,
) -> None:
    gw = Gateway(error(409, "idempotency_key_in_use", "1"), accepted)
    async with gw.client() as client:
        assert await client.send_turn("sess_1", "hi") == "turn_1"
    assert gw.keys[0] == gw.keys[1] is not None
    assert round(gw.times[1] - gw.times[0], 3) == 1.0


async def test_each_call_has_its_own_key() -> None:
    gw = Gateway(created, created)
    async with gw.client() as client:
        await client.create_session()
        await client.create_session()
    assert gw.keys[0] != gw.keys[1]


@pytest.mark.parametrize(
    "final",
    [
        error(409, "turn_in_progress"),
        error(422, "idempotency_key_reused"),
        error(503, "store_unavailable"),  # no Retry-After: the gateway did not say when
        error(429, "rate_limited", "1"),
    ],
)
async def test_every_other_error_is_final(final: Step) -> None:
    gw = Gateway(final)
    async with gw.client() as client:
        with pytest.raises(ApiError):
            await client.send_turn("sess_1", "hi")
    assert len(gw.keys) == 1


async def test_the_retries_are_bounded(autojump_clock: trio.abc.Clock) -> None:
    gw = Gateway(*[error(503, "over_capacity", "60")] * 3)
    async with gw.client(retries=2) as client:
        with pytest.raises(ApiError) as refused:
            await client.create_session()
    assert refused.value.code == "over_capacity"
    assert len(gw.keys) == 3
    assert round(gw.times[1] - gw.times[0], 3) == RETRY_MAX_S  # Retry-After capped
    gw = Gateway(drop, drop)
    async with gw.client(retries=1) as client:
        with pytest.raises(ClientError) as lost:
            await client.create_session()
    assert lost.value.code == "unreachable"


async def test_other_calls_carry_no_key_and_are_not_retried() -> None:
    gw = Gateway(drop)
    async with gw.client() as client:
        with pytest.raises(ClientError):
            await client.list_sessions()
    assert gw.keys == [None]


def test_the_body_is_the_same_on_every_attempt() -> None:
    bodies: list[bytes] = []

    def record(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return (
            httpx.Response(503, headers={"Retry-After": "0"})
            if len(bodies) < 2
            else (httpx.Response(201, json=CREATED))
        )

    async def main() -> None:
        client = GatewayClient("http://gw", transport=httpx.MockTransport(record))
        async with client:
            await client.create_session(metadata={"a": 1})

    trio.run(main)
    assert bodies[0] == bodies[1] and json.loads(bodies[0]) == {"metadata": {"a": 1}}
