"""A session's files: kept, found, read back (docs/protocol.md §2 "Files").

The one place that stores a file and resolves a file reference, for every way
a file comes in: ``POST /sessions/{id}/files``, an inline image or document of
a turn (the REST, AG-UI and AI SDK doors), a tool's image (an MCP tool). Each
file is checked against its type (:func:`gateway.media.check`, in a worker
thread: decoding a 20 MiB image is CPU work), then stored with the session,
content-addressed (gateway.ids.file_id_of), within ``[files] max_per_session``
and ``[limits] max_file_mb_per_key`` (gateway.store.base.Store.put_file: one
atomic step, across nodes).

A file is its session's: a reference to another session's file, another
key's included, is no file here (the store is keyed by session). What the
wire carries is a :data:`~gateway.protocol.shapes.FileBlock`, never the
bytes; a provider gets the bytes from :meth:`Files.read` when it builds a
request, through a small cache (a turn's calls send the same files again).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import trio

from gateway import media
from gateway.config import Config
from gateway.errors import ApiError, StoreError, unavailable
from gateway.ids import file_id_of, now_ms
from gateway.protocol.http import Base64Source, DocumentInput, ImageInput, TurnBlock
from gateway.protocol.shapes import (
    AudioBlock,
    ContentBlock,
    DocumentBlock,
    FileBlock,
    ImageBlock,
    ToolResultBlock,
)
from gateway.store.base import FileRecord, FileRefusal, Store

CACHE_BYTES = 64 * 1024 * 1024
"""The bytes :meth:`Files.read` keeps in memory, most recently used first."""

_CHECKS = trio.CapacityLimiter(2)  # decoding images: CPU-bound, at most two at once

Refuse = Callable[[FileBlock], str | None]
"""What a turn's model cannot take: a reason (422 ``unsupported_content``), or ``None``."""


def block_of(rec: FileRecord) -> FileBlock:
    """The block that stands for a file: image, document, or (a tool's) audio."""
    return _block(rec.file_id, rec.media_type, rec.size)


def _block(file_id: str, media_type: str, size: int) -> FileBlock:
    if media_type in media.IMAGE_TYPES:
        return ImageBlock(file_id, media_type, size)
    if media_type.startswith("audio/"):
        return AudioBlock(file_id, media_type, size)
    return DocumentBlock(file_id, media_type, size)


def admit(block: FileBlock, kind: str, where: str, refuse: Refuse | None) -> FileBlock:
    """``block`` if a turn's block of ``kind`` may be it and its model takes it.

    Raises:
        ApiError: 422 ``invalid_body`` (a file of the other kind), ``unsupported_content``.
    """
    if block.__struct_config__.tag != kind:
        raise ApiError(
            422, "invalid_body", f"{where}: {block.file_id} is {block.media_type}, not an {kind}"
        )
    reason = refuse(block) if refuse is not None else None
    if reason is not None:
        raise ApiError(422, "unsupported_content", f"{where}: {reason}")
    return block


def inline_block(file_id: str, media_type: str, data: bytes) -> FileBlock:
    """The block an inline file will be once kept: content-addressed, its id is known
    (``file_id``, the caller's: worked out where its base64 was decoded, off the event
    loop for a large file)."""
    return _block(file_id, media_type, len(data))


def file_ids(blocks: Iterable[ContentBlock]) -> list[str]:
    """Every file a list of blocks names, tool results' included, in order, once each."""
    found: dict[str, None] = {}
    for b in blocks:
        if isinstance(b, ImageBlock | DocumentBlock | AudioBlock):
            found[b.file_id] = None
        elif isinstance(b, ToolResultBlock) and b.files:
            found.update((f.file_id, None) for f in b.files)
    return list(found)


class Files:
    """The files of every session of a node (module docstring).

    Args:
        store: where files are kept.
        config: ``[files]`` and ``[limits] max_file_mb_per_key``.
    """

    def __init__(self, store: Store, config: Config) -> None:
        self._store = store
        self._files = config.files
        self._quota = config.limits.max_file_mb_per_key * 1024 * 1024
        self._cache: OrderedDict[tuple[str, str], tuple[str, bytes]] = OrderedDict()
        self._cached = 0

    async def upload(
        self, session_id: str, owner: str, media_type: str, data: bytes, *, checked: bool = True
    ) -> FileRecord:
        """Check ``data`` as a file of ``media_type`` and keep it with the session.

        ``checked=False`` keeps a tool's file (audio included) with no type check:
        the model never sent it, a tool did; or a file :meth:`check` passed already
        (a turn's inline file, a door's). Either way within the limits.

        Raises:
            ApiError: 413 ``file_too_large``, 415 ``unsupported_media_type``,
                422 ``invalid_file``, 404 ``session_not_found`` (deleted meanwhile),
                409 ``too_many_files``, 429 ``quota_exceeded``.
            Refused: 503 ``store_unavailable``.
        """
        digest = await self._checked(media_type, data, checked=checked, digest=True)
        rec = FileRecord(
            file_id_of(digest), session_id, owner, digest, media_type, len(data), now_ms()
        )
        try:
            put = await self._store.put_file(
                rec,
                data,
                max_per_session=self._files.max_per_session,
                owner_quota_bytes=self._quota,
            )
        except StoreError as exc:
            raise unavailable(exc) from None
        if isinstance(put, FileRecord):
            return put
        raise _refusal(put, session_id, self._files.max_per_session, self._quota)

    async def check(self, media_type: str, data: bytes) -> None:
        """What :meth:`upload` checks of a file, without keeping it: a door checks the
        files of a message before the session they go to is made, so a refused
        message makes nothing (gateway.doors.attachments), then uploads them
        ``checked=False``.

        Raises:
            ApiError: 413 ``file_too_large``, 415 ``unsupported_media_type``,
                422 ``invalid_file``.
        """
        await self._checked(media_type, data, checked=True, digest=False)

    async def _checked(self, media_type: str, data: bytes, *, checked: bool, digest: bool) -> str:
        """The file's SHA-256 (``digest``; else ""), once it is within ``[files] max_bytes``
        and (``checked``) of its type: CPU work on up to ``max_bytes``, off the event loop.
        A door's :meth:`check` hashes nothing: its upload, next, does."""
        if len(data) > self._files.max_bytes:
            raise ApiError(
                413, "file_too_large", f"The file is over {self._files.max_bytes} bytes."
            )
        pixels = self._files.max_image_pixels

        def work() -> str:
            if checked:
                media.check(media_type, data, max_pixels=pixels)
            return hashlib.sha256(data).hexdigest() if digest else ""

        return await trio.to_thread.run_sync(work, limiter=_CHECKS)

    async def get(self, session_id: str, file_id: str) -> tuple[FileRecord, bytes]:
        """A file of the session and its bytes (404 ``file_not_found`` otherwise)."""
        try:
            found = await self._store.get_file(session_id, file_id)
        except StoreError as exc:
            raise unavailable(exc) from None
        if found is None:
            raise ApiError(404, "file_not_found", f"{file_id[:80]!r} is not a file of this session")
        return found

    async def records(self, session_id: str) -> dict[str, FileRecord]:
        """The session's files by id, without their bytes."""
        try:
            return {r.file_id: r for r in await self._store.files_of(session_id)}
        except StoreError as exc:
            raise unavailable(exc) from None

    async def resolve(
        self,
        session_id: str,
        owner: str,
        blocks: Sequence[TurnBlock],
        refuse: Refuse | None = None,
    ) -> list[ContentBlock]:
        """A turn's blocks as stored: each file named by id checked to be the session's,
        each inline one kept; what the model cannot take refused. Every block is
        checked, an inline file's bytes included (:meth:`check`), before an inline
        file is kept: a turn refused for one of its blocks keeps none of its files.

        Raises:
            ApiError: 422 ``unknown_file`` (not a file of this session),
                ``invalid_body`` (a file block of both or neither ``file_id`` and
                ``source``, or of the wrong kind), ``unsupported_content``; the
                errors of :meth:`upload` for an inline file.
        """
        if not any(isinstance(b, ImageInput | DocumentInput) for b in blocks):
            return list(blocks)  # type: ignore[arg-type]  # text (and other kinds: refused later)
        known = await self.records(session_id)
        out: list[ContentBlock | tuple[str, str, str, bytes]] = []  # or (where, kind, inline)
        for position, b in enumerate(blocks):
            if not isinstance(b, ImageInput | DocumentInput):
                out.append(b)
                continue
            kind = "image" if isinstance(b, ImageInput) else "document"
            where = f"content[{position}]"
            if (b.file_id is None) == (b.source is None):
                raise ApiError(
                    422, "invalid_body", f"{where}: an {kind} block needs a file_id or a source"
                )
            if b.source is not None:
                # Decoding up to 27 MiB of base64, and hashing it: off the event loop.
                file_id, media_type, data = await trio.to_thread.run_sync(_decoded, b.source, where)
                if media_type in media.MEDIA_TYPES:  # else check's 415
                    admit(inline_block(file_id, media_type, data), kind, where, refuse)
                await self.check(media_type, data)  # its bytes are one of its block's checks
                out.append((where, kind, media_type, data))  # kept once every block is checked
            elif (found := known.get(b.file_id or "")) is not None:
                out.append(admit(block_of(found), kind, where, refuse))
            else:
                raise ApiError(
                    422,
                    "unknown_file",
                    f"{where}: {str(b.file_id)[:80]!r} is not a file of this session "
                    "(POST /sessions/{id}/files first)",
                )
        return [
            admit(
                block_of(await self.upload(session_id, owner, *b[2:], checked=False)),
                b[1],
                b[0],
                refuse,
            )
            if isinstance(b, tuple)
            else b
            for b in out
        ]

    async def read(self, session_id: str, ids: Iterable[str]) -> dict[str, tuple[str, bytes]]:
        """The media type and bytes of each file named (a provider's request); one the
        store no longer has (its session deleted meanwhile) is left out."""
        out: dict[str, tuple[str, bytes]] = {}
        for file_id in ids:
            key = (session_id, file_id)
            if (cached := self._cache.get(key)) is not None:
                self._cache.move_to_end(key)
                out[file_id] = cached
                continue
            try:
                found = await self._store.get_file(session_id, file_id)
            except StoreError as exc:
                raise unavailable(exc) from None
            if found is not None:
                rec, data = found
                out[file_id] = self._remember(key, (rec.media_type, data))
        return out

    def forget(self, session_ids: Iterable[str]) -> None:
        """Drop the cached bytes of deleted sessions."""
        gone = set(session_ids)
        for key in [k for k in self._cache if k[0] in gone]:
            self._cached -= len(self._cache.pop(key)[1])

    def _remember(self, key: tuple[str, str], entry: tuple[str, bytes]) -> tuple[str, bytes]:
        if len(entry[1]) <= CACHE_BYTES // 4:
            if (before := self._cache.pop(key, None)) is not None:  # read at once by two calls
                self._cached -= len(before[1])
            self._cache[key] = entry
            self._cached += len(entry[1])
            while self._cached > CACHE_BYTES:
                _, dropped = self._cache.popitem(last=False)
                self._cached -= len(dropped[1])
        return entry


def _decoded(source: Base64Source, where: str) -> tuple[str, str, bytes]:
    """An inline file's id, media type, read as an upload's ``Content-Type`` is (parameters
    dropped, lower case), and bytes (422 ``invalid_body`` for bad base64)."""
    try:
        data = base64.b64decode(source.data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "invalid_body", f"{where}: source.data is not base64") from None
    return (
        file_id_of(hashlib.sha256(data).hexdigest()),
        media.media_type_of(source.media_type),
        data,
    )


def _refusal(why: FileRefusal, session_id: str, most: int, quota: int) -> ApiError:
    if why == "session_not_found":
        return ApiError(404, "session_not_found", f"session {session_id} not found")
    if why == "too_many_files":
        return ApiError(
            409, "too_many_files", f"the session holds {most} files ([files] max_per_session)"
        )
    return ApiError(
        429,
        "quota_exceeded",
        f"this key's files would pass {quota // (1024 * 1024)} MiB "
        "([limits] max_file_mb_per_key); delete sessions to free room",
    )
