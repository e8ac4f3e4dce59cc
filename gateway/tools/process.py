"""Tool processes: what they inherit, and that none outlives the daemon (docs/protocol.md §15).

Every process the gateway starts for a tool (the ``shell`` tool today; MCP
servers over stdio and the Claude Code CLI use the same door) is started by
:meth:`ToolProcesses.spawn` and stopped by :meth:`ToolProcesses.stop`:

- **Environment** (:func:`tool_environment`): ``PATH`` (the daemon's, else
  ``os.defpath``), ``HOME`` = the session's workspace, ``LANG`` (the daemon's,
  else ``C.UTF-8``), plus exactly ``[tools] env`` (which may override those
  three), nothing else of the daemon's: no provider API key, no ``GATEWAY_*``,
  no ``USER``, ``TZ`` or ``TMPDIR``.
- **Limits**: ``[tools] rlimit_cpu_s``, ``rlimit_memory_mb`` (address space)
  and ``rlimit_file_mb`` (largest file written) become soft and hard
  ``setrlimit`` limits in the child before it execs (0 = none), so neither it
  nor anything it starts can raise them.
- **Process group**: each process leads a new session
  (``start_new_session``), so it and everything it starts share one group,
  which is what is signalled.
- **Dies with the daemon**, kill -9 included: one watchdog process per daemon
  (gateway.tools.reaper), started with the first tool process and kept by the
  ``tool-reaper`` task (:meth:`ToolProcesses.run`), is told of every group as
  it starts (``+PGID``) and once it is dead (``-PGID``), on a pipe only the
  daemon holds. When the daemon exits, however it exits, the pipe reaches
  end-of-file and the watchdog SIGKILLs every group still registered. A
  group's command runs only once a live watchdog has answered its ``+PGID``:
  the process starts as ``/bin/sh`` waiting on a pipe of the daemon's (the
  *gate*), and execs the command when the daemon writes to it; if the daemon
  dies first, the gate reads end-of-file and the shell exits without running
  anything. So a tool started while a watchdog dies (killed a moment ago, not
  yet reaped) waits for the next one, and a daemon killed meanwhile leaves
  nothing behind. (Not
  ``PR_SET_PDEATHSIG``: Trio forks from a worker thread, and the signal fires
  when that *thread* exits, which an idle worker does after seconds.) If the
  watchdog dies, the daemon logs ``tool_reaper_died`` and starts another at
  once, which is told of every live group; spawns wait for it meanwhile.
- **The daemon's own environment**: before its first tool process the daemon
  makes itself non-dumpable (:func:`keep_environment_private`), so a tool
  cannot read it back through ``/proc/$PPID/environ``.
- **No ``CAP_SYS_PTRACE``** (docs/protocol.md §15, "Tool processes"): root
  passes the non-dumpable check with that capability, so a daemon running as
  root would run tools that read its memory (``/proc/$PPID/mem``, where its
  keys are). Each tool process drops it, in the child before it execs
  (:func:`drop_ptrace`): from its bounding set (nothing it execs, setuid
  programs included, gets it back) and from its inheritable and ambient sets.
  The Claude Code CLI and the MCP servers are tool processes: so are their
  children (Bash, its background shells, the sandbox).

Left open on purpose: a process that leaves its group (``setsid``) escapes the
group kill, as it would escape any supervisor that is not a container.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from gateway.config import ToolsConfig
from gateway.logs import event

log = logging.getLogger("gateway.tools")

REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")
"""The watchdog's script, run by path with ``python -I -S`` (nothing of the gateway imported)."""

REAPER_START_TIMEOUT_S = 5.0
"""How long a spawn waits for the watchdog's first start before it goes on without."""

REAPER_RESTART_DELAY_S = 1.0
"""The pause before a watchdog that died (or failed to start) is started again."""

GATE = 'read -r _ < /proc/self/fd/{fd} || exit 111; exec "$@"'
"""What a tool process starts as: a shell that runs the command once the gate opens.

The gate is named by path: the daemon's descriptor numbers run past 9, which
``sh``'s ``<&N`` does not take. On a system without ``/proc`` nothing is gated.
"""

GATED = sys.platform == "linux"
"""Whether tool processes wait for the watchdog's answer (module docstring)."""

_MIB = 1024 * 1024


def tool_environment(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a tool process (module docstring): nothing else is inherited."""
    env = {
        "PATH": os.environ.get("PATH") or os.defpath,
        "HOME": home,
        "LANG": os.environ.get("LANG") or "C.UTF-8",
    }
    env.update(extra or {})
    return env


def _check_runnable(command: str, workspace: str, search: str) -> None:
    """Raise what ``subprocess`` would if ``command`` cannot be run (the gate execs it later).

    Raises:
        FileNotFoundError: no such file, on ``PATH`` for a bare name.
        PermissionError: a file that is not executable.
    """
    if "/" in command:
        path = os.path.join(workspace, command)  # (an absolute command stays itself)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
    elif shutil.which(command, path=search) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)


def _in_child(limits: tuple[tuple[int, int], ...], ptrace: bool) -> None:
    """In the child, between fork and exec: ``prctl``/``capset`` and ``setrlimit`` calls only,
    no lock taken. ``ptrace``: :func:`drop_ptrace` first."""
    if ptrace:
        drop_ptrace()
    for which, value in limits:
        resource.setrlimit(which, (value, value))


CAP_SYS_PTRACE = 19
_CAP_SETPCAP = 8
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_LOWER = 3
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _capabilities() -> tuple[_CapHeader, ctypes.Array[_CapData]]:
    """This process's capability sets (``capget``, version 3: two 32-bit words)."""
    assert _LIBC is not None
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if _LIBC.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    return header, data


def ptrace_held() -> bool:
    """Whether a process this one starts could hold ``CAP_SYS_PTRACE`` (Linux; else False).

    Root's programs get every capability of the bounding set when they exec;
    anyone's get what is inheritable and ambient. So: in the bounding set while
    running as root (or able to drop it), or in the inheritable set.
    """
    if _LIBC is None:
        return False
    bounding = _LIBC.prctl(_PR_CAPBSET_READ, CAP_SYS_PTRACE, 0, 0, 0) == 1
    _header, data = _capabilities()
    setpcap = bool(data[0].effective & (1 << _CAP_SETPCAP))
    inheritable = bool(data[0].inheritable & (1 << CAP_SYS_PTRACE))
    return (bounding and (os.geteuid() == 0 or setpcap)) or inheritable


def drop_ptrace() -> None:
    """Drop ``CAP_SYS_PTRACE`` from this process's bounding, inheritable and ambient sets.

    Called in a tool process between fork and exec (module docstring): what it
    execs never holds the capability, nor can anything it starts regain it.

    Raises:
        OSError: a set could not be lowered (the spawn then fails: closed, not open).
    """
    assert _LIBC is not None
    bounding = _LIBC.prctl(_PR_CAPBSET_READ, CAP_SYS_PTRACE, 0, 0, 0) == 1
    if bounding and _LIBC.prctl(_PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE) failed")
    header, data = _capabilities()
    if data[0].inheritable & (1 << CAP_SYS_PTRACE):
        data[0].inheritable &= ~(1 << CAP_SYS_PTRACE)  # the ambient bit goes with it
        if _LIBC.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset failed")
    _LIBC.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_LOWER, CAP_SYS_PTRACE, 0, 0)


class ToolProcesses:
    """The tool processes of one daemon: their environment, limits, and watchdog."""

    def __init__(self, config: ToolsConfig | None = None) -> None:
        config = config or ToolsConfig()
        self.env: dict[str, str] = dict(config.env)
        limits = (
            (resource.RLIMIT_CPU, config.rlimit_cpu_s),
            (resource.RLIMIT_AS, config.rlimit_memory_mb * _MIB),
            (resource.RLIMIT_FSIZE, config.rlimit_file_mb * _MIB),
        )
        self.limits = tuple((which, value) for which, value in limits if value > 0)
        self.drop_ptrace = ptrace_held()  # what each child drops before it execs
        self.reaper_pid: int | None = None
        self._reaper: trio.Process | None = None
        self._groups: set[int] = set()  # registered with the watchdog: started, not yet dead
        self._acks: dict[int, trio.Event] = {}  # groups waiting for a watchdog's answer
        self._pipe: int | None = None  # the write end of the watchdog's stdin
        self._kept = False  # :meth:`run` is running
        self._wanted = trio.Event()
        self._up = trio.Event()

    # --- spawning ------------------------------------------------------------------

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        workspace: str,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> trio.Process:
        """Start a tool process in ``workspace``, in a group of its own, known to the watchdog.

        ``kwargs`` go to ``trio.lowlevel.open_process`` (``stdin``, ``stdout``,
        ``stderr``); the environment, working directory, session and limits are
        this module's. ``env`` adds to the environment after ``[tools] env`` (an
        MCP server's own ``env``). The command runs once the watchdog has
        answered (module docstring); cancelled before that, the process is
        stopped here and never runs it.
        """
        if self._kept and not self._watched():  # the first spawn, or a watchdog restarting
            self._wanted.set()
            with trio.move_on_after(REAPER_START_TIMEOUT_S):
                while not self._watched():
                    if self._up.is_set():
                        await trio.sleep(0.01)  # it will within a checkpoint or two
                    else:
                        await self._up.wait()
        # Gated only where a watchdog is up (one that cannot start is waited for
        # above, then gone on without, as before).
        gated = self._kept and GATED and self._watched()
        environment = tool_environment(workspace, {**self.env, **(env or {})})
        if gated:  # a command that cannot run fails here, as an exec of it would
            _check_runnable(argv[0], workspace, environment["PATH"])
        gate_read, gate_write = os.pipe() if gated else (-1, -1)
        try:
            proc = await trio.lowlevel.open_process(
                ["/bin/sh", "-c", GATE.format(fd=gate_read), "gateway-tool", *argv]
                if gated
                else list(argv),
                cwd=workspace,
                env=environment,
                start_new_session=True,
                preexec_fn=(
                    functools.partial(_in_child, self.limits, self.drop_ptrace)
                    if self.limits or self.drop_ptrace
                    else None
                ),
                pass_fds=(gate_read,) if gated else (),
                **kwargs,
            )
        except BaseException:
            if gated:
                os.close(gate_write)
            raise
        finally:
            if gated:
                os.close(gate_read)
        self._groups.add(proc.pid)
        if not gated:  # no watchdog is kept (a test's): nothing to wait for
            self._tell(b"+%d\n" % proc.pid)
            return proc
        acked = self._acks[proc.pid] = trio.Event()
        self._tell(b"+%d\n" % proc.pid)
        try:
            # Answered by this watchdog, or by the next one if it is dying (a new
            # one is told every group): the command runs only once it is known.
            with trio.move_on_after(REAPER_START_TIMEOUT_S):
                await acked.wait()
        except BaseException:  # cancelled: the command never runs
            os.close(gate_write)
            with trio.CancelScope(shield=True):
                await self.stop(proc, 0)
            raise
        finally:
            self._acks.pop(proc.pid, None)
        try:
            os.write(gate_write, b"go\n")
        finally:
            os.close(gate_write)
        return proc

    def _watched(self) -> bool:
        """A watchdog is up, and alive this very moment.

        One killed a moment ago is dead before the ``tool-reaper`` task has
        seen it: a tool started then would be known to no watchdog, and would
        outlive a daemon killed before the next one starts.
        """
        reaper = self._reaper
        return self._up.is_set() and reaper is not None and reaper.poll() is None

    async def stop(self, proc: trio.Process, grace_s: float) -> None:
        """Stop every process of ``proc``'s group and reap ``proc``; run it shielded.

        A process still running gets SIGTERM, with its whole group, and
        ``grace_s`` to exit (docs/protocol.md §8). Then the group gets SIGKILL in
        every case: children that ignored SIGTERM, or were left in the
        background by a process that exited on its own, are in it still. Only
        then is the group struck off the watchdog's list.
        """
        if proc.returncode is None:
            signal_group(proc.pid, signal.SIGTERM)
            with trio.move_on_after(grace_s):
                await proc.wait()
        signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        if proc.pid in self._groups:
            self._groups.discard(proc.pid)
            self._tell(b"-%d\n" % proc.pid)

    # --- the watchdog ----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The ``tool-reaper`` task: keep a watchdog running from the first spawn on.

        Cancelled at shutdown, after the sessions stopped (their processes are
        stopped with them): it closes the pipe, so the watchdog kills whatever
        is left and exits, and waits for it.
        """
        self._kept = True
        task_status.started()
        reaper: trio.Process | None = None
        try:
            await self._wanted.wait()
            keep_environment_private()
            while True:
                started = trio.current_time()
                try:
                    reaper = await self._start_reaper()
                except OSError as exc:
                    event(
                        log, logging.ERROR, "tool_reaper_failed",
                        f"the tool process watchdog could not start: {exc}", error=str(exc),
                    )  # fmt: skip
                else:
                    self._up.set()
                    async with trio.open_nursery() as acks:
                        assert reaper.stdout is not None
                        acks.start_soon(self._read_acks, reaper.stdout, name="tool-reaper-acks")
                        code = await reaper.wait()
                        acks.cancel_scope.cancel()
                    # Spawns wait for the next one: a group started now would
                    # be known to no watchdog.
                    self._up = trio.Event()
                    event(
                        log, logging.ERROR, "tool_reaper_died",
                        f"the tool process watchdog exited ({code}); starting another",
                        exit_code=code,
                    )  # fmt: skip
                    self._close_pipe()
                # At once after a watchdog that lived; a pause after one that
                # could not start or died at once (no busy loop).
                if trio.current_time() - started < REAPER_RESTART_DELAY_S:
                    await trio.sleep(REAPER_RESTART_DELAY_S)
        finally:
            self._kept = False
            self._close_pipe()  # end-of-file: the watchdog kills what is left and exits
            if reaper is not None and reaper.returncode is None:
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(5):
                        await reaper.wait()
                    if reaper.returncode is None:
                        reaper.kill()
                        await reaper.wait()

    async def _start_reaper(self) -> trio.Process:
        """Start a watchdog and tell it every group alive now."""
        read, write = os.pipe()  # neither end is inherited by anything else
        try:
            reaper = await trio.lowlevel.open_process(
                [sys.executable, "-I", "-S", REAPER],
                env=tool_environment("/"),  # nothing of the daemon's: it is a process of its user
                stdin=read,
                stdout=subprocess.PIPE,  # its answers to "+PGID"
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a tool group's kill or a terminal's ^C never reaches it
            )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        os.set_blocking(write, False)
        self._pipe = write
        self.reaper_pid = reaper.pid
        self._reaper = reaper
        for pgid in list(self._groups):
            self._tell(b"+%d\n" % pgid)
        return reaper

    async def _read_acks(self, answers: trio.abc.ReceiveStream) -> None:
        """The watchdog's answers: each ``+PGID`` it registered opens that group's gate."""
        pending = b""
        async for data in answers:
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                digits = line[1:]
                if line[:1] == b"+" and digits.isdigit():
                    acked = self._acks.get(int(digits))
                    if acked is not None:
                        acked.set()

    def _tell(self, line: bytes) -> None:
        """Send one line to the watchdog, without waiting (a line is far below PIPE_BUF)."""
        if self._pipe is None:
            return
        try:
            os.write(self._pipe, line)
        except OSError as exc:  # full (a stuck watchdog) or closed (a dead one): logged
            event(
                log, logging.ERROR, "tool_reaper_unreachable",
                f"the tool process watchdog was not told {line.decode().strip()}: {exc}",
                error=str(exc),
            )  # fmt: skip

    def _close_pipe(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._pipe = None


def keep_environment_private() -> None:
    """Make the daemon non-dumpable, so its tool processes cannot read its environment.

    A tool runs as the daemon's user, and a process may read
    ``/proc/<pid>/environ`` (the environment the daemon *started* with: its
    provider API keys) of any process of its user that is dumpable; the
    minimal environment of :func:`tool_environment` would be bypassed by
    ``cat /proc/$PPID/environ``. ``prctl(PR_SET_DUMPABLE, 0)`` makes those files
    the superuser's (and turns off core dumps and same-user ptrace of the
    daemon: attach py-spy as root). Root passes that check with
    ``CAP_SYS_PTRACE``, which no tool process holds (:func:`drop_ptrace`). Done
    once, before the first tool process; a daemon that runs no tool stays as it
    was. Elsewhere than Linux: nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        event(
            log, logging.WARNING, "tool_environment_readable",
            f"prctl(PR_SET_DUMPABLE, 0) failed ({os.strerror(errno)}): tool processes"
            " may read the daemon's environment through /proc",
        )  # fmt: skip


_PR_SET_DUMPABLE = 4


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group that may be empty already (the usual case after a clean exit).

    Its id is its leader's pid, which the kernel does not hand out again while
    the group has a member.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
