"""Traces: OpenTelemetry spans of turns, LLM calls and tools (docs/operating.md "Traces").

Optional (``pip install 'gateway[otel]'``) and off unless configured: with
nothing to export, nothing of OpenTelemetry is imported and every hook below
is one test of a module global (:func:`current` is ``None``). The hooks are
called where a turn, an LLM call and a tool start and end, never per event.

Spans follow OpenTelemetry's GenAI semantic conventions:

==========================  ===================  ================================
span                        parent               from - to
==========================  ===================  ================================
``invoke_agent {agent}``    a delegate's tool    ``turn.started`` - its terminal
                            span, else the       event (error on a cancel/error)
                            request's context
                            (``traceparent``),
                            else none
``chat {model}``            the turn             ``llm.call_started`` - the end of
                                                 its message (error on a failure)
``execute_tool {tool}``     the turn             the tool's run - its result
==========================  ===================  ================================

The parents are explicit (Trio tasks do not carry OpenTelemetry's context
from a session's task to another's): spans in flight are held here, by turn
id and by tool use id, while they are open. A worker's turn finds its
parent's tool span by the tool use id its session was created for
(``metadata.delegated_by``); a worker is always made by its parent's node.

A turn asked for over HTTP joins the trace its request came with (standard
W3C ``traceparent``/``tracestate``, read by OpenTelemetry's propagators):
:func:`incoming` holds the request's context while its handler runs,
:func:`carried` hands it to the ``StartTurn`` operation (which travels to the
node that runs the session, gateway.cluster.ops), and the turn keeps it
(``Turn.trace``) until :func:`turn_started` opens its span under it. The
context is a plain ``dict[str, str]`` outside this module, empty when traces
are off: OpenTelemetry is imported here and nowhere else. No HTTP server span
is made: the spans are the GenAI conventions' own.

Which settings win (docs/reference.md ``[telemetry]``): a ``[telemetry]`` key
(the file, then ``GATEWAY_TELEMETRY_*``) over the standard ``OTEL_*``
environment, which fills in what the keys leave empty.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from gateway.config import TelemetryConfig
from gateway.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

__all__ = [
    "Settings",
    "Tracing",
    "call_ended",
    "call_started",
    "carried",
    "current",
    "incoming",
    "install",
    "settings",
    "start",
    "stop",
    "tool_ended",
    "tool_started",
    "turn_ended",
    "turn_started",
    "uninstall",
]

_DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
_FAILED_OUTCOMES = frozenset({"cancelled", "error"})


@dataclass(frozen=True, slots=True)
class Settings:
    """What to export, decided from ``[telemetry]`` and the ``OTEL_*`` environment."""

    endpoint: str  # the OTLP/HTTP traces URL
    service_name: str
    sample_ratio: float
    shutdown_timeout_s: float
    # OTEL_EXPORTER_OTLP_(TRACES_)HEADERS as given: passed to the exporter, which would read
    # them from os.environ, where the daemon takes them out (gateway.environment)
    headers: str = ""


def settings(config: TelemetryConfig, env: Mapping[str, str]) -> Settings | None:
    """The export settings, or ``None`` when nothing is to be exported.

    ``traces = "otlp"`` exports; ``"none"`` never does; ``""`` (the default)
    exports when the environment asks: ``OTEL_TRACES_EXPORTER=otlp``, or an
    ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` with ``OTEL_TRACES_EXPORTER`` unset,
    or ``endpoint`` set; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
    turn that off.

    Raises:
        ConfigError: traces asked for without the ``otel`` extra installed.
    """
    if not _wanted(config, env):
        return None
    if importlib.util.find_spec("opentelemetry.sdk") is None or (
        importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None
    ):
        raise ConfigError(
            "config error: traces are configured ([telemetry] or OTEL_*) but need the otel"
            " extra: pip install 'gateway[otel]'"
        )
    endpoint = config.endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
    if not endpoint and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return Settings(
        endpoint=endpoint or _DEFAULT_ENDPOINT,
        service_name=config.service_name or env.get("OTEL_SERVICE_NAME", "") or "gateway",
        sample_ratio=config.sample_ratio,
        shutdown_timeout_s=config.shutdown_timeout_s,
        headers=env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
        or env.get("OTEL_EXPORTER_OTLP_HEADERS", ""),
    )


def _wanted(config: TelemetryConfig, env: Mapping[str, str]) -> bool:
    if config.traces != "":
        return config.traces == "otlp"
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")}
    exporters.discard("")
    if exporters:
        return "otlp" in exporters
    return bool(
        config.endpoint
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


# --- the tracer in use -----------------------------------------------------------

_active: Tracing | None = None


def current() -> Tracing | None:
    """The tracing in use in this process, ``None`` when traces are off."""
    return _active


def install(tracing: Tracing) -> None:
    """Make ``tracing`` the one the hooks use (:func:`start`; tests, with their own exporter)."""
    global _active
    _active = tracing


def uninstall(tracing: Tracing) -> None:
    """Stop using ``tracing`` (if it is the one in use)."""
    global _active
    if _active is tracing:
        _active = None


def start(chosen: Settings | None) -> Tracing | None:
    """At daemon start: build the OTLP/HTTP exporter and its batch processor, and install them.

    The batch processor's thread is the SDK's; :func:`stop` flushes and ends it.
    """
    if chosen is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": chosen.service_name}),
        sampler=ParentBased(TraceIdRatioBased(chosen.sample_ratio)),
    )
    from opentelemetry.util.re import parse_env_headers

    headers = parse_env_headers(chosen.headers, liberal=True) if chosen.headers else None
    exporter = OTLPSpanExporter(
        endpoint=chosen.endpoint, headers=headers, timeout=chosen.shutdown_timeout_s
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracing = Tracing(provider, chosen.shutdown_timeout_s)
    install(tracing)
    return tracing


async def stop(tracing: Tracing | None) -> None:
    """At daemon stop: flush what is queued and end the processor, within its timeout."""
    if tracing is None:
        return
    uninstall(tracing)
    with trio.CancelScope(shield=True), trio.move_on_after(tracing.shutdown_timeout_s + 1):
        await trio.to_thread.run_sync(tracing.provider.shutdown, abandon_on_cancel=True)


class Tracing:
    """A tracer and the spans it has open (by turn id and by tool use id)."""

    def __init__(self, provider: TracerProvider, shutdown_timeout_s: float = 5.0) -> None:
        from opentelemetry import propagate, trace
        from opentelemetry.trace import Status, StatusCode

        self.provider = provider
        self.shutdown_timeout_s = shutdown_timeout_s
        self.tracer = provider.get_tracer("gateway")
        self._in = trace.set_span_in_context
        self._extract, self._inject = propagate.extract, propagate.inject
        self._fields = frozenset(propagate.get_global_textmap().fields)  # the headers it reads
        self._status, self._error_code = Status, StatusCode.ERROR
        self.turns: dict[str, Span] = {}
        self.calls: dict[str, Span] = {}  # calls in flight: by turn id; a sampling's by call id
        self.tools: dict[str, Span] = {}

    def carrier(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The trace context of a request's (lower-cased) headers, as headers again.

        Read and written by the global propagators (``OTEL_PROPAGATORS``; W3C
        trace context and baggage by default): a malformed ``traceparent`` is
        dropped, so what travels on is always well-formed.
        """
        if not self._fields.intersection(headers):
            return {}
        out: dict[str, str] = {}
        self._inject(out, context=self._extract(headers))
        return out

    def _child(
        self,
        name: str,
        parent: Span | None,
        attributes: dict[str, Any],
        remote: Context | None = None,
    ) -> Span:
        context = self._in(parent) if parent is not None else remote
        return self.tracer.start_span(name, context=context, attributes=attributes)

    def _fail(self, span: Span, error_type: str, why: str) -> None:
        span.set_attribute("error.type", error_type)
        span.set_status(self._status(self._error_code, why or error_type))


def _provider_model(model: str) -> tuple[str, str]:
    """``anthropic:claude-x`` -> (``anthropic``, ``claude-x``)."""
    provider, _, name = model.partition(":")
    return (provider, name) if name else ("", model)


# --- the request's trace context -------------------------------------------------

_incoming: ContextVar[dict[str, str] | None] = ContextVar("gateway_trace_context", default=None)
_NOTHING = nullcontext()  # what a request without a trace context holds


def incoming(headers: Mapping[str, str]) -> AbstractContextManager[None]:
    """While a request's handler runs: the trace context its headers carry (:func:`carried`)."""
    t = _active
    if t is None:
        return _NOTHING
    carrier = t.carrier(headers)
    return _holding(carrier) if carrier else _NOTHING


@contextmanager
def _holding(carrier: dict[str, str]) -> Iterator[None]:
    token = _incoming.set(carrier)
    try:
        yield
    finally:
        _incoming.reset(token)


def carried() -> dict[str, str]:
    """The trace context of the request being handled, to send on with it (``{}``: none)."""
    carrier = _incoming.get()
    return dict(carrier) if carrier else {}


# --- the hooks (each one test of _active when traces are off) ----------------------


def turn_started(
    session_id: str,
    turn_id: str,
    agent: str,
    model: str,
    delegated_by: str | None = None,
    trace: Mapping[str, str] | None = None,
) -> None:
    """A turn began (``turn.started``): its ``invoke_agent`` span opens.

    Its parent: the delegate's tool span of the worker's parent turn, else the
    trace context its request came with (``trace``, :func:`carried`), else none.
    """
    t = _active
    if t is None:
        return
    provider, name = _provider_model(model)
    parent = t.tools.get(delegated_by) if delegated_by else None
    remote = t._extract(trace) if trace and parent is None else None
    t.turns[turn_id] = t._child(
        f"invoke_agent {agent}",
        parent,
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": session_id,
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
            "gen_ai.request.model": name,
            "gateway.turn.id": turn_id,
        },
        remote,
    )


def turn_ended(
    turn_id: str, outcome: str, reason: str | None, input_tokens: int, output_tokens: int
) -> None:
    """The turn's terminal event: its span (and a call span left open) ends."""
    t = _active
    if t is None:
        return
    call = t.calls.pop(turn_id, None)
    if call is not None:
        t._fail(call, "cancelled" if outcome == "cancelled" else "error", reason or outcome)
        call.end()
    span = t.turns.pop(turn_id, None)
    if span is None:
        return
    span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    span.set_attribute("gen_ai.response.finish_reasons", [outcome])
    if outcome in _FAILED_OUTCOMES:
        t._fail(span, outcome, reason or outcome)
    span.end()


def call_started(
    session_id: str,
    turn_id: str,
    model: str,
    max_tokens: int,
    temperature: float | None,
    *,
    sampling_for: tuple[str, str] | None = None,
) -> None:
    """An LLM call began (``llm.call_started``): its ``chat`` span opens under the turn's.

    ``sampling_for``: (tool use id, call id) of a call an MCP server asked for
    while that tool ran (``purpose: "sampling"``, docs/protocol.md §11): its
    span is the tool's child, kept under the call's own id (:func:`call_ended`
    with that ``key``), since a tool may sample twice at once and other tools
    of its round run meanwhile.
    """
    t = _active
    if t is None:
        return
    provider, name = _provider_model(model)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.request.model": name,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.conversation.id": session_id,
    }
    if temperature is not None:
        attributes["gen_ai.request.temperature"] = temperature
    if sampling_for is not None:
        tool_use_id, call_id = sampling_for
        attributes["gateway.llm.purpose"] = "sampling"
        t.calls[call_id] = t._child(f"chat {name}", t.tools.get(tool_use_id), attributes)
        return
    previous = t.calls.pop(turn_id, None)
    if previous is not None:  # never ended (a gateway bug): do not leak it
        previous.end()
    t.calls[turn_id] = t._child(f"chat {name}", t.turns.get(turn_id), attributes)


def call_ended(
    key: str,
    error_class: str | None,
    error_message: str,
    response_model: str | None,
    response_id: str | None,
    stop_reason: str | None,
    input_tokens: int,
    output_tokens: int,
) -> None:
    """The call's message ended (complete, failed or cancelled): its span ends.

    ``key``: the turn id; a sampling call's own id (:func:`call_started`'s ``sampling_for``).
    """
    t = _active
    if t is None:
        return
    span = t.calls.pop(key, None)
    if span is None:
        return
    if response_model:
        span.set_attribute("gen_ai.response.model", _provider_model(response_model)[1])
    if response_id:
        span.set_attribute("gen_ai.response.id", response_id)
    if stop_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [stop_reason])
    span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    if error_class is not None:
        t._fail(span, error_class, error_message)
    span.end()


def tool_started(session_id: str, turn_id: str, tool_use_id: str, name: str) -> None:
    """A tool began to run: its ``execute_tool`` span opens under the turn's."""
    t = _active
    if t is None:
        return
    t.tools[tool_use_id] = t._child(
        f"execute_tool {name}",
        t.turns.get(turn_id),
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": tool_use_id,
            "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": session_id,
        },
    )


def tool_ended(tool_use_id: str, error_class: str | None = None, message: str = "") -> None:
    """The tool's ``tool.completed`` or ``tool.failed``: its span ends."""
    t = _active
    if t is None:
        return
    span = t.tools.pop(tool_use_id, None)
    if span is None:
        return
    if error_class is not None:
        t._fail(span, error_class, message)
    span.end()
