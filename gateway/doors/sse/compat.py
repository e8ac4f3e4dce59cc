"""The doors' context under the names gateway.doors.sse.events still calls it by.

That module came over from gateway/server/ unedited (its delivery-queue
consumer is being rewritten beside this change, issue 33): it still asks for
``api._authenticate`` and ``api._session``. Once it calls
:meth:`~gateway.doors.context.DoorContext.authenticate` and
:meth:`~gateway.doors.context.DoorContext.session` on the context itself,
this module goes.
"""

from __future__ import annotations

from gateway.doors.context import DoorContext


class Api:
    """:class:`~gateway.doors.context.DoorContext`, as gateway.doors.sse.events names it."""

    def __init__(self, ctx: DoorContext) -> None:
        self.node = ctx.node
        self.config = ctx.config
        self._authenticate = ctx.authenticate
        self._session = ctx.session
