"""Fixtures of the integration tests that more than one package of them uses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from gateway import telemetry

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Traces on, to OpenTelemetry's in-memory exporter (docs/operating.md "Traces").

    The otel extra's SDK is imported here, not at the module's top: a test that
    uses it skips first without the extra (tests/unit/test_extras.py).
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing = telemetry.Tracing(provider)
    telemetry.install(tracing)
    try:
        yield memory
    finally:
        telemetry.uninstall(tracing)
        provider.shutdown()
