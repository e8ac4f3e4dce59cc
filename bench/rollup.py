"""``python -m bench --profile rollup``: the delta rollup on and off (docs/protocol.md §3
"Delta rollup"), frames, bytes and the gateway's CPU per delivered token.

One real ``gateway serve`` daemon and the native WebSocket door
(:mod:`bench.doors`' client and window). Each round measures every window of
``windows`` (``coalesce_ms``, 0 first: rollup off) in a phase of its own, the
order rotated from round to round: ``sessions`` fresh sessions (10; ``--sessions
1``: one session of 1,000 viewers), ``clients`` WebSocket clients (1,000) spread
evenly over them, each subscribing with that ``coalesce_ms``, one turn per
session (a ``sleep`` while the clients settle, then ``words`` words of
``lorem``, one every ``delay_ms``: 50 tokens/s at 20 ms). The window opens
when every client has seen the tool called and closes when every client has
seen the turn end; the daemon's CPU time is read at both.

Units: **a frame** is an ``event`` frame received (a rolled-up delta is one);
**a byte** is a frame's payload and header; **a delivered token** is a word of
the script at a client: ``words`` per client that saw its turn end with the
whole text (a rolled-up delta carries several). The clients of the first
session decode every text delta and join its text (the others only count):
every one of them, in every phase, must end with the same text, which the
report says (``same_text``). That a resume at any event id is exact is the
test suite's (tests/unit/session/test_rollup.py, tests/integration/session/
test_delta_rollup.py, the conformance traces), not this run's.

Ratios are each window's figure over the rollup-off window's **in the same
round**; the report gives their median and range over the rounds.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec

from bench.doors import DoorsRun, Meter, Phase, Tally, WsDoorClient
from bench.profiles import RollupProfile
from bench.tables import (
    Log,
    announce,
    fmt,
    median,
    number,
    ratio,
    row,
    run_profile,
    stem,
    write_files,
)
from bench.wire import open_ws

OFF = 0
NOISY = 0.25  # cores taken outside the bench during a window (bench.measure's threshold)
CLIENT_BUSY = 0.85


class _Delta(msgspec.Struct):
    text: str = ""


class _Event(msgspec.Struct):
    payload: _Delta


class _Frame(msgspec.Struct):
    event: _Event


_decode = msgspec.json.Decoder(_Frame).decode


class TextClient(WsDoorClient):
    """A WebSocket client that counts, and (``sample``) joins the text of its text deltas."""

    def __init__(self, *args: Any, sample: bool) -> None:
        super().__init__(*args)
        self.sample = sample
        self.text: list[str] = []

    def on_text(self, payload: bytes, now: float) -> None:
        super().on_text(payload, now)
        if self.sample and b'"type":"text.delta"' in payload:
            self.text.append(_decode(payload).event.payload.text)


class RollupPhase(Phase):
    """One window's clients on one round's sessions (module docstring)."""

    def __init__(self, run: DoorsRun, coalesce_ms: int, sessions: list[str]) -> None:
        super().__init__(run, "websocket", sessions)
        self.coalesce_ms = coalesce_ms
        self.samples: list[TextClient] = []

    async def attach_native(self) -> None:
        p, server = self.run.profile, self.run.server
        frame = {"type": "subscribe", "filter": p.filter, "coalesce_ms": self.coalesce_ms}
        subscribe = msgspec.json.encode(frame)
        for index, session_id in enumerate(self.sessions):
            for _ in range(p.clients_per_session):
                path, _token = await self._token(session_id)
                tally = Tally()
                client = TextClient(
                    server.host, server.port, path, subscribe, tally, sample=index == 0
                )
                self.ws.append(client)
                self.tallies.append(tally)
                if index == 0:
                    self.samples.append(client)
                await open_ws(client)
        await self._until("subscribed", lambda t: t.ready, 60.0)
        script = {"content": _script(p)}
        for session_id in self.sessions:
            await self.run.http.request("POST", f"/sessions/{session_id}/turns", script)


def _script(p: RollupProfile) -> str:
    rounds = [[{"tool_use": {"name": "sleep", "input": {"seconds": p.sleep_s}}}],
              [{"lorem": p.words}]]  # fmt: skip
    return msgspec.json.encode({"script": {"delay_ms": p.delay_ms, "rounds": rounds}}).decode()


def window_figures(phase: RollupPhase, window: dict[str, float], late: int, unfinished: int,
                   words: int) -> dict[str, Any]:  # fmt: skip
    """One window's figures: frames, bytes, the daemon's CPU per frame and per token."""
    tallies = phase.tallies
    clients = len(tallies)
    frames = sum(t.events for t in tallies)
    size = sum(t.bytes for t in tallies)
    tokens = words * sum(1 for t in tallies if t.ended)
    cpu, wall = window["server_cpu_s"], window["wall_s"]
    texts = {"".join(c.text) for c in phase.samples}
    return {
        "coalesce_ms": phase.coalesce_ms,
        "clients": clients,
        "frames": frames,
        "text_delta_frames": sum(t.deltas for t in tallies),
        "bytes": size,
        "tokens": tokens,
        "late_clients": late,
        "unfinished_clients": unfinished,
        "wall_s": round(wall, 3),
        "server_cpu_s": round(cpu, 4),
        "server_cores": round(cpu / wall, 3) if wall else None,
        "clients_cores": round(window["clients_cpu_s"] / wall, 3) if wall else None,
        "other_cores": round(window["other_cpu_s"] / wall, 3) if wall else None,
        "frames_per_client": round(frames / clients, 1) if clients else None,
        "bytes_per_client": round(size / clients) if clients else None,
        "cpu_us_per_token": round(cpu / tokens * 1e6, 3) if tokens else None,
        "cpu_us_per_frame": round(cpu / frames * 1e6, 3) if frames else None,
        "sample_texts": sorted(texts),
    }


class RollupRun(DoorsRun):
    """The daemon and the rounds (module docstring)."""

    profile: RollupProfile  # (a DoorsRun of a RollupProfile: the same fields it reads)

    async def window(self, coalesce_ms: int) -> dict[str, Any]:
        p = self.profile
        created = [await self.http.request("POST", "/sessions", {}) for _ in range(p.sessions)]
        phase = RollupPhase(self, coalesce_ms, [str(c["session_id"]) for c in created])
        try:
            await phase.attach_native()
            late = await phase._until("tool called", lambda t: t.marked, p.sleep_s + 20.0)
            for tally in phase.tallies:
                tally.reset()
            meter = Meter(self.server_pid)
            unfinished = await phase._until("turn ended", lambda t: t.ended, p.turn_timeout_s)
            return window_figures(phase, meter.read(), late, unfinished, p.words)
        finally:
            await phase.close()

    async def rollup_rounds(self) -> list[dict[str, Any]]:
        p = self.profile
        measured: list[dict[str, Any]] = []
        for index in range(p.warmup + p.repetitions):
            shift = index % len(p.windows)
            order = p.windows[shift:] + p.windows[:shift]
            windows = {str(w): await self.window(w) for w in order}
            counted = index >= p.warmup
            self.log(f"round {index + 1}{'' if counted else ' (warm-up)'}: " + ", ".join(
                f"{w} ms: {f['frames_per_client']} frames/client, {f['cpu_us_per_token']} us/token"
                for w, f in windows.items()))  # fmt: skip
            if counted:
                measured.append({"round": len(measured) + 1, "order": list(order),
                                 "windows": windows})  # fmt: skip
        return measured


async def run_rollup(profile: RollupProfile, workdir: Path, log: Log) -> dict[str, Any]:
    """The daemon started, every round measured, the daemon stopped."""
    run = RollupRun(profile, workdir, log)
    try:
        await run.start()
        rounds = await run.rollup_rounds()
    finally:
        await run.stop()
    sizes = {**asdict(profile), "clients_per_session": profile.clients_per_session}
    return {"profile": profile.name, "sizes": sizes, "rounds": rounds}


FIGURES = ("frames_per_client", "bytes_per_client", "cpu_us_per_token", "cpu_us_per_frame",
           "server_cores", "clients_cores", "other_cores")  # fmt: skip
RATIOS = ("frames_per_client", "bytes_per_client", "cpu_us_per_token")


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians by window, ratios to rollup off by round, the text check, flagged windows."""
    rounds, windows = result["rounds"], [str(w) for w in result["sizes"]["windows"]]
    by_window = {w: {f: median([r["windows"][w][f] for r in rounds]) for f in FIGURES}
                 for w in windows}  # fmt: skip
    ratios: dict[str, dict[str, Any]] = {}
    for w in windows:
        ratios[w] = {}
        for f in RATIOS:
            each = [ratio(r["windows"][w][f], r["windows"][str(OFF)][f]) for r in rounds]
            known = [x for x in each if x is not None]
            ratios[w][f] = {"median": median(known), "min": min(known, default=None),
                            "max": max(known, default=None), "rounds": each}  # fmt: skip
    texts = {t for r in rounds for f in r["windows"].values() for t in f["sample_texts"]}
    flags: dict[str, list[str]] = {"noisy": [], "client_limited": [], "incomplete": []}
    for r in rounds:
        for w, f in r["windows"].items():
            where = f"round {r['round']} {w} ms"
            if number(f["other_cores"]) and f["other_cores"] >= NOISY:
                flags["noisy"].append(where)
            if number(f["clients_cores"]) and f["clients_cores"] >= CLIENT_BUSY:
                flags["client_limited"].append(where)
            if f["late_clients"] or f["unfinished_clients"] or len(f["sample_texts"]) != 1:
                flags["incomplete"].append(where)
    summary = {"windows": by_window, "ratios": ratios, "same_text": len(texts) == 1,
               "flags": flags}  # fmt: skip
    result["summary"] = summary
    return summary


def markdown(result: dict[str, Any]) -> str:
    """The report's table (bench/README.md, "Delta rollup")."""
    s, p = result["summary"], result["sizes"]
    windows = [str(w) for w in p["windows"]]
    rolled = [w for w in windows if w != str(OFF)]
    clients = p["sessions"] * p["clients_per_session"]
    lines = [
        f"One daemon, {len(result['rounds'])} rounds (after {p['warmup']} not counted), each "
        f"window in a phase of its own: {p['sessions']} sessions x {p['clients_per_session']} "
        f"WebSocket clients ({clients}), `{p['filter']}`, one turn per session of "
        f"{p['words']} tokens, one every {p['delay_ms']:g} ms "
        f"({1000 / p['delay_ms']:g} tokens/s). Medians over the rounds; each ratio is the "
        "window's figure over rollup off's (`coalesce_ms` 0) in the same round (median, and "
        "its range over the rounds).",
        "",
        row(["figure", *(f"coalesce_ms {w}" for w in windows), *(f"{w} / 0" for w in rolled)]),
        row(["---"] * (1 + len(windows) + len(rolled))),
    ]

    def cell(w: str, f: str) -> str:
        r = s["ratios"][w][f]
        if r["median"] is None:
            return "-"
        return f"{fmt(r['median'])} ({fmt(r['min'])} to {fmt(r['max'])})"

    labels = {
        "frames_per_client": "event frames per client per turn",
        "bytes_per_client": "bytes per client per turn",
        "cpu_us_per_token": "gateway CPU per delivered token (µs)",
        "cpu_us_per_frame": "gateway CPU per frame (µs)",
        "server_cores": "gateway cores in the window",
        "clients_cores": "client process cores in the window",
        "other_cores": "cores used outside the bench",
    }
    for f, label in labels.items():
        extra = [cell(w, f) if f in RATIOS else "" for w in rolled]
        lines.append(row([label, *(s["windows"][w][f] for w in windows), *extra]))
    flags = s["flags"]
    lines += [
        "",
        f"The same final text at every sampled client (the first session's "
        f"{p['clients_per_session']}, every window, every round): {fmt(s['same_text'])}.",
        "",
        f"Noisy windows (>= {NOISY} cores outside the bench): "
        f"{', '.join(flags['noisy']) or 'none'}.",
        f"Client-limited windows: {', '.join(flags['client_limited']) or 'none'}.",
        f"Incomplete windows: {', '.join(flags['incomplete']) or 'none'}.",
        "",
        f"Elapsed {result.get('elapsed_s')} s. Command: `{result.get('command')}`.",
    ]
    return "\n".join(lines) + "\n"


def main(profile: RollupProfile, out: Path, command: str) -> int:
    """Run ``profile``, write ``<out>/<stamp>-<profile>.json`` and ``.md``, print the table."""
    result = run_profile(
        "bench-rollup-", command, lambda tmp, log: asyncio.run(run_rollup(profile, tmp, log))
    )
    summarize(result)
    announce(result, *write_files(stem(out, profile.name), result, markdown(result)))
    return 0
