"""A task's SSE stream, fed from the session's hub like any client (docs/doors/a2a.md).

The task's :class:`TaskSubscriber` (a :class:`~gateway.doors.oneway.OneWayQueue`)
joins the session's hub through the seam before anything it streams happens
(live, before a turn is submitted or an approval decided; or replayed from
the turn's start, for ``SubscribeToTask``), with the same bounded delivery
queue and slow-client rule as every stream (docs/protocol.md §3, §14).
:class:`TaskReader` gives each gateway event to the task's
:class:`~gateway.doors.a2a.feed.TaskFeed` and writes what it makes as
server-sent events: ``id:`` the event's cursor, ``data:`` the JSON-RPC
response whose ``result`` is the A2A ``StreamResponse``. The stream ending
(the client gone) never cancels the turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

from gateway.doors.a2a import shapes as a2
from gateway.doors.a2a.feed import Cursor, Out, TaskFeed
from gateway.doors.a2a.tasks import FoundTask, TaskNotFound
from gateway.doors.context import SSE_HEADERS, DoorContext, once
from gateway.doors.oneway import OneWayQueue, TypedReader, close_named, direct_reader, pump
from gateway.http.server import Request, StreamingResponse
from gateway.protocol.events import Envelope
from gateway.session.session import Session


class TaskSubscriber(OneWayQueue):
    """A task stream's side of the hub and the seam: its delivery queue (module docstring)."""

    queue_name = "A2A task queue"
    closes_how = "closing the stream"
    prefix = "a2a"  # its subscription's name: a2a-N
    left_as = "task_finished"


class TaskReader(TypedReader):
    """The task's part of the pump: the events through its feed, as SSE events.

    A queue closed for another reason than slowness (the session deleted, this
    node's relay of it lost) ends the stream with a JSON-RPC error event
    (``event: error``, -32603, the close's name in its data).
    """

    def __init__(self, feed: TaskFeed, request_id: a2.RequestId) -> None:
        self.feed = feed
        self.request_id = request_id

    @property
    def finished(self) -> bool:
        return self.feed.finished

    def events(self, events: list[Envelope[Any]], replayed: bool) -> bytes:
        del replayed  # the feed reads a replay's whole messages and the live deltas alike
        return self.sse([out for event in events for out in self.feed.receive(event)])

    def pause(self) -> bytes:
        return self.sse(self.feed.pause())

    def closed(self, code: str | None) -> bytes:
        name, message = close_named(code)
        error = a2.RpcError(-32603, message, error_info(name, 503))
        body = a2.encoder.encode(a2.RpcErrorResponse(self.request_id, error))
        return b"event: error\ndata: " + body + b"\n\n"

    def sse(self, outs: Iterable[Out]) -> bytes:
        """Each event with its cursor as its ``id:``, its JSON-RPC response as its data."""
        return b"".join(
            b"id: "
            + str(at).encode()
            + b"\ndata: "
            + a2.encoder.encode(a2.RpcResult(self.request_id, event))
            + b"\n\n"
            for at, event in outs
        )


class TaskStreams:
    """A task's subscriptions, as the methods open them (module docstring).

    Args:
        ctx: the doors' context (its node, sessions and subscriptions).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.node = ctx.node
        self.config = ctx.config

    def feed(
        self, found: FoundTask, start: int, cursor: Cursor | None = None, **kw: Any
    ) -> TaskFeed:
        base = self.config.server.public_url
        return TaskFeed(found.id, found.session.id, found.turn_id, start, cursor, base, **kw)

    async def read_task(self, found: FoundTask) -> a2.Task:
        """The task as it stands: its turn replayed from its start through the seam
        (docs/protocol.md §3), into a feed that streams nothing.

        Raises:
            TaskNotFound: its start is no longer held (retention, ``replay_max_events``).
        """
        start = await found.start()
        if start is None:
            if found.queued:
                return a2.Task(
                    id=found.id,
                    context_id=found.session.id,
                    status=a2.TaskStatus(state="TASK_STATE_SUBMITTED"),
                )
            raise TaskNotFound(found.id)
        feed = self.feed(found, start)
        sub = TaskSubscriber(found.session, self.config.stream, self.node.metrics)
        if await self.ctx.subscribe(found.session, sub, since=start) is not None:
            raise TaskNotFound(found.id)
        try:
            reader = TaskReader(feed, None)
            await sub.drain(await sub.rx.receive(), reader)
        finally:  # a read, not a client that came and went: no bus event of it
            sub.subscribed = False
            found.session.hub.unsubscribe(sub)
        return feed.task()

    async def follow(
        self, sub: TaskSubscriber, feed: TaskFeed, timeout_s: float = float("inf")
    ) -> None:
        """Take the task's events until it is terminal or waits for an answer (or the
        timeout), writing nothing: a blocking ``SendMessage``, a ``CancelTask``."""

        async def discard(data: bytes) -> None:
            del data

        with trio.move_on_after(timeout_s):
            await pump(sub, TaskReader(feed, None), discard, self.config.stream.ping_interval_s)

    async def open_task(
        self,
        req: Request,
        task: tuple[str, Session, str],
        start: int | None,
        cursor: Cursor | None,
        before: Callable[[], Awaitable[None]] | None = None,
        history: list[a2.Message] | None = None,
        answered: frozenset[str] = frozenset(),
    ) -> tuple[TaskSubscriber, TaskFeed, Callable[[], None]]:
        """A task's subscriber and feed, its stream counted (``[limits]``, docs/protocol.md
        §2): subscribed ``since`` the turn's start (or live, ``None``), then ``before`` run
        (an approval decided: its cursor is then where the subscription began, so the
        stream holds what follows it)."""
        task_ref, session, turn_id = task
        release = once(await self.node.limits.open_stream(session.record.owner, "a2a"))
        try:
            sub = TaskSubscriber(session, self.config.stream, self.node.metrics, req.client)
            if await self.ctx.subscribe(session, sub, since=start) is not None:
                raise TaskNotFound(task_ref)
            joined = self.node.sequencer.last
            try:
                if before is not None:
                    await before()
                    cursor = Cursor(joined, None)
            except BaseException:
                sub.leave("client_closed")
                raise
        except BaseException:
            release()
            raise
        base = self.config.server.public_url
        first = joined if start is None else start
        feed = TaskFeed(
            task_ref, session.id, turn_id, first, cursor, base, history=history, answered=answered
        )
        return sub, feed, release

    def respond(
        self,
        sub: TaskSubscriber,
        feed: TaskFeed,
        rid: a2.RequestId,
        release: Callable[[], None],
        opening: list[Any],
    ) -> StreamingResponse:
        """The SSE answer of a subscribed feed; its stream's count given back when it ends."""
        reader = TaskReader(feed, rid)
        interval = self.config.stream.ping_interval_s

        async def run(send: Callable[[bytes], Awaitable[None]]) -> None:
            try:
                await pump(
                    sub, direct_reader(sub, reader, send), send, interval, reader.sse(opening)
                )
            finally:
                release()

        def abandon() -> None:
            sub.leave("client_closed")
            release()

        return StreamingResponse(run, headers=SSE_HEADERS, abandon=abandon)


ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def error_info(code: str, status: int) -> list[dict[str, Any]]:
    """A JSON-RPC error's ``data``: the gateway's error code, as A2A 1.0 carries details
    (a ``google.rpc.ErrorInfo``; the official client reads its ``metadata``)."""
    return [
        {
            "@type": ERROR_INFO,
            "reason": code.upper(),
            "domain": "gateway",
            "metadata": {"code": code, "status": str(status)},
        }
    ]
