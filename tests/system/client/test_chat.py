"""``gateway chat``: the screen it keeps, and the real command in a pseudo-terminal.

- :class:`Region`, the part of the screen that is redrawn by difference, is
  checked against an independent terminal emulator (pyte): whatever sequence
  of redraws, settles and closes, the emulated screen shows exactly the
  lines written for good followed by the region's lines, wrapped at the
  terminal's width (hypothesis draws the sequences, wide characters and
  lines longer than the width included).
- The command itself runs in a pseudo-terminal driven by pexpect, against a
  ``gateway serve`` subprocess on the scripted model: a turn with thinking,
  text and a tool (one line with its status and duration), an approval
  answered with one key, Ctrl-C cancelling the turn in flight, a second
  Ctrl-C quitting with exit status 0 (chat.py says why 0), and a connection
  cut mid-reply (by a proxy in the test) that leaves the final screen
  exactly as an uninterrupted chat's. What the terminal finally shows is
  read by feeding everything the chat wrote to pyte.

pexpect's reads block, so they run in a worker thread while the test's Trio
loop serves the proxy; every wait has a cap.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pexpect
import pyte
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.client import GatewayClient
from gateway.client.chat import Line, Region, layout
from gateway.protocol.shapes import ImageBlock, TextBlock
from tests.integration.client.test_attach_cli import SilenceableProxy
from tests.paths import ROOT

# slow: gateway serve and gateway chat as processes, in a pseudo-terminal
pytestmark = pytest.mark.slow

ROOT = ROOT
READY = re.compile(rb"gateway listening on http://127\.0\.0\.1:(\d+)")
EXAMPLES = int(os.environ.get("GATEWAY_HYPOTHESIS_EXAMPLES", "200"))
PROMPT_MARK = "\u203a"
PROMPT = f"\x1b[1m{PROMPT_MARK}\x1b[0m "
WIDTH, HEIGHT = 100, 60


# --- the region, against an emulator --------------------------------------------------------


def emulate(output: str, width: int, height: int = 200) -> list[str]:
    """The screen rows after ``output`` (with the tty's newline translation), trailing
    blanks stripped."""
    screen = pyte.Screen(width, height)
    pyte.Stream(screen).feed(output.replace("\n", "\r\n"))
    rows = [row.rstrip() for row in screen.display]
    while rows and not rows[-1]:
        rows.pop()
    return rows


def wrapped(lines: list[str], width: int) -> list[str]:
    """Logical lines as rows of a terminal ``width`` cells wide, trailing blanks stripped."""
    rows = []
    for line in lines:
        rows.extend([line[i : i + width].rstrip() for i in range(0, len(line), width)] or [""])
    return rows


class Recorder(io.StringIO):
    encoding = "utf-8"


# One cell per character: pyte, unlike xterm, does not move a wide character that
# does not fit at the end of a row to the next one (test_rows_follow_xterm does).
texts = st.text(alphabet="ab c", max_size=45)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("show"), st.lists(texts, max_size=5)),  # anything at all
        st.tuples(st.just("add"), texts),  # a new last line (a status line, a block)
        st.tuples(st.just("grow"), st.text(alphabet="xyz ", min_size=1, max_size=30)),
        st.tuples(st.just("drop"), st.integers(1, 3)),  # the last lines go
        st.tuples(st.just("settle"), st.integers(0, 5)),
        st.tuples(st.just("close"), st.none()),
    ),
    max_size=30,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(ops=operations, width=st.integers(8, 30))
def test_the_region_shows_exactly_what_it_was_given(ops: list[Any], width: int) -> None:
    out = Recorder()
    region = Region(out, lambda: width)
    written: list[str] = []  # lines written for good
    current: list[str] = []
    for op, arg in ops:
        match op:
            case "show":
                current = list(arg)
            case "add":
                current = [*current, arg]
            case "grow":  # text streaming into the last line
                current = [*current[:-1], (current[-1] if current else "") + arg]
            case "drop":
                current = current[: max(len(current) - arg, 0)]
            case "settle":
                count = min(arg, len(current))
                region.settle(count)
                written += current[:count]
                current = current[count:]
            case "close":
                region.close()
                written += current
                current = []
        region.show([Line(x) for x in current])
    expected = wrapped(written + current, width)
    while expected and not expected[-1]:
        expected.pop()
    assert emulate(out.getvalue(), width) == expected


def test_rows_follow_xterm() -> None:
    assert layout("", 8) == (1, 0)
    assert layout("a" * 8, 8) == (1, 0)  # full: the cursor waits on the row
    assert layout("a" * 9, 8) == (2, 1)
    assert layout("aaaaaaa界", 8) == (2, 1)  # the wide character goes to the next row
    assert layout("aaaaaa界", 8) == (1, 0)


def test_the_region_appends_text_that_only_grew_and_styles_each_line() -> None:
    out = Recorder()
    region = Region(out, lambda: 40)
    region.show([Line("Hello")])
    region.show([Line("Hello, wor")])
    region.show([Line("Hello, world"), Line("⏺ sleep  running…", "36")])
    assert out.getvalue() == "Hello, wor" + "ld" + "\n\x1b[36m⏺ sleep  running…\x1b[0m"
    region.show([Line("Hello, world")])  # the status line goes: only it is rewritten
    assert out.getvalue().endswith("\r\x1b[1A\x1b[JHello, world")
    assert emulate(out.getvalue(), 40) == ["Hello, world"]


# --- the command in a pseudo-terminal ------------------------------------------------------------


@asynccontextmanager
async def gateway_serve(tmp_path: Path, stream: str = "", **config: Any) -> AsyncIterator[int]:
    """``gateway serve`` as a process on port 0, its log in ``tmp_path``; its port.

    ``stream``: lines of its ``[stream]`` table; ``config``: keys of ``[tools]``."""
    lines = [f'[server]\nport = 0\n[store]\npath = "gateway.db"\n[stream]\n{stream}\n[tools]']
    lines += [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    (tmp_path / "gateway.toml").write_text("\n".join(lines) + "\n")
    with open(tmp_path / "serve.log", "wb") as log:  # noqa: ASYNC230 (a file handle to pass)
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "gateway", "serve", "--config", "gateway.toml"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=log,
        )
    try:
        assert proc.stdout is not None
        seen = b""
        with trio.fail_after(20):
            while not (match := READY.search(seen)):
                chunk = await proc.stdout.receive_some(1024)
                assert chunk, f"the gateway exited: {(tmp_path / 'serve.log').read_text()}"
                seen += chunk
        yield int(match.group(1))
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert proc.stdout is not None
        await proc.stdout.aclose()


class Terminal:
    """``gateway chat ARGS`` in a pseudo-terminal of ``WIDTH`` x ``HEIGHT``."""

    def __init__(self, *args: str) -> None:
        self.written = io.StringIO()
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "gateway", "chat", *args],
            cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", "COLUMNS": str(WIDTH)},
            dimensions=(HEIGHT, WIDTH),
            encoding="utf-8",
            timeout=20,
        )
        self.child.logfile_read = self.written

    async def expect(self, pattern: str) -> str:
        """Wait for ``pattern`` (a regular expression) in what the chat writes next."""
        await trio.to_thread.run_sync(self.child.expect, pattern, abandon_on_cancel=True)
        return str(self.child.after)

    async def prompt(self) -> None:
        await self.expect(re.escape(PROMPT))

    def send(self, text: str) -> None:
        self.child.send(text)

    async def exit_status(self) -> int:
        await trio.to_thread.run_sync(self.child.expect, pexpect.EOF, abandon_on_cancel=True)
        self.child.close()
        assert self.child.exitstatus is not None, self.child.signalstatus
        return int(self.child.exitstatus)

    def screen(self) -> list[str]:
        """What the terminal shows now (all of it: the emulated screen is tall)."""
        return emulate(self.written.getvalue(), WIDTH)

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@asynccontextmanager
async def terminal(*args: str) -> AsyncIterator[Terminal]:
    term = Terminal(*args)
    try:
        yield term
    finally:
        term.close()


def script(*rounds: list[dict[str, Any]], delay_ms: int = 0) -> str:
    return json.dumps({"script": {"delay_ms": delay_ms, "rounds": list(rounds)}})


async def test_a_turn_an_approval_a_cancel_and_quit(tmp_path: Path) -> None:
    tool_turn = script(
        [
            {"thinking": "Let me look at the notes first."},
            {"text": "Reading them."},
            {"tool_use": {"name": "read_file", "input": {"path": "notes.txt"}}},
            {"tool_use": {"name": "sleep", "input": {"seconds": 0.05}}},
        ],
        [{"text": "The notes say hello."}],
    )
    with trio.fail_after(60):
        async with (
            gateway_serve(tmp_path, require_approval=["read_file"]) as port,
            terminal("--url", f"http://127.0.0.1:{port}") as chat,
        ):
            sid = (await chat.expect(r"session sess_\w+")).split()[1]
            # The session's own workspace (docs/protocol.md §15), made with it.
            own = tmp_path / "workspaces" / "local" / ".own" / sid
            (own / "notes.txt").write_text("the notes\n")
            await chat.prompt()
            chat.send(tool_turn + "\r")
            await chat.expect(r"\? allow read_file \{\"path\": \"notes.txt\"\}  \[y/n\]")
            chat.send("y")
            await chat.expect("The notes say hello.")
            await chat.prompt()
            turn = chat.screen()
            # a long reply, cancelled by Ctrl-C while it streams
            chat.send(script([{"lorem": 400}], delay_ms=20) + "\r")
            await chat.expect("lorem ipsum")
            chat.child.sendintr()
            await chat.expect(r"\(cancelled\)")
            await chat.prompt()
            chat.child.sendintr()  # a second Ctrl-C, with nothing to cancel: quit
            status = await chat.exit_status()
    assert status == 0
    start = turn.index("✻ Let me look at the notes first.")
    assert turn[start + 1] == "Reading them.", turn
    assert turn[start + 4 :] == ["The notes say hello.", PROMPT_MARK], turn
    tools = turn[start + 2 : start + 4]
    assert re.fullmatch(r'⏺ read_file \{"path": "notes.txt"\}  ✓ \d+ ms', tools[0]), tools
    assert re.fullmatch(r'⏺ sleep \{"seconds": 0.05\}  ✓ \d+ ms', tools[1]), tools
    final = chat.screen()
    assert final[-2] == "(cancelled)", final
    assert final[-1] in (PROMPT_MARK, f"{PROMPT_MARK} ^C"), final  # the tty may echo the ^C
    assert not any("Traceback" in row for row in final)


async def test_queue_and_steer_while_a_turn_runs(tmp_path: Path) -> None:
    """docs/protocol.md §2 "A busy session": while a turn runs, ``/`` opens a command line. A
    ``/queue`` waits under the conversation until the turn ends, then runs as a turn of its
    own; a ``/steer`` is taken after the tool round, stands in the turn marked
    ``(steered)``, and the turn's next call answers it."""
    turn = script(
        [{"text": "Working on it."}, {"tool_use": {"name": "sleep", "input": {"seconds": 2}}}]
    )
    with trio.fail_after(60):
        async with (
            gateway_serve(tmp_path) as port,
            terminal("--url", f"http://127.0.0.1:{port}") as chat,
        ):
            await chat.prompt()
            chat.send(turn + "\r")
            await chat.expect("running")  # the tool sleeps: the turn is in flight
            chat.send("/queue the next one\r")
            await chat.expect(re.escape("… queued 1: the next one"))
            chat.send("/steer also this\r")
            await chat.expect(re.escape("(steered: the running turn takes it"))
            await chat.expect("You said: the next one")
            await chat.prompt()
            final = chat.screen()
            chat.send("/quit\r")
            assert await chat.exit_status() == 0
    start = final.index("Working on it.")
    assert re.fullmatch(r'⏺ sleep \{"seconds": 2\}  ✓ \d+ ms', final[start + 1]), final
    assert final[start + 2 :] == [
        f"{PROMPT_MARK} also this",
        "  (steered)",
        "You said: also this",
        f"{PROMPT_MARK} the next one",
        "You said: the next one",
        PROMPT_MARK,
    ], final
    assert not any("queued" in row or row.startswith("/") for row in final), final


async def test_simple_view_and_a_cut_connection_leave_no_trace(tmp_path: Path) -> None:
    """The socket is cut mid-reply (no close frame): the chat resumes with ``since`` and
    the screen ends as an uninterrupted chat's, the first round's text replaced."""
    two_rounds = script(
        [
            {"thinking": "Hm."},
            {"text": "Checking."},
            {"tool_use": {"name": "sleep", "input": {"seconds": 0.05}}},
        ],
        [{"lorem": 120}],
        delay_ms=15,
    )
    with trio.fail_after(60):
        async with gateway_serve(tmp_path) as port, trio.open_nursery() as nursery:
            proxy = CuttingProxy(port)
            proxy_port = await nursery.start(proxy.serve)
            async with terminal(
                "--url", f"http://127.0.0.1:{proxy_port}", "--view", "simple"
            ) as chat:
                await chat.prompt()
                chat.send(two_rounds + "\r")
                await chat.expect("lorem ipsum dolor sit amet")
                proxy.cut_websockets()
                await chat.prompt()
                cut = chat.screen()
                chat.send("/quit\r")
                assert await chat.exit_status() == 0
            # the same turn again, uninterrupted, for comparison
            async with terminal("--url", f"http://127.0.0.1:{port}", "--view", "simple") as again:
                await again.prompt()
                again.send(two_rounds + "\r")
                await again.prompt()
                whole = again.screen()
                again.send("/quit\r")
                assert await again.exit_status() == 0
            nursery.cancel_scope.cancel()
    assert proxy.cuts >= 1
    reply = cut[cut.index(next(r for r in cut if r.startswith("lorem"))) : -1]
    assert reply == whole[whole.index(next(r for r in whole if r.startswith("lorem"))) : -1]
    assert "Checking." not in cut and "Checking." not in whole  # the first round's text went
    assert not any("reconnecting" in row for row in cut), cut


class CuttingProxy(SilenceableProxy):
    """A relay that can cut its WebSocket connections (both sockets closed at once)."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.cuts = 0
        self.scopes: list[tuple[Any, trio.CancelScope]] = []

    def cut_websockets(self) -> None:
        for relay, scope in self.scopes:
            if relay.websocket and not scope.cancel_called:
                scope.cancel()
                self.cuts += 1

    async def _relay(self, downstream: trio.SocketStream) -> None:
        from tests.integration.client.test_attach_cli import _Relay

        relay = _Relay()
        async with downstream, await trio.open_tcp_stream("127.0.0.1", self.target_port) as up:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                async for data in src:
                    relay.websocket = relay.websocket or b"upgrade: websocket" in data.lower()
                    await dst.send_all(data)
                nursery.cancel_scope.cancel()

            async with trio.open_nursery() as nursery:
                self.scopes.append((relay, nursery.cancel_scope))
                nursery.start_soon(pump, downstream, up)
                nursery.start_soon(pump, up, downstream)


async def test_a_session_longer_than_a_snapshot_opens_at_its_newest(tmp_path: Path) -> None:
    """docs/protocol.md §15: a session grown past ``snapshot_max_bytes`` (64 KiB) opens with
    ``--session`` on its newest messages, and says the earlier ones are not shown."""
    lorem = {"script": {"chunk_chars": 8000, "rounds": [[{"lorem": 2000}]]}}
    with trio.fail_after(60):
        async with gateway_serve(tmp_path, stream="snapshot_max_bytes = 65536") as port:
            url = f"http://127.0.0.1:{port}"
            async with GatewayClient(url) as client:
                session_id = (await client.create_session()).session_id
                async with client.open_session(session_id) as session:
                    for content in [json.dumps(lorem)] * 12 + ["the last one"]:
                        turn_id = await session.send(content)
                        async for _update in session:
                            if session.turn_ended(turn_id):
                                break
            async with terminal("--url", url, "--session", session_id) as chat:
                await chat.expect(re.escape("(earlier messages not shown)"))
                await chat.expect("You said: the last one")
                await chat.prompt()
                chat.send("\x04")  # Ctrl-D at the prompt: quit
                status = await chat.exit_status()
    assert status == 0
    assert not any("Traceback" in row for row in chat.screen())


async def test_what_retrying_cannot_fix_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with gateway_serve(tmp_path) as port:
            done = await trio.run_process(
                [sys.executable, "-m", "gateway", "chat", "--url", f"http://127.0.0.1:{port}",
                 "--session", "sess_00000000000000000000"],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.decode() == "chat: session sess_00000000000000000000 not found\n"


async def test_edit_and_retry_go_on_from_before_the_message(tmp_path: Path) -> None:
    """``/edit N TEXT`` and ``/retry`` (docs/protocol.md §2 "Edit and regenerate"): the
    screen keeps what it showed, marks the rewind, then shows the edited branch; the
    gateway's conversation is that branch."""
    with trio.fail_after(60):
        async with (
            gateway_serve(tmp_path) as port,
            terminal("--url", f"http://127.0.0.1:{port}") as chat,
        ):
            sid = (await chat.expect(r"session sess_\w+")).split()[1]
            for text in ("The first question", "The second question"):
                await chat.prompt()
                chat.send(text + "\r")
                await chat.expect(f"You said: {text}")
            await chat.prompt()
            chat.send("/edit 3 nothing\r")
            await chat.expect(re.escape("(not sent: no message 3 of yours: 1 to 2)"))
            await chat.prompt()
            for command in ("/edit 1 The first question, edited", "/retry"):
                chat.send(command + "\r")
                await chat.expect(re.escape("from your message 1 on"))
                await chat.expect("You said: The first question, edited")
                await chat.prompt()
            chat.send("/quit\r")  # (a Ctrl-D sent before the prompt reads a line is a byte)
            status = await chat.exit_status()
            async with GatewayClient(f"http://127.0.0.1:{port}") as client:
                page = await client.messages(sid)
                every = await client.messages(sid, include_rewound=True)
    assert status == 0
    screen = chat.screen()
    assert not any("Traceback" in row for row in screen)
    marks = [row for row in screen if row.startswith("· rewound")]
    assert (
        marks == ["· rewound: from your message 1 on, the messages above left the conversation"] * 2
    ), screen
    first = screen.index(marks[0])
    typed = (f"{PROMPT_MARK} /", f"{PROMPT_MARK} ^")  # the commands typed, a bare prompt
    after = [
        row for row in screen[first:] if row.strip(PROMPT_MARK + " ") and not row.startswith(typed)
    ]
    assert after[:3] == [
        marks[0],
        f"{PROMPT_MARK} The first question, edited",
        "You said: The first question, edited",
    ], screen
    assert after[-3:] == [
        marks[1],
        f"{PROMPT_MARK} The first question, edited",
        "You said: The first question, edited",
    ], screen
    said = [(m.role, m.content[0].text) for m in page.messages]  # type: ignore[union-attr]
    assert said == [
        ("user", "The first question, edited"),
        ("assistant", "You said: The first question, edited"),
    ]
    assert sum(bool(m.rewound) for m in every.messages) == 6


async def test_attach_uploads_a_file_for_the_next_message(tmp_path: Path) -> None:
    """``/attach PATH`` (docs/clients.md): the file is uploaded to the session, listed above
    the prompt until the next message, which carries it first; a name of a type the
    gateway does not take is refused before anything is sent; ``/help`` lists it."""
    from tests.files_support import png

    picture = tmp_path / "red dot.png"
    picture.write_bytes(png(5, 5))
    (tmp_path / "notes.xyz").write_text("not a type the gateway takes")
    with trio.fail_after(60):
        async with (
            gateway_serve(tmp_path) as port,
            terminal("--url", f"http://127.0.0.1:{port}") as chat,
        ):
            sid = (await chat.expect(r"session sess_\w+")).split()[1]
            await chat.prompt()
            chat.send("/help\r")
            await chat.expect(re.escape("/attach PATH"))
            await chat.prompt()
            chat.send(f"/attach {tmp_path / 'notes.xyz'}\r")
            await chat.expect(re.escape("(not attached: ") + r".*notes\.xyz: the gateway takes")
            await chat.prompt()
            chat.send(f"/attach {tmp_path / 'nothing.png'}\r")
            await chat.expect(re.escape("(not attached: ") + r".*nothing\.png: ")
            await chat.prompt()
            chat.send(f"/attach {picture}\r")
            attached = (
                r"\(attached to your next message: \[image image/png \d+ B file_[0-9a-f]{32}\]\)"
            )
            await chat.expect(attached)
            await chat.prompt()
            chat.send("What is this?\r")
            await chat.expect("You said: What is this?")
            await chat.prompt()
            chat.send("/attach\r")
            await chat.expect(re.escape("(nothing attached: /attach PATH uploads a file)"))
            await chat.prompt()
            chat.send("/quit\r")
            status = await chat.exit_status()
            async with GatewayClient(f"http://127.0.0.1:{port}") as client:
                page = await client.messages(sid)
                stored = page.messages[0].content[0]
                assert isinstance(stored, ImageBlock), page.messages[0]
                data = await client.download(sid, stored.file_id)
    assert status == 0
    assert [type(b) for b in page.messages[0].content] == [ImageBlock, TextBlock]
    assert data == picture.read_bytes()
    assert not any("Traceback" in row for row in chat.screen())
