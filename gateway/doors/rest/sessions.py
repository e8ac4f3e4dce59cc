"""``/sessions`` and a session's messages (docs/protocol.md sections 2 and 15)."""

from __future__ import annotations

from gateway.doors.rest import idempotency
from gateway.errors import ApiError
from gateway.http.parsing import decode_optional, int_query
from gateway.http.router import Api
from gateway.http.server import Request, Response, json_response
from gateway.ids import new_session_id
from gateway.protocol.http import (
    CreateSession,
    MessagePage,
    SessionCreated,
    SessionList,
    SessionListing,
)
from gateway.session.session import summary_of
from gateway.store.base import SessionRecord
from gateway.tenancy import NO_OWNER, sees


async def create_session(api: Api, req: Request) -> Response:
    """``POST /sessions``: answered once the session is committed.

    At most once per ``Idempotency-Key`` (gateway.server.idempotency): the
    session's id is chosen first and kept with the key.
    """
    owner = api._authenticate(req) or NO_OWNER
    body = decode_optional(req, CreateSession) or CreateSession()

    async def create(session_id: str) -> Response:
        session = await api.node.create_session(  # 429 past max_sessions_per_key
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
        live = api.node.sessions.get(session_id)
        record = live.record if live else await api.node.store.get_session(session_id)
        if record is None or record.owner != owner:
            return None
        await api.node.durable_or_503()
        return _created(record)

    return await idempotency.once(api, req, owner, new_session_id(), create, find)


def _created(r: SessionRecord) -> Response:
    return json_response(201, SessionCreated(r.id, r.active_model, r.created_at, r.agent))


async def list_sessions(api: Api, req: Request) -> Response:
    """``GET /sessions``: the caller's sessions, newest first, a page at a time."""
    node = api.node
    caller = api._authenticate(req)
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
            live.summary() if live and here else summary_of(rec, tools=node.tool_infos(rec.agent))
        )
        listings.append(SessionListing(summary, rec.created_at, rec.metadata))
    return json_response(200, SessionList(listings, has_more))


async def delete_session(api: Api, req: Request, session_id: str) -> Response:
    """``DELETE /sessions/{id}``: 204 once the session and its workers are gone (§13)."""
    session = await api._session(session_id, api._authenticate(req))
    await api.node.delete_session(session)
    return Response(204)


async def list_messages(api: Api, req: Request, session_id: str) -> Response:
    """``GET /sessions/{id}/messages``: a page of the session's messages, oldest first."""
    session = await api._session(session_id, api._authenticate(req))
    limit = int_query(req, "limit", default=50, low=1, high=200)
    messages = await api.node.messages_of(session)
    end = len(messages)
    before = req.query.get("before")
    if before is not None:
        end = next((i for i, m in enumerate(messages) if m.id == before), -1)
        if end < 0:
            raise ApiError(404, "message_not_found", f"no message {before!r} in {session_id}")
    start = max(0, end - limit)
    return json_response(200, MessagePage(messages[start:end], start > 0))


async def get_message(api: Api, req: Request, session_id: str, message_id: str) -> Response:
    """One finished message, whole (docs/protocol.md §15: what a snapshot cut).

    The session's own messages only, as the caller may see the session
    (:meth:`Api._session`); the newest are the likeliest, so they are looked
    at first.
    """
    session = await api._session(session_id, api._authenticate(req))
    for message in reversed(await api.node.messages_of(session)):
        if message.id == message_id:
            return json_response(200, message)
    raise ApiError(404, "message_not_found", f"no message {message_id!r} in {session_id}")
