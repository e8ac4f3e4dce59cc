"""What every bench profile's run and report share (bench/tables.py): figures read
defensively, table cells, the run in a temporary directory."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bench.tables import fmt, median, number, ratio, row, run_profile, stem, write_files


@pytest.mark.parametrize("value", [None, True, "3", math.nan, math.inf, [1]])
def test_what_is_not_a_measured_figure_has_no_ratio(value: Any) -> None:
    assert not number(value)
    assert ratio(value, 2.0) is None and ratio(2.0, value) is None


def test_ratios_and_medians() -> None:
    assert ratio(1, 3) == 0.333 and ratio(3.0, 0) is None
    assert median([3, None, 1, "x", 2.0]) == 2.0 and median([None]) is None


def test_cells() -> None:
    assert [fmt(v) for v in (None, True, False, 0.00123456, 99.94, 1234.5, 12345)] == [
        "-", "yes", "no", "0.00123", "99.9", "1,234", "12,345"
    ]  # fmt: skip
    assert row(["label", 1.5, None, "text"]) == "| label | 1.5 | - | text |"


def test_a_run_gets_its_command_its_time_and_a_directory_gone_after_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Path] = []

    def run(workdir: Path, log: Any) -> dict[str, Any]:
        assert workdir.is_dir()
        seen.append(workdir)
        log("halfway")
        return {"profile": "p"}

    result = run_profile("bench-test-", "python -m bench --profile p", run)
    assert result["command"] == "python -m bench --profile p" and result["elapsed_s"] >= 0
    assert not seen[0].exists() and seen[0].name.startswith("bench-test-")
    assert capsys.readouterr().err.strip().endswith("s] halfway")
    assert stem(tmp_path, "p").name.endswith("-p") and stem(tmp_path, "p").parent == tmp_path


def test_a_runs_files_are_its_json_and_its_table(tmp_path: Path) -> None:
    json_path, md_path = write_files(tmp_path / "out" / "stamp-p", {"a": [1]}, "| t |\n")
    assert (json_path.name, md_path.name) == ("stamp-p.json", "stamp-p.md")
    assert json_path.read_text() == '{\n  "a": [\n    1\n  ]\n}\n'
    assert md_path.read_text() == "| t |\n"
