"""The files of a user message sent through a door: data URLs and the gateway's own URLs.

docs/protocol.md §2 "Files"; the AI SDK's ``file`` parts (docs/doors/aisdk.md
"Files") and AG-UI's media parts (docs/doors/agui.md "Files"). Such a front
end names a file by URL, and the gateway takes two kinds:

- a ``data:`` URL (``data:image/png;base64,...``, what ``useChat`` makes of a
  picked file): decoded, checked as ``POST /sessions/{id}/files`` checks a
  file, and kept as a file of the session;
- a URL the gateway itself served for a file of *this* session: the path
  ``/sessions/{id}/files/{file_id}``, relative or absolute (any host: the
  path says which file, and only a file of the session the message goes to
  is one; under the path of ``[server] public_url`` when it has one, as
  :func:`file_url` gives it): that file.

Any other URL is 422 ``unsupported_file_url``: the gateway fetches nothing
from the network (a URL a client gives it is no reason to open a connection:
a server-side request forgery, and bytes no check has seen). A file of another
session, by its URL, is 422 ``unknown_file``, as its id is on ``POST
.../turns``.

A message is read in two steps. :func:`parse` (pure) reads its parts
and decodes its data URLs, and :func:`check` checks their bytes, both before
the session the message goes to is made, so a refused message makes nothing;
:func:`stored` keeps the files with the session and answers the turn's
content blocks, through :meth:`gateway.session.files.Files.resolve` as every
turn's files are (file ids checked, what the model cannot take refused).
:func:`file_url` is the URL the doors give back for a file. A message
carrying more than :data:`OFF_LOOP_BYTES` is read (base64 decoded, hashed) by
:func:`read` in a worker thread, as ``POST /sessions/{id}/files`` checks its
bytes: 20 MiB of base64 decoded and hashed on the event loop held every other
client of the node for tens of milliseconds.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from gateway import media
from gateway.doors.context import DoorContext
from gateway.errors import ApiError
from gateway.ids import file_id_of
from gateway.protocol.http import DocumentInput, ImageInput, TurnBlock
from gateway.protocol.shapes import ContentBlock, TextBlock
from gateway.session.files import Files, Refuse, admit, block_of, inline_block
from gateway.session.session import Session

_FILE_PATH = re.compile(r"/sessions/([A-Za-z0-9_-]{1,128})/files/([A-Za-z0-9_-]{1,80})")
"""The path of ``GET /sessions/{id}/files/{file_id}``."""

OFF_LOOP_BYTES = 64 * 1024
"""A message whose request is larger than this is read in a worker thread (:func:`read`)."""


def file_url(base: str, session_id: str, file_id: str) -> str:
    """The URL of a file of a session, as the doors give it back: the file route's path,
    after ``[server] public_url`` when one is set (``base``), else relative."""
    return f"{base.rstrip('/')}/sessions/{session_id}/files/{file_id}"


@dataclass(frozen=True)
class Inline:
    """A file sent in the message itself (a data URL, base64): its bytes, not yet kept."""

    media_type: str
    data: bytes
    kind: str  # "image" or "document": its block
    file_id: str = field(init=False)

    def __post_init__(self) -> None:  # content-addressed: the id it will have once kept
        object.__setattr__(self, "file_id", file_id_of(hashlib.sha256(self.data).hexdigest()))


@dataclass(frozen=True)
class Served:
    """A file of the session, named by its URL (or its id)."""

    file_id: str
    kind: str | None  # as the part says ("image", "document"); None: the file's own type


Attachment = Inline | Served


@dataclass
class Sent:
    """A user message as a door read it: its text and its files, in their order."""

    parts: list[str | Attachment]

    @property
    def text(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def file_ids(self) -> list[str]:
        """The files it names, in order (an inline one by the id it will have)."""
        return [p.file_id for p in self.parts if not isinstance(p, str)]

    def empty(self) -> bool:
        return not self.text and not self.file_ids


async def read(make: Callable[[], Sent], size: int) -> Sent:
    """``make()``, which reads a message (its data URLs decoded, their bytes hashed):
    in a worker thread when its request has more than :data:`OFF_LOOP_BYTES`
    (``size``), so no other client waits for it (module docstring)."""
    if size <= OFF_LOOP_BYTES:
        return make()
    return await trio.to_thread.run_sync(make)


def kind_of(media_type: str, declared: str | None, where: str) -> str:
    """The block a file of ``media_type`` is: what the part declared must fit it."""
    kind = media.kind_of(media_type)
    if declared is not None and declared != kind:
        raise ApiError(422, "invalid_body", f"{where}: a {media_type} file is no {declared}")
    return kind


def data_url(url: str, declared_type: str | None, where: str) -> tuple[str, bytes]:
    """The media type and bytes of a ``data:`` URL (RFC 2397).

    Its media type is the URL's (parameters such as ``charset`` dropped), else
    the part's; both given, they must agree. The type must be one the gateway
    takes (415 ``unsupported_media_type``, an SVG's included).

    Raises:
        ApiError: 422 ``invalid_body`` (not a data URL, bad base64, the types
            disagree), 415 ``unsupported_media_type``.
    """
    head, comma, payload = url[5:].partition(",")
    if not comma:
        raise ApiError(422, "invalid_body", f"{where}: a data: URL needs a ',' before its data")
    params = head.split(";")
    encoded = len(params) > 1 and params[-1].strip().lower() == "base64"
    media_type = media.media_type_of(params[0])
    declared = media.media_type_of(declared_type) if declared_type else ""
    if media_type and declared and media_type != declared:
        raise ApiError(
            422,
            "invalid_body",
            f"{where}: the data: URL is {media_type[:80]!r}, the part says {declared[:80]!r}",
        )
    media_type = media.accepted(media_type or declared)
    if not encoded:
        return media_type, urllib.parse.unquote_to_bytes(payload)
    try:
        return media_type, base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(
            422, "invalid_body", f"{where}: the data: URL's data is not base64"
        ) from None


def served(url: str, session_id: str, where: str, base: str = "") -> str:
    """The file id of a URL the gateway served for a file of ``session_id`` (after
    ``base``'s path, ``[server] public_url``, if the URL is under it).

    Raises:
        ApiError: 422 ``unknown_file`` (a file of another session), 422
            ``unsupported_file_url`` (any other URL: nothing is fetched).
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        parts = None
    ours = parts is not None and parts.scheme.lower() in ("", "http", "https")
    path = parts.path if parts is not None else ""
    prefix = urllib.parse.urlsplit(base).path.rstrip("/")
    if prefix and path.startswith(prefix + "/"):
        path = path[len(prefix) :]
    found = _FILE_PATH.fullmatch(path) if ours else None
    if found is None:
        shown = url[:60] + ("..." if len(url) > 60 else "")
        raise ApiError(
            422,
            "unsupported_file_url",
            f"{where}: {shown!r} is not a file the gateway served; the gateway fetches "
            "nothing from the network: send the file as a data: URL, or POST it to "
            "/sessions/{id}/files and send /sessions/{id}/files/{file_id}",
        )
    if found.group(1) != session_id:
        raise ApiError(
            422, "unknown_file", f"{where}: {found.group(2)!r} is not a file of {session_id}"
        )
    return found.group(2)


def attachment(
    url: str,
    media_type: str | None,
    declared: str | None,
    session_id: str,
    where: str,
    base: str = "",
) -> Attachment:
    """A file part's URL read: a data URL's bytes, or a file of the session (module docstring).

    ``media_type`` is what the part says the file is; ``declared`` the block
    kind the part says (``"image"``, ``"document"``; ``None``: as its type).
    A file of the session is what it was stored as: a type the part gives it
    that the gateway does not take (``image/*``) leaves the file's own to decide.
    ``base`` is ``[server] public_url`` (:func:`served`).
    """
    if url[:5].lower() == "data:":
        kind_type, data = data_url(url, media_type, where)
        return Inline(kind_type, data, kind_of(kind_type, declared, where))
    said = media.media_type_of(media_type or "")
    if declared is None and said in media.MEDIA_TYPES:  # else the file's own type decides
        declared = media.kind_of(said)
    return Served(served(url, session_id, where, base), declared)


def inline(value: str, media_type: str, declared: str | None, where: str) -> Inline:
    """A file sent as plain base64 with its media type (AG-UI's ``data`` source)."""
    kind_type = media.accepted(media.media_type_of(media_type))
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "invalid_body", f"{where}: the data is not base64") from None
    return Inline(kind_type, data, kind_of(kind_type, declared, where))


async def check(
    files: Files, sent: Sent, session_known: bool, new_refuse: Refuse | None = None
) -> None:
    """Check a message's files before its session is made (module docstring): each inline
    one's bytes; when the session does not exist yet, a file named by URL (no file is
    one of it), and what its model cannot take (``new_refuse``, the default agent's).

    Raises:
        ApiError: the errors of :meth:`gateway.session.files.Files.check`; 422
            ``unknown_file``, ``unsupported_content``.
    """
    for i, p in enumerate(sent.parts):
        if isinstance(p, Inline):
            if not session_known:
                admit(
                    inline_block(p.file_id, p.media_type, p.data), p.kind, f"part {i}", new_refuse
                )
            await files.check(p.media_type, p.data)
        elif isinstance(p, Served) and not session_known:
            raise ApiError(422, "unknown_file", f"{p.file_id[:80]!r} is not a file of this session")


async def kept(ctx: DoorContext, session: Session, sent: Sent) -> list[ContentBlock]:
    """:func:`stored` for a door's turn: the session's files, what its model cannot take
    refused (:meth:`gateway.doors.context.DoorContext.file_refusal`)."""
    refuse = ctx.file_refusal(session)
    return await stored(ctx.node.files, session.id, session.record.owner, sent, refuse)


async def stored(
    files: Files, session_id: str, owner: str, sent: Sent, refuse: Refuse | None = None
) -> list[ContentBlock]:
    """The message as a turn's content: its files checked against the session's model
    (and a URL's, to be the session's), then its inline files kept with the session
    (their bytes checked already: :func:`check`), then every file resolved as a
    turn's are (module docstring). A message refused keeps none of its files.

    Raises:
        ApiError: the errors of :meth:`gateway.session.files.Files.upload` and
            :meth:`~gateway.session.files.Files.resolve` (422 ``unknown_file``,
            ``invalid_body``, ``unsupported_content``).
    """
    known = await files.records(session_id) if sent.file_ids else {}
    kinds: list[str] = []
    for i, p in enumerate(sent.parts):
        if isinstance(p, Inline):
            admit(inline_block(p.file_id, p.media_type, p.data), p.kind, f"part {i}", refuse)
            kinds.append(p.kind)
        elif isinstance(p, Served):
            if (rec := known.get(p.file_id)) is None:
                raise ApiError(
                    422, "unknown_file", f"{p.file_id[:80]!r} is not a file of this session"
                )
            kind = p.kind or media.kind_of(rec.media_type)
            admit(block_of(rec), kind, f"part {i}", refuse)
            kinds.append(kind)
    for p in sent.parts:
        if isinstance(p, Inline):
            await files.upload(session_id, owner, p.media_type, p.data, checked=False)
    blocks: list[TurnBlock] = []
    for p in sent.parts:
        if isinstance(p, str):
            if blocks and isinstance(blocks[-1], TextBlock):
                blocks[-1] = TextBlock(blocks[-1].text + p)
            elif p:
                blocks.append(TextBlock(p))
            continue
        kind = kinds.pop(0)
        blocks.append(
            ImageInput(file_id=p.file_id) if kind == "image" else DocumentInput(p.file_id)
        )
    return await files.resolve(session_id, owner, blocks, refuse)
