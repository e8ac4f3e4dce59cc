"""Without an optional extra, its tests skip, saying why: never an error, never an INTERNALERROR.

The test extra pulls in the claude-code and otel extras (pyproject.toml), so the
README's test command runs every test; an environment without them (``pip
install -e .`` and the test tools alone) must still pass, its tests of those
extras skipped. Here a pytest of its own runs the modules that need them with
the packages made absent (:mod:`tests.absent_packages`): a filter, a mark or an
import at module level that reaches for them before the skip is decided shows
up as an error, as the ``filterwarnings`` mark of tests/claude_code_support.py
once stopped the whole run with ``ModuleNotFoundError: claude_agent_sdk``.

The modules are found, not listed: a test module that imports, names or marks
itself with one of the packages at module level (functions' bodies aside), or
imports tests/claude_code_support.py.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from tests.paths import ROOT, TESTS

# Each extra's packages, as imported (pyproject.toml's [project.optional-dependencies]).
EXTRAS = {"claude-code": ("claude_agent_sdk",), "otel": ("opentelemetry",)}
ABSENT = [package for packages in EXTRAS.values() for package in packages]
_NEEDS = re.compile(rf"\b({'|'.join(ABSENT)}|claude_code_support)\b")


def module_level(source: str) -> str:
    """What runs as the module is imported and its tests are set up: its text without its
    functions' and classes' bodies (their decorators, marks among them, kept)."""
    parts = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            parts += [ast.unparse(decorator) for decorator in node.decorator_list]
        else:
            parts.append(ast.unparse(node))
    return "\n".join(parts)


def modules_needing_extras() -> list[Path]:
    return sorted(
        path
        for path in TESTS.rglob("test_*.py")
        if path != Path(__file__).resolve()  # it names them, and would run itself again
        and _NEEDS.search(text := path.read_text(encoding="utf-8"))
        and _NEEDS.search(module_level(text))
    )


def test_the_modules_are_found() -> None:
    found = {path.relative_to(TESTS).as_posix() for path in modules_needing_extras()}
    assert {
        "system/claude_code/test_claude_code.py",
        "system/bench/test_bench_claude_code.py",
        "unit/runtimes/test_claude_code_mapping.py",
        "unit/providers/test_factory.py",
        "integration/operating/test_telemetry.py",
        "system/operating/test_telemetry_otlp.py",
    } <= found, found
    assert "integration/agents/test_agents.py" not in found  # it imports the SDK in a function only


def test_without_the_extras_their_tests_skip(tmp_path: Path) -> None:
    modules = modules_needing_extras()
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATEWAY_TEST_ABSENT": ",".join(ABSENT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "tests.absent_packages",
         "-p", "no:cacheprovider", f"--junitxml={report}", *[str(m) for m in modules]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "INTERNALERROR" not in out, out
    [suite] = ElementTree.parse(report).getroot()
    assert suite.get("errors") == "0" and suite.get("failures") == "0", out
    # Each module skips (as a whole, or each test that needs the extra), saying why.
    skipped = {
        (case.get("classname") or case.get("name"), skip.text or "")
        for case in suite.iter("testcase")
        for skip in case.iter("skipped")
    }
    expected = {".".join(m.relative_to(ROOT).with_suffix("").parts) for m in modules}
    assert {module for module, _ in skipped} == expected, out
    assert all("extra" in reason for _, reason in skipped), skipped
