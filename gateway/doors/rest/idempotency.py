"""``Idempotency-Key`` on ``POST /sessions``, ``POST .../turns`` and ``POST .../fork``
(docs/protocol.md §13).

The store keeps one record per (owner, key) for 24 h (gateway.store.idempotency:
the state machine and both stores); this module is the HTTP side:

- :func:`key_of`: the header, 1 to 255 printable ASCII characters, else 400
  ``invalid_idempotency_key``;
- :func:`fingerprint`: method, path and the body as canonical JSON (keys
  sorted, no spaces; an empty body is ``{}``), so the same request written
  another way is the same request. The path is in it: a key used on one
  session's turns and then another's is ``idempotency_key_reused``;
- :func:`once`: claim the key, run the request under the target the record
  holds, record a 2xx answer, and let the key go on anything else.

What is recorded: only a 2xx answer (something was made). Any other answer
(a 4xx, a 503 ``shutting_down``, ``store_unavailable``, ``over_capacity``,
a 429) lets the key go with its target kept: a retry runs again, under the
same session or turn id. An attempt holds the key for :func:`hold_ms`
(``commit_timeout_s`` plus twice ``lease_s``, longer than a request's own
limits); a node that dies holding it holds it no longer than that. A retry
that then takes the key over first looks for its target (the session's
record, or a message of the turn): found, it was made before the node died,
and its answer is rebuilt, recorded and answered; else it is made now.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable

import msgspec
import trio

from gateway.doors.context import DoorContext
from gateway.errors import ApiError, StoreError, unavailable
from gateway.http.refusals import http_error
from gateway.http.server import Request, Response
from gateway.ids import now_ms
from gateway.logs import event
from gateway.store.idempotency import Claim

log = logging.getLogger("gateway.server")

HEADER = "idempotency-key"
MAX_KEY_CHARS = 255
SETTLE_TIMEOUT_S = 1.0  # recording an answer or letting a key go: bounded (the hold ends anyway)
REPLAYED = ("Idempotent-Replayed", "true")  # on every answer that is a recorded one


def key_of(req: Request) -> str | None:
    """The request's ``Idempotency-Key``, ``None`` without one.

    Raises:
        ApiError: 400 ``invalid_idempotency_key``: empty, over 255 characters,
            or a character outside printable ASCII (0x20 to 0x7E).
    """
    value = req.headers.get(HEADER)
    if value is None:
        return None
    if not 1 <= len(value) <= MAX_KEY_CHARS or not all(" " <= c <= "~" for c in value):
        raise ApiError(
            400,
            "invalid_idempotency_key",
            f"the Idempotency-Key header must be 1 to {MAX_KEY_CHARS} printable ASCII characters",
        )
    return value


def fingerprint(method: str, path: str, body: bytes) -> str:
    """The digest of a request: method, path, canonical JSON body (module docstring)."""
    try:
        canonical = msgspec.json.encode(msgspec.json.decode(body or b"{}"), order="sorted")
    except msgspec.DecodeError:
        canonical = body  # not JSON: the request is refused anyway, and not recorded
    text = f"{method} {path}\n".encode() + canonical
    return hashlib.sha256(text).hexdigest()


def hold_ms(ctx: DoorContext) -> int:
    """How long an attempt holds its key (module docstring)."""
    store = ctx.config.store
    return round((store.commit_timeout_s + 2 * store.lease_s) * 1000)


Run = Callable[[str], Awaitable[Response]]
"""Make the request's thing under the given target id; its answer."""
Find = Callable[[str], Awaitable[Response | None]]
"""The answer of a target made before (a node died before recording it), or ``None``."""


async def once(
    ctx: DoorContext, req: Request, owner: str, new_target: str, run: Run, find: Find
) -> Response:
    """Answer ``req`` at most once per key (module docstring); without a key, ``run`` it."""
    key = key_of(req)
    if key is None:
        return await run(new_target)
    store = ctx.node.store
    holder = secrets.token_hex(8)
    claim = Claim(fingerprint(req.method, req.path, req.body), new_target, holder, hold_ms(ctx))
    try:
        with trio.fail_after(ctx.config.store.commit_timeout_s):  # a store that hangs: 503
            claimed = await store.claim_request(owner, key, claim, now_ms())
    except trio.TooSlowError:
        exc = StoreError("the store did not answer within commit_timeout_s")
        raise http_error(unavailable(exc)) from None
    except StoreError as exc:
        raise http_error(unavailable(exc)) from None
    record = claimed.record
    holder = record.holder  # the store may have qualified it (SQLite: its process)
    match claimed.outcome:
        case "reused":
            raise ApiError(
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was used with another request (method, path or body)",
            )
        case "in_use":
            raise ApiError(
                409,
                "idempotency_key_in_use",
                "a request with this Idempotency-Key is still in progress; retry",
                headers=(("Retry-After", "1"),),
            )
        case "answered":
            ctx.node.metrics.idempotent_replays.inc()
            return Response(record.status, record.body, headers=[REPLAYED])
    try:
        # Taken over: what the attempt before may have made is looked for first.
        found = await find(record.target) if claimed.outcome == "taken" else None
        if found is not None:  # made before its node died: answered now
            await _settle(ctx, owner, key, holder, found)
            ctx.node.metrics.idempotent_replays.inc()
            found.headers.append(REPLAYED)
            return found
        answer = await run(record.target)
    except BaseException:
        with trio.CancelScope(shield=True):
            await _settle(ctx, owner, key, holder, None)
        raise
    await _settle(ctx, owner, key, holder, answer)
    return answer


async def _settle(
    ctx: DoorContext, owner: str, key: str, holder: str, answer: Response | None
) -> None:
    """Record a 2xx ``answer``; let the key go (target kept) on anything else.

    A store that does not answer within :data:`SETTLE_TIMEOUT_S` (one that
    fails: the SQLite store's writer holds it while it retries) is logged, not
    raised: the attempt's hold then runs out, and a retry finds what was made
    (module docstring).
    """
    status = answer.status if answer is not None and 200 <= answer.status < 300 else None
    body = answer.body if answer is not None and status is not None else b""
    try:
        with trio.fail_after(SETTLE_TIMEOUT_S):
            await ctx.node.store.settle_request(owner, key, holder, status, body)
    except (StoreError, trio.TooSlowError) as exc:
        event(
            log, logging.WARNING, "idempotency_not_recorded",
            f"the answer of an Idempotency-Key was not recorded: {str(exc) or 'no answer in time'}",
            error=str(exc),
        )  # fmt: skip
