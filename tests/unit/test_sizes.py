"""No class of ``gateway`` over 400 lines, no function over 80 (issue 33).

Read with :mod:`ast`, as tests/unit/test_imports.py reads the import graph: a
class or function counts from its ``class``/``def`` line to its last line,
docstring and comments included. One that grows past its bound is split along
a seam of its own (a collaborator, a pure function), not cut anywhere.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.paths import ROOT

MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 80


def oversized(source: str, where: str) -> Iterator[str]:
    """Each class and function of ``source`` over its bound, with its place and size."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            kind, bound = "class", MAX_CLASS_LINES
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            kind, bound = "function", MAX_FUNCTION_LINES
        else:
            continue
        assert node.end_lineno is not None
        lines = node.end_lineno - node.lineno + 1
        if lines > bound:
            yield f"{where}:{node.lineno}: {kind} {node.name} is {lines} lines (at most {bound})"


def test_the_check_finds_a_long_class_and_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    assert list(oversized(f"class Big:\n{body}\n", "a.py")) == [
        f"a.py:1: class Big is {MAX_CLASS_LINES + 1} lines (at most {MAX_CLASS_LINES})"
    ]
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    found = list(oversized(f"class Small:\n    async def long(self):\n{body}\n", "b.py"))
    assert found == [
        f"b.py:2: function long is {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})"
    ]
    assert list(oversized("def short():\n    return 1\n", "c.py")) == []


def test_no_class_or_function_of_gateway_is_over_its_bound() -> None:
    paths = sorted((ROOT / "gateway").rglob("*.py"))
    assert len(paths) > 100
    wrong = [
        line
        for path in paths
        for line in oversized(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not wrong, "split these along a seam of their own:\n" + "\n".join(wrong)
