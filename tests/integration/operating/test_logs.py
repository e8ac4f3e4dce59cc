"""The daemon's log (docs/reference.md ``[log]``; docs/operating.md "Logs").

- The formatters, line by line: JSON lines parse and carry ``ts`` (RFC 3339
  UTC), ``level``, ``event`` and the event's fields, a failure its traceback,
  and nothing a caller passes can break a line or overwrite those keys; text
  lines read as a sentence with the event and its fields after it.
- A real gateway in JSON: a session, a client, a tool turn with a made-up tool,
  a provider error, a provider bug (a session failure), a replay: each
  lifecycle event is one line with the ids it concerns, and every line parses.
- ``gateway serve --config`` with ``format = "json"``: the whole stderr of a
  real process is JSON lines, from ``gateway_started`` to ``gateway_stopped``.
- The daemon's handler (:class:`gateway.logs.QueuedHandler`) with a reader that
  stalls: logging never waits, a full queue drops and counts, the writer says
  how many once the reader takes lines again, and stopping it is bounded.
  (The same against a real process: tests/system/operating/test_log_stall.py.)
"""

from __future__ import annotations

import io
import json
import logging
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.config import LogConfig
from gateway.logs import JsonFormatter, QueuedHandler, TextFormatter, configure, event, stop
from gateway.metrics import LOG_LINES_DROPPED
from gateway.protocol.shapes import TextBlock
from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from gateway.providers.scripted import ScriptedProvider
from tests.conftest import Client, make_config, open_ws, running_gateway
from tests.system.cli.test_cli_serve import gateway_process

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def one_logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"gateway.test.{id(buf)}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger, buf


def test_json_lines_have_ts_level_event_and_the_fields() -> None:
    log, buf = one_logger(JsonFormatter())
    before = datetime.now(UTC)
    event(log, logging.INFO, "turn_ended", "turn t1 ended", session_id="s1", turn_id="t1",
          duration_ms=12, stop_reason="end_turn", reason=None)  # fmt: skip
    log.warning("a library's line: %s", "as is")
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        event(log, logging.ERROR, "session_failed", "it failed", exc_info=exc, session_id="s1")
    # Fields cannot overwrite the line's own keys, and an odd value is still JSON.
    event(log, logging.INFO, "odd", "odd values", level="fake", ts="fake", obj=object(),
          text='quote " and \n newline')  # fmt: skip
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert len(lines) == 4
    first, library, failure, odd = lines
    assert first == {
        "ts": first["ts"],
        "level": "info",
        "event": "turn_ended",
        "logger": log.name,
        "message": "turn t1 ended",
        "session_id": "s1",
        "turn_id": "t1",
        "duration_ms": 12,
        "stop_reason": "end_turn",
    }  # a None field is left out
    assert RFC3339_UTC.fullmatch(first["ts"])
    ts = datetime.fromisoformat(first["ts"].replace("Z", "+00:00"))
    assert abs((ts - before).total_seconds()) < 5
    assert library["event"] == "log" and library["message"] == "a library's line: as is"
    assert library["level"] == "warning"
    assert failure["level"] == "error" and failure["event"] == "session_failed"
    assert failure["exc"].startswith("Traceback (most recent call last)")
    assert failure["exc"].rstrip().endswith("RuntimeError: boom")
    assert odd["level"] == "info" and odd["ts"] != "fake"
    assert odd["obj"].startswith("<object object")
    assert odd["text"] == 'quote " and \n newline'


def test_text_lines_read_as_a_sentence_with_the_event_after_it() -> None:
    log, buf = one_logger(TextFormatter())
    event(log, logging.INFO, "client_closed", "ws-3 closed (client_closed, 1000)",
          client="ws-3 127.0.0.1:5000", code=1000, session_id="s1")  # fmt: skip
    log.info("plain")
    closed, plain = buf.getvalue().splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO gateway\.test\.\d+: "
        r"ws-3 closed \(client_closed, 1000\) "
        r"\[client_closed client='ws-3 127\.0\.0\.1:5000' code=1000 session_id=s1\]",
        closed,
    ), closed
    assert plain.endswith(": plain")


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The daemon's log set up as ``gateway serve`` does, into a buffer; undone after."""
    root = logging.getLogger()
    level = root.level
    buf = io.StringIO()
    handler = configure(LogConfig(format="json", level="info"), stream=buf)
    try:
        yield buf
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_configure_installs_one_handler_and_the_level() -> None:
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    try:
        first = configure(LogConfig(format="text", level="warning"), stream=io.StringIO())
        second = configure(LogConfig(format="json", level="debug"), stream=io.StringIO())
        assert first not in root.handlers and second in root.handlers
        assert len(root.handlers) == len(before) + 1
        assert root.level == logging.DEBUG
        assert isinstance(second.formatter, JsonFormatter)
        with pytest.raises(ValueError, match="format must be 'text' or 'json'"):
            configure(LogConfig(format="xml"), stream=io.StringIO())  # type: ignore[arg-type]
        assert second in root.handlers  # a refused set-up changes nothing
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)


class BuggyProvider:
    """The scripted model, except that a user message "explode" makes it raise (a bug)."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedProvider()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        last = request.messages[-1]
        if any(isinstance(b, TextBlock) and b.text == "explode" for b in last.content):
            raise RuntimeError("injected provider bug")
        async with aclosing(self.inner.stream(request)) as inner:
            async for raw in inner:
                yield raw

    async def aclose(self) -> None:
        await self.inner.aclose()


TOOLS = {
    "script": {
        "rounds": [
            [{"text": "Trying."}, {"tool_use": {"name": "no_such_tool", "input": {}}}],
            [{"text": "Done."}],
        ]
    }
}
OVERLOADED = {
    "script": {
        "rounds": [[{"text": "one two three"}]],
        "fail": {"round": 0, "after_deltas": 1, "error_class": "overloaded"},
    }
}


def by_event(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == name]


async def test_a_gateway_logs_each_lifecycle_event_once_with_its_ids(
    tmp_path: Path, captured: io.StringIO
) -> None:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path), BuggyProvider()) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as client:
                await client.subscribe()
                ok = await gw.submit(sid, TOOLS)
                await client.until_turn_ends()
                overloaded = await gw.submit(sid, OVERLOADED)
                await client.until_turn_ends()
                exploded = await gw.submit(sid, "explode")
                await client.until_turn_ends()
                first_id = client.events[0].id
            async with gw.client(sid) as late:
                await late.subscribe(since=first_id)
            while gw.node.connections:
                await gw.node.changed()
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    for line in lines:
        assert {"ts", "level", "event", "logger", "message"} <= set(line), line
        assert RFC3339_UTC.fullmatch(line["ts"])

    [created] = by_event(lines, "session_created")
    assert created["session_id"] == sid and created["level"] == "info"
    started = by_event(lines, "turn_started")
    ended = by_event(lines, "turn_ended")
    assert [s["turn_id"] for s in started] == [ok, overloaded, exploded]
    assert [e["turn_id"] for e in ended] == [ok, overloaded, exploded]
    assert all(line["session_id"] == sid for line in started + ended)
    assert [e["stop_reason"] for e in ended] == ["end_turn", "error", "error"]
    assert all(isinstance(e["duration_ms"], int) and e["duration_ms"] >= 0 for e in ended)

    [tool] = by_event(lines, "tool_failed")
    assert (tool["turn_id"], tool["tool"], tool["code"]) == (ok, "no_such_tool", "unknown_tool")
    # The overloaded call, and the call the provider's bug failed (api_error).
    provider = by_event(lines, "provider_error")
    assert [(p["turn_id"], p["code"], p["level"]) for p in provider] == [
        (overloaded, "overloaded", "warning"),
        (exploded, "api_error", "warning"),
    ]
    [failure] = by_event(lines, "session_failed")
    assert (failure["session_id"], failure["turn_id"]) == (sid, exploded)
    assert failure["component"] == "provider" and failure["level"] == "error"
    assert "Traceback (most recent call last)" in failure["exc"]
    assert "RuntimeError: injected provider bug" in failure["exc"]

    attached = by_event(lines, "client_attached")
    subscribed = by_event(lines, "client_subscribed")
    closed = by_event(lines, "client_closed")
    assert len(attached) == len(subscribed) == len(closed) == 2
    for line in attached + subscribed + closed:
        assert re.fullmatch(r"ws-\d+ 127\.0\.0\.1:\d+", line["client"]), line
        assert line["session_id"] == sid
    assert [s["mode"] for s in subscribed] == ["live", "replay"]
    assert subscribed[1]["since"] == first_id and subscribed[1]["replayed"] > 0
    assert [(c["code"], c["reason"]) for c in closed] == [(1000, "client_closed")] * 2
    # One line per lifecycle event: nothing above was logged twice.
    names = [line["event"] for line in lines]
    for name in ("session_created", "tool_failed", "session_failed"):
        assert names.count(name) == 1, name


async def test_text_format_is_a_readable_line(tmp_path: Path) -> None:
    root = logging.getLogger()
    level, buf = root.level, io.StringIO()
    handler = configure(LogConfig(format="text", level="info"), stream=buf)
    try:
        with trio.fail_after(30):
            async with running_gateway(make_config(tmp_path)) as gw:
                sid = await gw.create_session()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    [line] = [x for x in buf.getvalue().splitlines() if "session_created" in x]
    assert f"INFO gateway.node: session {sid} created [session_created session_id={sid}" in line
    assert "{" not in line


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_serve_with_json_config_writes_only_json_lines(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('[log]\nformat = "json"\n')
    async with gateway_process(tmp_path, "--config", str(config), "--port", "0") as (proc, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            url = (await http.get(f"/sessions/{sid}")).json()["ws_url"]
            async with open_ws(url) as ws:
                client = Client(ws, sid)
                await client.subscribe()
                r = await http.post(f"/sessions/{sid}/turns", json={"content": "hello"})
                turn_id = r.json()["turn_id"]
                with trio.fail_after(10):
                    await client.until_turn_ends()
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            assert await proc.wait() == 0
        assert proc.stderr is not None and proc.stdout is not None
        stderr = stdout = b""
        while chunk := await proc.stderr.receive_some():
            stderr += chunk
        while chunk := await proc.stdout.receive_some():
            stdout += chunk
    # stdout's listening line was the gateway_started record (read by ready_port): nothing follows
    assert stdout == b"", stdout
    lines = [json.loads(line) for line in stderr.decode().splitlines()]
    names = [line["event"] for line in lines]
    assert names[0] == "gateway_started" and names[-1] == "gateway_stopped", names
    for name in ("session_created", "turn_started", "turn_ended", "client_attached",
                 "client_subscribed", "client_closed", "shutdown_started"):  # fmt: skip
        assert name in names, (name, names)
    [ended] = by_event(lines, "turn_ended")
    assert (ended["session_id"], ended["turn_id"], ended["stop_reason"]) == (
        sid,
        turn_id,
        "end_turn",
    )


@pytest.mark.slow  # a daemon process
async def test_under_json_a_startup_failure_is_one_json_line(tmp_path: Path) -> None:
    """A port already taken: exit 1 and one ``startup_failed`` record on stderr, nothing else."""
    config = tmp_path / "gw.toml"
    config.write_text('[log]\nformat = "json"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
        proc = await trio.run_process(
            [*serve, "--port", str(port)],
            cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stdout == b""
    [line] = [json.loads(x) for x in proc.stderr.decode().splitlines()]
    assert (line["event"], line["level"]) == ("startup_failed", "error"), line
    assert str(port) in line["message"], line


class StalledReader:
    """The writer's output: each write waits until :meth:`drain` (a full pipe)."""

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.entered = threading.Event()
        self.drained = threading.Event()

    def write(self, text: str) -> None:
        self.entered.set()
        if not self.drained.wait(10):
            raise AssertionError("the test never drained the reader")
        self.chunks.append(text)

    def drain(self) -> None:
        self.drained.set()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in "".join(self.chunks).splitlines()]


def queued_logger(reader: StalledReader, capacity: int) -> tuple[logging.Logger, QueuedHandler]:
    handler = QueuedHandler(reader.write, capacity)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"gateway.test.queued.{id(reader)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    handler.start()
    return logger, handler


def test_a_full_queue_drops_and_counts_and_never_blocks() -> None:
    reader = StalledReader()
    logger, handler = queued_logger(reader, capacity=3)
    before = LOG_LINES_DROPPED.total
    try:
        event(logger, logging.INFO, "first", "taken by the writer, which then stalls")
        assert reader.entered.wait(10)
        started = time.monotonic()
        for i in range(3 + 50):  # three fill the queue, fifty are dropped
            event(logger, logging.INFO, "line", f"line {i}", i=i)
        assert time.monotonic() - started < 1.0  # nothing waited for the reader
        assert LOG_LINES_DROPPED.total - before == 50
        reader.drain()
        assert handler.stop(timeout=10)
    finally:
        logger.removeHandler(handler)
    lines = reader.lines()
    # What was queued, in order, after the report of what was not.
    assert [x["event"] for x in lines] == ["first", "log_lines_dropped", "line", "line", "line"]
    assert [x["i"] for x in lines[2:]] == [0, 1, 2]
    report = lines[1]
    assert (report["level"], report["logger"], report["dropped"]) == ("warning", "gateway.logs", 50)
    assert report["dropped_total"] >= 50
    assert "50 log lines dropped" in report["message"]


def test_stopping_is_bounded_by_a_reader_that_never_comes_back() -> None:
    reader = StalledReader()
    logger, handler = queued_logger(reader, capacity=2)
    try:
        for i in range(10):
            event(logger, logging.INFO, "line", f"line {i}")
        assert reader.entered.wait(10)
        started = time.monotonic()
        assert not handler.stop(timeout=0.2)  # the writer is left behind, blocked
        assert time.monotonic() - started < 2.0
    finally:
        logger.removeHandler(handler)
        reader.drain()  # let the thread go


def test_the_daemon_log_is_queued_and_stop_writes_what_is_queued() -> None:
    """``configure`` without a stream (the daemon's) queues; ``stop`` flushes and removes it."""
    root = logging.getLogger()
    level, buf = root.level, io.StringIO()
    try:
        handler = configure(LogConfig(format="json", level="info"), stream=buf, queued=True)
        assert isinstance(handler, QueuedHandler) and handler in root.handlers
        for i in range(100):
            event(logging.getLogger("gateway.test"), logging.INFO, "line", "line", i=i)
        stop()
        assert handler not in root.handlers
        assert [json.loads(x)["i"] for x in buf.getvalue().splitlines()] == list(range(100))
    finally:
        stop()
        root.setLevel(level)
