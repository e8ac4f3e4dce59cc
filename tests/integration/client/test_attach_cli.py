"""``gateway attach`` against a real gateway on 127.0.0.1, port 0.

Two ways of driving it. :func:`attach` runs in the test's own Trio loop where
the test must act between its steps (stop and restart the daemon, silence the
network): its stdout and stderr are :class:`_Output` objects the test waits
on. Where the point is what an operator sees, the exit status and the one
line on stderr, the real command runs as a process (``python -m gateway
attach``), against a gateway served by the test's loop.

Real clock, with ``fail_after`` caps; the backoff is made short with a small
:class:`Backoff` (its timing is asserted on the MockClock in
``test_attach_backoff.py``). "At once" means well inside a cap of a few
seconds, where the old client retried a refused subscribe for ~110 s.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.client.attach import Backoff, attach
from tests.conftest import Harness, free_port, make_config, running_gateway

FAST = Backoff(base_s=0.05, cap_s=0.2)


class _Output(io.StringIO):
    """What attach prints, with a way to wait for a line that satisfies a predicate."""

    def __init__(self) -> None:
        super().__init__()
        self._wrote = trio.Event()

    def write(self, s: str) -> int:
        self._wrote.set()
        return super().write(s)

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._wrote.wait()
            self._wrote = trio.Event()

    def lines(self) -> list[str]:
        return self.getvalue().splitlines()

    def frames(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines()]

    def events(self) -> list[dict[str, Any]]:
        return [f["event"] for f in self.frames() if f["type"] == "event"]

    def types(self) -> list[str]:
        return [f["type"] if f["type"] != "event" else f["event"]["type"] for f in self.frames()]


def completed_turns(out: _Output) -> int:
    return sum(e["type"] == "turn.completed" for e in out.events())


async def run_turn(gw: Harness, sid: str, content: Any = "hello there") -> list[str]:
    """Submit a turn and wait for its end with a client of our own; the event ids."""
    async with gw.client(sid) as client:
        await client.subscribe(filter="preset:full")
        await gw.submit(sid, content)
        await client.until_turn_ends()
    return [e.id for e in client.events]


def assert_in_order_and_once(out: _Output) -> None:
    ids = [e["id"] for e in out.events()]
    assert ids == sorted(set(ids)), "an event printed twice, or out of order"


# --- resuming -----------------------------------------------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_attach_prints_the_stream_and_resumes_across_a_1001_without_loss(
    gw: Harness,
) -> None:
    sid = await gw.create_session()
    out, err = _Output(), _Output()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: attach(gw.base, sid, filter="preset:full", out=out, err=err, backoff=FAST)
            )
            await out.until(lambda: "subscribe_ack" in out.types())
            await gw.submit(sid, {"script": {"delay_ms": 2, "rounds": [[{"lorem": 200}]]}})
            await out.until(lambda: len(out.events()) > 50)
            for conn in list(gw.node.connections):
                conn.request_close("shutdown")  # 1001: the client should come back
            await out.until(lambda: completed_turns(out) == 1)
            nursery.cancel_scope.cancel()
    acks = [f for f in out.frames() if f["type"] == "subscribe_ack"]
    assert len(acks) == 2 and acks[1]["since"] is not None
    assert_in_order_and_once(out)
    text = "".join(e["payload"]["text"] for e in out.events() if e["type"] == "text.delta")
    complete = next(e for e in out.events() if e["type"] == "message.complete")
    assert complete["payload"]["final_content"][0]["text"].startswith(text[:20])
    assert err.lines()[0].startswith("attach: closed 1001 shutdown; reconnecting in ")


@pytest.mark.slow  # a gateway daemon restarted under it
async def test_attach_rides_out_a_daemon_restart_with_backoff(tmp_path: Path) -> None:
    """The old client reconnected at once, found nothing listening, and died with a traceback."""
    out, err = _Output(), _Output()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async with running_gateway(make_config(tmp_path)) as gw:
                port = int(gw.base.rsplit(":", 1)[1])
                sid = await gw.create_session()
                nursery.start_soon(
                    lambda: attach(
                        gw.base, sid, out=out, err=err, backoff=FAST, max_reconnects=1000
                    )
                )
                await out.until(lambda: "subscribe_ack" in out.types())
                await gw.submit(sid, "before the restart")
                await out.until(lambda: completed_turns(out) == 1)
            # stopped: attach got its 1001 and finds nothing listening, again and again
            await err.until(lambda: sum("cannot reach" in line for line in err.lines()) >= 3)
            restarted = make_config(tmp_path, **{"server.port": port})
            async with running_gateway(restarted) as gw:
                await out.until(lambda: out.types().count("subscribe_ack") == 2)
                await gw.submit(sid, "after the restart")
                await out.until(lambda: completed_turns(out) == 2)
            nursery.cancel_scope.cancel()

    acks = [f for f in out.frames() if f["type"] == "subscribe_ack"]
    before = next(e for e in out.events() if e["type"] == "turn.completed")
    assert acks[1]["since"] == before["id"]  # resumed where it was, not from a snapshot
    assert_in_order_and_once(out)
    lines = err.lines()
    assert lines[0].startswith("attach: closed 1001 shutdown; reconnecting in ")
    retries = [line for line in lines if "cannot reach" in line]
    assert all(line.endswith(" s") and "reconnecting in" in line for line in retries)
    assert not any("Traceback" in line for line in lines)


@pytest.mark.parametrize("cursor", ["expired", "too_old_to_replay"])
async def test_a_cursor_the_server_cannot_replay_falls_back_to_a_snapshot(
    tmp_path: Path, cursor: str
) -> None:
    """``cursor_expired`` and ``replay_too_large``: the old client retried the same subscribe."""
    config = make_config(tmp_path, **{"stream.replay_max_events": 2})
    out, err = _Output(), _Output()
    with trio.fail_after(10):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            first = await run_turn(gw, sid)
            since = "evt_99999999999999999999" if cursor == "expired" else first[0]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: attach(gw.base, sid, since=since, out=out, err=err, backoff=FAST)
                )
                await out.until(lambda: "snapshot" in out.types())
                await gw.submit(sid, "and now live")
                await out.until(lambda: completed_turns(out) == 1)
                nursery.cancel_scope.cancel()

    code = "cursor_expired" if cursor == "expired" else "replay_too_large"
    frames = out.frames()
    assert [f["type"] for f in frames[:3]] == ["subscribe_error", "subscribe_ack", "snapshot"]
    assert frames[0]["code"] == code
    assert frames[1]["snapshot"] is True
    snapshot = frames[2]
    assert [m["role"] for m in snapshot["messages"]] == ["user", "assistant"]
    assert snapshot["snapshot_at_event_id"] >= first[-1]
    assert all(e["id"] > snapshot["snapshot_at_event_id"] for e in out.events())
    assert err.lines() == [f"attach: {code} (since {since}); starting from a snapshot"]


async def test_a_frame_over_a_mebibyte_is_printed(gw: Harness) -> None:
    """trio-websocket's default limit (1 MiB) closed the old client with 1009 on a long message."""
    sid = await gw.create_session()
    out, err = _Output(), _Output()
    script = {"script": {"chunk_chars": 200_000, "rounds": [[{"lorem": 250_000}]]}}
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: attach(gw.base, sid, out=out, err=err, backoff=FAST))
            await out.until(lambda: "subscribe_ack" in out.types())
            await gw.submit(sid, script)
            await out.until(lambda: completed_turns(out) == 1)
            nursery.cancel_scope.cancel()
    complete = next(e for e in out.events() if e["type"] == "message.complete")
    assert len(complete["payload"]["final_content"][0]["text"]) > 2**20
    assert err.lines() == []


class _Relay:
    """One proxied TCP connection; ``silent`` drops every byte both ways from then on."""

    def __init__(self) -> None:
        self.websocket = False
        self.silent = False


class SilenceableProxy:
    """A TCP relay in front of the gateway that can make its WebSocket connections vanish:
    no close frame, no FIN, no RST, just nothing, as when a network path dies."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.relays: list[_Relay] = []

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._relay, listeners)

    def silence_websockets(self) -> None:
        for relay in self.relays:
            relay.silent = relay.silent or relay.websocket

    async def _relay(self, downstream: trio.SocketStream) -> None:
        relay = _Relay()
        self.relays.append(relay)
        async with downstream, await trio.open_tcp_stream("127.0.0.1", self.target_port) as up:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                async for data in src:
                    relay.websocket = relay.websocket or b"upgrade: websocket" in data.lower()
                    if not relay.silent:
                        await dst.send_all(data)
                nursery.cancel_scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, downstream, up)
                nursery.start_soon(pump, up, downstream)


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_gateway_that_vanishes_is_found_by_the_keepalive(gw: Harness) -> None:
    """Silence for ``keepalive_s``: a ping; as long again: reconnect (the old client waited on)."""
    sid = await gw.create_session()
    out, err = _Output(), _Output()
    proxy = SilenceableProxy(int(gw.base.rsplit(":", 1)[1]))
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(proxy.serve)
            nursery.start_soon(
                lambda: attach(
                    f"http://127.0.0.1:{port}",
                    sid,
                    out=out,
                    err=err,
                    backoff=FAST,
                    keepalive_s=0.25,
                )
            )
            await out.until(lambda: "subscribe_ack" in out.types())
            await gw.submit(sid, "one")
            await out.until(lambda: completed_turns(out) == 1)
            proxy.silence_websockets()
            await err.until(lambda: bool(err.lines()))
            await gw.submit(sid, "two")  # while attach is away: replayed when it is back
            await out.until(lambda: completed_turns(out) == 2)
            nursery.cancel_scope.cancel()
    assert err.lines()[0].startswith("attach: no frame from the gateway in 0.5 s; reconnecting in")
    assert out.types().count("subscribe_ack") == 2
    assert_in_order_and_once(out)


# --- the real command: exit status and one line ------------------------------------------------


def _attach_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", "attach", *args]


async def run_attach(*args: str, cap_s: float = 10) -> tuple[int, str, str]:
    """``gateway attach ARGS`` to its end: the exit status, stdout and stderr."""
    with trio.fail_after(cap_s):
        done = await trio.run_process(
            _attach_command(*args), capture_stdout=True, capture_stderr=True, check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_an_unreachable_gateway_is_one_line_and_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    status, stdout, stderr = await run_attach("sess_x", "--url", url)
    assert (status, stdout) == (1, "")
    assert stderr.startswith(f"attach: cannot reach {url}")
    assert stderr.count("\n") == 1


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize(
    ("args", "status", "line"),
    [
        (["sess_00000000000000000000"], 1, "attach: session sess_00000000000000000000 not found"),
        (["{sid}", "--filter", "preset:nope"], 2, "attach: subscribe refused: invalid_filter: "),
        (["{sid}", "--filter", '{"actors": ["nobody"]}'], 2, "attach: subscribe refused: inv"),
        (["{sid}", "--filter", '{"colour": "red"}'], 2, "attach: subscribe refused: invalid_frame"),
        (["{sid}", "--filter", "{not json"], 2, "attach: --filter is not JSON: "),
    ],
    ids=["unknown-session", "unknown-preset", "unknown-actor", "unknown-field", "not-json"],
)
async def test_an_error_retrying_cannot_fix_exits_at_once(
    gw: Harness, args: list[str], status: int, line: str
) -> None:
    sid = await gw.create_session()
    argv = [a.replace("{sid}", sid) for a in args]
    got, _, stderr = await run_attach(*argv, "--url", gw.base, cap_s=5)
    assert got == status
    assert stderr.startswith(line) and stderr.count("\n") == 1, stderr


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize(("key", "status"), [(None, 401), ("wrong", 403)])
async def test_a_refused_api_key_exits_at_once(
    tmp_path: Path, key: str | None, status: int
) -> None:
    config = make_config(tmp_path, **{"auth.api_keys": ["right"]})
    async with running_gateway(config) as gw:
        r = await gw.http.post("/sessions", json={}, headers={"Authorization": "Bearer right"})
        sid = r.json()["session_id"]
        key_args = ["--api-key", key] if key else []
        got, _, stderr = await run_attach(sid, "--url", gw.base, *key_args, cap_s=5)
    assert got == 1
    assert stderr.startswith(f"attach: the gateway refused: {status} ")
    assert stderr.endswith("(pass --api-key)\n") and stderr.count("\n") == 1


@asynccontextmanager
async def attach_process(*args: str) -> AsyncIterator[tuple[trio.Process, trio.abc.ReceiveStream]]:
    proc = await trio.lowlevel.open_process(
        _attach_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        yield proc, proc.stdout
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await proc.stdout.aclose()
        await proc.stderr.aclose()


async def read_until(stream: trio.abc.ReceiveStream, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = await stream.receive_some()
        assert chunk, f"the stream ended before {marker!r}: {seen!r}"
        seen += chunk
    return seen


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_ctrl_c_prints_one_line_and_exits_130(gw: Harness) -> None:
    sid = await gw.create_session()
    with trio.fail_after(10):
        async with attach_process(sid, "--url", gw.base) as (proc, stdout):
            await read_until(stdout, b'"type":"subscribe_ack"')
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 130
            assert proc.stderr is not None
            stderr = b""
            async for chunk in proc.stderr:
                stderr += chunk
    assert stderr == b"attach: interrupted\n"


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_reader_that_goes_away_ends_attach_quietly(gw: Harness) -> None:
    """``gateway attach ... | head -1``: the old client died with BrokenPipeError tracebacks."""
    sid = await gw.create_session()
    with trio.fail_after(10):
        async with attach_process(sid, "--url", gw.base) as (proc, stdout):
            await read_until(stdout, b'"type":"subscribe_ack"')
            await stdout.aclose()  # like head, once it has its line
            await gw.submit(sid, "more output than anyone reads")
            assert await proc.wait() == 0
            assert proc.stderr is not None
            stderr = b""
            async for chunk in proc.stderr:
                stderr += chunk
    assert stderr == b""
