"""The AG-UI door (docs/doors/agui.md): a run is a turn, streamed as server-sent events."""

from __future__ import annotations

from gateway.doors.agui.routes import CANCEL, RUN, STREAM, AguiRoutes
from gateway.doors.context import DoorContext
from gateway.http.router import route


class Door:
    """AG-UI's routes, and what they keep between runs (:class:`AguiRoutes`).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.runs = AguiRoutes(ctx)
        self.routes = (
            route("/agui", "agui", POST=(self.runs.agui_run, RUN)),
            route("/agui/{session_id}/cancel", "agui_cancel", POST=(self.runs.agui_cancel, CANCEL)),
            route(
                "/agui/{session_id}/runs/{run_id}/stream",
                "agui_stream",
                GET=(self.runs.agui_stream, STREAM),
            ),
        )
