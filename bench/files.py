"""``python -m bench.files``: what a 5 MiB attachment costs (docs/protocol.md §2 "Files").

One ``gateway serve`` process on 127.0.0.1 (SQLite in a temp dir, the scripted
model, which answers at once: the figures are the gateway's own), measured
from outside, in rounds of four, each a fresh session:

- ``upload``: ``POST /sessions/{id}/files`` of a PNG of about 5 MiB (random
  pixels, so it does not compress; a new one every round, so every upload is
  a new file), from the request to the 201: the transport, the check (a
  whole decode with Pillow, in a worker thread), the SHA-256, the write;
- ``turn_text``: a text-only turn, from ``POST .../turns`` to
  ``turn.completed`` on a WebSocket subscribed beforehand (after a first
  turn of the session, not measured);
- ``turn_file``: the same turn naming the uploaded file by ``file_id`` (0.2 s
  after the upload, as a person would send it; it and ``turn_text`` take
  turns at going first, round by round);
- ``turn_inline``: the same turn with another such PNG inline (base64 in the
  JSON body, about 7 MiB), stored as a file first.

The daemon's memory is read from ``/proc/PID/status``: its resident set
(``VmRSS``) before the first round and after the last, and its peak
(``VmHWM``) after the warm-up rounds and at the end; the JSON also has its
resident set after every round (``rss_kib``). The first
``--warmup`` rounds are discarded. Prints a table (medians, p95 and the
ratio of each turn to the text-only one) and, with ``--out DIR``, writes
``<stamp>-files.json`` and ``.md`` there. Example::

    python -m bench.files --runs 20 --out bench/results/issue35
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from PIL import Image
from trio_websocket import WebSocketConnection, open_websocket_url

SIDE = 1322  # 1322 x 1322 RGB: 5,243,052 bytes of pixels, a PNG of about 5 MiB
PATHS = ("upload", "turn_text", "turn_file", "turn_inline")
PROMPT = "What is in this picture?"
_READY = re.compile(rb"listening on http://[^\s:]+:(\d+)")


def noise_png() -> bytes:
    """A PNG of random pixels: it does not compress, and no two are the same file."""
    pixels = os.urandom(SIDE * SIDE * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (SIDE, SIDE), pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process, KiB (Linux)."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


@asynccontextmanager
async def daemon(scratch: Path) -> AsyncIterator[tuple[int, int]]:
    """``gateway serve`` with its store in ``scratch``: (its port, its pid)."""
    config = scratch / "gateway.toml"
    config.write_text(
        f'[store]\npath = "{scratch / "bench.db"}"\n'
        f'[sessions]\nworkspace_root = "{scratch / "workspaces"}"\n'
        "[tools]\nenabled = []\n"
    )
    command = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"]
    proc = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=scratch
    )
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(60):
            while b"\n" not in line:
                chunk = await proc.stdout.receive_some(200)
                if not chunk:
                    raise RuntimeError("the gateway exited before its readiness line")
                line += chunk
        match = _READY.search(line)
        if match is None:
            raise RuntimeError(f"the gateway did not start: {line!r}")
        yield int(match.group(1)), proc.pid
    finally:
        proc.terminate()
        with trio.move_on_after(15):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _completed(ws: WebSocketConnection) -> None:
    while True:
        frame = json.loads(await ws.get_message())
        if frame["type"] == "event" and frame["event"]["type"] == "turn.completed":
            return


async def _turn(http: httpx.AsyncClient, ws: WebSocketConnection, sid: str, content: Any) -> float:
    started = time.perf_counter()
    answer = await http.post(f"/sessions/{sid}/turns", json={"content": content})
    answer.raise_for_status()
    await _completed(ws)
    return time.perf_counter() - started


async def one_round(
    http: httpx.AsyncClient, image: bytes, inline: bytes, *, text_first: bool
) -> dict[str, float]:
    """The seconds of each path, on a new session."""
    sid = (await http.post("/sessions", json={})).json()["session_id"]
    ws_url = (await http.get(f"/sessions/{sid}")).json()["ws_url"]
    out: dict[str, float] = {}
    async with open_websocket_url(ws_url, max_message_size=1 << 24) as ws:
        subscribe = {"type": "subscribe", "filter": {"event_types": ["turn.completed"]}}
        await ws.send_message(json.dumps(subscribe | {"since": None, "snapshot": False}))
        await ws.get_message()  # the ack
        text = {"type": "text", "text": PROMPT}
        # the session's first turn, not measured: each measured turn is a later
        # turn of a session, as in a conversation
        await _turn(http, ws, sid, [text])
        started = time.perf_counter()
        r = await http.post(
            f"/sessions/{sid}/files", content=image, headers={"Content-Type": "image/png"}
        )
        r.raise_for_status()
        file_id = r.json()["file_id"]
        out["upload"] = time.perf_counter() - started
        await trio.sleep(0.2)  # a person's pause: the upload's write settles first
        turns = {"turn_text": [text], "turn_file": [text, {"type": "image", "file_id": file_id}]}
        for name in sorted(turns, reverse=text_first):  # each first in every other round
            out[name] = await _turn(http, ws, sid, turns[name])
        data = base64.b64encode(inline).decode()
        source = {"type": "base64", "media_type": "image/png", "data": data}
        out["turn_inline"] = await _turn(http, ws, sid, [text, {"type": "image", "source": source}])
    return out


async def measure(runs: int, warmup: int) -> dict[str, Any]:
    """Every path's seconds per measured round, the daemon's memory, the file's size."""
    with tempfile.TemporaryDirectory() as scratch:
        async with daemon(Path(scratch)) as (port, pid):
            results: dict[str, list[float]] = {name: [] for name in PATHS}
            memory = {"start": memory_kib(pid)}
            size = 0
            rss_kib: list[int] = []  # after each round, warm-up included
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                for round_ in range(warmup + runs):
                    image, inline = noise_png(), noise_png()
                    size = len(image)
                    seconds = await one_round(http, image, inline, text_first=round_ % 2 == 0)
                    rss_kib.append(memory_kib(pid)["VmRSS"])
                    if round_ + 1 == warmup:
                        memory["after_warmup"] = memory_kib(pid)
                    if round_ >= warmup:
                        for name, value in seconds.items():
                            results[name].append(value)
            memory["end"] = memory_kib(pid)
    return {"seconds": results, "memory_kib": memory, "rss_kib": rss_kib, "file_bytes": size}


def _figures(seconds: list[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in seconds)
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[-1] if len(ms) > 1 else ms[0]
    return statistics.median(ms), p95


def report(measured: dict[str, Any], runs: int, warmup: int) -> str:
    seconds = measured["seconds"]
    text_p50 = _figures(seconds["turn_text"])[0]
    lines = [
        f"a {measured['file_bytes']:,}-byte PNG, {runs} rounds after {warmup} warm-up rounds",
        "",
        "| path | p50 (ms) | p95 (ms) | p50 / text-only turn |",
        "|---|---|---|---|",
    ]
    for name in PATHS:
        p50, p95 = _figures(seconds[name])
        ratio = f"{p50 / text_p50:.2f}" if name.startswith("turn") else "-"
        lines.append(f"| {name} | {p50:.1f} | {p95:.1f} | {ratio} |")
    mem = measured["memory_kib"]
    lines += [
        "",
        "| daemon memory (MiB) | at start | after warm-up | at the end |",
        "|---|---|---|---|",
        "| resident (VmRSS) | "
        + " | ".join(f"{mem[k]['VmRSS'] / 1024:.1f}" for k in ("start", "after_warmup", "end"))
        + " |",
        "| peak (VmHWM) | "
        + " | ".join(f"{mem[k]['VmHWM'] / 1024:.1f}" for k in ("start", "after_warmup", "end"))
        + " |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.files",
        description="What a 5 MiB upload and a turn that uses it cost, on the scripted model.",
    )
    parser.add_argument("--runs", type=int, default=20, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=3, help="discarded rounds first")
    parser.add_argument("--out", type=Path, help="write <stamp>-files.json and .md here")
    args = parser.parse_args(argv)
    measured = trio.run(measure, args.runs, args.warmup)
    table = report(measured, args.runs, args.warmup)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        machine = {"python": platform.python_version(), "cpus": os.cpu_count()}
        everything = measured | {"runs": args.runs, "warmup": args.warmup, "machine": machine}
        (args.out / f"{stamp}-files.json").write_text(json.dumps(everything, indent=1) + "\n")
        (args.out / f"{stamp}-files.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
