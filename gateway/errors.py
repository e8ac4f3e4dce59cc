"""The gateway's one error family.

Every error the gateway raises on purpose is a :class:`GatewayError`; each
subclass maps to exactly one thing a user sees (§N: docs/protocol.md section N;
reference: docs/reference.md)::

    GatewayError
    ├── ConfigError          bad config file, key, type or range: one line, exit 2 (reference)
    ├── Refused              a request the gateway refuses, by ``code`` (§2); the
    │                        server's table (gateway.http.refusals) gives its HTTP status
    ├── ApiError             an HTTP error body {"error": {"code", "message"}} (§2)
    ├── SubscribeRejected    a ``subscribe_error`` frame; the connection stays open (§3)
    ├── FrameRejected        an ``error`` frame; the connection stays open (§3)
    ├── ProviderError        an ``llm.call_failed`` event with its ``error_class`` (§7)
    ├── ToolError            a ``tool.failed`` event with its ``error_class`` (§5)
    ├── StoreError           the store could not be opened or written
    ├── StartupError         the daemon could not start: one line, exit 1 (reference)
    ├── ShutdownError        the daemon stopped, writes lost: one line, exit 1 (reference)
    └── ClientError          the client library (gateway.client) cannot go on: ``code`` says why

The client library raises :class:`ApiError` for an HTTP error answer,
:class:`SubscribeRejected` and :class:`FrameRejected` for a refused
subscription, and :class:`ClientError` for the rest (gateway.client.stream).

Errors are values that the layer above turns into frames, events or statuses;
none of them ever breaks a stream (docs/protocol.md §7: "errors are events").
"""

from __future__ import annotations

from typing import Self


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @classmethod
    def within(cls, exc: BaseException) -> Self | None:
        """The error of this class ``exc`` is, or that is all an exception group of them holds
        (the first); None for anything else."""
        if isinstance(exc, BaseExceptionGroup):
            match, rest = exc.split(cls)
            if match is None or rest is not None:
                return None
            leaf: BaseException = match
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            exc = leaf
        return exc if isinstance(exc, cls) else None


class ConfigError(GatewayError):
    """The configuration is unusable. ``str()`` is the one line the CLI prints."""


class Refused(GatewayError):
    """A request refused by the domain: what it is (``code``), and why (``message``).

    Raised by the node, the sessions and the cluster link; never an HTTP
    status of its own: the server answers it as its table says
    (gateway.http.refusals: one status per code, docs/protocol.md §2). One
    refused by the node that runs a session crosses the cluster link as a
    typed reply and is raised again as the same refusal on the asking node.

    ``retry_after_s``: the answer's ``Retry-After``, in whole seconds.
    """

    def __init__(self, code: str, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s


class ApiError(GatewayError):
    """An HTTP error answer: ``status`` and the body ``{"error": {"code", "message"}}``."""

    def __init__(
        self, status: int, code: str, message: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = headers  # extra response headers, e.g. ``Allow`` on a 405


class SubscribeRejected(GatewayError):
    """A ``subscribe`` that cannot be honoured; ``code`` is the frame's ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class FrameRejected(GatewayError):
    """A client frame that is refused with an ``error`` frame of this ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ProviderError(GatewayError):
    """A model call failed; ``error_class`` is ``llm.call_failed.error_class``.

    ``context_overflow``: the provider refused the call because its input is
    longer than the model's context (Anthropic's 400 "prompt is too long", an
    OpenAI-compatible server's ``context_length_exceeded``). Its
    ``error_class`` stays ``invalid_request``; the agent loop compacts and
    retries the call once (docs/protocol.md §12, ``trigger: "overflow"``).
    """

    def __init__(self, error_class: str, message: str, *, context_overflow: bool = False) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.context_overflow = context_overflow


class ToolError(GatewayError):
    """A tool failed; ``error_class`` is ``tool.failed.error_class``."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class StoreError(GatewayError):
    """The store could not be opened, read or written."""


class StartupError(GatewayError):
    """The daemon could not start; the message is the one line an operator reads.

    docs/reference.md "Command line": the port is taken, the host is not this
    machine's, the store cannot be opened. Raised by :func:`gateway.app.serve`
    before the readiness line, never after.
    """


class ShutdownError(GatewayError):
    """The daemon stopped, but not everything it had accepted was made durable.

    docs/reference.md "Command line": the store still failed to write when
    its close gave up (gateway.store.group_commit); the message says how many
    writes were lost and why, in the one line an operator reads. Raised by
    the node as the last step of a shutdown.
    """


class ClientError(GatewayError):
    """The client library cannot go on; ``code`` says why, ``str()`` is one line:

    - ``unreachable``: the gateway could not be reached (at the first attempt
      of a stream; on any HTTP call);
    - ``not_a_gateway``: the answer was not the gateway's (a wrong URL);
    - ``stream_refused``: the WebSocket handshake was refused for good (403);
    - ``closed``: a close that says not to reconnect (1009, an unknown code);
    - ``session_deleted``: the stream's session was deleted (a 1000
      ``session_deleted`` close, docs/protocol.md §13);
    - ``gave_up``: ``max_reconnects`` attempts in a row made no progress;
    - ``protocol_violation``: the server made a move the contract does not allow;
    - ``invalid_url``: the base URL is not a URL.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def unavailable(exc: StoreError) -> Refused:
    """The ``store_unavailable`` refusal of a store that did not answer (docs/protocol.md §2).

    One answer wherever it is raised: a route's handler (gateway.http.server)
    or an operation between nodes (gateway.node).
    """
    return Refused("store_unavailable", f"{exc}; the request may be retried", retry_after_s=1)


def first_leaf(exc: BaseException) -> BaseException:
    """The first error inside nested exception groups (one line for a log or a message)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
