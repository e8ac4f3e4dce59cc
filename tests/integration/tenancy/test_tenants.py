"""Tenants: a session belongs to the key that created it (docs/protocol.md §2).

"Where API keys are configured ... a session belongs to the key that created
it: to any other key it does not exist (404 on every route of it, absent from
``GET /sessions``)." Checked here with two keys, A and B, over real sockets:
every route of A's session answers B exactly as an unknown id does, B's list
never shows A's sessions (paging included), a worker belongs to its parent's
key, an attach token opens only its own session, sessions made without keys
are everyone's, and the store keeps a digest of the key, never the key. Also
the keys file (``[auth] api_keys_file``), its re-reading on SIGHUP, and the
store's schema version 3 (the owner column) upgraded in place from version 2.

Test rules: a real gateway on 127.0.0.1 port 0 with independent clients, on
the real clock under ``fail_after``; whatever a test waits for, it waits for
the event that says it happened (a stream event, a log line of the daemon).
"""

from __future__ import annotations

import json
import logging
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.config import AuthConfig
from gateway.errors import StartupError
from gateway.protocol.shapes import Message, TextBlock
from gateway.store import SessionRecord, SqliteStore, StoredMessage
from gateway.tenancy import ApiKeys, KeysFileError, key_id, parse_keys, sees
from tests.conftest import Harness, make_config, running_gateway
from tests.integration.doors.rest.test_http_api import accepted, assert_error, rejected
from tests.system.cli.test_cli_serve import gateway_process

KEYS = {"auth.api_keys": ["key-a", "key-b"]}
UNKNOWN = "sess_00000000000000000000"
ASK_FIRST = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}]]}}
"""A turn whose ``sleep`` waits for permission (``require_approval = ["sleep"]``)."""


@asynccontextmanager
async def tenants(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[Harness, Harness]]:
    """A gateway with keys ``key-a`` and ``key-b``; a harness speaking with each key."""
    with trio.fail_after(30):
        async with (
            running_gateway(make_config(tmp_path, **(KEYS | overrides))) as gw,
            httpx.AsyncClient(base_url=gw.base, headers=bearer("key-a")) as http_a,
            httpx.AsyncClient(base_url=gw.base, headers=bearer("key-b")) as http_b,
        ):
            yield Harness(gw.gateway, http_a), Harness(gw.gateway, http_b)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def listed(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [s["session"]["id"] for s in r.json()["sessions"]]


# --- every route of a session ------------------------------------------------------


async def test_every_route_of_a_session_is_404_to_another_key(tmp_path: Path) -> None:
    async with tenants(tmp_path, **{"tools.require_approval": ["sleep"]}) as (a, b):
        sid = await a.create_session()
        async with a.client(sid) as watcher:
            await watcher.subscribe()
            turn_id = await a.submit(sid, ASK_FIRST)
            asked = (await watcher.until(lambda e: e.type == "permission.requested"))[-1]
            perm_id = asked.payload.perm_id
            user_message = (await a.http.get(f"/sessions/{sid}/messages")).json()["messages"][0]

            routes: list[tuple[str, str, Any]] = [
                ("GET", "/sessions/{}", None),
                ("HEAD", "/sessions/{}", None),
                ("GET", "/sessions/{}/messages", None),
                ("GET", f"/sessions/{{}}/messages?before={user_message['id']}", None),
                ("POST", "/sessions/{}/turns", {"content": "hello"}),
                ("POST", f"/sessions/{{}}/turns/{turn_id}/cancel", {"reason": "mine now"}),
                ("POST", f"/sessions/{{}}/permissions/{perm_id}", {"decision": "allow"}),
                ("POST", "/sessions/{}/feedback", {"message_id": user_message["id"], "rating": 1}),
            ]
            for method, path, body in routes:
                theirs = await b.http.request(method, path.format(sid), json=body)
                unknown = await b.http.request(method, path.format(UNKNOWN), json=body)
                assert theirs.status_code == unknown.status_code == 404, (path, theirs.text)
                if method != "HEAD":
                    assert_error(theirs, 404, "session_not_found")
                    # the same answer as for an id that does not exist: no oracle
                    assert theirs.text.replace(sid, UNKNOWN) == unknown.text, path

            # nothing B sent reached the session: the permission still waits for A
            r = await a.http.post(
                f"/sessions/{sid}/permissions/{perm_id}", json={"decision": "deny"}
            )
            assert r.status_code == 202, r.text
            events = await watcher.until_turn_ends()
            assert events[-1].type == "turn.completed"
            seen = [e.type for e in watcher.events]
            assert "feedback.recorded" not in seen and "turn.cancelled" not in seen
            resolved = [e for e in watcher.events if e.type == "permission.resolved"]
            assert [e.payload.decision for e in resolved] == ["deny"]
        session = (await a.http.get("/sessions")).json()["sessions"][0]["session"]
        assert session["turn_count"] == 1  # B's turn was never submitted


async def test_the_stream_of_a_session_is_404_to_another_keys_bearer(tmp_path: Path) -> None:
    async with tenants(tmp_path) as (a, b):
        sid = await a.create_session()
        url = await a.ws_url(sid)
        # B cannot get a token: GET /sessions/{id} is 404 for it
        assert_error(await b.http.get(f"/sessions/{sid}"), 404, "session_not_found")
        # a client that sends its key on the handshake is held to it
        as_b = [(b"Authorization", b"Bearer key-b")]
        assert await rejected(url, extra_headers=as_b) == (404, "session_not_found")
        wrong = [(b"Authorization", b"Bearer key-c")]
        assert await rejected(url, extra_headers=wrong) == (403, "forbidden")
        # neither refusal used the token up: A opens its stream, with or without its key
        await accepted(url, sid, extra_headers=[(b"Authorization", b"Bearer key-a")])
        await accepted(await a.ws_url(sid), sid)
        # a scheme that is not Bearer (a proxy's Basic auth) is no key: the token decides
        basic = [(b"Authorization", b"Basic dXNlcjpwYXNz")]
        await accepted(await a.ws_url(sid), sid, extra_headers=basic)


async def test_another_keys_stored_session_is_not_even_loaded(tmp_path: Path) -> None:
    async with tenants(tmp_path) as (a, _b):
        sid = await a.create_session()
    async with tenants(tmp_path) as (a, b):  # a restart: the session is only in the store
        for path in (f"/sessions/{sid}", f"/sessions/{sid}/messages"):
            assert_error(await b.http.get(path), 404, "session_not_found")
        assert sid not in b.node.sessions  # B's requests did not bring it into memory
        assert (await a.http.get(f"/sessions/{sid}")).status_code == 200
        assert sid in a.node.sessions


async def test_a_token_of_one_session_cannot_open_another(tmp_path: Path) -> None:
    async with tenants(tmp_path) as (a, b):
        mine, theirs = await a.create_session(), await b.create_session()
        token = (await a.http.get(f"/sessions/{mine}")).json()["attach_token"]
        their_url = (await b.ws_url(theirs)).split("?")[0]
        assert await rejected(f"{their_url}?attach={token}") == (403, "attach_token_invalid")
        another = (await a.http.get(f"/sessions/{mine}")).json()["attach_token"]
        url = f"{their_url}?attach={another}"
        assert await rejected(url, extra_headers=[(b"Authorization", b"Bearer key-a")]) == (
            404,
            "session_not_found",
        )


# --- GET /sessions -------------------------------------------------------------------


async def test_the_list_shows_only_the_callers_sessions_and_pages_through_them(
    tmp_path: Path,
) -> None:
    async with tenants(tmp_path) as (a, b):
        made: dict[str, list[str]] = {"a": [], "b": []}
        for who in "ababa":  # interleaved: a page cut before filtering would come up short
            made[who].append(await (a if who == "a" else b).create_session())
        assert listed(await a.http.get("/sessions")) == made["a"][::-1]
        assert listed(await b.http.get("/sessions")) == made["b"][::-1]

        pages, flags, before = [], [], None
        while True:
            params: dict[str, Any] = {"limit": 1} | ({"before": before} if before else {})
            r = await a.http.get("/sessions", params=params)
            pages += listed(r)
            flags.append(r.json()["has_more"])
            if not r.json()["has_more"]:
                break
            before = pages[-1]
        assert pages == made["a"][::-1]
        assert flags == [True, True, False]  # B's older sessions are no "more" for A

        # another key's session is no cursor either, with the body of an unknown one
        r = await b.http.get("/sessions", params={"before": made["a"][0]})
        unknown = await b.http.get("/sessions", params={"before": UNKNOWN})
        assert_error(r, 404, "session_not_found")
        assert r.text.replace(made["a"][0], UNKNOWN) == unknown.text


async def test_a_worker_belongs_to_its_parents_key(tmp_path: Path) -> None:
    task = "look it up"
    script = {"script": {"rounds": [[{"tool_use": {"name": "delegate", "input": {"task": task}}}]]}}
    async with tenants(tmp_path) as (a, b):
        sid = await a.create_session()
        async with a.client(sid) as watcher:
            await watcher.subscribe()
            await a.submit(sid, script)
            started = (await watcher.until(lambda e: e.type == "delegate.started"))[-1]
            await watcher.until_turn_ends()
        worker = started.payload.worker_session_id
        assert set(listed(await a.http.get("/sessions"))) == {sid, worker}
        assert listed(await b.http.get("/sessions")) == []
        assert_error(await b.http.get(f"/sessions/{worker}"), 404, "session_not_found")
        assert (await a.http.get(f"/sessions/{worker}/messages")).status_code == 200
        record = await a.node.store.get_session(worker)
        assert record is not None and record.owner == key_id("key-a")


async def test_sessions_made_without_keys_are_everyones(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as open_gw:
            ownerless = await open_gw.create_session()
    async with tenants(tmp_path) as (a, b):
        mine = await a.create_session()
        assert listed(await a.http.get("/sessions")) == [mine, ownerless]
        assert listed(await b.http.get("/sessions")) == [ownerless]
        assert listed(await a.http.get("/sessions", params={"before": mine})) == [ownerless]
        r = await b.http.get("/sessions", params={"before": mine})
        assert_error(r, 404, "session_not_found")
        for tenant in (a, b):  # each key uses it as its own
            async with tenant.client(ownerless) as watcher:
                await watcher.subscribe()
                await tenant.submit(ownerless, "hello")
                assert (await watcher.until_turn_ends())[-1].type == "turn.completed"
    # and without keys again, every session is everyone's (no auth: loopback use)
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as open_gw:
            assert listed(await open_gw.http.get("/sessions")) == [mine, ownerless]
            assert (await open_gw.http.get(f"/sessions/{mine}")).status_code == 200


def test_who_sees_what() -> None:
    assert sees(None, "") and sees(None, "abc")  # no keys configured
    assert sees("abc", "") and sees("abc", "abc")
    assert not sees("abc", "abd")


async def test_the_store_keeps_a_digest_of_the_key_never_the_key(tmp_path: Path) -> None:
    secret = "sk-live-0123456789abcdef"
    config = make_config(tmp_path, **{"auth.api_keys": [secret]})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            r = await gw.http.post("/sessions", json={}, headers=bearer(secret))
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            await gw.node.store.flush()
    db = sqlite3.connect(tmp_path / "gateway.db")
    try:
        owners = db.execute("SELECT owner FROM sessions WHERE id = ?", (sid,)).fetchall()
    finally:
        db.close()
    assert owners == [(key_id(secret),)]
    assert len(key_id(secret)) == 16 and key_id(secret) != key_id(secret + "x")
    for path in await trio.Path(tmp_path).glob("gateway.db*"):
        assert secret.encode() not in await path.read_bytes()


# --- the keys file ---------------------------------------------------------------------


def test_the_keys_file_format() -> None:
    text = "# the keys\n\n  key-one  \n\tkey-two\n   # an indented comment\nkey#3\n"
    assert parse_keys(text, "keys.txt") == ("key-one", "key-two", "key#3")
    assert parse_keys("", "keys.txt") == ()
    for bad, line in [("ok\nhas space\n", 2), ("caf\u00e9\n", 1), ("a\x00b\n", 1)]:
        with pytest.raises(KeysFileError) as info:
            parse_keys(bad, "keys.txt")
        assert f"'keys.txt' line {line}:" in str(info.value)
        assert "space" not in str(info.value).split(":")[0]  # the line itself is never quoted


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_missing_or_bad_keys_file_is_a_startup_failure(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(StartupError, match=r"cannot read api_keys_file '.*nope\.txt': No such"):
        ApiKeys(AuthConfig(api_keys_file=missing))
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9\n")
    with pytest.raises(StartupError, match="not UTF-8"):
        ApiKeys(AuthConfig(api_keys_file=str(latin)))

    config = tmp_path / "gw.toml"
    config.write_text(f'[auth]\napi_keys_file = "{missing}"\n')
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
            cwd=tmp_path,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 1
    assert done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "cannot read api_keys_file" in lines[0], done.stderr


async def test_keys_from_the_file_and_the_config_both_work(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# ops\nfrom-file\n")
    overrides = {"auth.api_keys": ["from-config"], "auth.api_keys_file": str(keys)}
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as gw:
            for key in ("from-file", "from-config"):
                r = await gw.http.post("/sessions", json={}, headers=bearer(key))
                assert r.status_code == 201, r.text
            r = await gw.http.post("/sessions", json={}, headers=bearer("ops"))
            assert_error(r, 403, "forbidden")


async def test_an_empty_keys_file_refuses_everyone_rather_than_opening_up(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# every key was revoked\n")
    with trio.fail_after(30):
        async with running_gateway(
            make_config(tmp_path, **{"auth.api_keys_file": str(keys)})
        ) as gw:
            assert_error(await gw.http.post("/sessions", json={}), 401, "unauthorized")
            r = await gw.http.get("/sessions", headers=bearer("anything"))
            assert_error(r, 403, "forbidden")
            assert (await gw.http.get("/healthz")).status_code == 200


async def test_reload_takes_the_new_keys_and_keeps_the_old_on_a_bad_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.txt"
    path.write_text("old-key\n")
    keys = ApiKeys(AuthConfig(api_keys=("config-key",), api_keys_file=str(path)))
    assert keys.identify("old-key") == key_id("old-key") and len(keys) == 2

    path.write_text("new-key\n# old-key was revoked\n")
    assert await keys.reload()
    assert keys.identify("new-key") == key_id("new-key")
    assert keys.identify("old-key") is None
    assert keys.identify("config-key") == key_id("config-key")  # the config's keys stay

    for broken in ("new-key\nhalf written\n", None):
        if broken is None:
            path.unlink()
        else:
            path.write_text(broken)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gateway.auth"):
            assert not await keys.reload()
        assert keys.identify("new-key") == key_id("new-key") and len(keys) == 2
        [record] = caplog.records
        assert record.levelno == logging.ERROR and "keeping the 2 keys" in record.getMessage()

    no_file = ApiKeys(AuthConfig(api_keys=("k",)))
    assert not await no_file.reload() and no_file.identify("k") == key_id("k")


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_sighup_rereads_the_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("first\n")
    config = tmp_path / "gw.toml"
    config.write_text(f'[auth]\napi_keys_file = "{keys}"\n')
    async with gateway_process(tmp_path, "--config", str(config), "--port", "0") as (proc, port):
        assert proc.stderr is not None
        log = LogLines(proc.stderr)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            sid = (await http.post("/sessions", json={}, headers=bearer("first"))).json()[
                "session_id"
            ]
            assert_error(await http.get("/sessions", headers=bearer("second")), 403, "forbidden")

            keys.write_text("first\nsecond\n")
            proc.send_signal(signal.SIGHUP)
            with trio.fail_after(10):
                line = await log.until("re-read api_keys_file")
            assert "2 keys from it" in line
            assert listed(await http.get("/sessions", headers=bearer("second"))) == []
            assert listed(await http.get("/sessions", headers=bearer("first"))) == [sid]

            keys.unlink()  # unreadable now: the keys stay as they were
            proc.send_signal(signal.SIGHUP)
            with trio.fail_after(10):
                line = await log.until("cannot read api_keys_file")
            assert "keeping the 2 keys" in line
            assert listed(await http.get("/sessions", headers=bearer("second"))) == []
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            assert await proc.wait() == 0


class LogLines:
    """The daemon's stderr, read a line at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def until(self, text: str) -> str:
        """Read lines until one contains ``text``; that line."""
        while True:
            while b"\n" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if text in line:
                    return line
            chunk = await self.stream.receive_some(65536)
            assert chunk, f"the gateway's stderr ended before a line with {text!r}"
            self.buffer += chunk


# --- the store: schema version 3 ------------------------------------------------------


def make_version_2_store(path: str) -> None:
    """A store as the previous release wrote it: schema version 2, no owner column."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', 2)")
        conn.execute("INSERT INTO meta VALUES ('event_ceiling', 1000000)")
        conn.execute(
            """CREATE TABLE sessions (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL,
            workspace_path TEXT NOT NULL, active_model TEXT NOT NULL, metadata BLOB NOT NULL,
            parent_session_id TEXT, routing_policy_version TEXT NOT NULL,
            cost_so_far_usd REAL NOT NULL, turn_count INTEGER NOT NULL,
            current_turn_id TEXT, current_turn_seq INTEGER NOT NULL DEFAULT 0)"""
        )
        conn.execute("CREATE INDEX sessions_by_age ON sessions (created_at, id)")
        conn.execute(
            "CREATE INDEX sessions_by_parent ON sessions (parent_session_id)"
            " WHERE parent_session_id IS NOT NULL"
        )
        conn.execute(
            "CREATE INDEX sessions_in_flight ON sessions (id) WHERE current_turn_id IS NOT NULL"
        )
        conn.execute(
            """CREATE TABLE messages (ord INTEGER PRIMARY KEY, session_id TEXT NOT NULL,
            id TEXT NOT NULL, data BLOB NOT NULL, complete_event_id TEXT, stop_reason TEXT,
            complete_ts INTEGER, UNIQUE (session_id, id))"""
        )
        conn.execute(
            """CREATE TABLE events (seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL,
            type TEXT NOT NULL, ts INTEGER NOT NULL, data BLOB NOT NULL)"""
        )
        sessions = [
            ("sess_old", 1, None, 2, None, 0),
            ("sess_busy", 2, None, 1, "turn_b", 7),
            ("sess_worker", 3, "sess_old", 1, None, 0),
        ]
        for sid, created, parent, turns, turn_id, seq in sessions:
            conn.execute(
                "INSERT INTO sessions VALUES (?, ?, '/w', 'scripted:echo', ?, ?, 'static-1',"
                " 0.25, ?, ?, ?)",
                (sid, created, b'{"team":"ops"}', parent, turns, turn_id, seq),
            )
        message = {
            "id": "msg_1",
            "session_id": "sess_old",
            "turn_id": "turn_a",
            "role": "user",
            "content": [{"type": "text", "text": "hi"}],
            "status": "complete",
            "created_at": 5,
        }
        conn.execute(
            "INSERT INTO messages (session_id, id, data) VALUES ('sess_old', 'msg_1', ?)",
            (json.dumps(message).encode(),),
        )
        conn.execute(
            "INSERT INTO events VALUES (7, 'sess_busy', 'turn.started', 9, ?)",
            (b'{"type":"turn.started","turn_id":"turn_b"}',),
        )
    conn.close()


async def test_a_version_2_store_is_upgraded_in_place_and_keeps_everything(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "gateway.db")
    make_version_2_store(path)
    store = SqliteStore(path)
    state = await store.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        assert state.event_ceiling == 1_000_000
        old = await store.get_session("sess_old")
        assert old is not None
        assert (old.owner, old.metadata, old.turn_count, old.cost_so_far_usd) == (
            "",
            {"team": "ops"},
            2,
            0.25,
        )
        assert [
            (r.id, r.current_turn_id, r.current_turn_seq) for r in await store.open_turns()
        ] == [("sess_busy", "turn_b", 7)]
        assert await store.worker_ids("sess_old") == ["sess_worker"]
        [stored] = await store.load_messages("sess_old")
        assert stored.message.content == [TextBlock("hi")]
        assert [e.seq for e in await store.events_after(["sess_busy"], 0, 10)] == [7]
        # every version-2 session is ownerless: every key sees them
        page, more = await store.list_sessions(limit=10, before=None, visible_to=key_id("k"))
        assert [r.id for r in page] == ["sess_worker", "sess_busy", "sess_old"] and not more
        assert await store.sessions_per_owner() == {"": 3}  # the worker is counted

        # the new column is written and read back
        mine = SessionRecord("sess_new", 4, "/w", "scripted:echo", {}, None, "s", owner="abc")
        store.put_session(mine)
        reply = Message("msg_2", "sess_new", "t", "user", [TextBlock("yo")], "complete", 6)
        store.put_message(StoredMessage(reply, None))
        await store.flush()
        assert await store.get_session("sess_new") == mine
        await store.aclose()
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (6,)
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "sessions_by_owner" in names
    finally:
        db.close()
    again = SqliteStore(path)  # a version-3 store opens as it is
    await again.open()
    assert (await again.get_session("sess_new")) == mine
    assert [m.message for m in await again.load_messages("sess_new")] == [reply]
    await again.aclose()


async def test_the_list_filters_before_the_page_is_cut(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "gateway.db"))
    await store.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        owners = ["a", "b", "b", "", "b", "a", "b"]
        for i, owner in enumerate(owners):
            rec = SessionRecord(f"sess_{i}", i, "/w", "m", {}, None, "s", owner=owner)
            store.put_session(rec)
        store.put_session(SessionRecord("sess_w", 9, "/w", "m", {}, "sess_0", "s", owner="a"))
        await store.flush()
        seen: list[str] = []
        before = None
        while True:
            page, more = await store.list_sessions(limit=2, before=before, visible_to="a")
            seen += [r.id for r in page]
            if not more:
                break
            before = seen[-1]
        assert seen == ["sess_w", "sess_5", "sess_3", "sess_0"]
        everyone, _ = await store.list_sessions(limit=20, before=None)
        assert len(everyone) == 8
        assert await store.sessions_per_owner() == {"a": 3, "b": 4, "": 1}  # sess_w counts
        await store.aclose()
