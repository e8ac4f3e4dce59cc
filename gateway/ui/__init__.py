"""The web page (docs/clients.md): its files, and how the gateway serves them.

The page is plain HTML, CSS and ES modules in this directory, served as they
are: no build step, no CDN, nothing fetched from anywhere but the gateway
itself, so it works offline. ``GET /`` is ``index.html``; ``GET /ui/NAME`` is
any other file here (``app.js``, ``reducer.js``, ``style.css``, ...). The page is
public, as ``/healthz`` is: it holds no data; everything it shows comes from the
HTTP API and the session stream, with the API key the user types in
(docs/protocol.md sections 2 and 3).

Serving rules (gateway.doors.rest.page: ``page`` and ``asset``):

- **Only the files that are here.** The set of files is read once, when first
  asked for; a name is served only if it is one of them (a plain file name with
  a known extension). Nothing is ever joined to a path from the request, so
  ``..``, ``%2e%2e``, ``/`` or ``\\`` in a name is simply an unknown name: 404.
- **Types.** ``text/html``, ``text/javascript`` (a module script needs a
  JavaScript type), ``text/css``, ``image/svg+xml``, ``image/png``, each with
  ``X-Content-Type-Options: nosniff``.
- **Caching.** The names carry no version, so a browser must not keep an old
  ``app.js`` beside a new ``reducer.js`` after an upgrade: ``Cache-Control:
  no-cache`` (always revalidate) with a strong ``ETag`` (a hash of the bytes);
  ``If-None-Match`` with it gets 304 and no body.
- **The page's own policy.** ``index.html`` carries a Content-Security-Policy
  that allows scripts, styles and images from the gateway only (and ``blob:``
  images: a file of a session is fetched with the key and shown from a blob
  URL, never as HTML) and connections to it and its WebSocket, and no framing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
    "png": "image/png",
}
"""What each served extension is (anything else here, this module included, is not served)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\.(" + "|".join(CONTENT_TYPES) + ")")

INDEX = "index.html"

# ws: and wss: besides 'self': the stream may be on the configured public URL
# (docs/protocol.md §2, ws_url), which a browser does not count as 'self'.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self' ws: wss:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True, slots=True)
class Asset:
    """One file of the page, ready to send."""

    name: str
    body: bytes
    content_type: str
    etag: str  # strong, quoted: '"<16 hex digits of sha-256>"'

    def headers(self) -> list[tuple[str, str]]:
        """The headers of its 200 and 304 answers (module docstring)."""
        headers = [
            ("ETag", self.etag),
            ("Cache-Control", "no-cache"),
            ("X-Content-Type-Options", "nosniff"),
        ]
        if self.name == INDEX:
            headers += [
                ("Content-Security-Policy", PAGE_POLICY),
                ("Referrer-Policy", "no-referrer"),
            ]
        return headers

    def fresh(self, if_none_match: str | None) -> bool:
        """Whether the client's copy is this one (RFC 9110 13.1.2: weak comparison)."""
        if if_none_match is None:
            return False
        tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
        return "*" in tags or self.etag in tags


def load() -> dict[str, Asset]:
    """Every file of the page by name (the installed package's copy)."""
    assets: dict[str, Asset] = {}
    for entry in resources.files(__name__).iterdir():
        match = _NAME.fullmatch(entry.name)
        if match is None or not entry.is_file():
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        assets[entry.name] = Asset(entry.name, body, CONTENT_TYPES[match.group(1)], etag)
    return assets
