"""Attach tokens: single-use, bound to one session, with a TTL (docs/protocol.md §2).

One interface, :class:`Tokens`, picked once at start-up: :class:`AttachTokens`
in this process for a node alone on its store, :class:`RedisAttachTokens` in
Redis where several nodes share it (a token issued by one node is redeemed by
whichever node the client's WebSocket reaches).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from gateway.errors import Refused, StoreError, unavailable
from gateway.ids import new_attach_token

if TYPE_CHECKING:
    import coredis

TOKEN_INVALID = "the attach token is unknown, used, or for another session"


def _missing() -> Refused:
    return Refused("attach_token_required", "the ?attach= token is missing")


def _invalid() -> Refused:
    return Refused("attach_token_invalid", TOKEN_INVALID)


def _expired() -> Refused:
    return Refused("attach_token_expired", "the attach token has expired")


class Tokens(Protocol):
    """Where this node's attach tokens are kept."""

    ttl_s: float

    async def issue_token(self, session_id: str) -> str:
        """A single-use token for the session, good for ``ttl_s``.

        Raises:
            Refused: ``store_unavailable`` (Redis did not answer).
        """
        ...

    async def redeem_token(self, token: str | None, session_id: str) -> None:
        """Use a token up.

        Raises:
            Refused: ``attach_token_required``, ``attach_token_invalid`` (unknown,
                used, or another session's), ``attach_token_expired``;
                ``store_unavailable``.
        """
        ...


class AttachTokens:
    """The tokens of a node alone on its store, kept in this process.

    A token is kept under its session and itself: a handshake on another
    session's path looks up another key and finds nothing, so it cannot use
    up the token of the session it was issued for (docs/protocol.md §15).
    Time is Trio's clock, so the TTL is testable with ``MockClock``.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._tokens: dict[tuple[str, str], float] = {}  # (session, token): expiry

    def issue(self, session_id: str) -> str:
        now = trio.current_time()
        # Tokens expire in the order they were issued (one TTL for all), which
        # is the dict's order: prune from the front, stop at the first live one.
        for key, expires in list(itertools.islice(self._tokens.items(), 64)):
            if expires + self.ttl_s > now:  # kept one more TTL, to say "expired"
                break
            del self._tokens[key]
        token = new_attach_token()
        self._tokens[session_id, token] = now + self.ttl_s
        return token

    def redeem(self, token: str | None, session_id: str) -> None:
        """Use a token up (:meth:`Tokens.redeem_token`).

        Only a handshake on the token's own session uses it up; on any other
        it is unknown there, and stays good for its own.
        """
        if not token:
            raise _missing()
        expires = self._tokens.pop((session_id, token), None)
        if expires is None:
            raise _invalid()
        if trio.current_time() >= expires:
            raise _expired()

    async def issue_token(self, session_id: str) -> str:
        return self.issue(session_id)

    async def redeem_token(self, token: str | None, session_id: str) -> None:
        self.redeem(token, session_id)


RedisCall = Callable[[Callable[["coredis.Redis[bytes]"], Awaitable[Any]]], Awaitable[Any]]
"""Runs a command on a Redis client (:meth:`gateway.cluster.link.Cluster.redis_call`)."""


class RedisAttachTokens:
    """The tokens of a deployment of several nodes, kept in Redis.

    Kept there for twice their TTL, so that a late one is told "expired", not
    "unknown"; a token's age is read from Redis's own clock (``PTTL``), so the
    nodes' clocks need not agree. The key holds the session id, so a
    handshake on another session's path reads another key: it cannot use the
    token up (docs/protocol.md §15; the same rule as :class:`AttachTokens`).
    """

    def __init__(self, redis_call: RedisCall, prefix: str, ttl_s: float) -> None:
        self._call = redis_call
        self._prefix = prefix
        self.ttl_s = ttl_s

    async def issue_token(self, session_id: str) -> str:
        token = new_attach_token()
        px = max(2, round(self.ttl_s * 2000))
        key = self._key(session_id, token)
        try:
            await self._call(lambda c: c.set(key, session_id, px=px))
        except StoreError as exc:
            raise unavailable(exc) from None
        return token

    async def redeem_token(self, token: str | None, session_id: str) -> None:
        """Use a token up (``GETDEL``: one redemption wins, on whichever node)."""
        if not token:
            raise _missing()
        key = self._key(session_id, token)

        async def redeem(c: coredis.Redis[bytes]) -> tuple[int, bytes | None]:
            async with c.pipeline(transaction=True) as pipe:
                left = pipe.pttl(key)
                owner = pipe.getdel(key)
            return await left, await owner

        try:
            left_ms, owner = await self._call(redeem)
        except StoreError as exc:
            raise unavailable(exc) from None
        if owner is None:
            raise _invalid()
        if left_ms < self.ttl_s * 1000:  # kept twice its TTL: more than one TTL has passed
            raise _expired()

    def _key(self, session_id: str, token: str) -> str:
        return f"{self._prefix}tok:{session_id}:{token}"


__all__ = ["TOKEN_INVALID", "AttachTokens", "RedisAttachTokens", "Tokens"]
