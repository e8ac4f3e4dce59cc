"""How a model call that failed with an HTTP status is classed (docs/protocol.md sections 5 and 7).

docs/protocol.md §5 lists the classes of ``llm.call_failed.error_class``, and
section 7 says a provider's failure is an ``llm.call_failed`` event with its
class. A body's own error type says it best (the Anthropic provider reads it
by :data:`~gateway.providers.raw.ERROR_CLASSES`); where it says nothing the
provider knows, the status does, by the one table here.
"""

from __future__ import annotations

from collections.abc import Mapping

STATUS_CLASSES: Mapping[int, str] = {529: "overloaded", 429: "rate_limited"}
"""The statuses of the Messages API with an ``error_class`` of their own."""

SERVER_STATUS_CLASSES: Mapping[int, str] = {**STATUS_CLASSES, 503: "overloaded", 408: "timeout"}
"""Those of OpenAI-compatible servers: a local server answers 503 while it
loads a model or with a full queue, and 408 when it gave up waiting."""


def status_class(status: int, classes: Mapping[int, str] = STATUS_CLASSES) -> str:
    """The ``llm.call_failed.error_class`` an HTTP error status amounts to.

    Args:
        status: an HTTP status: an answer's, or the ``code`` of an error chunk.
        classes: the statuses with a class of their own: :data:`STATUS_CLASSES`,
            or :data:`SERVER_STATUS_CLASSES` for an OpenAI-compatible server.

    Returns:
        The class in ``classes``, else ``api_error`` for a 5xx and
        ``invalid_request`` for any other status.
    """
    return classes.get(status) or ("api_error" if status >= 500 else "invalid_request")
