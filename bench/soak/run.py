"""One soak run: the daemon, the load in two phases, the quiet points, the audits.

The timeline (bench/README.md, "Soak"):

1. start ``gateway serve`` (:class:`~bench.soak.daemon.Daemon`), run one
   plain turn so that the node has issued an event id, create the sessions
   and attach their stayers (a snapshot each, before any of their turns);
2. **warm-up**: the full load for ``warmup_s``;
3. **quiet point** (the *baseline*): the load stops, every turn ends, every
   churning client is gone; ``/metrics`` is read until the connection gauge
   shows only the stayers and file descriptors and tasks hold still;
4. **load** for ``duration_s``, ``/metrics`` sampled every
   ``sample_every_s`` (the slopes are fitted to these samples);
5. **quiet point** again (the *end*), the last audit of every stayer, then
   the verdict (:mod:`bench.soak.report`).

The load, all at once: per session a turn runner (scripted turns back to
back, :mod:`bench.soak.scripts`) that cancels and approves through the
session's stayer (``cancel`` frames) or over HTTP; churning clients; slow
clients; killers (:mod:`bench.soak.clients`); and per session an auditor that
every ``audit_every_s`` asks for a replay from its last cursor and compares it
with what the stayer received (the *lost* check, :func:`bench.soak.audit.compare_replay`).

If the daemon exits on its own, everything is cancelled at once and the run
is reported as it stood, with the daemon's log: a crash is the finding.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.profiles import SoakProfile, config_toml
from bench.soak.audit import compare_replay
from bench.soak.clients import (
    CONNECT_ERRORS,
    KILLS,
    TURN_ENDS,
    ChurnStats,
    Stayer,
    churn,
    connect,
    kill,
    replay_ids,
    stall,
    subscribe_frame,
)
from bench.soak.daemon import Daemon, scrape
from bench.soak.scripts import NOTES_FILE, ROTATION, Scenario, judge, scenarios
from bench.soak.visitors import Visitor, verify, visit_loop
from gateway.protocol.events import Event, PermissionRequested
from gateway.protocol.frames import EventFrame

MAX_PROBLEMS = 30
PHASES = ("warmup", "baseline", "load", "end", "verify")


@dataclass
class Sample:
    """One read of ``/metrics``: seconds since the load started, the phase, the figures."""

    t: float
    phase: str
    figures: dict[str, float]


@dataclass
class TurnTally:
    run: int = 0
    as_expected: int = 0
    unexpected: int = 0
    stuck: int = 0


@dataclass
class Rig:
    """One session of the soak: its stayer, its runner's state, its audits."""

    session_id: str
    stayer: Stayer
    offset: int
    stalled: bool = False
    cursor: str = ""  # the replay cursor of the next audit
    audits: int = 0
    audit_errors: list[str] = field(default_factory=list)
    compared: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    order_differs: int = 0

    def set_stalled(self, stalled: bool) -> None:
        self.stalled = stalled


class Soak:
    """One soak run (module docstring); :meth:`run`, then read the attributes."""

    def __init__(self, profile: SoakProfile, workdir: Path, log: Callable[[str], None]) -> None:
        self.profile = profile
        self.workdir = workdir
        self.log = log
        self.scenarios = scenarios(profile.lorem_words, profile.lorem_delay_ms)
        self.daemon: Daemon | None = None
        self.died = False
        self.errors_after_death: list[str] = []
        self.shutdown_code: int | None = None
        self.rigs: list[Rig] = []
        self.visitors: list[Visitor] = []
        self.samples: list[Sample] = []
        self.baseline: dict[str, float] | None = None
        self.end: dict[str, float] | None = None
        self.quiet_timeouts: list[str] = []
        self.history: dict[str, dict[str, int]] = {}
        self.turns: dict[str, TurnTally] = {name: TurnTally() for name in self.scenarios}
        self.problems: list[str] = []
        self.churn = ChurnStats()
        self.kills: Counter[str] = Counter()
        self.kill_errors = 0
        self.phase = "start"
        # Set as each phase begins (tests wait on them).
        self.entered = {name: trio.Event() for name in PHASES}
        self._t0 = time.monotonic()
        self._load_t0: float | None = None
        self._scope = trio.CancelScope()

    # --- the run -------------------------------------------------------------------

    async def run(self) -> None:
        """Run the soak to its end, or until the daemon dies."""
        workspace = self.workdir / "workspace"
        workspace.mkdir(exist_ok=True)
        (workspace / NOTES_FILE).write_text("soak notes\n")
        # The sessions name this directory: the operator allows it (docs/protocol.md §15).
        sections = {
            **self.profile.gateway_config,
            "sessions": {
                **self.profile.gateway_config.get("sessions", {}),  # idle_unload_s
                "workspace_root": str(self.workdir / "workspaces"),
                "allowed_workspaces": [str(workspace)],
            },
        }
        config = self.workdir / "gateway.toml"
        config.write_text(config_toml(sections, str(self.workdir / "gateway.db")))
        daemon = self.daemon = Daemon(config, self.workdir / "gateway.log", self._died)
        async with trio.open_nursery() as top:
            await top.start(daemon.run, name="soak-daemon")
            self.log(f"gateway pid {daemon.pid} at {daemon.url}")
            try:
                with self._scope:
                    await self._soak(daemon, workspace)
            except Exception as exc:  # only while the daemon is dead
                # A client may meet the reset before the daemon's task has
                # noticed the exit: ask the process itself.
                if not (self.died or daemon.exited()):
                    raise
                self.died = True
                self.errors_after_death.append(repr(exc)[:500])
            self.shutdown_code = await daemon.stop()
        self.log(f"gateway exited with status {self.shutdown_code}")

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.entered[phase].set()

    def _died(self) -> None:
        self.died = True
        self.log("the gateway exited on its own: stopping the soak")
        self._scope.cancel()

    async def _soak(self, daemon: Daemon, workspace: Path) -> None:
        limits = httpx.Limits(max_connections=4)
        async with (
            httpx.AsyncClient(base_url=daemon.url, timeout=30, limits=limits) as control,
            trio.open_nursery() as background,
        ):
            background.start_soon(self._sample, control, name="soak-sampler")
            await self._prime(control)
            for index in range(self.profile.sessions):
                answer = await control.post("/sessions", json={"workspace_path": str(workspace)})
                answer.raise_for_status()
                session_id = str(answer.json()["session_id"])
                offset = index * len(ROTATION) // self.profile.sessions
                self.rigs.append(Rig(session_id, Stayer(control, session_id), offset))
            for _ in range(self.profile.visitors):  # sessions in and out of memory
                answer = await control.post("/sessions", json={})
                answer.raise_for_status()
                self.visitors.append(Visitor(str(answer.json()["session_id"])))
            async with trio.open_nursery() as stayers:
                for rig in self.rigs:
                    await stayers.start(rig.stayer.run, name=f"stayer {rig.session_id}")
                    rig.cursor = rig.stayer.since0
                await self._phase("warmup", self.profile.warmup_s)
                self.baseline = await self._quiet("baseline", control)
                self._load_t0 = time.monotonic()
                await self._phase("load", self.profile.duration_s)
                self.end = await self._quiet("end", control)
                self._enter("verify")
                for rig in self.rigs:
                    await self._audit(rig, control)
                    rig.stayer.audit.finish()
                for visitor in self.visitors:
                    await verify(control, visitor)
                for rig in self.rigs:
                    await rig.stayer.close()
            background.cancel_scope.cancel()

    async def _prime(self, http: httpx.AsyncClient) -> None:
        """One plain turn on a session of its own: the node has issued an event id."""
        answer = await http.post("/sessions", json={})
        answer.raise_for_status()
        session_id = str(answer.json()["session_id"])
        async with connect(http, session_id) as conn:
            await conn.ws.send_message(subscribe_frame(None))
            await conn.recv()
            turn = await http.post(f"/sessions/{session_id}/turns", json={"content": "hello"})
            turn.raise_for_status()
            with trio.fail_after(30):
                while True:
                    frame = await conn.recv()
                    if isinstance(frame, EventFrame) and frame.event.type in TURN_ENDS:
                        break

    async def _phase(self, name: str, seconds: float) -> None:
        """The whole load for ``seconds``; then the runners finish their turn."""
        self._enter(name)
        self.log(f"{name}: {seconds:.0f} s")
        profile = self.profile
        stop = trio.Event()
        ids = [rig.session_id for rig in self.rigs]
        assert self.daemon is not None
        async with (
            httpx.AsyncClient(base_url=self.daemon.url, timeout=30) as http,
            trio.open_nursery() as runners,
        ):
            for rig in self.rigs:
                runners.start_soon(self._runner, rig, http, stop, name=f"runner {rig.session_id}")
            for i, visitor in enumerate(self.visitors):
                rng = random.Random(profile.seed * 2000 + i)
                runners.start_soon(
                    visit_loop, http, visitor, profile.visitor_away_s, rng, stop,
                    name=f"visitor {visitor.session_id}",
                )  # fmt: skip
            async with trio.open_nursery() as load:
                for i in range(profile.churners):
                    rng = random.Random(profile.seed * 1000 + i)
                    load.start_soon(
                        partial(churn, http, ids, i, self.churn, rng,
                                read_s=profile.churn_read_s, pause_s=profile.churn_pause_s),
                        name=f"churn {i}",
                    )  # fmt: skip
                for i, rig in enumerate(self.rigs[: profile.slow_clients]):
                    load.start_soon(
                        partial(stall, http, rig.stayer, i, self.churn, rig.set_stalled,
                                max_stall_s=profile.max_stall_s, pause_s=1.0),
                        name=f"slow {i}",
                    )  # fmt: skip
                for i in range(profile.killers):
                    load.start_soon(self._killer, http, i, name=f"killer {i}")
                for i, rig in enumerate(self.rigs):
                    first = profile.audit_every_s * (i + 1) / len(self.rigs)
                    load.start_soon(self._auditor, rig, http, first, name=f"audit {i}")
                await trio.sleep(seconds)
                self.phase = "stopping"  # not sampled: the load is winding down
                load.cancel_scope.cancel()
            stop.set()

    async def _quiet(self, name: str, http: httpx.AsyncClient) -> dict[str, float]:
        """Read ``/metrics`` until only the stayers are connected and fds and tasks hold still."""
        self._enter(name)
        deadline = trio.current_time() + self.profile.quiet_timeout_s
        previous: dict[str, float] | None = None
        while True:
            figures = await scrape(http)
            settled = (
                previous is not None
                and figures["ws_connections"] == len(self.rigs)
                # the sessions no client holds (the visitors', the first) out of memory
                and figures["sessions_live"] == len(self.rigs)
                and figures["fds"] == previous["fds"]
                and figures["tasks"] == previous["tasks"]
            )
            if settled or trio.current_time() > deadline:
                break
            previous = figures
            await trio.sleep(1.0)
        if not settled:
            self.quiet_timeouts.append(name)
        self.history[name] = await self._history(http)
        self.samples.append(Sample(self._elapsed(), name, figures))
        self.log(f"{name}: " + ", ".join(f"{k} {v:g}" for k, v in figures.items()))
        return figures

    async def _history(self, http: httpx.AsyncClient) -> dict[str, int]:
        """The soak sessions' messages as ``GET .../messages`` pages them: count and JSON bytes.

        The daemon keeps every message of a loaded session in memory, so
        this is memory that grows with the load by design, shown beside RSS.
        """
        count = size = 0
        for rig in self.rigs:
            before: str | None = None
            while True:
                params = {"limit": "200", **({"before": before} if before else {})}
                answer = await http.get(f"/sessions/{rig.session_id}/messages", params=params)
                answer.raise_for_status()
                page = answer.json()
                count += len(page["messages"])
                size += len(answer.content)
                if not page["has_more"] or not page["messages"]:
                    break
                before = page["messages"][0]["id"]
        return {"messages": count, "bytes": size}

    def _elapsed(self) -> float:
        t0 = self._load_t0 if self._load_t0 is not None else self._t0
        return round(time.monotonic() - t0, 2)

    async def _sample(self, http: httpx.AsyncClient) -> None:
        while True:
            if self.phase in ("warmup", "load"):
                try:
                    figures = await scrape(http)
                except CONNECT_ERRORS as exc:
                    self._problem(f"/metrics: {exc!r}")
                else:
                    self.samples.append(Sample(self._elapsed(), self.phase, figures))
            await trio.sleep(self.profile.sample_every_s)

    # --- turns --------------------------------------------------------------------------

    async def _runner(self, rig: Rig, http: httpx.AsyncClient, stop: trio.Event) -> None:
        step = rig.offset
        while not stop.is_set():
            name = "lorem" if rig.stalled else ROTATION[step % len(ROTATION)]
            step += 1
            try:
                await self._turn(rig, http, self.scenarios[name])
            except CONNECT_ERRORS as exc:
                self._problem(f"{rig.session_id} {name}: {exc!r}")
                await trio.sleep(1.0)
            await trio.sleep(self.profile.turn_gap_s)

    async def _turn(self, rig: Rig, http: httpx.AsyncClient, scenario: Scenario) -> None:
        tally = self.turns[scenario.name]
        tally.run += 1
        stayer = rig.stayer
        answer = await http.post(
            f"/sessions/{rig.session_id}/turns", json={"content": scenario.content()}
        )
        if answer.status_code != 202:
            tally.unexpected += 1
            self._problem(f"{scenario.name}: POST turns {answer.status_code} {answer.text[:200]}")
            return
        turn_id = str(answer.json()["turn_id"])

        def events() -> list[Event]:
            return stayer.turns.get(turn_id, [])

        def ended() -> bool:
            got = events()
            return bool(got) and got[-1].type in TURN_ENDS

        timeout = self.profile.turn_timeout_s
        if scenario.trigger is not None:
            trigger = scenario.trigger
            seen = _Finder(events, trigger)
            await stayer.wait(lambda: ended() or seen.found() is not None, timeout)
            event = seen.found()
            if event is not None and not ended():
                await self._act(rig, http, scenario, turn_id, event)
        if not await stayer.wait(ended, timeout):
            tally.stuck += 1
            self._problem(f"{scenario.name} {turn_id}: no end within {timeout:.0f} s")
            await http.post(f"/sessions/{rig.session_id}/turns/{turn_id}/cancel", json={})
            await stayer.wait(ended, 10)
            stayer.turns.pop(turn_id, None)
            return
        problems = judge(scenario, stayer.turns.pop(turn_id))
        if problems:
            tally.unexpected += 1
            self._problem(f"{scenario.name} {turn_id}: {'; '.join(problems)}")
        else:
            tally.as_expected += 1

    async def _act(
        self, rig: Rig, http: httpx.AsyncClient, scenario: Scenario, turn_id: str, event: Event
    ) -> None:
        base = f"/sessions/{rig.session_id}"
        if scenario.action == "cancel_frame":
            await rig.stayer.send({"type": "cancel", "turn_id": turn_id, "reason": "soak"})
            return
        if scenario.action == "cancel_http":
            answer = await http.post(f"{base}/turns/{turn_id}/cancel", json={"reason": "soak"})
        else:
            assert isinstance(event.payload, PermissionRequested)
            answer = await http.post(
                f"{base}/permissions/{event.payload.perm_id}", json={"decision": "allow"}
            )
        if answer.status_code != 202:
            self._problem(f"{scenario.name} {turn_id}: {answer.status_code} {answer.text[:200]}")

    # --- killers and audits -------------------------------------------------------------

    async def _killer(self, http: httpx.AsyncClient, index: int) -> None:
        assert self.daemon is not None
        step = index
        while True:
            kind = KILLS[step % len(KILLS)]
            rig = self.rigs[step % len(self.rigs)]
            step += 1
            try:
                await kill(self.daemon.host, self.daemon.port, http, rig.session_id, kind)
                self.kills[kind] += 1
            except CONNECT_ERRORS:
                self.kill_errors += 1
            await trio.sleep(self.profile.kill_pause_s)

    async def _auditor(self, rig: Rig, http: httpx.AsyncClient, first_s: float) -> None:
        await trio.sleep(first_s)
        while True:
            await self._audit(rig, http)
            await trio.sleep(self.profile.audit_every_s)

    async def _audit(self, rig: Rig, http: httpx.AsyncClient) -> None:
        """Replay from the rig's cursor; compare with what its stayer got live."""
        stayer = rig.stayer
        since = rig.cursor
        before = stayer.audit.last_id
        try:
            replay = await replay_ids(http, rig.session_id, since)
        except (RuntimeError, *CONNECT_ERRORS) as exc:
            rig.audit_errors.append(repr(exc)[:300])
            return
        if replay:
            top = replay[-1]
            await stayer.wait(lambda: (stayer.audit.last_id or "") >= top, 15)
        check = compare_replay(stayer.audit.replayable, since, replay, live_before=before)
        rig.audits += 1
        rig.compared += check.compared
        rig.lost += check.lost
        rig.unexpected += check.unexpected
        rig.order_differs += check.order_differs
        if replay:
            rig.cursor = replay[-1]

    def _problem(self, what: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(what)

    # --- the result -----------------------------------------------------------------------

    def result(self) -> dict[str, Any]:
        """Everything measured, as plain values (:func:`bench.soak.report.verdict` judges it)."""
        daemon = self.daemon
        audits = [rig.stayer.audit for rig in self.rigs]
        churned = list(self.churn.audits.values())
        return {
            "profile": asdict(self.profile),
            "daemon": {
                "alive": not self.died,
                "exit_code": daemon.exit_code if daemon else None,
                "shutdown_code": self.shutdown_code,
                "log_tail": daemon.log_tail() if daemon and self.died else "",
                "errors_after_death": self.errors_after_death,
            },
            "samples": [{"t": s.t, "phase": s.phase, **s.figures} for s in self.samples],
            "baseline": self.baseline,
            "end": self.end,
            "quiet_timeouts": self.quiet_timeouts,
            "history": self.history,
            "stayers": {
                "sessions": len(self.rigs),
                "events": sum(a.received for a in audits),
                "compared": sum(r.compared for r in self.rigs),
                "audits": sum(r.audits for r in self.rigs),
                "audit_errors": [e for r in self.rigs for e in r.audit_errors][:MAX_PROBLEMS],
                "lost": sum(len(r.lost) for r in self.rigs),
                "unexpected": sum(len(r.unexpected) for r in self.rigs),
                "order_differs": sum(r.order_differs for r in self.rigs),
                "duplicated": sum(a.duplicated for a in audits),
                "out_of_order": sum(a.out_of_order for a in audits),
                "violations": sum(a.violations for a in audits),
                "dropped": [r.stayer.dropped for r in self.rigs if r.stayer.dropped],
                "error_frames": [e for r in self.rigs for e in r.stayer.error_frames][:10],
                "details": [d for a in audits for d in a.details][:MAX_PROBLEMS]
                + [f"lost {i}" for r in self.rigs for i in r.lost][:10],
            },
            "turns": {name: vars(t) for name, t in self.turns.items()},
            "turn_problems": self.problems,
            "churn": {
                "connections": self.churn.connections,
                "connect_errors": self.churn.connect_errors,
                "events": sum(a.received for a in churned),
                "duplicated": sum(a.duplicated for a in churned),
                "out_of_order": sum(a.out_of_order for a in churned),
                "violations": sum(a.violations for a in churned),
                "subscribe_errors": self.churn.subscribe_errors[:10],
                "details": [d for a in churned for d in a.details][:MAX_PROBLEMS],
            },
            "slow": {
                "stalls": self.churn.stalls,
                "closed_too_slow": self.churn.closed_too_slow,
                "stalls_without_overflow": self.churn.stalls_without_overflow,
                "other_closes": self.churn.other_closes[:10],
            },
            "kills": {**dict(self.kills), "errors": self.kill_errors},
            "visitors": {
                "sessions": len(self.visitors),
                "visits": sum(v.visits for v in self.visitors),
                "problems": [p for v in self.visitors for p in v.problems][:MAX_PROBLEMS],
            },
        }


class _Finder:
    """The first event of a type in a growing list, scanning each event once."""

    def __init__(self, events: Callable[[], list[Event]], type_: str) -> None:
        self.events = events
        self.type = type_
        self.pos = 0
        self.hit: Event | None = None

    def found(self) -> Event | None:
        got = self.events()
        while self.hit is None and self.pos < len(got):
            if got[self.pos].type == self.type:
                self.hit = got[self.pos]
            self.pos += 1
        return self.hit


async def run_soak(
    profile: SoakProfile, workdir: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run ``profile`` in ``workdir`` (the store, the config, the daemon's log); the result."""
    soak = Soak(profile, workdir, log)
    await soak.run()
    return soak.result()
