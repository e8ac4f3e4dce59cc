"""What a door may ask of the gateway: :class:`DoorContext`, and what the doors share.

A door (gateway.doors: the REST routes, the native stream over a WebSocket or
server-sent events, AG-UI, the AI SDK) is a way for a client onto the same
sessions. Each is a class ``Door`` built from one :class:`DoorContext` and
listing its routes (:class:`Door`); gateway.app registers them, in order. A
door asks the gateway only through the context:

- :meth:`DoorContext.authenticate`: who the caller is (its key's id), or a
  401/403;
- :meth:`DoorContext.session`: a session as that caller may see it (another
  key's is 404 exactly as an unknown id, docs/protocol.md §2);
- :meth:`DoorContext.counted_turn`: a turn, counted against the key's rate
  limit, answered once durable;
- :meth:`DoorContext.decide_answered`: an approval its client answered, a stale
  answer ignored;
- :meth:`DoorContext.file_refusal`: what the session's model cannot take of
  a turn's files (422 ``unsupported_content`` when the turn is posted);
- :meth:`DoorContext.subscribe`: join a session's stream with every event,
  live or replayed from an event through the seam;
- and the node itself (:attr:`DoorContext.node`: its turns, cancels,
  permissions, messages, limits, attach tokens), the configuration and the keys.

What the doors share besides: sessions a client names itself (AG-UI's
``threadId``, the AI SDK's chat ``id``: :class:`ClientNamedSessions` finds
one, or creates it owned by the caller's key, once however many requests
race to); streams that no proxy may buffer (:data:`SSE_HEADERS`); what a
stream holds given back exactly once (:func:`once`); the path of a session
and the attach token's query parameter, as the API document names them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gateway.cluster import ops
from gateway.errors import ApiError, Refused, SubscribeRejected
from gateway.http.boundary import authenticate
from gateway.http.openapi import ID_PATTERN, Documented, Query
from gateway.http.parsing import int_query
from gateway.http.router import Route
from gateway.http.server import Request
from gateway.ids import format_event_id
from gateway.protocol.filters import resolve_filter
from gateway.protocol.frames import MAX_COALESCE_MS, Subscribe
from gateway.protocol.http import IfBusy
from gateway.protocol.shapes import Message
from gateway.providers.attachments import refusal
from gateway.session import seam
from gateway.session.files import Refuse
from gateway.session.session import Session
from gateway.tenancy import NO_OWNER, ApiKeys, sees

if TYPE_CHECKING:
    from gateway.config import Config
    from gateway.node import Node

SSE_HEADERS = [("cache-control", "no-cache"), ("x-accel-buffering", "no")]
"""A door's stream: never cached, never buffered by a proxy (nginx reads the second)."""

CLIENT_ID = re.compile(f"(?={ID_PATTERN}$).{{1,128}}")
"""A session id a client chooses: 1 to 128 of A-Z a-z 0-9 _ -."""

SESSION = "/sessions/{session_id}"
"""A session's path, under which the native doors' routes are."""

ATTACH = Query(
    "attach",
    {"type": "string"},
    "The single-use attach token of `GET /sessions/{session_id}`.",
    required=True,
)
"""The native stream's credential, on the WebSocket's handshake and the SSE stream alike."""

COALESCE = Query(
    "coalesce_ms",
    {"type": "integer", "minimum": 0, "maximum": MAX_COALESCE_MS},
    "The delta rollup window of this stream, as a subscribe's `coalesce_ms` "
    '(docs/protocol.md §3 "Delta rollup"); absent: the server\'s `[stream] coalesce_ms`.',
)
"""A mapping door's ``?coalesce_ms=`` (the AI SDK's SSE, AG-UI): :func:`coalesce_query`."""


def coalesce_query(req: Request) -> int | None:
    """``?coalesce_ms=`` (:data:`COALESCE`); None when absent: the server's default.

    Raises:
        ApiError: ``invalid_query``: 400 not an integer, 422 out of 0..250.
    """
    if "coalesce_ms" not in req.query:
        return None
    return int_query(req, "coalesce_ms", default=0, low=0, high=MAX_COALESCE_MS)


ATTACH_REFUSALS = ("attach_token_required", "attach_token_invalid", "attach_token_expired")
"""The 403 codes of the native stream's credential (:data:`ATTACH`), on either door."""

NAMED_TURN_UNAVAILABLE = (
    "over_capacity",
    "shutting_down",
    "store_unavailable",
    "session_elsewhere",
    "session_owner_unreachable",
)
"""The 503 codes of a turn started on a session its client names (AG-UI's run, the AI
SDK's chat): the session made or found (:class:`ClientNamedSessions`), then the turn."""


class DoorContext:
    """What a door may ask of the gateway (module docstring): one for every door.

    Args:
        node: the daemon's node (its sessions, turns, limits, attach tokens).
        keys: the API keys (``[auth]``).
    """

    def __init__(self, node: Node, keys: ApiKeys) -> None:
        self.node = node
        self.config: Config = node.config
        self.keys = keys
        self.documented: list[Documented] = []
        """Every registered door's documented routes, in order (``GET /openapi.json``);
        given by gateway.app once the doors are built."""

    def authenticate(self, req: Request) -> str | None:
        """The caller: the id of its API key, or ``None`` where no keys are configured.

        Raises:
            ApiError: 401 ``unauthorized`` without ``Authorization: Bearer``, 403
                ``forbidden`` for a key that is not (or no longer) accepted.
        """
        return authenticate(self.keys, req)

    async def session(self, session_id: str, caller: str | None) -> Session:
        """The session, as ``caller`` may see it (docs/protocol.md §2).

        Another key's session is answered exactly as an unknown id (same status,
        code and message: no oracle), and is not even loaded from the store: a
        stored session's owner is read first, one store read as for an unknown id.

        Raises:
            ApiError: 404 ``session_not_found``.
        """
        unknown = ApiError(404, "session_not_found", f"no session {session_id!r}")
        if caller is not None and session_id not in self.node.sessions:
            record = await self.node.store.get_session(session_id)
            if record is not None and not sees(caller, record.owner):
                raise unknown
        session: Session | None = await self.node.get_session(session_id)
        if session is None or not sees(caller, session.record.owner):
            raise unknown
        return session

    async def counted_turn(
        self,
        key: str,
        session: Session,
        message: Message,
        if_busy: IfBusy | None = None,
        rewind_to: str | None = None,
    ) -> ops.TurnTaken:
        """Submit a turn within the key's rate limit; return once it is durable (section 9).

        The turn is counted in the step that checks the limit (two racing
        requests cannot both take the last one) and refunded if it is refused
        (409, or sent to an owner that could not take it); one accepted but
        not yet durable (503 ``store_unavailable``) stays counted.
        ``if_busy``: ``None`` is ``[turns] if_busy`` (docs/protocol.md §2 "A busy session").
        """
        limits = self.node.limits
        counted = await limits.count_turn(key)  # 429 rate_limited, with Retry-After
        busy = if_busy or self.config.turns.if_busy
        try:  # on whichever node runs it
            return await self.node.submit_turn(session, message, busy, rewind_to)
        except Refused as exc:
            if exc.code != "store_unavailable":
                await limits.refund_turn(key, counted)
            raise

    async def decide_answered(
        self, session: Session, perm_id: str, decision: str, content: dict[str, Any] | None = None
    ) -> None:
        """Decide an approval a door's client answered with its next request (AG-UI's
        ``resume``, the AI SDK's continuation). One no longer waiting, answered elsewhere
        or timed out since the door looked, is ignored: the answer is stale, not wrong
        (docs/doors/agui.md "Approvals are interrupts", docs/doors/aisdk.md "The routes").

        Raises:
            Refused: any other refusal of the decision (``invalid_content``...).
        """
        try:
            await self.node.decide_permission(session, perm_id, decision, content)
        except Refused as exc:
            if exc.code not in ("permission_resolved", "permission_not_found"):
                raise

    def file_refusal(self, session: Session | None) -> Refuse:
        """What the session's model cannot take of a turn's files, for
        ``Files.resolve(refuse=)``: 422 ``unsupported_content`` at the POST, not a
        failed call later (docs/protocol.md §2 "Files"; every door that takes a turn).
        ``None``: a session a door is about to make, of the default agent."""
        agents = self.node.agents
        agent = agents[session.record.agent if session is not None else agents.default]
        return functools.partial(refusal, agent.runtime, agent.provider)  # its model's provider

    async def subscribe(
        self,
        session: Session,
        sub: seam.SeamSubscriber,
        since: int | None = None,
        coalesce_ms: int | None = None,
    ) -> SubscribeRejected | None:
        """Join ``session``'s hub with every event (``preset:full``): live, or, ``since`` an
        event id, replayed from after it through the seam, then live (no gap, no duplicate:
        docs/protocol.md §3). The seam's refusal of the replay (None: joined).
        ``coalesce_ms``: the delta rollup window (docs/protocol.md §3 "Delta rollup";
        None: ``[stream] coalesce_ms``)."""
        resolved, key = resolve_filter("preset:full")
        cursor = None if since is None else format_event_id(since)
        asked = Subscribe("preset:full", since=cursor, coalesce_ms=coalesce_ms)
        done = await seam.subscribe(session, sub, asked, resolved, key, self.config.stream)
        return done.error


class Door(Protocol):
    """A door, as gateway.app registers it: built from the context, it lists its routes.

    Its routes' handlers are its own methods (``handler(req, *ids)``), so they
    reach its state and the context; their order is the API document's.
    """

    @property
    def routes(self) -> Sequence[Route]: ...


DoorType = Callable[[DoorContext], Door]
"""A door's class: what the registration list of gateway.app names."""


class ClientNamedSessions:
    """Sessions named by their client (module docstring).

    Args:
        ctx: the doors' context (its node, and its ownership check).
        field: the request field that names the session, for the 422's message.
        code: the 422's code for a name that is no session id.
    """

    def __init__(self, ctx: DoorContext, field: str, code: str) -> None:
        self.ctx = ctx
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
        made = await self.ctx.node.registry.create_named(name, caller or NO_OWNER)
        if made is not None:
            return made
        return await self.ctx.session(name, caller)


def once(release: Callable[[], None]) -> Callable[[], None]:
    """``release``, called at most once however often the result is."""
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            release()

    return call


def rewind_if_busy(if_busy: IfBusy | None, rewind_to: str | None, default: IfBusy) -> IfBusy | None:
    """What a turn asks of a busy session, checked against its ``rewind_to``.

    A rewind applies to the history as it is when its turn starts, so it
    starts now or not at all (docs/protocol.md §2 "Edit and regenerate"):
    ``queue`` or ``steer`` asked with it is 422 ``invalid_body``; absent, a
    ``[turns] if_busy`` of ``queue`` or ``steer`` (``default``) is ``reject``
    for it. Raised from the body, before the turn is counted.
    """
    if rewind_to is None:
        return if_busy
    if if_busy in ("queue", "steer"):
        raise ApiError(
            422,
            "invalid_body",
            f'rewind_to takes if_busy "reject" or "interrupt", not {if_busy!r}: a rewind'
            " applies to the history as it is when its turn starts",
        )
    if if_busy is None and default in ("queue", "steer"):
        return "reject"
    return if_busy
