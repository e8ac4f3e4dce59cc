"""A2A's handlers: the agent card, and the JSON-RPC methods at ``POST /a2a``.

Routes of the A2A door (gateway.doors.a2a.door), so they share the router's
boundary (Host, Origin, content type) and the doors' authentication,
ownership and limits (docs/protocol.md §2, §14, §15). A context is a
session, a task one of its turns (gateway.doors.a2a.tasks); a task's events
are made by its :class:`~gateway.doors.a2a.feed.TaskFeed` from the
session's events, live or replayed through the seam (docs/protocol.md §3),
and streamed by :mod:`gateway.doors.a2a.stream`. The decisions are in
docs/doors/a2a.md.
"""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from gateway.doors.a2a import shapes as a2
from gateway.doors.a2a.card import PROTOCOL_VERSION, agent_card, base_url
from gateway.doors.a2a.feed import parse_cursor
from gateway.doors.a2a.history import history, limit_of
from gateway.doors.a2a.messages import Messages
from gateway.doors.a2a.push import Push, not_offered
from gateway.doors.a2a.rpc import (
    EXTENDED_CARD_NOT_CONFIGURED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    TASK_NOT_CANCELABLE,
    VERSION_NOT_SUPPORTED,
    RpcFailure,
    error_response,
    params,
    read_request,
    request_id_of,
    result_response,
    rpc_error,
)
from gateway.doors.a2a.stream import TaskStreams, TaskSubscriber
from gateway.doors.a2a.tasks import FoundTask, TaskNotFound, find_task, task_id
from gateway.doors.context import DoorContext
from gateway.errors import ApiError, Refused
from gateway.http.refusals import as_http
from gateway.http.server import Request, Response, StreamingResponse, json_response
from gateway.protocol.shapes import Message
from gateway.session.turn_start import turn_starts

Answer = Response | StreamingResponse

CANCEL_WAIT_S = 30.0
"""How long ``CancelTask`` waits for the task to end before answering it as it stands."""
PUSH = (
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
)
LEGACY = ("message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe")


class A2aRoutes:
    """The A2A handlers of one router (module docstring).

    Args:
        ctx: the doors' context (its authentication, sessions and turn submission).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.node = ctx.node
        self.config = ctx.config
        self.streams = TaskStreams(ctx)
        self.push = Push(ctx.node, ctx.config.a2a, ctx.config.server.public_url.rstrip("/"))
        self.messages = Messages(ctx, self.streams, self.push)
        if self.push.offered:  # the node's sessions put their tasks' notifications in the outbox
            self.node.push_notes = self.push.notes
            self.node.session_listeners.append(self.push.forget)

    # --- the card -----------------------------------------------------------------------

    async def card(self, req: Request) -> Response:
        """``GET /.well-known/agent-card.json`` (gateway.doors.a2a.card)."""
        agents = [(p.name, p.runtime, p.model) for p in self.node.agents.profiles()]
        base = base_url(req, self.config.server.public_url)
        card = agent_card(
            base, agents, self.node.agents.default, self.ctx.keys.enabled, self.push.offered
        )
        return json_response(200, card)

    # --- JSON-RPC -----------------------------------------------------------------------

    async def rpc(self, req: Request) -> Answer:
        """``POST /a2a``: one JSON-RPC request (gateway.doors.a2a.rpc for the envelope)."""
        caller = self.ctx.authenticate(req)
        try:
            request_id, method, raw = read_request(req.body)
        except RpcFailure as failure:
            return error_response(request_id_of(req.body), failure)
        try:
            self._check_version(req)
            return await self._call(req, caller, request_id, method, raw)
        except RpcFailure as failure:
            return error_response(request_id, failure)
        except (ApiError, Refused) as exc:
            error = as_http(exc)
            if error.status in (429, 503):  # not taken: an HTTP answer, Retry-After and all
                raise error from None
            return error_response(request_id, rpc_error(error))

    def _check_version(self, req: Request) -> None:
        asked = req.headers.get("a2a-version", "").strip()
        if asked and asked.removesuffix(".0") != PROTOCOL_VERSION.removesuffix(".0"):
            raise RpcFailure(
                VERSION_NOT_SUPPORTED,
                f"A2A-Version {asked[:20]!r} is not served: this door speaks A2A "
                f"{PROTOCOL_VERSION}",
                "version_not_supported",
            )

    async def _call(
        self, req: Request, caller: str | None, rid: a2.RequestId, method: str, raw: msgspec.Raw
    ) -> Answer:
        if method in ("SendMessage", "SendStreamingMessage"):
            body = params(raw, a2.SendMessageRequest)
            return await self.messages.send(
                req, caller, rid, body, method == "SendStreamingMessage"
            )
        if method == "GetTask":
            get = params(raw, a2.GetTaskRequest)
            limit = limit_of(get.history_length)
            found = await find_task(self.ctx, caller, get.id)
            task = await self.streams.read_task(found)
            messages = await self.node.messages_of(found.session) if limit else []
            task.history = self._history(found, messages, limit)
            return result_response(rid, task)
        if method == "CancelTask":
            cancel = params(raw, a2.CancelTaskRequest)
            return result_response(rid, await self._cancel(req, caller, cancel))
        if method == "SubscribeToTask":
            sub = params(raw, a2.SubscribeToTaskRequest)
            return await self._resubscribe(req, caller, rid, sub)
        if method == "ListTasks":
            listing = params(raw, a2.ListTasksRequest)
            return result_response(rid, await self._list(caller, listing))
        if method in PUSH:
            return result_response(rid, await self._push(caller, method, raw))
        if method == "GetExtendedAgentCard":
            raise RpcFailure(
                EXTENDED_CARD_NOT_CONFIGURED,
                "there is no extended card",
                "extended_agent_card_not_configured",
            )
        legacy = " (A2A 0.3's name: this door speaks A2A 1.0)" if method in LEGACY else ""
        raise RpcFailure(METHOD_NOT_FOUND, f"no method {method[:60]!r}{legacy}", "method_not_found")

    # --- push notifications (gateway.doors.a2a.push) -----------------------------------------

    async def _push(self, caller: str | None, method: str, raw: msgspec.Raw) -> object:
        if not self.push.offered:
            raise not_offered()
        body = params(raw, dict[str, Any])
        task, config_id = body.get("taskId"), body.get("id") or ""
        if not isinstance(task, str) or not isinstance(config_id, str):
            raise RpcFailure(INVALID_PARAMS, "taskId (and id) are strings", "invalid_params")
        found = await find_task(self.ctx, caller, task)
        if method == "CreateTaskPushNotificationConfig":
            return await self.push.create(found, body)
        if method == "GetTaskPushNotificationConfig":
            return await self.push.get(found, config_id)
        if method == "ListTaskPushNotificationConfigs":
            return await self.push.listed(found)
        await self.push.delete(found, config_id)
        return {}

    # --- cancelling -----------------------------------------------------------------------

    async def _cancel(
        self, req: Request, caller: str | None, body: a2.CancelTaskRequest
    ) -> a2.Task:
        """``CancelTask``: the turn's cancel (docs/protocol.md §8); answered once the task
        is ``TASK_STATE_CANCELED`` (or however it ended first)."""
        found = await find_task(self.ctx, caller, body.id)
        if not (found.in_flight or found.queued):
            raise not_cancelable(found.id)
        start = await found.start()
        sub = TaskSubscriber(found.session, self.config.stream, self.node.metrics, req.client)
        if await self.ctx.subscribe(found.session, sub, since=start) is not None:
            start = None  # its start no longer replayable: its end, live, is enough here
            sub = TaskSubscriber(found.session, self.config.stream, self.node.metrics, req.client)
            await self.ctx.subscribe(found.session, sub)
        feed = self.streams.feed(found, start if start is not None else self.node.sequencer.last)
        try:
            reason = (body.metadata or {}).get("reason")
            why = reason if isinstance(reason, str) and reason else "user"
            try:
                await self.node.cancel_turn(found.session, found.turn_id, why, f"a2a:{req.client}")
            except (ApiError, Refused) as exc:
                if as_http(exc).status in (404, 409):  # it ended meanwhile
                    raise not_cancelable(found.id) from None
                raise
            await self.streams.follow(sub, feed, CANCEL_WAIT_S)
        finally:
            if sub.subscribed:
                sub.leave("task_finished")
        return feed.task()

    # --- streams ----------------------------------------------------------------------------

    async def _resubscribe(
        self, req: Request, caller: str | None, rid: a2.RequestId, body: a2.SubscribeToTaskRequest
    ) -> StreamingResponse:
        """``SubscribeToTask``: the task again, after the client's cursor (``Last-Event-ID``),
        replayed from the turn's start then live: no gap, no duplicate. A task read
        queued is joined live, then read again: started meanwhile, it is joined anew
        from its start (docs/doors/a2a.md "Streams and the cursor")."""
        header = req.headers.get("last-event-id")
        cursor = parse_cursor(header) if header else None
        if header and cursor is None:
            raise RpcFailure(
                INVALID_PARAMS, f"Last-Event-ID {header[:60]!r} is no cursor", "invalid_cursor"
            )
        found = await find_task(self.ctx, caller, body.id)
        while True:
            start = await found.start()
            if start is None and not found.queued:
                raise TaskNotFound(found.id)
            if cursor is not None and start is not None and cursor.seq < start:
                cursor = None  # before the task: the whole task
            task = (found.id, found.session, found.turn_id)
            sub, feed, release = await self.streams.open_task(req, task, start, cursor)
            if start is not None:
                break
            # Read queued, joined live: had its turn started meanwhile, the live stream
            # would miss its start (its end too); it is then replayed from its start.
            try:
                summary = await self.node.live_summary(found.session)
            except BaseException:
                sub.leave("client_closed")
                release()
                raise
            found = FoundTask(found.id, found.session, found.turn_id, summary)
            if found.queued:
                break
            sub.subscribed = False  # joined again at once: no bus event of it
            found.session.hub.unsubscribe(sub)
            release()
        return self.streams.respond(sub, feed, rid, release, [])

    def _history(
        self, found: FoundTask, messages: list[Message], limit: int
    ) -> list[a2.Message] | None:
        """The task's ``history`` (gateway.doors.a2a.history), at most ``limit`` messages."""
        base = self.config.server.public_url
        return history(messages, found.id, found.session.id, found.turn_id, base, limit)

    # --- listing ----------------------------------------------------------------------------

    async def _list(self, caller: str | None, body: a2.ListTasksRequest) -> a2.ListTasksResponse:
        """``ListTasks`` of one context (``contextId`` required): its turns, oldest first,
        each read as ``GetTask`` reads it, those in the ``status`` asked (a page of turns
        may then hold fewer tasks), artifacts only with ``includeArtifacts``. Another
        key's context lists nothing."""
        if not body.context_id:
            raise RpcFailure(INVALID_PARAMS, "contextId is required", "invalid_params")
        try:
            session = await self.ctx.session(body.context_id, caller)
        except ApiError as exc:
            if exc.status == 404:
                return a2.ListTasksResponse(tasks=[])
            raise
        token = body.page_token
        if token and not (token.isascii() and token.isdigit() and len(token) <= 9):
            raise RpcFailure(INVALID_PARAMS, "pageToken is no page token", "invalid_page_token")
        limit = limit_of(body.history_length) if body.history_length is not None else 0
        wanted = state_filter(body.status)
        turns: dict[str, None] = {}  # in order, once each: read once for the whole page
        messages = await self.node.messages_of(session)
        for m in messages:
            if m.turn_id is not None:
                turns.setdefault(m.turn_id)
        size = min(max(body.page_size or 50, 1), 100)
        skip = int(token or 0)
        page = list(turns)[skip : skip + size]
        summary = await self.node.live_summary(session)
        starts = await turn_starts(session, page)  # one read of the store for the page
        tasks = []
        for turn_id in page:
            tid = task_id(session.id, turn_id)
            found = FoundTask(tid, session, turn_id, summary, starts.get(turn_id))
            try:
                task = await self.streams.read_task(found)
            except TaskNotFound:
                continue
            if wanted is not None and task.status.state != wanted:
                continue
            if not body.include_artifacts:
                task.artifacts = None
            task.history = self._history(found, messages, limit)
            tasks.append(task)
        more = skip + size < len(turns)
        return a2.ListTasksResponse(
            tasks=tasks,
            next_page_token=str(skip + size) if more else "",
            page_size=size,
            total_size=len(turns),
        )


def state_filter(status: str | int | None) -> str | None:
    """``ListTasks``'s ``status``: a ``TaskState`` by name or number, as protobuf's JSON
    reads an enum (None: any state; ``TASK_STATE_UNSPECIFIED`` too). -32602 otherwise."""
    states = ("TASK_STATE_UNSPECIFIED", *get_args(a2.TaskState))  # numbered as A2A 1.0's
    if isinstance(status, int) and not isinstance(status, bool) and 0 <= status < len(states):
        status = states[status]
    if status is None or status == states[0]:
        return None
    if status not in states:
        raise RpcFailure(INVALID_PARAMS, f"status {status!r:.60} is no TaskState", "invalid_params")
    return str(status)


def not_cancelable(task: str) -> RpcFailure:
    """-32002: a task that has ended is not cancelled (docs/doors/a2a.md "Cancelling")."""
    return RpcFailure(TASK_NOT_CANCELABLE, f"task {task} has ended", "task_not_cancelable", 409)
