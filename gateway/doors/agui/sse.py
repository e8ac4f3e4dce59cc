"""One AG-UI run's SSE stream, fed from the session's hub like any client.

The run's :class:`RunSubscriber` (a :class:`~gateway.doors.oneway.OneWayQueue`)
goes through the seam (:func:`gateway.session.seam.subscribe`, live mode)
*before* the turn is submitted or resumed, so no event of the turn is missed,
and gets the same shared batches every WebSocket client gets, through the same
bounded :class:`~gateway.session.delivery.DeliveryQueue` (``[stream]
queue_max_events``). Enqueueing never blocks the session: a batch that would
overflow the bound applies the slow-client rule as for a WebSocket (counted,
logged, ``bus.handler_warning``, unsubscribed) and the SSE stream is cut (the
turn goes on; the client can watch it on the gateway's own stream).

:func:`stream_run` writes the run: the opening events, then, through the
one-way streams' :func:`~gateway.doors.oneway.pump`, each event the run's
:class:`~gateway.doors.agui.resume.RunFeed` makes of what arrives (:class:`RunReader`),
a ``: ping`` comment after ``ping_interval_s`` without a write (so proxies
keep an idle stream open), until the run has finished. The HTTP connection
dropping ends this writer only: the turn is never cancelled by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.doors.agui import shapes as ag
from gateway.doors.agui.resume import RunFeed, Tagged, event_id
from gateway.doors.oneway import (
    OneWayQueue,
    Send,
    TypedReader,
    close_named,
    direct_reader,
    pump,
)
from gateway.ids import now_ms
from gateway.protocol.events import Envelope


class RunSubscriber(OneWayQueue):
    """A run's side of the hub and the seam: its delivery queue (module docstring)."""

    queue_name = "AG-UI run queue"
    closes_how = "closing the stream"
    prefix = "agui"  # its subscription's name: agui-N
    left_as = "run_finished"


class RunReader(TypedReader):
    """The run's part of the pump: the events through its feed, as tagged SSE events.

    A queue closed for another reason than slowness (the session deleted, this
    node's relay of it lost) ends the run with ``RUN_ERROR`` whose ``code`` is
    the close's name.
    """

    def __init__(self, feed: RunFeed) -> None:
        self.feed = feed

    @property
    def finished(self) -> bool:
        return self.feed.finished

    def events(self, events: list[Envelope[Any]], replayed: bool) -> bytes:
        if replayed:
            return tagged_sse(self.feed.replayed(events, now_ms()))
        return tagged_sse([t for event in events for t in self.feed.receive(event)])

    def pause(self) -> bytes:
        return tagged_sse(self.feed.pause(now_ms()))

    def closed(self, code: str | None) -> bytes:
        return tagged_sse(self.feed.closed(*close_named(code), now_ms()))


def sse(events: Iterable[ag.AguiEvent]) -> bytes:
    """``data: JSON`` blocks, one per event (the AG-UI HTTP transport's SSE encoding)."""
    return b"".join(b"data: " + ag.encode(e) + b"\n\n" for e in events)


def tagged_sse(events: Iterable[Tagged]) -> bytes:
    """Each event with its ``id:`` line (:func:`~gateway.doors.agui.resume.event_id`), then data."""
    return b"".join(
        b"id: " + event_id(pos).encode() + b"\ndata: " + ag.encode(e) + b"\n\n" for pos, e in events
    )


async def stream_run(
    sub: RunSubscriber, feed: RunFeed, opening: list[Tagged], send: Send, ping_interval_s: float
) -> None:
    """Write one run until it finishes (module docstring).

    Raises:
        SlowClient: the queue overflowed.
        trio.BrokenResourceError: the client went away (the turn goes on).
    """
    reader = direct_reader(sub, RunReader(feed), send)
    await pump(sub, reader, send, ping_interval_s, tagged_sse(opening))
