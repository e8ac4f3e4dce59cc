"""gateway.partial_json: a JSON object cut anywhere gives what parses (docs/protocol.md §8).

Rules of these tests: every prefix of a realistic tool input must give a dict
without raising, and nothing that is not in the whole object; the table below
pins the exact answer for each rule of the module docstring.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.partial_json import best_effort

REALISTIC = [
    '{"command": "ls -la /tmp && echo \\"done\\"", "timeout_s": 30}',
    '{"path": "src/caf\\u00e9/\\ud83d\\ude00.py", "lines": [1, 2.5, -3e2], "ok": true, "x": null}',
    '{\n  "task": "summarise",\n  "options": {"depth": [{"k": "v"}, []], "flags": {}},\n'
    '  "note": "tab\\there\\nnewline"\n}',
    '{"seconds": 30}',
    "{}",
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # nothing, or not an object
        ("", {}),
        ("   ", {}),
        ("[1, 2]", {}),
        ('"a string"', {}),
        ("42", {}),
        ("nul", {}),
        # open objects and arrays are closed
        ("{", {}),
        ('{"a": {', {"a": {}}),
        ('{"a": [', {"a": []}),
        ('{"a": [1, {"b": 2', {"a": [1, {}]}),
        ('{"a": [1, {"b": 2}', {"a": [1, {"b": 2}]}),
        # a trailing key, colon or comma is dropped
        ('{"a": 1, "b', {"a": 1}),
        ('{"a": 1, "b"', {"a": 1}),
        ('{"a": 1, "b":', {"a": 1}),
        ('{"a": 1, "b": ', {"a": 1}),
        ('{"a": 1,', {"a": 1}),
        ('{"a": [1,', {"a": [1]}),
        # a string value cut short is closed, a half escape dropped
        ('{"a": "hel', {"a": "hel"}),
        ('{"a": "', {"a": ""}),
        ('{"a": ["x", "y', {"a": ["x", "y"]}),
        ('{"a": "x\\', {"a": "x"}),
        ('{"a": "x\\u00', {"a": "x"}),
        ('{"a": "x\\u00e9', {"a": "xé"}),
        ('{"a": "x\\ud83d', {"a": "x"}),
        ('{"a": "x\\ud83d\\ude0', {"a": "x"}),
        ('{"a": "x\\ud83d\\ude00', {"a": "x😀"}),
        # numbers at the very end may grow; words cannot
        ('{"a": 1', {}),
        ('{"a": 12 ', {"a": 12}),
        ('{"a": 1.', {}),
        ('{"a": -', {}),
        ('{"a": tru', {}),
        ('{"a": true', {"a": True}),
        ('{"a": null', {"a": None}),
        # whole objects, and malformed input keeps what came before the fault
        ('{"a": 1}', {"a": 1}),
        ('{"a": 1} trailing', {"a": 1}),
        ('{"a": 1, "b" 2}', {"a": 1}),
        ('{"a": 1, }', {"a": 1}),
        ('{"a": "x\x01y"}', {}),
        ('{"a": [1}', {"a": [1]}),
    ],
)
def test_cuts(text: str, expected: dict[str, Any]) -> None:
    assert best_effort(text) == expected


def _is_prefix_of(partial: Any, whole: Any) -> bool:
    """``partial`` could have been read from a prefix of ``whole``'s JSON text."""
    if isinstance(whole, dict):
        return isinstance(partial, dict) and all(
            key in whole and _is_prefix_of(value, whole[key]) for key, value in partial.items()
        )
    if isinstance(whole, list):
        return (
            isinstance(partial, list)
            and len(partial) <= len(whole)
            and all(_is_prefix_of(p, w) for p, w in zip(partial, whole, strict=False))
        )
    if isinstance(whole, str):
        return isinstance(partial, str) and whole.startswith(partial)
    return partial == whole and type(partial) is type(whole)


@pytest.mark.parametrize("whole", REALISTIC)
def test_every_prefix_gives_part_of_the_whole(whole: str) -> None:
    expected = json.loads(whole)
    previous_keys: list[str] = []
    for end in range(len(whole) + 1):
        got = best_effort(whole[:end])
        assert isinstance(got, dict)
        assert _is_prefix_of(got, expected), (whole[:end], got)
        keys = list(got)
        assert keys[: len(previous_keys)] == previous_keys, "a key seen once stays"
        previous_keys = keys
    assert best_effort(whole) == expected


_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    whole=st.dictionaries(st.text(max_size=5), _json_values, max_size=4),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 1]),
)
def test_every_prefix_of_any_object(
    whole: dict[str, Any], ascii_only: bool, indent: int | None
) -> None:
    text = json.dumps(whole, ensure_ascii=ascii_only, indent=indent)
    for end in range(len(text) + 1):
        got = best_effort(text[:end])
        assert _is_prefix_of(got, whole), (text[:end], got)
    assert best_effort(text) == whole
