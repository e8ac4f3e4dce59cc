"""How an unloaded session's memory goes back to the system (gateway.node.unloading).

The figures are the bench's (``python -m bench --profile sessions``,
docs/performance.md "Idle sessions"); these tests pin the policy: two malloc
arenas unless the operator says otherwise, and the allocator trimmed.
"""

from __future__ import annotations

import pytest

from gateway.node import unloading


def test_serve_asks_glibc_for_two_arenas(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(unloading, "_mallopt", lambda p, v: calls.append((p, v)) or 1)
    unloading.limit_allocator_arenas()
    assert calls == [(unloading.M_ARENA_MAX, unloading.ALLOCATOR_ARENAS)]


def test_an_operators_malloc_arena_max_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    monkeypatch.setattr(unloading, "_mallopt", lambda p, v: calls.append((p, v)) or 1)
    unloading.limit_allocator_arenas()
    assert calls == []


def test_another_c_library_is_left_to_its_own_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(unloading, "_mallopt", None)
    monkeypatch.setattr(unloading, "_malloc_trim", None)
    unloading.limit_allocator_arenas()
    unloading._give_back_memory()


def test_the_real_glibc_call_is_accepted() -> None:
    if unloading._mallopt is None:
        pytest.skip("not glibc")
    assert unloading._mallopt(unloading.M_ARENA_MAX, unloading.ALLOCATOR_ARENAS) == 1
