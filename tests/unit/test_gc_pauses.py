"""``gateway_gc_pause_seconds`` and ``gateway_gc_frozen_objects`` (docs/operating.md
"Garbage collection"): every collection timed while installed, by generation, and
nothing once the daemon's block is left."""

from __future__ import annotations

import gc

from prometheus_client.core import Metric

from gateway.metrics import GcPauses


def counts(families: list[Metric]) -> dict[str, float]:
    """The ``_count`` sample of each generation."""
    return {
        s.labels["generation"]: s.value
        for s in families[0].samples
        if s.name == "gateway_gc_pause_seconds_count"
    }


def test_each_collection_is_timed_by_generation_while_installed() -> None:
    pauses = GcPauses()
    with pauses.installed():
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    before = counts(list(pauses.families()))
    assert before["0"] >= 1 and before["2"] == 2  # gen 0 may also run by itself
    assert pauses.by_generation[2].sum > 0
    gc.collect()  # left: not timed
    assert counts(list(pauses.families()))["2"] == 2
    assert pauses._callback not in gc.callbacks


def test_the_frozen_objects_are_exported() -> None:
    gauge = list(GcPauses().families())[1]
    assert gauge.name == "gateway_gc_frozen_objects"
    assert gauge.samples[0].value == gc.get_freeze_count()
