"""What every profile's run and report share: the run itself, and the cells of its table.

- :func:`run_profile`: a profile's run in a temporary directory, its log lines
  stamped with the seconds since the start (on stderr), the result given its
  command and elapsed time; :func:`stem` names its result files
  (``<out>/<stamp>-<profile>``), :func:`write_files` writes them (the JSON and
  the markdown table); :func:`announce` prints what was written.
- :func:`number`, :func:`ratio`, :func:`median`: figures, read defensively (a
  figure a run could not measure is None, and so is any ratio of it).
- :func:`fmt`, :func:`row`: a markdown table's cells.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Log = Callable[[str], None]


def run_profile(
    prefix: str, command: str, run: Callable[[Path, Log], dict[str, Any]]
) -> dict[str, Any]:
    """``run(workdir, log)`` in a temporary directory; its result, with ``command`` and
    ``elapsed_s``."""
    t0 = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        result = run(Path(tmp), log)
    result["command"] = command
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    return result


def stem(out: Path, profile: str) -> Path:
    """Where a run's result files go, less their suffix: ``<out>/<stamp>-<profile>``."""
    return out / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile}"


def write_files(
    stem: Path, result: dict[str, Any], table: str, indent: int = 2
) -> tuple[Path, Path]:
    """Write ``<stem>.json`` (``result``) and ``<stem>.md`` (``table``); their paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    json_path.write_text(json.dumps(result, indent=indent) + "\n")
    md_path.write_text(table)
    return json_path, md_path


def announce(result: dict[str, Any], json_path: Path, md_path: Path) -> None:
    """Print the run's table and where its files are."""
    print(f"# bench {result.get('profile')}: {result['command']}")
    print(md_path.read_text())
    print(f"wrote {json_path}, {md_path}")
    print(f"elapsed {result['elapsed_s']} s")


def number(value: Any) -> bool:
    """Whether ``value`` is a measured figure (a finite int or float, not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def ratio(a: Any, b: Any) -> float | None:
    """``a / b`` to three places; None when either is not a figure or ``b`` is 0."""
    if not (number(a) and number(b)) or b == 0:
        return None
    return round(float(a) / float(b), 3)


def median(values: list[Any]) -> float | None:
    """The median of the figures among ``values`` to three places (None: none)."""
    numbers = [float(v) for v in values if number(v)]
    return round(statistics.median(numbers), 3) if numbers else None


def fmt(value: Any) -> str:
    """A table cell: ``-`` for nothing, yes/no, three significant digits below 100,
    thousands separated above."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def row(cells: list[Any]) -> str:
    """A markdown table row; cells that are not text go through :func:`fmt`."""
    return "| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in cells) + " |"
