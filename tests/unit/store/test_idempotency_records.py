"""The idempotency records' state machine (gateway.store.idempotency), sans-IO, and its SQL.

Every transition of :func:`decide` and :func:`settle`, at the edges of their
times (the hold, the 24 h), and the same rules through the SQLite functions
on a real (temporary) database, pruning included.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.store.idempotency import RECORD_TTL_MS, Claim, RequestRecord, decide, settle
from gateway.store.redis.requests import claimed as redis_claimed
from gateway.store.sqlite.requests import SCHEMA as SQLITE_SCHEMA
from gateway.store.sqlite.requests import claim_request as sqlite_claim
from gateway.store.sqlite.requests import settle_request as sqlite_settle

T0 = 1_700_000_000_000
CLAIM = Claim("fp", "sess_1", "h1", 1000)


def test_a_new_key_is_claimed_for_its_hold() -> None:
    claimed, write = decide(None, CLAIM, T0)
    assert claimed.outcome == "new" and write == claimed.record
    assert write == RequestRecord("fp", "sess_1", "h1", T0, T0 + 1000)


def test_a_key_in_progress_is_in_use_until_its_hold_ends_then_taken_with_its_target() -> None:
    _, held = decide(None, CLAIM, T0)
    assert held is not None
    retry = Claim("fp", "sess_2", "h2", 1000)
    claimed, write = decide(held, retry, T0 + 999)
    assert (claimed.outcome, write) == ("in_use", None)
    claimed, write = decide(held, retry, T0 + 1000)
    assert claimed.outcome == "taken"
    assert write == RequestRecord("fp", "sess_1", "h2", T0, T0 + 2000)  # target kept


def test_another_request_under_the_key_is_reused_whatever_its_state() -> None:
    _, held = decide(None, CLAIM, T0)
    assert held is not None
    other = Claim("other", "sess_2", "h2", 1000)
    assert decide(held, other, T0 + 1)[0].outcome == "reused"
    done = settle(held, "h1", 201, b"{}")
    assert done is not None
    assert decide(done, other, T0 + 1)[0].outcome == "reused"
    assert decide(done, other, T0 + 1)[1] is None


def test_an_answered_key_answers_until_24_hours_then_is_new() -> None:
    _, held = decide(None, CLAIM, T0)
    assert held is not None
    done = settle(held, "h1", 202, b'{"turn_id":"t"}')
    assert done is not None and (done.status, done.until) == (202, 0)
    claimed, write = decide(done, Claim("fp", "x", "h2", 1000), T0 + RECORD_TTL_MS - 1)
    assert (claimed.outcome, claimed.record.body, write) == ("answered", b'{"turn_id":"t"}', None)
    claimed, write = decide(done, Claim("other", "x", "h2", 1000), T0 + RECORD_TTL_MS)
    assert claimed.outcome == "new" and write is not None and write.target == "x"


def test_letting_go_keeps_the_target_and_frees_the_key_at_once() -> None:
    _, held = decide(None, CLAIM, T0)
    assert held is not None
    free = settle(held, "h1", None, b"")
    assert free is not None and (free.until, free.status, free.target) == (0, 0, "sess_1")
    claimed, _ = decide(free, Claim("fp", "sess_9", "h2", 1000), T0 + 1)
    assert (claimed.outcome, claimed.record.target) == ("taken", "sess_1")


def test_only_the_holder_settles_and_only_once() -> None:
    _, held = decide(None, CLAIM, T0)
    assert held is not None
    assert settle(held, "someone-else", 201, b"{}") is None
    assert settle(None, "h1", 201, b"{}") is None
    done = settle(held, "h1", 201, b"{}")
    assert done is not None
    assert settle(done, "h1", None, b"") is None  # an answer is never let go
    assert settle(done, "h1", 201, b"other") is None


def test_a_holder_of_a_process_that_is_gone_holds_nothing() -> None:
    _, held = decide(None, Claim("fp", "sess_1", "old/h1", 60_000), T0)
    assert held is not None
    retry = Claim("fp", "sess_2", "new/h2", 1000)
    assert decide(held, retry, T0 + 1)[0].outcome == "in_use"  # a store of several nodes
    assert decide(held, retry, T0 + 1, alive="new/")[0].outcome == "taken"
    assert decide(held, retry, T0 + 1, alive="old/")[0].outcome == "in_use"


def test_the_redis_answer_reads_as_a_record() -> None:
    answer: list[bytes | str] = [b"taken", b"fp", b"sess_1", b"h2", b"5", b"10", b"0", b""]
    claimed = redis_claimed(answer)
    assert claimed.outcome == "taken"
    assert claimed.record == RequestRecord("fp", "sess_1", "h2", 5, 10, 0, b"")


@pytest.fixture
def db(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "requests.db", isolation_level=None)
    for statement in SQLITE_SCHEMA:
        conn.execute(statement)
    return conn


def test_sqlite_claims_settles_and_scopes_by_owner(db: sqlite3.Connection) -> None:
    mine = sqlite_claim(db, "a", "k", CLAIM, T0, "p1")
    assert (mine.outcome, mine.record.holder) == ("new", "p1/h1")
    assert sqlite_claim(db, "b", "k", CLAIM, T0, "p1").outcome == "new"  # another owner's
    assert sqlite_claim(db, "a", "k", CLAIM, T0 + 1, "p1").outcome == "in_use"
    sqlite_settle(db, "a", "k", "h1", 201, b"not the holder")
    sqlite_settle(db, "a", "k", "p1/h1", 201, b'{"session_id":"sess_1"}')
    claimed = sqlite_claim(db, "a", "k", CLAIM, T0 + 2, "p1")
    assert (claimed.outcome, claimed.record.body) == ("answered", b'{"session_id":"sess_1"}')
    assert sqlite_claim(db, "b", "k", CLAIM, T0 + 2, "p1").outcome == "in_use"


def test_sqlite_frees_at_once_what_a_previous_process_held(db: sqlite3.Connection) -> None:
    sqlite_claim(db, "a", "k", CLAIM, T0, "before-restart")
    claimed = sqlite_claim(db, "a", "k", Claim("fp", "sess_2", "h2", 1000), T0 + 1, "after")
    assert (claimed.outcome, claimed.record.target, claimed.record.holder) == (
        "taken",
        "sess_1",
        "after/h2",
    )


def test_sqlite_prunes_what_is_older_than_24_hours(db: sqlite3.Connection) -> None:
    sqlite_claim(db, "a", "old", CLAIM, T0, "p")
    sqlite_claim(db, "a", "young", CLAIM, T0 + 10, "p")
    sqlite_claim(db, "a", "other", CLAIM, T0 + RECORD_TTL_MS, "p")
    keys = {k for (k,) in db.execute("SELECT key FROM requests")}
    assert keys == {"young", "other"}
