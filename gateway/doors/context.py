"""What the other front ends' doors share (docs/protocol.md §14): AG-UI and the AI SDK.

Each of them names its session itself (AG-UI's ``threadId``, the AI SDK's
chat ``id``): :class:`ClientNamedSessions` finds it, or creates it owned by
the caller's key, once however many requests race to. Their streams are
server-sent events that no proxy may buffer (:data:`SSE_HEADERS`), each fed
every event of its session (:func:`subscribe_full`: live, or replayed
through the seam from a turn's start), and what a stream holds is given
back exactly once (:func:`once`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from gateway.errors import ApiError, SubscribeRejected
from gateway.http.openapi import ID_PATTERN
from gateway.http.server import Request
from gateway.ids import format_event_id
from gateway.protocol.filters import resolve_filter
from gateway.protocol.frames import Subscribe
from gateway.protocol.shapes import Message
from gateway.session import seam
from gateway.session.session import Session
from gateway.tenancy import NO_OWNER, ApiKeys

if TYPE_CHECKING:
    from gateway.config import Config, StreamConfig
    from gateway.node import Node

SSE_HEADERS = [("cache-control", "no-cache"), ("x-accel-buffering", "no")]
"""A door's stream: never cached, never buffered by a proxy (nginx reads the second)."""

CLIENT_ID = re.compile(f"(?={ID_PATTERN}$).{{1,128}}")
"""A session id a client chooses: 1 to 128 of A-Z a-z 0-9 _ -."""


class DoorRouter(Protocol):
    """What a door uses of the router (:class:`gateway.server.routes.Api`).

    Named here rather than imported: the router imports the doors.
    """

    node: Node
    config: Config
    keys: ApiKeys

    def _authenticate(self, req: Request) -> str | None: ...

    async def _session(self, session_id: str, caller: str | None) -> Session: ...

    async def _counted_turn(self, key: str, session: Session, message: Message) -> None: ...


class ClientNamedSessions:
    """Sessions named by their client (module docstring).

    Args:
        api: the router (its node, and its ownership check).
        field: the request field that names the session, for the 422's message.
        code: the 422's code for a name that is no session id.
    """

    def __init__(self, api: DoorRouter, field: str, code: str) -> None:
        self.api = api
        self.field = field
        self.code = code

    def check(self, name: str) -> None:
        """422 ``code`` unless ``name`` can be a session id."""
        if not CLIENT_ID.fullmatch(name):
            raise ApiError(
                422,
                self.code,
                f"{self.field} must be 1 to 128 of A-Z a-z 0-9 _ -, got {name[:40]!r}",
            )

    async def get(self, name: str, caller: str | None) -> Session:
        """The session ``name``, created (owned by the caller's key) when unknown.

        Another key's is 404 ``session_not_found``, as anywhere. Whichever doors ask
        for one name at once, one session is made, owned by one key
        (:meth:`gateway.node.registry.Registry.create_named`).
        """
        self.check(name)
        made = await self.api.node.registry.create_named(name, caller or NO_OWNER)
        if made is not None:
            return made
        return await self.api._session(name, caller)


def once(release: Callable[[], None]) -> Callable[[], None]:
    """``release``, called at most once however often the result is."""
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            release()

    return call


Send = Callable[[bytes], Awaitable[None]]
"""A stream's writer: one piece of the body."""


async def subscribe_full(
    session: Session, sub: seam.SeamSubscriber, config: StreamConfig, since: int | None = None
) -> SubscribeRejected | None:
    """Join ``session``'s hub with every event (``preset:full``): live, or, ``since`` an
    event id, replayed from after it through the seam, then live (no gap, no duplicate:
    docs/protocol.md §3). The seam's refusal of the replay (None: joined)."""
    resolved, key = resolve_filter("preset:full")
    cursor = None if since is None else format_event_id(since)
    done = await seam.subscribe(
        session, sub, Subscribe("preset:full", since=cursor), resolved, key, config
    )
    return done.error
