"""The Redis store's key names, under the deployment's prefix (``gw:`` by default).

The layout itself, what each key holds, is gateway.store.redis.store's docstring.
"""

from __future__ import annotations

from gateway.store.base import SessionRecord
from gateway.store.outbox import Lane


def index_member(rec: SessionRecord) -> str:
    """A session's member in the lex-ordered indexes: ``created_at`` order, then id."""
    return f"{rec.created_at:016d}:{rec.id}"


def sid_of(member: bytes) -> str:
    return member.decode().split(":", 1)[1]


class Keys:
    """Every key name of the layout (gateway.store.redis.store's docstring), under one prefix."""

    def __init__(self, prefix: str) -> None:
        p = prefix
        self.version = f"{p}version"
        self.meta = f"{p}meta"
        self.sessions = f"{p}sessions"
        self.owners = f"{p}owners"
        self.open = f"{p}open"
        self.ets = f"{p}ets"
        self.lanes = f"{p}oblanes"  # the webhook outbox's lanes with a delivery pending
        self.file_bytes = f"{p}fbytes"  # owner -> its files' bytes (gateway.store.redis.files)
        self._p = p

    def session(self, sid: str) -> str:
        return f"{self._p}s:{{{sid}}}"

    def owner(self, owner: str) -> str:
        return f"{self._p}owner:{owner}"

    def roots(self, owner: str) -> str:
        return f"{self._p}roots:{owner}"

    def workers(self, parent: str) -> str:
        return f"{self._p}workers:{parent}"

    def messages(self, sid: str) -> str:
        return f"{self._p}m:{{{sid}}}"

    def message_order(self, sid: str) -> str:
        return f"{self._p}mo:{{{sid}}}"

    def events(self, sid: str) -> str:
        return f"{self._p}e:{{{sid}}}"

    def file_meta(self, sid: str) -> str:
        return f"{self._p}fm:{{{sid}}}"

    def files(self, sid: str) -> str:
        return f"{self._p}f:{{{sid}}}"

    def lease(self, sid: str) -> str:
        return f"{self._p}lease:{{{sid}}}"

    # The webhook outbox's (gateway.store.redis.outbox): a lane's deliveries, and the
    # claim of the node delivering it. A webhook's name has no ``:`` (gateway.config).

    def lane(self, lane: Lane) -> str:
        return f"{self._p}ob:{lane[0]}:{{{lane[1]}}}"

    def lane_claim(self, lane: Lane) -> str:
        return f"{self._p}obclaim:{lane[0]}:{{{lane[1]}}}"


# --- the store's keys the per-key limits read (gateway.node.limits) ----------------


def record_and_owner_keys(prefix: str) -> tuple[tuple[str, str], str]:
    """A session record's key as ``(before, after)`` its id; an owner index's key before the owner.

    ``max_sessions_per_key`` on Redis counts an owner's index and checks that
    the records of the sessions being created have landed.
    """
    keys = Keys(prefix)
    before, _, after = keys.session("\0").partition("\0")
    return (before, after), keys.owner("")
