"""The gateway's Python client library: the HTTP API, and sessions kept up to date for you.

Async, on Trio, httpx and trio-websocket. Two layers::

    GatewayClient            docs/protocol.md §2: create, list and open sessions, send a
    │                        turn (queued or steered into a busy session's: submit_turn),
    │                        cancel it, answer a permission or an elicitation,
    │                        leave feedback, list the agents (section 11), upload and
    │                        download a session's files (gateway.client.files)
    ├── subscribe(...)       a Subscription (gateway.client.stream): one session's frames,
    │                        resumed after every drop, with any filter
    └── open_session(...)    a Session: a Subscription to ``preset:full`` that starts from
                             a snapshot and keeps the reduced state (gateway.client.reducer)
                             and the views of section 10, plus the session's own calls

A :class:`Session` is an async iterator of :class:`Update`: the frame or
notice that arrived, already applied to :attr:`Session.state`, and the
:class:`Chunk` of text or thinking it added. Chunks are computed from the
state, not copied from ``text.delta`` events, so a resume (whose replay
restores a message with one ``message.snapshot`` or its ``message.complete``,
section 3) never shows a chunk twice nor leaves one out: joined, a block's
chunks are exactly its text. (But for a block a snapshot cut to fit, PROTOCOL
section 15: the open block of a streaming message starts at the end the
snapshot kept, and its ``message.complete`` adds nothing to it; a finished one
gets the rest of its text once the message completes. A cut block that had
already completed is whole by :meth:`Session.fetch_whole`.) Errors are the
family of :mod:`gateway.errors`:
:class:`~gateway.errors.ApiError` for an HTTP error answer,
:class:`~gateway.errors.ClientError` for a gateway that cannot be reached or
a stream that cannot go on, :class:`~gateway.errors.SubscribeRejected` and
:class:`~gateway.errors.FrameRejected` for a refused subscription.

Example (docs/clients.md runs it as written)::

    async with GatewayClient("http://127.0.0.1:8421") as gateway:
        session_id = (await gateway.create_session()).session_id
        async with gateway.open_session(session_id) as session:
            turn_id = await session.send("hello gateway")
            async for update in session:
                for chunk in update.chunks:
                    print(chunk.text, end="")
                if session.turn_ended(turn_id):
                    break
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

import httpx
import msgspec
import trio

from gateway.client.files import FilesApi, TurnContent
from gateway.client.reducer import Reducer
from gateway.client.stream import (
    Backoff,
    Heartbeat,
    Item,
    Notice,
    Received,
    Subscription,
    WebSocketConnector,
    api_error,
    default_connector,
    describe,
)
from gateway.client.views import (
    FullView,
    QueuedView,
    SimpleView,
    full_view,
    queued_view,
    simple_view,
)
from gateway.errors import ClientError
from gateway.protocol.events import (
    ContextCompacted,
    Event,
    MessageComplete,
    ToolCalled,
    ToolCompleted,
    ToolFailed,
    ToolProgress,
    TurnCancelled,
    TurnCompleted,
    TurnStarted,
)
from gateway.protocol.frames import EventFrame, ServerFrame, Snapshot, SubscribeAck
from gateway.protocol.http import (
    Accepted,
    CancelAccepted,
    ForkCreated,
    IfBusy,
    MessagePage,
    SessionAttach,
    SessionCreated,
    SessionList,
    TurnAccepted,
)
from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    PendingPermission,
    TextBlock,
    ThinkingBlock,
    ToolInfo,
)

T = TypeVar("T")

_encoder = msgspec.json.Encoder()

RETRIES = 4
"""How many times a ``POST /sessions`` or ``POST .../turns`` is sent again (docs/clients.md)."""
RETRY_FIRST_S = 0.25  # after a lost answer: 0.25 s, doubling...
RETRY_MAX_S = 5.0  # ...and never longer than this, whatever Retry-After says


def _retry_in(r: httpx.Response | None, attempt: int) -> float | None:
    """How long to wait before sending an idempotent request again; ``None``: do not.

    ``r`` is ``None`` when the answer was lost (the connection failed or timed
    out). A 503 with ``Retry-After``, or a 409 ``idempotency_key_in_use``
    (the first attempt is still running), is waited for too.
    """
    backoff: float = min(RETRY_FIRST_S * 2.0**attempt, RETRY_MAX_S)
    if r is None:
        return backoff
    retry_after = r.headers.get("retry-after", "")
    if r.status_code == 503 and retry_after.isdigit():
        return min(float(retry_after), RETRY_MAX_S)
    if r.status_code == 409 and b"idempotency_key_in_use" in r.content:
        return min(float(retry_after), RETRY_MAX_S) if retry_after.isdigit() else backoff
    return None


# --- the client ---------------------------------------------------------------------------


class GatewayClient(FilesApi):
    """The HTTP API of one gateway (docs/protocol.md §2), and its session streams.

    Use it as an async context manager (it owns an ``httpx.AsyncClient``).

    Args:
        base_url: the gateway's ``http://HOST:PORT`` (or ``https://``).
        api_key: the Bearer key, where the gateway has ``[auth] api_keys``.
        timeout: seconds for each HTTP request.
        transport: an httpx transport (tests: ``httpx.MockTransport``).
        connector: opens a session stream's WebSocket from its ``ws_url``.
        retries: how many times a ``POST /sessions`` or ``POST .../turns`` is
            sent again, under the same ``Idempotency-Key``, after a lost answer,
            a 503 with ``Retry-After`` or a 409 ``idempotency_key_in_use``.

    Raises:
        ClientError: ``invalid_url``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        connector: WebSocketConnector = default_connector,
        retries: int = RETRIES,
    ) -> None:
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            self.http = httpx.AsyncClient(
                base_url=base_url, headers=headers, timeout=timeout, transport=transport
            )
        except httpx.InvalidURL as exc:
            raise ClientError("invalid_url", f"{base_url!r} is not a URL: {exc}") from None
        if self.http.base_url.scheme not in ("http", "https") or not self.http.base_url.host:
            why = "an http:// or https:// URL with a host, please"
            raise ClientError("invalid_url", f"{base_url!r} is not a URL: {why}")
        self.connector = connector

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    # --- section 2, route by route

    async def create_session(
        self,
        *,
        workspace_path: str | None = None,
        model: str | None = None,
        metadata: dict[str, Any] | None = None,
        agent: str | None = None,
    ) -> SessionCreated:
        """``POST /sessions``; ``None`` leaves a field to the gateway's default.

        ``agent`` names the agent the session runs for its life (PROTOCOL
        section 11; :meth:`list_agents` lists them).

        Raises:
            ApiError: 422 ``invalid_workspace``, ``invalid_model`` or
                ``unknown_agent`` (its message lists the names), 401/403, ...
            ClientError: ``unreachable``, ``not_a_gateway``.
        """
        body = {
            "workspace_path": workspace_path,
            "model": model,
            "metadata": metadata,
            "agent": agent,
        }
        present = {key: value for key, value in body.items() if value is not None}
        return await self._call("POST", "/sessions", SessionCreated, body=present, once=True)

    async def list_agents(self) -> AgentList:
        """``GET /agents``: the agents a session may run (docs/protocol.md §11).

        Raises:
            ApiError: 404 from a gateway that has no agents route (older than section 11).
        """
        return await self._call("GET", "/agents", AgentList)

    async def list_sessions(
        self, *, limit: int | None = None, before: str | None = None
    ) -> SessionList:
        """``GET /sessions``: a page, newest first; ``before`` is a session id."""
        params = {k: v for k, v in (("limit", limit), ("before", before)) if v is not None}
        return await self._call("GET", "/sessions", SessionList, params=params)

    async def attach(self, session_id: str) -> SessionAttach:
        """``GET /sessions/{id}``: the session, with a fresh attach token and ``ws_url``.

        Raises:
            ApiError: 404 ``session_not_found`` (also a session of another key).
        """
        return await self._call("GET", f"/sessions/{session_id}", SessionAttach)

    async def messages(
        self,
        session_id: str,
        *,
        before: str | None = None,
        limit: int | None = None,
        include_rewound: bool = False,
    ) -> MessagePage:
        """``GET /sessions/{id}/messages``: a page of the history, oldest first.

        ``include_rewound``: the messages a rewind took out too, each with
        ``rewound`` true (docs/protocol.md §2 "Edit and regenerate").
        """
        params = {k: v for k, v in (("limit", limit), ("before", before)) if v is not None}
        if include_rewound:
            params["include_rewound"] = "true"
        return await self._call(
            "GET", f"/sessions/{session_id}/messages", MessagePage, params=params
        )

    async def message(self, session_id: str, message_id: str) -> Message:
        """``GET /sessions/{id}/messages/{message_id}``: one finished message, whole.

        What a snapshot sent cut (``truncated``, docs/protocol.md §15).

        Raises:
            ApiError: 404 ``message_not_found`` (unknown, streaming, or another
                session's), 404 ``session_not_found``.
        """
        return await self._call("GET", f"/sessions/{session_id}/messages/{message_id}", Message)

    async def send_turn(
        self,
        session_id: str,
        content: TurnContent,
        *,
        rewind_to: str | None = None,
    ) -> str:
        """``POST /sessions/{id}/turns``: the new turn's id (:meth:`submit_turn`, ``reject``)."""
        return (await self.submit_turn(session_id, content, rewind_to=rewind_to)).turn_id

    async def delete_session(self, session_id: str) -> None:
        """``DELETE /sessions/{id}``: the session, its workers, messages and events, for good.

        Its turn in flight is cancelled and its streams end (a
        :class:`~gateway.client.stream.Subscription` of it raises
        :class:`~gateway.errors.ClientError` ``session_deleted``; docs/protocol.md §13).

        Raises:
            ApiError: 404 ``session_not_found`` (unknown, already deleted, or another key's).
        """
        try:
            r = await self.http.request("DELETE", f"/sessions/{session_id}")
        except httpx.TransportError as exc:
            raise ClientError(
                "unreachable", f"cannot reach {self.http.base_url}: {describe(exc)}"
            ) from exc
        if r.status_code != 204:
            raise api_error(r)

    async def fork(self, session_id: str, at_message_id: str | None = None) -> ForkCreated:
        """``POST /sessions/{id}/fork``: a new session from the session's history up to
        ``at_message_id`` (``None``: its last message) and a copy of its workspace.

        Made at most once, retried as :meth:`create_session` is (an
        ``Idempotency-Key``). Made at a user message, the fork's history ends
        before it and its content is the answer's ``draft`` (docs/protocol.md §2,
        "Forks").

        Raises:
            ApiError: 404 ``session_not_found``, ``message_not_found``; 409
                ``turn_in_progress``, ``not_a_fork_point``, ``worker_session``,
                ``workspace_too_large``, ``transcript_unavailable``; 429
                ``too_many_sessions``.
        """
        body = {} if at_message_id is None else {"at_message_id": at_message_id}
        path = f"/sessions/{session_id}/fork"
        return await self._call("POST", path, ForkCreated, body=body, once=True)

    async def cancel_turn(
        self, session_id: str, turn_id: str, *, reason: str | None = None
    ) -> None:
        """``POST /sessions/{id}/turns/{turn_id}/cancel`` (docs/protocol.md §8).

        A turn already cancelling is no error. A queued turn (:meth:`submit_turn`
        with ``if_busy="queue"``) is removed from the queue and never starts
        (``turn.cancelled`` with ``phase: "queued"``, docs/protocol.md §2 "A busy
        session"). Raises:
            ApiError: 404 ``turn_not_found`` (also a queued turn that has already
                been cancelled), 409 ``turn_not_in_flight``.
        """
        body = {} if reason is None else {"reason": reason}
        path = f"/sessions/{session_id}/turns/{turn_id}/cancel"
        await self._call("POST", path, CancelAccepted, body=body)

    async def submit_turn(
        self,
        session_id: str,
        content: TurnContent,
        *,
        if_busy: IfBusy | None = None,
        rewind_to: str | None = None,
    ) -> TurnAccepted:
        """``POST /sessions/{id}/turns``, made at most once (an ``Idempotency-Key``); the 202.

        ``content``: text, or blocks: text, and images and documents by the id of
        a file :meth:`upload` stored (gateway.client.files: ``file_block``).

        ``if_busy`` (docs/protocol.md §2 "A busy session"; ``None``: ``[turns]
        if_busy``): an idle session starts it at once; a busy one ``queue``s it
        (``queued``, its ``position``; :meth:`cancel_turn` takes it out), is
        ``interrupt``ed for it, or takes it as a ``steer`` (``steered``;
        ``turn_id`` is then the running turn's). ``rewind_to``: one of the
        session's user messages; the turn goes on from the history before it
        ("Edit and regenerate": an edit, or with its own content a regeneration).

        Raises:
            ApiError: 409 ``turn_in_progress`` (``reject``), ``queue_full``; 422 for
                content it cannot take (``unknown_file``, ``unsupported_content``);
                with ``rewind_to``: 404 ``message_not_found``, 409 ``message_rewound``,
                ``not_a_user_message``.
        """
        body: dict[str, Any] = {"content": content}
        if if_busy is not None:
            body["if_busy"] = if_busy
        if rewind_to is not None:
            body["rewind_to"] = rewind_to
        path = f"/sessions/{session_id}/turns"
        return await self._call("POST", path, TurnAccepted, body=body, once=True)

    async def answer_permission(
        self,
        session_id: str,
        perm_id: str,
        decision: Literal["allow", "deny"],
        *,
        content: dict[str, Any] | None = None,
    ) -> None:
        """``POST /sessions/{id}/permissions/{perm_id}``.

        ``content`` answers an elicitation (``kind: "elicitation"``, PROTOCOL
        section 11): with ``allow``, what the person filled in, which should
        match the request's ``requested_schema``; ``deny`` declines it. The
        request may be a worker's: ``session_id`` is the session whose stream
        showed it (the answer is the same route, docs/protocol.md §5).

        Raises:
            ApiError: 404 ``permission_not_found``, 409 ``permission_resolved``,
                422 for content the schema refuses.
        """
        path = f"/sessions/{session_id}/permissions/{perm_id}"
        body: dict[str, Any] = {"decision": decision}
        if content is not None:
            body["content"] = content
        await self._call("POST", path, Accepted, body=body)

    async def leave_feedback(
        self,
        session_id: str,
        message_id: str,
        rating: Literal[-1, 1],
        *,
        comment: str | None = None,
    ) -> None:
        """``POST /sessions/{id}/feedback`` (emits ``feedback.recorded``).

        Raises:
            ApiError: 404 ``message_not_found``.
        """
        body: dict[str, Any] = {"message_id": message_id, "rating": rating}
        if comment is not None:
            body["comment"] = comment
        await self._call("POST", f"/sessions/{session_id}/feedback", Accepted, body=body)

    # --- streams

    @asynccontextmanager
    async def subscribe(
        self,
        session_id: str,
        *,
        filter: Any = "preset:full",
        since: str | None = None,
        snapshot: bool = False,
        coalesce_ms: int | None = None,
        backoff: Backoff | None = None,
        heartbeat: Heartbeat | None = None,
        max_reconnects: int = 10,
        buffer: int = 64,
        rand: Callable[[], float] = random.random,
    ) -> AsyncIterator[Subscription]:
        """A session's stream of frames, resumed after every drop (gateway.client.stream).

        Args:
            session_id: the session.
            filter: a preset name or a Filter as a dict (docs/protocol.md §3).
            since: start after this event id (replay).
            snapshot: start with a snapshot.
            coalesce_ms: the delta rollup window, 0 to 250 (docs/protocol.md §3
                "Delta rollup"); None: the gateway's default.
            backoff: the reconnect delays.
            heartbeat: the client's pings and how many missed pongs mean a dead server.
            max_reconnects: attempts in a row without progress before giving up.
            buffer: frames received ahead of the consumer.
            rand: the backoff jitter's numbers in [0, 1).

        Yields:
            The :class:`Subscription`, already connecting; it stops when the block ends.
        """
        subscription = Subscription(
            self.http, session_id, filter=filter, since=since, snapshot=snapshot,
            coalesce_ms=coalesce_ms, backoff=backoff, heartbeat=heartbeat,
            max_reconnects=max_reconnects, connector=self.connector, buffer=buffer, rand=rand,
        )  # fmt: skip
        async with _background(subscription.run):
            yield subscription

    @asynccontextmanager
    async def open_session(
        self,
        session_id: str,
        *,
        include_worker_sessions: bool = False,
        backoff: Backoff | None = None,
        heartbeat: Heartbeat | None = None,
        max_reconnects: int = 10,
        buffer: int = 64,
    ) -> AsyncIterator[Session]:
        """The session, from a snapshot on, with its state kept for you (:class:`Session`).

        The block starts once the snapshot is applied: :attr:`Session.state` is
        the session's as it stands (an unknown session raises here).

        Args:
            session_id: the session.
            include_worker_sessions: also deliver the events of its ``delegate``
                workers (section 5); they do not change this session's state.
            backoff, heartbeat, max_reconnects, buffer: as for :meth:`subscribe`.
        """
        filter_: Any = "preset:full"
        if include_worker_sessions:
            filter_ = {"event_types": None, "actors": None, "include_worker_sessions": True}
        async with self.subscribe(
            session_id,
            filter=filter_,
            snapshot=True,
            backoff=backoff,
            heartbeat=heartbeat,
            max_reconnects=max_reconnects,
            buffer=buffer,
        ) as subscription:
            session = Session(self, subscription, include_worker_sessions=include_worker_sessions)
            await session.ready()
            yield session

    # --- the one way a call is made

    async def _call(
        self,
        method: str,
        path: str,
        answer: type[T],
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        once: bool = False,
    ) -> T:
        """One request; ``once``: under an ``Idempotency-Key``, sent again as it says.

        ``once`` (``POST /sessions``, ``POST .../turns`` and ``POST .../fork``): a fresh key
        (uuid4), the same for every attempt, so the gateway makes the thing at
        most once (docs/protocol.md §13) and a retry gets the first answer.
        """
        content = None if body is None else _encoder.encode(body)
        # Every POST says so, an empty one too (docs/protocol.md §15: else 415).
        json_body = body is not None or method == "POST"
        headers = {"Content-Type": "application/json"} if json_body else {}
        if once:
            headers["Idempotency-Key"] = str(uuid.uuid4())
        retries = self.retries if once else 0
        r = await _attempts(self.http, retries, method, path, content, params, headers)
        if not 200 <= r.status_code < 300:
            raise api_error(r)
        try:
            return msgspec.json.decode(r.content, type=answer)
        except msgspec.DecodeError as exc:
            raise ClientError(
                "not_a_gateway", f"{method} {path}: not the gateway's answer: {exc}"
            ) from None


async def _attempts(
    http: httpx.AsyncClient,
    retries: int,
    method: str,
    path: str,
    content: bytes | None,
    params: dict[str, Any] | None,
    headers: dict[str, str],
) -> httpx.Response:
    """A request sent until it is answered, at most ``retries`` times again (after a lost
    answer, or an answer :func:`_retry_in` says to try again after)."""
    attempt = 0
    while True:
        try:
            r: httpx.Response | None = await http.request(
                method, path, content=content, params=params, headers=headers
            )
        except httpx.TransportError as exc:
            if attempt >= retries:
                raise ClientError(
                    "unreachable", f"cannot reach {http.base_url}: {describe(exc)}"
                ) from exc
            r = None
        wait = _retry_in(r, attempt) if attempt < retries else None
        if r is not None and wait is None:
            return r
        await trio.sleep(wait or 0)
        attempt += 1


@asynccontextmanager
async def _background(run: Callable[[], Any]) -> AsyncIterator[None]:
    """Run ``run`` in a task for the length of the block, then cancel it.

    An exception of the block comes out as itself, not inside an
    ``ExceptionGroup``: the block does not run in the nursery's scope of
    errors (the task's own errors are delivered through the subscription).
    """
    raised: BaseException | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        try:
            yield
        except BaseException as exc:
            raised = exc
        nursery.cancel_scope.cancel()
    if raised is not None:
        raise raised


# --- a session, kept up to date ---------------------------------------------------------------


ChunkKind = Literal["text", "thinking"]


@dataclass(frozen=True)
class Chunk:
    """Text or thinking that arrived, never shown before (module docstring).

    ``index`` is the block's ``content_block_index``.
    """

    message_id: str
    index: int
    kind: ChunkKind
    text: str


@dataclass(frozen=True)
class Update:
    """What one step of a :class:`Session` brought: a frame (applied) or a notice."""

    item: Item
    chunks: tuple[Chunk, ...] = ()

    @property
    def frame(self) -> ServerFrame | None:
        return self.item.frame if isinstance(self.item, Received) else None

    @property
    def event(self) -> Event | None:
        frame = self.frame
        return frame.event if isinstance(frame, EventFrame) else None


class AgentInfo(msgspec.Struct):
    """One agent of ``GET /agents`` (docs/protocol.md §11); ``default``: the one a
    ``POST /sessions`` without ``agent`` runs."""

    name: str
    runtime: str
    model: str
    default: bool = False
    tools: list[ToolInfo] = msgspec.field(default_factory=list)


class AgentList(msgspec.Struct):
    """The answer of ``GET /agents``."""

    agents: list[AgentInfo]


@dataclass(frozen=True)
class ToolRun:
    """A tool call as a person follows it: running, then completed or failed.

    ``duration_ms`` is what the tool's end event says (``None`` when it never
    ran, or when its end is known from a snapshot only, which carries no
    duration). ``progress``: the last ``tool.progress`` of a running tool
    (docs/protocol.md §5), ``None`` when it sent none or has ended.
    """

    tool_use_id: str
    tool_name: str
    input: dict[str, Any]
    status: Literal["running", "completed", "failed"] = "running"
    duration_ms: int | None = None
    error_class: str | None = None
    progress: ToolProgress | None = None


class Session:
    """One session: its stream, its reduced state, and its calls.

    Made by :meth:`GatewayClient.open_session`. Iterate it for
    :class:`Update`; each is already applied to :attr:`state` (the reference
    :class:`~gateway.client.reducer.Reducer`: messages, the streaming message,
    tool results, the turn, pending permissions, workers) and to :attr:`tools`;
    :attr:`full` and :attr:`simple` are the two views of section 10, computed
    from it. The state moves only as you iterate.

    Attributes:
        id: the session id.
        state: the reduced state (docs/protocol.md sections 6-8).
        tools: tool calls seen by this client, by ``tool_use_id``, with durations.
        compactions: the ``context.compacted`` events this client saw, by the
            ``summary_message_id`` of the ``context`` message they put (their
            token counts, which a snapshot's message does not carry).
        connected: subscribed, as far as this client knows.
    """

    def __init__(
        self,
        client: GatewayClient,
        subscription: Subscription,
        *,
        include_worker_sessions: bool = False,
    ) -> None:
        self.client = client
        self.include_worker_sessions = include_worker_sessions
        self.subscription = subscription
        self.id = subscription.session_id
        self.state = Reducer(self.id)
        self.tools: dict[str, ToolRun] = {}
        self.compactions: dict[str, ContextCompacted] = {}
        self.connected = False
        self._shown: dict[tuple[str, int], int] = {}  # chars of each block delivered as chunks
        # Blocks restored cut at their beginning (the open block of a snapshot that had
        # to fit, docs/protocol.md §15): what was delivered is their end.
        self._tail_kept: set[tuple[str, int]] = set()
        self._known: set[str] = set()  # ids of the messages this client holds
        self._snapshots = 0
        self._ended_turns: set[str] = set()
        self._early: list[Update] = []  # read by ready(), delivered first

    async def ready(self) -> None:
        """Read up to the first snapshot, so that :attr:`state` is the session's
        (what was read is still delivered by the iteration).

        Raises:
            ClientError: ``closed``: the stream ended before a snapshot.
            GatewayError: as ``__anext__``.
        """
        while self._snapshots == 0:
            try:
                self._early.append(await self._next())
            except StopAsyncIteration:
                raise ClientError("closed", "the stream ended before its snapshot") from None

    # --- the session's calls (section 2)

    async def send(self, content: TurnContent, *, rewind_to: str | None = None) -> str:
        """Start a turn; its id. Raises ApiError 409 ``turn_in_progress``.

        ``rewind_to``: a user message the turn edits (or, with its own content,
        regenerates the answer to): :meth:`GatewayClient.send_turn`.
        """
        return await self.client.send_turn(self.id, content, rewind_to=rewind_to)

    async def submit(self, content: TurnContent, *, if_busy: IfBusy | None = None) -> TurnAccepted:
        """Send a turn saying what a busy session does with it (queue, interrupt, steer);
        the 202 body (:meth:`GatewayClient.submit_turn`). The queued turns are in
        :attr:`queued` once their ``turn.queued`` arrived."""
        return await self.client.submit_turn(self.id, content, if_busy=if_busy)

    async def cancel(self, turn_id: str | None = None, *, reason: str | None = None) -> None:
        """Cancel ``turn_id``, by default the turn in flight (none: nothing to do); a queued
        turn is taken out of the queue."""
        if turn_id is None:
            turn = self.state.turn
            if turn is None or turn.status != "in_flight":
                return
            turn_id = turn.turn_id
        await self.client.cancel_turn(self.id, turn_id, reason=reason)

    async def answer(
        self,
        perm_id: str,
        decision: Literal["allow", "deny"],
        *,
        content: dict[str, Any] | None = None,
    ) -> None:
        """Answer a permission request or an elicitation (see :attr:`pending_permissions`)."""
        await self.client.answer_permission(self.id, perm_id, decision, content=content)

    async def feedback(
        self, message_id: str, rating: Literal[-1, 1], *, comment: str | None = None
    ) -> None:
        """Rate an assistant message."""
        await self.client.leave_feedback(self.id, message_id, rating, comment=comment)

    async def load_earlier(self, limit: int = 50) -> bool:
        """One page of the messages the snapshot left out, put before the others in :attr:`state`.

        A snapshot holds the newest messages that fit (docs/protocol.md §15);
        ``state.has_more`` says there are older ones. Returns whether there
        are still more.
        """
        before = self.state.oldest_message_id
        if not self.state.has_more or before is None:
            return False
        page = await self.client.messages(self.id, before=before, limit=limit)
        self.state.prepend_history(page.messages, page.has_more)
        self._known.update(message.id for message in page.messages)
        return page.has_more

    async def fetch_whole(self, message_id: str) -> Message:
        """A finished message a snapshot sent cut, fetched whole and put in :attr:`state`."""
        message = await self.client.message(self.id, message_id)
        self.state.replace_message(message)
        return message

    def turn_ended(self, turn_id: str) -> bool:
        """Whether this client knows the turn has ended: its ``turn.completed`` or
        ``turn.cancelled`` arrived, or a snapshot holds its messages and shows the
        session in no turn or another one (a resume that fell back to a snapshot
        does not deliver the end event)."""
        return turn_id in self._ended_turns

    @property
    def busy(self) -> bool:
        """A turn is in flight, as far as the state shows."""
        return self.state.running_turn_id is not None

    @property
    def queued(self) -> list[QueuedView]:
        """The turns waiting to start, next first (docs/protocol.md §2 "A busy session"):
        the ``queued`` of both views (:func:`gateway.client.views.queued_view`)."""
        return queued_view(self.state)

    @property
    def pending_permissions(self) -> dict[str, PendingPermission]:
        """Tools waiting for a decision, by ``perm_id`` (answer with :meth:`answer`)."""
        return self.state.permissions

    @property
    def full(self) -> FullView:
        """The full view of docs/protocol.md §10 (:func:`gateway.client.views.full_view`)."""
        return full_view(self.state, workers=self.include_worker_sessions)

    @property
    def simple(self) -> SimpleView:
        """The replace-then-append view (:func:`gateway.client.views.simple_view`)."""
        return simple_view(self.state)

    # --- the stream

    def __aiter__(self) -> Session:
        return self

    async def __anext__(self) -> Update:
        """The next update, applied.

        Raises:
            StopAsyncIteration: the server closed the stream normally.
            GatewayError: what retrying cannot fix (gateway.client.stream);
                ``ClientError`` ``protocol_violation`` for a frame that breaks
                the contract.
        """
        if self._early:
            return self._early.pop(0)
        return await self._next()

    async def _next(self) -> Update:
        item = await self.subscription.__anext__()
        if isinstance(item, Notice):
            self.connected = item.connected
            return Update(item)
        frame = item.frame
        if isinstance(frame, SubscribeAck):
            self.connected = True
        if not isinstance(frame, Snapshot | EventFrame):
            return Update(item)
        try:
            self.state.apply(frame)
        except ValueError as exc:
            raise ClientError("protocol_violation", str(exc)) from None
        if isinstance(frame, Snapshot):
            chunks = self._after_snapshot(frame)
        else:
            chunks = self._after_event(frame.event)
        return Update(item, chunks)

    def _after_snapshot(self, snapshot: Snapshot) -> tuple[Chunk, ...]:
        """A snapshot replaced the state: chunks for what it brought that was never shown.

        The first snapshot's finished messages are history, not news: only its
        streaming message is. A later one (a resume that fell back to a
        snapshot) brings news in every assistant message this client did not
        hold, and the rest of any it had shown in part.
        """
        first = self._snapshots == 0
        self._snapshots += 1
        chunks: list[Chunk] = []
        held = {id_ for id_, _ in self._shown}
        for message in self.state.messages:
            news = not first and message.id not in self._known
            if message.role == "assistant" and (news or message.id in held):
                chunks += self._news(message.id, _blocks_of(message.content))
                self._forget(message.id)
        chunks += self._streaming_news()
        self._shown = {key: n for key, n in self._shown.items() if self._is_streaming(key[0])}
        self._known = {message.id for message in self.state.messages}
        turn_id = snapshot.session.current_turn_id
        for message in snapshot.messages:
            if message.turn_id is not None and message.turn_id != turn_id:
                self._ended_turns.add(message.turn_id)
        if snapshot.session.current_turn_status != "in_flight" and turn_id is not None:
            self._ended_turns.add(turn_id)
        return tuple(chunks)

    def _after_event(self, event: Event) -> tuple[Chunk, ...]:
        if event.session_id != self.id:
            return ()  # a worker's event: this session's state is not its
        chunks: list[Chunk] = []
        payload = event.payload
        match payload:
            case MessageComplete(message_id=message_id):
                for message in reversed(self.state.messages):
                    if message.id == message_id:
                        blocks = _blocks_of(message.content)
                        for index, _, text in blocks:  # their end was delivered: all of it
                            if (message_id, index) in self._tail_kept:
                                self._shown[(message_id, index)] = len(text)
                        chunks += self._news(message_id, blocks)
                        break
                self._forget(message_id)
                self._tail_kept = {key for key in self._tail_kept if key[0] != message_id}
                self._known.add(message_id)
            case TurnStarted(user_message=message):
                self._known.add(message.id)
            case TurnCompleted(turn_id=turn_id) | TurnCancelled(turn_id=turn_id):
                self._ended_turns.add(turn_id)
            case ToolCalled():
                self.tools[payload.tool_use_id] = ToolRun(
                    payload.tool_use_id, payload.tool_name, payload.input
                )
            case ToolCompleted() | ToolFailed():
                self._tool_ended(payload)
            case ToolProgress(tool_use_id=tool_use_id) if tool_use_id in self.tools:
                run = self.tools[tool_use_id]
                if run.status == "running":
                    self.tools[tool_use_id] = dataclasses.replace(run, progress=payload)
            case ContextCompacted(summary_message_id=str(message_id)):
                self.compactions[message_id] = payload
            case _:
                pass
        chunks += self._streaming_news()
        return tuple(chunks)

    def _tool_ended(self, payload: ToolCompleted | ToolFailed) -> None:
        run = self.tools.get(payload.tool_use_id) or ToolRun(
            payload.tool_use_id, payload.tool_name, {}
        )
        failed = isinstance(payload, ToolFailed)
        self.tools[payload.tool_use_id] = ToolRun(
            run.tool_use_id,
            run.tool_name,
            run.input,
            "failed" if failed else "completed",
            payload.duration_ms,
            payload.error_class if isinstance(payload, ToolFailed) else None,
        )

    def _streaming_news(self) -> list[Chunk]:
        streaming = self.state.streaming
        if streaming is None:
            return []
        blocks: list[tuple[int, ChunkKind, str]] = []
        for index, block in sorted(streaming.blocks.items()):
            if block.kind == "text" or block.kind == "thinking":
                blocks.append((index, block.kind, block.text))
                if block.truncated and not block.closed:
                    self._tail_kept.add((streaming.message_id, index))
        return self._news(streaming.message_id, blocks)

    def _news(self, message_id: str, blocks: list[tuple[int, ChunkKind, str]]) -> list[Chunk]:
        """The part of each block beyond what was delivered; remembered as delivered."""
        chunks = []
        for index, kind, text in blocks:
            shown = self._shown.get((message_id, index), 0)
            if len(text) > shown:
                chunks.append(Chunk(message_id, index, kind, text[shown:]))
                self._shown[(message_id, index)] = len(text)
        return chunks

    def _forget(self, message_id: str) -> None:
        self._shown = {key: n for key, n in self._shown.items() if key[0] != message_id}

    def _is_streaming(self, message_id: str) -> bool:
        return self.state.streaming is not None and self.state.streaming.message_id == message_id


def _blocks_of(content: list[ContentBlock]) -> list[tuple[int, ChunkKind, str]]:
    """The text and thinking blocks of a finished message, by index."""
    blocks: list[tuple[int, ChunkKind, str]] = []
    for index, block in enumerate(content):
        if isinstance(block, TextBlock):
            blocks.append((index, "text", block.text))
        elif isinstance(block, ThinkingBlock):
            blocks.append((index, "thinking", block.thinking))
    return blocks
