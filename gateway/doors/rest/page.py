"""The web page (gateway.ui): ``GET /`` and ``GET /ui/NAME``.

Public (it holds no data) and not part of the API document (it is not the
API); its files are read once, on first use, and served with their ETag.
"""

from __future__ import annotations

from gateway import ui
from gateway.errors import ApiError
from gateway.http.server import Request, Response


class Page:
    """The handlers of the web page, and its files once read (module docstring)."""

    def __init__(self) -> None:
        self.files: dict[str, ui.Asset] | None = None  # read on first use

    async def page(self, req: Request) -> Response:
        """``GET /``: the web page (gateway.ui)."""
        return self._serve(req, ui.INDEX)

    async def asset(self, req: Request, name: str) -> Response:
        """``GET /ui/NAME``: a file of the page; 404 for any name that is not one (gateway.ui)."""
        return self._serve(req, name)

    def _serve(self, req: Request, name: str) -> Response:
        if self.files is None:
            self.files = ui.load()
        found = self.files.get(name)
        if found is None:
            raise ApiError(404, "not_found", f"no file {name!r} in the web page")
        if found.fresh(req.headers.get("if-none-match")):
            return Response(304, b"", found.content_type, found.headers())
        return Response(200, found.body, found.content_type, found.headers())
