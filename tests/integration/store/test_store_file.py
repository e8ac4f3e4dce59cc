"""The store is the truth (docs/protocol.md §15): a lost or replaced file, a full disk.

What an adversarial trial found: after ``rm gateway.db*`` under load the
daemon went on answering 201/202 into the unlinked file, and at restart every
session was gone and event ids started again at 1, with nothing logged; on a
full disk ``/readyz`` stayed 200. Here, the store notices its file (and its
``-wal``) deleted or replaced, commits nothing more, logs
``store_file_replaced`` once and refuses writes until a restart (503
``store_unavailable``, ``/readyz`` 503); a restart's ids are above every id a
client saw; a full disk (``PRAGMA max_page_count``: SQLite's own "database or
disk is full", no mock) makes ``/readyz`` 503 until a commit lands, then 200
and ``store_reconnected`` once.

The store's own tests run it directly; the daemon's run ``gateway serve`` as
an operator does, in a temporary directory, with a client creating sessions
and turns in a loop while the files are removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from gateway.errors import Refused, StoreError
from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.node import Node
from gateway.protocol.shapes import Message, TextBlock
from gateway.providers.scripted import ScriptedProvider
from gateway.session.session import Session
from gateway.store.base import SessionRecord
from gateway.store.sqlite.store import SqliteStore, id_floor
from gateway.tools.builtin import build_registry
from tests.conftest import Client, make_config, open_ws, running_gateway
from tests.system.cli.test_cli_serve import gateway_process

TEXT_SCRIPT = {"script": {"rounds": [[{"text": "Hello there."}]]}}
TEXT = json.dumps(TEXT_SCRIPT)


def record(sid: str, metadata: dict[str, Any] | None = None) -> SessionRecord:
    return SessionRecord(
        id=sid,
        created_at=1,
        workspace_path="/w",
        active_model="scripted:x",
        metadata=metadata or {},
        parent_session_id=None,
        routing_policy_version="static-1",
    )


def remove_store(path: Path) -> None:
    """``rm gateway.db gateway.db-wal gateway.db-shm``, as in the trial."""
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        name.unlink(missing_ok=True)


def replace_store(path: Path) -> None:
    """``mv`` another database over the store: a copy of it (a backup), taken now."""
    backup = path.with_name("backup.db")
    source = sqlite3.connect(path)
    target = sqlite3.connect(backup)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    os.replace(backup, path)


def replaced_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "store_file_replaced"]


async def _on_the_writer(store: SqliteStore, sql: str) -> None:
    """``sql`` on the store's write connection, in its thread, between its writes."""
    writer = store._database()._writer
    with trio.fail_after(10):
        await trio.to_thread.run_sync(writer.execute, sql, limiter=store._write_limiter)


async def fill_the_disk(store: SqliteStore) -> None:
    """The database may not grow by a page: SQLite's own ``database or disk is full``."""
    writer = store._database()._writer
    (pages,) = await trio.to_thread.run_sync(
        lambda: writer.execute("PRAGMA page_count").fetchone(), limiter=store._write_limiter
    )
    await _on_the_writer(store, f"PRAGMA max_page_count = {pages}")


async def make_space(store: SqliteStore) -> None:
    await _on_the_writer(store, "PRAGMA max_page_count = 1073741823")


@asynccontextmanager
async def running_store(path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(str(path))
    await store.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        try:
            yield store
        finally:
            with contextlib.suppress(StoreError):  # a store that refuses says what it lost
                await store.aclose()
            nursery.cancel_scope.cancel()


# --- the store itself ------------------------------------------------------------


@pytest.mark.parametrize("change", [remove_store, replace_store], ids=["deleted", "replaced"])
async def test_a_store_whose_file_is_gone_or_another_commits_nothing_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, change: Callable[[Path], None]
) -> None:
    path = tmp_path / "gateway.db"
    store = SqliteStore(str(path))
    await store.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.put_session(record("sess_a"))
        await store.flush()
        assert store.committed == 1

        change(path)
        store.put_session(record("sess_b"))
        with pytest.raises(StoreError, match=r"gateway\.db"):
            await store.flush()
        assert store.committed == 1  # never reported committed
        assert store.refusing is not None and store.failure is store.refusing
        # It stays refusing: the writer takes nothing more, a flush says why at once.
        store.put_session(record("sess_c"))
        with trio.fail_after(5), pytest.raises(StoreError):
            await store.flush()
        with pytest.raises(StoreError):
            await store.purge_before(10)
        assert store.committed == 1
        [line] = replaced_lines(caplog)  # once
        assert line.levelno == logging.ERROR
        assert str(path) in line.getMessage()
        kind = "deleted" if change is remove_store else "replaced by another file"
        assert kind in line.getMessage()
        if change is remove_store:
            assert not path.exists()  # not recreated
        else:  # nothing written into the file put there (it is the copy, as it was)
            db = sqlite3.connect(path)
            ids = [sid for (sid,) in db.execute("SELECT id FROM sessions")]
            db.close()
            assert ids == ["sess_a"]
        # Closing says what was lost, at once (no retrying a store that refuses).
        with trio.fail_after(5), pytest.raises(StoreError, match="2 writes were not made durable"):
            await store.aclose()
        nursery.cancel_scope.cancel()


async def test_a_batch_that_landed_in_the_unlinked_file_is_not_committed(tmp_path: Path) -> None:
    """The file removed between the check before the write and its commit (a race).

    The write goes into the unlinked file, which no restart sees: the check
    after the commit refuses to call it durable.
    """
    path = tmp_path / "gateway.db"
    async with running_store(path) as store:
        store.put_session(record("sess_a"))
        await store.flush()
        db = store._database()

        def on_statement(sql: str) -> None:
            if sql.startswith("BEGIN"):
                remove_store(path)

        db._writer.set_trace_callback(on_statement)  # runs in the writer's thread
        store.put_session(record("sess_b"))
        with pytest.raises(StoreError, match="deleted"):
            await store.flush()
        assert store.committed == 1


async def test_a_full_disk_fails_the_commits_until_space_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gateway.db"
    async with running_store(path) as store:
        caplog.set_level(logging.INFO, logger="gateway.store")
        await store.flush()
        await fill_the_disk(store)
        failed = trio.Event()
        store.on_write_error = lambda exc: failed.set()
        store.put_session(record("sess_big", {"pad": "x" * 20_000}))
        with trio.fail_after(10):
            await failed.wait()
        assert "database or disk is full" in str(store.failure)
        assert store.committed == 0
        assert store.refusing is None  # a full disk passes: retried
        await make_space(store)
        with trio.fail_after(10):
            await store.wait_committed(store.ticket())
        assert store.failure is None
        assert (await store.get_session("sess_big")) is not None
        [back] = [r for r in caplog.records if getattr(r, "event", None) == "store_reconnected"]
        assert "writing again after" in back.getMessage()


def test_event_ids_start_above_the_clock_in_microseconds() -> None:
    """The floor a lost store restarts above (20 digits hold it; 2**63 until 2262)."""
    floor = id_floor()
    assert 1_700_000_000_000_000 < floor < 2**63
    assert len(str(floor)) <= 20


# --- the node: its turns end, its requests are 503 at once (Trio's MockClock) --------

NAP = {
    "script": {
        "rounds": [
            [{"text": "Napping."}, {"tool_use": {"name": "sleep", "input": {"seconds": 600}}}],
            [{"text": "Awake."}],
        ]
    }
}


def user_message(session: Session, content: dict[str, Any]) -> Message:
    return Message(
        new_message_id(), session.id, new_turn_id(), "user",
        [TextBlock(json.dumps(content))], "complete", now_ms(),
    )  # fmt: skip


@asynccontextmanager
async def node_on(tmp_path: Path) -> AsyncIterator[Node]:
    """A node on an inline SQLite store (Trio's clock drives it all), ``commit_timeout_s`` 10."""
    config = make_config(tmp_path, **{"store.commit_timeout_s": 10})
    store = SqliteStore(str(tmp_path / "gateway.db"), inline=True)
    node = Node(config, store, ScriptedProvider(), build_registry(["sleep"]))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            try:
                yield node
            finally:
                node.stop()
    except BaseExceptionGroup as group:  # its close says what it could not make durable
        lost, rest = group.split(lambda e: "were not made durable" in str(e))
        if rest is not None or lost is None:
            raise


async def refused(call: Awaitable[Any]) -> tuple[str, float]:
    """The refusal's code, and how long (Trio's clock) it took to come."""
    started = trio.current_time()
    with pytest.raises(Refused) as info:
        await call
    return info.value.code, trio.current_time() - started


async def test_a_turn_in_flight_ends_and_every_write_is_503_at_once_once_the_file_is_gone(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A turn running a tool when the file goes; the next write finds it gone.

    The turn is cancelled (``reason: "store_unavailable"``) rather than left
    in flight until shutdown, its session's next turn is 503, not 409
    ``turn_in_progress``, and the write that found the file gone is answered
    503 at once, not after ``commit_timeout_s``.
    """
    async with node_on(tmp_path) as node:
        session = await node.create_session()
        turn = session.submit_turn(user_message(session, NAP))
        await session.accepted(turn)
        with trio.fail_after(5):
            while turn.phase != "tools":  # noqa: ASYNC110 (a phase, no event to wait on)
                await trio.sleep(0.01)
        remove_store(tmp_path / "gateway.db")
        # The first write since finds it gone: 503 at once (POST /sessions' put and wait).
        node.store.put_session(record("sess_new"))
        assert await refused(node.durable_or_503()) == ("store_unavailable", 0)
        [line] = replaced_lines(caplog)
        assert "deleted" in line.getMessage()
        with trio.fail_after(1):  # its tool stopped, its turn closed as a cancel
            await turn.done.wait()
        assert (turn.outcome, turn.cancel_reason) == ("cancelled", "store_unavailable")
        assert session.turn is None
        # What comes next is 503 at once: a turn, a compaction, a new session.
        code, took = await refused(
            node.submit_turn(session, user_message(session, TEXT_SCRIPT), "reject", None)
        )
        assert (code, took) == ("store_unavailable", 0)
        assert await refused(node.compact(session)) == ("store_unavailable", 0)
        code, _ = await refused(node.create_session())  # (its workspace: a thread, a clock jump)
        assert code == "store_unavailable"


async def test_a_turn_whose_start_finds_the_file_gone_ends_with_its_503(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The turn's own ``turn.started`` is the first write since: it never stays ``starting``."""
    async with node_on(tmp_path) as node:
        session = await node.create_session()
        remove_store(tmp_path / "gateway.db")
        turn = session.submit_turn(user_message(session, TEXT_SCRIPT))
        assert await refused(session.accepted(turn)) == ("store_unavailable", 0)
        with trio.fail_after(1):
            await turn.done.wait()
        assert (turn.outcome, turn.cancel_reason) == ("cancelled", "store_unavailable")
        assert session.turn is None
        code, _ = await refused(
            node.submit_turn(session, user_message(session, TEXT_SCRIPT), "reject", None)
        )
        assert code == "store_unavailable"  # not turn_in_progress


# --- the daemon: readiness on a full disk ------------------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_readyz_is_503_while_the_disk_is_full_then_200_and_store_reconnected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.store")
    config = make_config(tmp_path, **{"store.commit_timeout_s": 1.0})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            assert (await gw.http.get("/readyz")).status_code == 200
            store = gw.node.store
            assert isinstance(store, SqliteStore)
            await fill_the_disk(store)
            r = await gw.http.post("/sessions", json={"metadata": {"pad": "x" * 20_000}})
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "store_unavailable"
            assert "database or disk is full" in r.json()["error"]["message"]
            ready = await gw.http.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["error"]["code"] == "store_unavailable"
            assert int(ready.headers["retry-after"]) >= 1
            assert (await gw.http.get("/healthz")).status_code == 200  # alive, not ready

            await make_space(store)
            with trio.fail_after(15):  # the session refused with 503 was held, and lands
                await store.wait_committed(store.ticket())
            assert (await gw.http.get("/readyz")).json() == {"status": "ready"}
            assert (await gw.http.post("/sessions", json={})).status_code == 201
    back = [r for r in caplog.records if getattr(r, "event", None) == "store_reconnected"]
    assert len(back) == 1


# --- the daemon: files removed or replaced under load ---------------------------------


class Daemon:
    """``gateway serve --port 0`` in a directory, its log (JSON lines) read as it comes."""

    def __init__(self, proc: trio.Process, port: int) -> None:
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"
        self.log: list[dict[str, Any]] = []

    async def read_log(self) -> None:
        assert self.proc.stderr is not None
        buffer = b""
        while chunk := await self.proc.stderr.receive_some(65536):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    self.log.append(json.loads(line))
                except ValueError:
                    self.log.append({"event": "unparsed", "line": line.decode(errors="replace")})

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.log if line.get("event") == name]


@asynccontextmanager
async def daemon(cwd: Path) -> AsyncIterator[Daemon]:
    env = {
        "GATEWAY_LOG_FORMAT": "json",
        "GATEWAY_STORE_COMMIT_TIMEOUT_S": "2",  # a request caught in the change waits this
    }
    async with gateway_process(cwd, "--port", "0", env=env) as (proc, port):
        d = Daemon(proc, port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(d.read_log)
            yield d
            proc.kill()


async def last_id_seen(http: httpx.AsyncClient) -> str:
    """A session with a turn, watched by a client: the id of the last event it received."""
    sid = (await http.post("/sessions", json={})).json()["session_id"]
    url = (await http.get(f"/sessions/{sid}")).json()["ws_url"]
    async with open_ws(url) as ws:
        client = Client(ws, sid)
        await client.subscribe()
        turn = await http.post(f"/sessions/{sid}/turns", json={"content": TEXT})
        assert turn.status_code == 202
        events = await client.until_turn_ends()
    last: str = events[-1].id
    return last


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize("change", [remove_store, replace_store], ids=["rm", "mv"])
async def test_a_store_file_removed_or_replaced_under_load_stops_the_writes(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    path = tmp_path / "gateway.db"
    with trio.fail_after(90):
        async with daemon(tmp_path) as d, httpx.AsyncClient(base_url=d.base) as http:
            seen = await last_id_seen(http)
            changed = False
            after: list[int] = []  # statuses of the writes sent once the files were changed
            before: list[int] = []
            loaded = trio.Event()  # a few writes went through

            async def load() -> None:
                for _ in range(400):  # bounded
                    late = changed
                    r = await http.post("/sessions", json={})
                    (after if late else before).append(r.status_code)
                    if len(before) >= 20:
                        loaded.set()
                    if r.status_code == 201:
                        sid = r.json()["session_id"]
                        late = changed
                        turn = await http.post(f"/sessions/{sid}/turns", json={"content": TEXT})
                        (after if late else before).append(turn.status_code)
                    if len(after) >= 5:
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(load)
                await loaded.wait()  # under load
                change(path)
                changed = True
            assert set(before) <= {201, 202, 503}
            assert after and set(after) == {503}  # nothing more is taken
            r = await http.post("/sessions", json={})
            assert (r.status_code, r.json()["error"]["code"]) == (503, "store_unavailable")
            assert int(r.headers["retry-after"]) >= 1
            ready = await http.get("/readyz")
            assert (ready.status_code, ready.json()["error"]["code"]) == (503, "store_unavailable")
            [line] = d.events("store_file_replaced")
            assert line["level"] == "error" and line["path"] == "gateway.db"
            if change is remove_store:
                assert not await trio.Path(path).exists()  # not recreated
                assert not await trio.Path(f"{path}-wal").exists()

        # A restart opens what is there now (a new, empty store, or the copy):
        # its ids are above every id a client saw.
        async with daemon(tmp_path) as d, httpx.AsyncClient(base_url=d.base) as http:
            assert (await http.get("/readyz")).status_code == 200
            assert await last_id_seen(http) > seen
