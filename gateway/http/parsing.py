"""What a handler reads from a request: its JSON body, its query, a user's content.

Each refusal is an :class:`~gateway.errors.ApiError` with the status PROTOCOL
section 2 gives it: 400 malformed JSON or a query that is no integer, 415 a
POST not declared ``application/json``, 422 a body or query out of its schema.
The router (gateway.http.router) checks the content type and the query's
names before the handler runs; the handlers decode the rest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

import msgspec

from gateway.errors import ApiError
from gateway.http.openapi import Operation
from gateway.http.server import Request
from gateway.protocol.http import DocumentInput, ImageInput, TurnBlock
from gateway.protocol.shapes import ContentBlock, TextBlock

T = TypeVar("T")


def decode_optional(req: Request, type_: type[T]) -> T | None:
    """The body as ``type_``, or ``None`` for an empty body."""
    return decode(req, type_) if req.body.strip() else None


def decode(req: Request, type_: type[T]) -> T:
    """The body as ``type_``: 400 for malformed JSON, 422 for a schema violation."""
    if not req.body.strip():
        raise ApiError(400, "invalid_json", "the request body is empty; JSON expected")
    try:
        return msgspec.json.decode(req.body, type=type_)
    except msgspec.ValidationError as exc:
        raise ApiError(422, "invalid_body", str(exc)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        # msgspec raises UnicodeDecodeError for invalid UTF-8 inside a string.
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # docs/protocol.md §2: a 4xx however deep the input, never a 500
        raise ApiError(400, "invalid_json", "the body is nested too deeply to decode") from None


def json_content_type(req: Request) -> None:
    """415 ``unsupported_media_type`` unless the POST says ``Content-Type: application/json``.

    Parameters (``; charset=utf-8``) are allowed, the type compares
    case-insensitively; an empty body needs it too (docs/protocol.md §15: a
    browser sends an empty ``text/plain`` POST cross-site without a preflight).
    """
    declared = req.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != "application/json":
        shown = f"{declared[:100]!r}" if declared else "none"
        raise ApiError(
            415,
            "unsupported_media_type",
            f"a POST needs Content-Type: application/json (got {shown}; docs/protocol.md §15)",
        )


def body_content_type(req: Request, raw_types: tuple[str, ...]) -> None:
    """A POST's ``Content-Type``: JSON, or one of ``raw_types`` where the route takes a raw
    body (a file, docs/protocol.md §2 "Files"); else 415 ``unsupported_media_type``."""
    if not raw_types:
        json_content_type(req)
        return
    declared = req.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() not in raw_types:
        shown = f"{declared[:100]!r}" if declared else "none"
        why = " (an SVG may hold script)" if "svg" in declared.lower() else ""
        raise ApiError(
            415,
            "unsupported_media_type",
            f"a file's Content-Type must be one of {', '.join(raw_types)} "
            f'(got {shown}{why}; docs/protocol.md §2 "Files")',
        )


def known_query(req: Request, operation: Operation) -> None:
    """422 ``invalid_query`` for a query parameter the operation does not take.

    A misspelt ``?limt=5`` would otherwise be ignored without a word, as an
    unknown body field is not (``forbid_unknown_fields``).
    """
    unknown = sorted(set(req.query) - {q.name for q in operation.query})
    if unknown:
        takes = ", ".join(q.name for q in operation.query) or "none"
        raise ApiError(
            422,
            "invalid_query",
            f"unknown query parameter {unknown[0]!r} (this route takes: {takes})",
        )


_INTEGER = re.compile(r"-?[0-9]{1,18}")
"""An integer query parameter as written: ASCII decimal digits, no sign but ``-``, no
``_``, space, other script's digits or base prefix that ``int()`` would take."""


def int_query(req: Request, name: str, *, default: int, low: int, high: int) -> int:
    """The integer query parameter ``name``: 400 if it is no integer, 422 out of range."""
    raw = req.query.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):
        raise ApiError(400, "invalid_query", f"{name} must be an integer, got {raw[:40]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise ApiError(
            422, "invalid_query", f"{name} must be between {low} and {high}, got {value}"
        )
    return value


def bool_query(req: Request, name: str) -> bool:
    """The query parameter ``name``, ``true`` or ``false`` (absent: false); 400
    ``invalid_query`` for anything else (as the SSE door's ``snapshot``)."""
    raw = req.query.get(name, "false")
    if raw not in ("true", "false"):
        raise ApiError(400, "invalid_query", f"{name} must be true or false, got {raw[:40]!r}")
    return raw == "true"


def text_content(text: str) -> list[ContentBlock]:
    """A turn's text as its content: one text block, not empty (422 ``invalid_body``)."""
    if not text:
        raise ApiError(422, "invalid_body", "content must not be empty")
    return [TextBlock(text)]


def user_content(content: str | Sequence[TurnBlock]) -> list[TurnBlock]:
    """A turn's user content as blocks: text, images and documents, not empty (422
    ``invalid_body`` otherwise). The files are resolved next
    (gateway.session.files.Files.resolve)."""
    blocks: list[TurnBlock] = [TextBlock(content)] if isinstance(content, str) else list(content)
    if not blocks or all(isinstance(b, TextBlock) and not b.text for b in blocks):
        raise ApiError(422, "invalid_body", "content must not be empty")
    for b in blocks:
        if not isinstance(b, TextBlock | ImageInput | DocumentInput):
            raise ApiError(
                422,
                "invalid_body",
                "user content blocks must be text, image or document, "
                f"got {b.__struct_config__.tag!r}",
            )
    return blocks
