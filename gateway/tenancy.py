"""The tenants: API keys, the owner of a session, the limits per key (docs/protocol.md §2).

Below the node, which counts against the limits and keeps each session's
owner; the HTTP side (gateway.http.boundary) reads a request's key with
:class:`ApiKeys`, and the doors see sessions as :func:`sees` says.

Where API keys are configured, every HTTP route but ``/healthz`` needs
``Authorization: Bearer KEY``, and "a session belongs to the key that created
it: to any other key it does not exist (404 on every route of it, absent from
``GET /sessions``)". This module holds the three parts of that:

- **The keys** (:class:`ApiKeys`): ``[auth] api_keys`` plus the keys of
  ``[auth] api_keys_file`` (one a line, blank lines and ``#`` lines ignored),
  read at start-up (an unreadable file is a :class:`~gateway.errors.StartupError`)
  and again on SIGHUP (a file that became unreadable or bad keeps the keys loaded
  before, and says so in the log). Auth is on as soon as either is set: a keys
  file that holds no key refuses every request, it never opens the gateway.
- **The owner** of a session is a *key id*, :func:`key_id`: the first 16 hex
  digits of the key's SHA-256. The store keeps that, never the key, so a leaked
  database leaks no key. :data:`NO_OWNER` (``""``) is the owner of the sessions
  created while no key was configured: :func:`sees` shows them to every key
  (they were created without auth, hence belong to nobody).
- **The limits** of ``[limits]`` (:class:`Limits`, 0 = none): open streams in
  total and per key (503 ``over_capacity`` before the upgrade), sessions a key
  owns (429 ``too_many_sessions``), turns a key submits in any 60 s (429
  ``rate_limited`` with ``Retry-After``). Without keys every client is the one
  tenant :data:`NO_OWNER`, and the per-key limits apply to it as a whole.
  On one node they are counted here, in memory; on several nodes sharing
  Redis the per-key ones are counted there, for the whole deployment
  (:meth:`Limits.share`, gateway.node.limits); ``max_connections`` is each
  node's own.
  A ``delegate`` worker's session and its turn count against its owner's
  limits like a client's (docs/protocol.md §15); over them the tool fails
  ``limit`` instead of a 429 (:meth:`gateway.session.session.Session.spawn_worker`).
  The limits of one turn and of a session's size are the session's own
  (:mod:`gateway.session.agent`, :mod:`gateway.session.session`).

Time is Trio's clock (``trio.current_time``), so the turn window is tested
under ``MockClock``.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Protocol

import trio

from gateway.config import AuthConfig, LimitsConfig
from gateway.errors import ApiError, StartupError

log = logging.getLogger("gateway.auth")


def _event(logger: logging.Logger, level: int, name: str, message: str, **fields: object) -> None:
    """Log the event ``name`` with its fields, as gateway.logs formats them (docs/operating.md)."""
    logger.log(level, message, extra={"event": name, "fields": fields})


NO_OWNER = ""
"""The owner of a session created while no API key was configured: visible to every key."""

TURN_WINDOW_S = 60.0
"""The window of ``turns_per_minute_per_key``: a sliding minute."""


def key_id(key: str) -> str:
    """The id of an API key, as a session's owner is stored: 16 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def sees(caller: str | None, owner: str) -> bool:
    """Whether a caller (a key id, or ``None`` where no keys are configured) sees a session.

    docs/protocol.md §2: a session of another key does not exist for the caller.
    """
    return caller is None or owner in (NO_OWNER, caller)


# --- the keys -------------------------------------------------------------------


class KeysFileError(Exception):
    """The keys file cannot be read or holds something that is not a key; the message says which."""


def parse_keys(text: str, path: str) -> tuple[str, ...]:
    """The keys of a keys file: one a line, whitespace stripped, blank and ``#`` lines ignored.

    Raises:
        KeysFileError: a line that is not one key (inner whitespace, a control or
            non-ASCII character: such a key could not be sent in a header), naming
            the file and the line number, never the line itself (it may be a key).
    """
    keys: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not all("!" <= c <= "~" for c in line):
            raise KeysFileError(
                f"api_keys_file {path!r} line {number}: a key is one word of visible"
                " ASCII characters (no spaces, no control or non-ASCII characters)"
            )
        keys.append(line)
    return tuple(keys)


def read_keys_file(path: str) -> tuple[str, ...]:
    """Read and parse the keys file (blocking: at start-up, or in a worker thread).

    Raises:
        KeysFileError: the file is missing, unreadable, not UTF-8, or holds a bad line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise KeysFileError(f"cannot read api_keys_file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KeysFileError(f"cannot read api_keys_file {path!r}: it is not UTF-8 text") from None
    return parse_keys(text, path)


class ApiKeys:
    """The accepted API keys: ``[auth] api_keys`` plus those of ``api_keys_file``.

    Args:
        config: the ``[auth]`` section.

    Raises:
        StartupError: the keys file cannot be read or holds a bad line (one line,
            docs/reference.md "Command line": any other start-up failure).
    """

    def __init__(self, config: AuthConfig) -> None:
        self.path = config.api_keys_file
        self.enabled = bool(config.api_keys or config.api_keys_file)
        self._config_keys = tuple(config.api_keys)
        self._file_keys: tuple[str, ...] = ()
        if self.path:
            try:
                self._file_keys = read_keys_file(self.path)
            except KeysFileError as exc:
                raise StartupError(str(exc)) from None
        self._ids: dict[bytes, str] = {}
        self._index()
        if self.path:
            _event(
                log,
                logging.INFO,
                "api_keys_loaded",
                f"api keys: {len(self._file_keys)} from api_keys_file {self.path!r},"
                f" {len(self)} accepted in all",
                path=self.path,
                file_keys=len(self._file_keys),
                keys=len(self),
            )
        self._warn_if_empty()

    def _index(self) -> None:
        # Looked up by the key's full digest: the lookup compares digests, never keys.
        self._ids = {
            hashlib.sha256(key.encode()).digest(): key_id(key)
            for key in (*self._config_keys, *self._file_keys)
        }

    def _warn_if_empty(self) -> None:
        if self.enabled and not self._ids:
            _event(
                log,
                logging.WARNING,
                "api_keys_empty",
                "api keys: none accepted; every request but /healthz is refused",
            )

    def __len__(self) -> int:
        """How many distinct keys are accepted."""
        return len(self._ids)

    def identify(self, key: str) -> str | None:
        """The key id of an accepted key, ``None`` for any other string."""
        return self._ids.get(hashlib.sha256(key.encode()).digest())

    async def reload(self) -> bool:
        """Re-read ``api_keys_file`` (on SIGHUP); whether the new keys are in force.

        A file that cannot be read, or holds a bad line, keeps the keys loaded
        before: an error is logged and nothing changes (a half-written file must
        not lock everyone out, nor let anyone in).
        """
        if not self.path:
            _event(
                log,
                logging.INFO,
                "api_keys_reload_skipped",
                "api keys: SIGHUP, but no api_keys_file is configured; nothing to re-read",
            )
            return False
        try:
            keys = await trio.to_thread.run_sync(read_keys_file, self.path)
        except KeysFileError as exc:
            _event(
                log,
                logging.ERROR,
                "api_keys_reload_failed",
                f"api keys: {exc}; keeping the {len(self)} keys loaded before",
                path=self.path,
                error=str(exc),
                keys=len(self),
            )
            return False
        self._file_keys = keys
        self._index()
        _event(
            log,
            logging.INFO,
            "api_keys_reloaded",
            f"api keys: re-read api_keys_file {self.path!r}: {len(keys)} keys from it,"
            f" {len(self)} accepted in all",
            path=self.path,
            file_keys=len(keys),
            keys=len(self),
        )
        self._warn_if_empty()
        return True


# --- the limits -------------------------------------------------------------------


class SharedLimits(Protocol):
    """The per-key counts of a deployment of several nodes (gateway.node.limits, on Redis).

    Each check counts in the same step, for every node at once; ``Refused``
    ``store_unavailable`` where the shared store does not answer.
    """

    async def reserve_session(self, key: str, session_id: str, limit: int) -> int | None:
        """Count a session being created: ``None``, or how many the key owns (refused)."""
        ...

    async def unreserve_session(self, key: str, session_id: str) -> None:
        """End the count of a creation: it failed, or its record is durable."""
        ...

    async def turn(self, key: str, limit: int, *, count: bool) -> tuple[str | None, float]:
        """Look at (or count) a turn: ``(token, 0)``, or ``(None, seconds to wait)``."""
        ...

    async def refund_turn(self, key: str, token: str) -> None:
        """Take back the counted turn ``token``."""
        ...

    async def open_stream(self, key: str, limit: int) -> int | None:
        """Count a stream opening: ``None``, or how many the key has open (refused)."""
        ...

    def close_stream(self, key: str) -> None:
        """A stream counted by :meth:`open_stream` closed."""
        ...


TurnToken = str | float | None
"""What :meth:`Limits.count_turn` counted, for :meth:`Limits.refund_turn` (None: nothing)."""


class Limits:
    """The ``[limits]`` of docs/reference.md (0 = no limit).

    On one node they are counted in memory: every check is synchronous (no
    checkpoint between the check and the count), so two callers racing for
    the last slot cannot both get it. On several nodes sharing Redis, the
    placement hands the three per-key limits to :meth:`share`
    (gateway.node.limits): one Lua script checks and counts each, for the
    whole deployment. ``max_connections`` is always this node's own: it
    protects the process.

    Args:
        config: the ``[limits]`` section.
    """

    def __init__(self, config: LimitsConfig) -> None:
        self.config = config
        self.shared: SharedLimits | None = None
        self.streams = 0
        self.streams_by_key: collections.Counter[str] = collections.Counter()
        self.streams_by_door: collections.Counter[str] = collections.Counter()
        self.sessions_by_key: collections.Counter[str] = collections.Counter()
        self._turns: dict[str, collections.deque[float]] = {}

    def share(self, shared: SharedLimits) -> None:
        """Count the per-key limits for the whole deployment from now on (at start-up)."""
        self.shared = shared

    # --- streams ---

    async def open_stream(self, key: str, door: str) -> Callable[[], None]:
        """Count a stream of ``key`` opening; the release to call once, when it ends.

        ``door`` is what it comes through (``gateway_streams_open``,
        :data:`gateway.metrics.DOORS`).

        Raises:
            ApiError: 503 ``over_capacity``, naming the limit, when ``max_connections``
                (this node's) or ``max_connections_per_key`` is reached.
            Refused: ``store_unavailable``: the shared count could not be read.
        """
        total, per_key = self.config.max_connections, self.config.max_connections_per_key
        if total and self.streams >= total:
            raise ApiError(
                503,
                "over_capacity",
                f"the gateway has its max_connections ({total}) streams open; retry later",
            )
        shared = self.shared if per_key else None
        if shared is None and per_key and self.streams_by_key[key] >= per_key:
            raise _too_many_streams(per_key)
        self.streams += 1  # before any wait: held while the shared count is asked
        self.streams_by_key[key] += 1
        self.streams_by_door[door] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.streams -= 1
            self.streams_by_key[key] -= 1
            self.streams_by_door[door] -= 1
            if not self.streams_by_key[key]:
                del self.streams_by_key[key]
            if shared is not None:
                shared.close_stream(key)

        if shared is not None:
            try:
                refused = await shared.open_stream(key, per_key)
            except BaseException:
                shared = None
                release()
                raise
            if refused is not None:
                shared = None
                release()
                raise _too_many_streams(per_key)
        return release

    # --- sessions ---

    def count_sessions(self, owned: Mapping[str, int]) -> None:
        """Start from the stored sessions each key owns (at start-up)."""
        self.sessions_by_key = collections.Counter(owned)

    def session_deleted(self, key: str) -> None:
        """A session of ``key`` was deleted: its slot is free (in memory; Redis reads the store)."""
        if self.sessions_by_key[key] > 0:
            self.sessions_by_key[key] -= 1

    @asynccontextmanager
    async def new_session(self, key: str, session_id: str) -> AsyncIterator[None]:
        """Count a session of ``key`` being created; uncounted if the block raises.

        Raises:
            ApiError: 429 ``too_many_sessions`` when ``max_sessions_per_key`` is reached.
            Refused: ``store_unavailable``: the shared count could not be read.
        """
        limit = self.config.max_sessions_per_key
        if self.shared is not None and limit:
            owned = await self.shared.reserve_session(key, session_id, limit)
            if owned is not None:
                raise _too_many_sessions(owned, limit)
            try:
                yield
            except BaseException:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await self.shared.unreserve_session(key, session_id)
                raise
            return
        if limit and self.sessions_by_key[key] >= limit:
            raise _too_many_sessions(self.sessions_by_key[key], limit)
        self.sessions_by_key[key] += 1
        try:
            yield
        except BaseException:
            self.sessions_by_key[key] -= 1
            raise

    async def session_stored(self, key: str, session_id: str) -> None:
        """The session :meth:`new_session` counted is durable: the store counts it from now on.

        On Redis its reservation ends here (else it would end by itself, at
        the next check of the key or after its time); nothing to do in memory.
        """
        if self.shared is not None and self.config.max_sessions_per_key:
            await self.shared.unreserve_session(key, session_id)

    # --- turns ---

    async def check_turn(self, key: str) -> None:
        """Refuse a turn of ``key`` over ``turns_per_minute_per_key`` in the last 60 s.

        Only looks: :meth:`count_turn` counts (and checks again).

        Raises:
            ApiError: 429 ``rate_limited`` with ``Retry-After``: the whole seconds
                (at least 1) until the oldest turn of the window leaves it.
            Refused: ``store_unavailable``: the shared count could not be read.
        """
        limit = self.config.turns_per_minute_per_key
        if not limit:
            return
        if self.shared is not None:
            token, wait = await self.shared.turn(key, limit, count=False)
            if token is None:
                raise _rate_limited(limit, wait)
            return
        self._check_turn(key, limit)

    async def count_turn(self, key: str) -> TurnToken:
        """Check and count a turn of ``key`` in one step; what to refund it with.

        Raises:
            ApiError, Refused: as :meth:`check_turn`.
        """
        limit = self.config.turns_per_minute_per_key
        if not limit:
            return None
        if self.shared is not None:
            token, wait = await self.shared.turn(key, limit, count=True)
            if token is None:
                raise _rate_limited(limit, wait)
            return token
        self._check_turn(key, limit)
        now = trio.current_time()
        self._turns.setdefault(key, collections.deque()).append(now)
        return now

    async def refund_turn(self, key: str, token: TurnToken) -> None:
        """Take back the turn :meth:`count_turn` counted for ``key``: it was refused after all."""
        if isinstance(token, str):
            if self.shared is not None:
                await self.shared.refund_turn(key, token)
            return
        window = self._turns.get(key)
        if window and token is not None and token in window:
            window.remove(token)

    def _check_turn(self, key: str, limit: int) -> None:
        window = self._window(key)
        if len(window) >= limit:
            raise _rate_limited(limit, window[0] + TURN_WINDOW_S - trio.current_time())

    def _window(self, key: str) -> collections.deque[float]:
        """The times of ``key``'s turns still inside the window (older ones dropped)."""
        window = self._turns.get(key)
        if window is None:
            return collections.deque()
        horizon = trio.current_time() - TURN_WINDOW_S
        while window and window[0] <= horizon:
            window.popleft()
        if not window:
            del self._turns[key]
        return window


def _too_many_streams(per_key: int) -> ApiError:
    return ApiError(
        503,
        "over_capacity",
        f"this API key has its max_connections_per_key ({per_key}) streams open;"
        " close one or retry later",
    )


def _too_many_sessions(owned: int, limit: int) -> ApiError:
    return ApiError(
        429,
        "too_many_sessions",
        f"this API key owns {owned} sessions, its max_sessions_per_key is {limit}",
    )


def _rate_limited(limit: int, wait: float) -> ApiError:
    """429 ``rate_limited``: ``Retry-After`` is the whole seconds (at least 1) of ``wait``."""
    retry_after = max(1, math.ceil(wait))
    return ApiError(
        429,
        "rate_limited",
        f"this API key submitted its turns_per_minute_per_key ({limit}) turns in the"
        f" last minute; the next is accepted in {retry_after} s",
        headers=(("Retry-After", str(retry_after)),),
    )
