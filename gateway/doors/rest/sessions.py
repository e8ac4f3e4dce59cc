"""``/sessions``, a session and its messages (docs/protocol.md sections 2 and 15).

``GET /sessions/{id}`` issues a single-use attach token and the URL of the
session's stream (gateway.doors.websocket; the token is the SSE stream's
credential too, gateway.doors.sse).
"""

from __future__ import annotations

import contextlib

import msgspec

from gateway.config import Config
from gateway.doors.context import DoorContext
from gateway.doors.rest import idempotency
from gateway.errors import ApiError, StoreError, unavailable
from gateway.http.parsing import bool_query, decode_optional, int_query
from gateway.http.server import Request, Response, json_response
from gateway.ids import new_session_id
from gateway.protocol.http import (
    CreateSession,
    ListedMessage,
    MessagePage,
    SessionAttach,
    SessionCreated,
    SessionList,
    SessionListing,
)
from gateway.protocol.shapes import Message
from gateway.session import busy, rewind
from gateway.session.fork_point import origin_of
from gateway.session.session import Session, summary_of
from gateway.store.base import SessionRecord
from gateway.tenancy import NO_OWNER, sees


class Sessions:
    """The handlers of ``/sessions`` and a session's messages (module docstring).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx

    async def create_session(self, req: Request) -> Response:
        """``POST /sessions``: answered once the session is committed.

        At most once per ``Idempotency-Key`` (gateway.doors.rest.idempotency): the
        session's id is chosen first and kept with the key.
        """
        owner = self.ctx.authenticate(req) or NO_OWNER
        body = decode_optional(req, CreateSession) or CreateSession()

        async def create(session_id: str) -> Response:
            session = await self.ctx.node.create_session(  # 429 past max_sessions_per_key
                workspace_path=body.workspace_path,
                model=body.model,
                agent=body.agent,
                metadata=body.metadata,
                owner=owner,
                session_id=session_id,
            )
            return _created(session.record)

        async def find(session_id: str) -> Response | None:
            # Made here and not yet durable (an attempt that answered 503
            # store_unavailable): answered once it is, as the first would have been.
            live = self.ctx.node.sessions.get(session_id)
            record = live.record if live else await self.ctx.node.store.get_session(session_id)
            if record is None or record.owner != owner:
                return None
            await self.ctx.node.durable_or_503()
            return _created(record)

        return await idempotency.once(self.ctx, req, owner, new_session_id(), create, find)

    async def list_sessions(self, req: Request) -> Response:
        """``GET /sessions``: the caller's sessions, newest first, a page at a time."""
        node = self.ctx.node
        caller = self.ctx.authenticate(req)
        limit = int_query(req, "limit", default=50, low=1, high=200)
        await node.durable_or_503()  # the page shows every session created so far
        before = req.query.get("before")
        if before is not None:
            cursor = await node.store.get_session(before)
            if cursor is None or not sees(caller, cursor.owner):
                raise ApiError(404, "session_not_found", f"no session {before!r} to page before")
        records, has_more = await node.store.list_sessions(
            limit=limit, before=before, visible_to=caller
        )
        listings = []
        for rec in records:
            live = node.sessions.get(rec.id)
            here = live is not None and node.runs_here(rec.id)  # else: the store's record
            summary = (
                live.summary()
                if live and here
                else summary_of(rec, tools=node.tool_infos(rec.agent))
            )
            listings.append(SessionListing(summary, rec.created_at, rec.metadata))
        return json_response(200, SessionList(listings, has_more))

    async def get_session(self, req: Request, session_id: str) -> Response:
        """``GET /sessions/{id}``: the session, a fresh attach token, its stream's URL."""
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        token = await self.ctx.node.issue_token(session.id)
        url = f"{_ws_base(self.ctx.config, req)}/sessions/{session.id}/stream?attach={token}"
        record = session.record
        attach = SessionAttach(session.id, record.active_model, token, url, record.agent)
        origin, draft = origin_of(record.metadata)  # a fork's (docs/protocol.md §2, "Forks")
        if origin is not None:
            attach.forked_from = origin
            attach.draft = msgspec.UNSET if draft is None else draft
        record = session.record
        if not self.ctx.node.runs_here(session.id):  # the store's: a replica's may lag
            with contextlib.suppress(StoreError):
                record = await self.ctx.node.store.get_session(session.id) or record
        # docs/protocol.md §2 "A busy session", without asking its owner (which may be away).
        attach.queued_turns = busy.queued_info(record) or msgspec.UNSET
        return json_response(200, attach)

    async def delete_session(self, req: Request, session_id: str) -> Response:
        """``DELETE /sessions/{id}``: 204 once the session and its workers are gone (§13)."""
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        await self.ctx.node.delete_session(session)
        return Response(204)

    async def list_messages(self, req: Request, session_id: str) -> Response:
        """``GET /sessions/{id}/messages``: a page of the session's messages, oldest first.

        The conversation; with ``include_rewound=true`` every stored message, each
        rewound one flagged (docs/protocol.md §2 "Edit and regenerate"). ``before``
        may name a rewound message either way: the page is then what the listing
        holds that was stored before it (a client whose view a rewind emptied
        pages from there).
        """
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        limit = int_query(req, "limit", default=50, low=1, high=200)
        include = bool_query(req, "include_rewound")
        before = req.query.get("before")
        if include:
            every, gone = await self._every_message(session)
            listed = [_listed(m, m.id in gone) for m in every]
        else:
            listed = [_listed(m) for m in await self.ctx.node.messages_of(session)]
        end = len(listed)
        if before is not None:
            end = next((i for i, m in enumerate(listed) if m.id == before), -1)
            if end < 0 and not include:  # a rewound message: the conversation stored before it
                every, _ = await self._every_message(session)
                at = next((i for i, m in enumerate(every) if m.id == before), None)
                earlier = {m.id for m in every[:at]} if at is not None else None
                end = -1 if earlier is None else sum(m.id in earlier for m in listed)
            if end < 0:
                raise ApiError(404, "message_not_found", f"no message {before!r} in {session_id}")
        start = max(0, end - limit)
        return json_response(200, MessagePage(listed[start:end], start > 0))

    async def get_message(self, req: Request, session_id: str, message_id: str) -> Response:
        """One finished message, whole (docs/protocol.md §15: what a snapshot cut).

        The session's own messages only, as the caller may see the session
        (:meth:`gateway.doors.context.DoorContext.session`); the newest are the
        likeliest, so they are looked at first, then the rewound ones (docs/protocol.md
        §2 "Edit and regenerate": still readable).
        """
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        for message in reversed(await self.ctx.node.messages_of(session)):
            if message.id == message_id:
                return json_response(200, message)
        every, gone = await self._every_message(session)
        for message in every:
            if message.id == message_id and message.id in gone:
                return json_response(200, message)
        raise ApiError(404, "message_not_found", f"no message {message_id!r} in {session_id}")

    async def _every_message(self, session: Session) -> tuple[list[Message], set[str]]:
        """Every stored message of the session, in the stored order, but one still
        streaming; and the ids of the rewound ones (gateway.session.rewind.stored).

        Read from the store once what this node wrote is durable (where the
        session runs here, with its own rewinds).

        Raises:
            Refused: ``store_unavailable``.
        """
        node = self.ctx.node
        here = node.runs_here(session.id)
        if here:
            await node.durable_or_503()
        try:
            every, gone = await rewind.stored(node.store, session.id, () if here else None)
        except StoreError as exc:
            raise unavailable(exc) from None
        if here:  # its own rewinds, read after the messages: one committed meanwhile hides too
            gone = rewind.hidden(every, session.record.rewinds)
        return [m for m in every if m.status != "in_progress"], gone


def _listed(message: Message, rewound: bool = False) -> ListedMessage:
    """A message as the listing shows it (``rewound`` only when true)."""
    return ListedMessage(**msgspec.structs.asdict(message), rewound=rewound)


def _created(r: SessionRecord) -> Response:
    return json_response(201, SessionCreated(r.id, r.active_model, r.created_at, r.agent))


def _ws_base(config: Config, req: Request) -> str:
    """Where ``ws_url`` points (docs/protocol.md §2): the public URL, else this request's Host.

    Without ``public_url``, the scheme follows the request's: ``wss://``
    when a trusted proxy says the client came over https
    (``X-Forwarded-Proto``, see :func:`gateway.http.server.forwarded_client`).
    """
    public: str = config.server.public_url.rstrip("/")
    if public:
        return "ws" + public.removeprefix("http")  # http -> ws, https -> wss
    server = config.server
    host = req.headers.get("host") or f"{server.host}:{server.port}"
    return f"{'wss' if req.scheme == 'https' else 'ws'}://{host}"
