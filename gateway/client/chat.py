"""``gateway chat``: an interactive chat with a session, in a terminal.

It is built on the client library and nothing of its own for the protocol:
:meth:`GatewayClient.open_session <gateway.client.api.GatewayClient.open_session>`
keeps the session's state (and resumes after a drop), and each redraw shows
one of the two views of docs/protocol.md §10 (:mod:`gateway.client.views`),
pure functions of that state. What the terminal shows is therefore a
function of the state too: a resume that restores a message from a
``message.snapshot`` redraws nothing, so a dropped connection leaves no
visible trace (after a second without a connection a dim status line says
it is reconnecting, and goes once it is back).

What a person sees:

- **full** (``--view full``, the default): every block. The reply streams as
  it is written; thinking is folded to one line (its latest words while it
  streams, its first words once it ended); each tool call is one line with
  its status and, once it ended, its duration; a message that was cancelled
  or failed says so.
- **simple** (``--view simple``): replace-then-append. One status line shows
  the latest thinking chunk or the tool at work; the reply's text streams,
  and is replaced when a later round of the turn starts; once the turn ends
  only the final round's text stays (marked when cancelled).
- **What a snapshot left out** (docs/protocol.md §15): a session opened on a
  long history starts at its newest messages that fit ``snapshot_max_bytes``,
  under a dim ``(earlier messages not shown)``; a block the snapshot cut is
  marked ``… (truncated)`` (a reply still streaming: ``… (the beginning is
  not shown)`` above its end, until it completes whole).
- **Permissions** are asked inline: ``? allow sleep {"seconds": 60}  [y/n]``;
  one key answers (no Enter needed). A worker's request is asked the same way
  (the parent's stream carries it, docs/protocol.md §5).
- **Elicitations** (an MCP server asks a question while its tool runs,
  docs/protocol.md §11): ``? mcp__tickets__create asks: Which priority?  [y/n]``;
  ``y`` opens a small form: the server's message, then one question per
  property of its ``requested_schema`` (string, number, integer, boolean or
  one of an enum; a required one must be answered; an answer the schema
  refuses is asked again), and the answers are sent as ``allow`` with
  ``content``. ``n``, or an empty answer (or ``n``) to the form's first
  question, declines (``deny``).
- **Compactions** (docs/protocol.md §12) are one quiet line where they stand:
  ``· context compacted: 12 messages summarised (52k → 3k tokens)`` (the
  token counts when this client saw ``context.compacted``); while one runs
  the simple view's status line says ``compacting context…``.
- **A busy session** (docs/protocol.md §2 "A busy session"): the turns waiting
  to start are listed under the conversation while they wait, one dim line
  each (``… queued 1: the text``), and leave it when they start (their
  message then stands in the conversation) or are cancelled. A message the
  running turn took (a steer) stands in the turn where it took it, marked
  ``(steered)``.

How the screen is kept (:class:`Region`): what belongs to finished items is
written once and never touched again; the rest, the *region* at the bottom
(the block that streams, tool lines still running, the question, the status
line), is redrawn by difference: text that only grew is appended, anything
else is rewritten from its first changed line (cursor up, erase below).
Model text, and what a tool or an MCP server says (a tool's name, an
elicitation's form and URL), is stripped of control characters, so a reply
cannot move the cursor or restyle the terminal, and of Unicode's bidirectional
controls, so a tool input in a question reads in the order it runs in.

Edit and regenerate (docs/protocol.md §2): ``/edit N TEXT`` sends ``TEXT`` in
place of the N-th user message shown (1 the first on screen), ``/retry`` the
last user message again for a new answer (:func:`rewind_command`). The
conversation then goes on from before that message: what the screen showed
of it stays above, under a dim ``· rewound: from your message N on, the
messages above left the conversation``, and the edited branch follows (a
rewind by another client is marked the same way).

Commands at the prompt: ``/fork`` forks the session at its last message
(``/fork MESSAGE_ID`` at that message: docs/protocol.md §2, "Forks") and goes
on with the fork, its history shown again from its snapshot; a fork made at
a user message shows that message as its draft, to send again or edit.
``/attach PATH`` uploads a file for the next message, ``/help`` lists the
commands (:mod:`gateway.client.chat_attach`). ``/quit`` (or ``/exit``) quits.

Keys: Enter sends the line typed at the prompt; while a turn runs the
keyboard does not echo (so typing cannot disturb the region), and ``y`` or
``n`` answer the question shown. ``/queue TEXT`` sends a turn that waits for
the running one (``if_busy: "queue"``), ``/steer TEXT`` a message for the
running turn to take before its next model call (``if_busy: "steer"``; a turn
that makes no further call runs it as a queued turn of its own): at the
prompt, or while a turn runs, where ``/`` opens a command line at the bottom
(Enter sends it, Backspace edits, Esc drops it) and a dim line says what the
gateway made of it. While any turn runs or waits (this chat's or another
client's) the keys answer its questions and open that command line; the
prompt comes back once the session is idle. Ctrl-C cancels the turn in flight; a
second Ctrl-C (or Ctrl-C at the prompt), Ctrl-D at the prompt, or ``/quit``
quits.

Exit status: 0 when the person quits (Ctrl-D, ``/quit``, or Ctrl-C when there
is no turn to cancel: quitting is the normal end of a chat, as in node's
REPL, not an interruption of something); 1 for what retrying cannot fix (an
unknown session, a refused key, a gateway that cannot be reached at the
start), one line on stderr; 2 for a usage error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TextIO

import trio
from rich.cells import cell_len, get_character_cell_size

from gateway.client.api import GatewayClient, Session, ToolRun
from gateway.client.chat_attach import Attachments, is_attach_command
from gateway.client.views import (
    BlockView,
    FullView,
    PermissionView,
    QueuedView,
    SimpleView,
    file_line,
    files_in,
)
from gateway.errors import ApiError, GatewayError
from gateway.protocol.events import ContextCompacted, Event, HistoryRewound
from gateway.protocol.http import ForkCreated, IfBusy, TurnAccepted
from gateway.protocol.shapes import TextBlock

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
API_KEY_ENV = "GW_API_KEY"  # not GATEWAY_*: those are the daemon's config keys (gateway serve)
RECONNECTING_AFTER_S = 1.0  # a drop shorter than this shows nothing at all

ViewName = Literal["full", "simple"]

# SGR styles: one per line.
DIM, BOLD, RED, GREEN, YELLOW, CYAN = "2", "1", "31", "32", "33", "36"
# Unicode's bidirectional controls (the embeddings, overrides and isolates, and the
# marks): text holding them may display in an order other than its own ("Trojan Source").
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# C0 and C1 controls but tab and newline, and the bidirectional ones.
_CONTROL = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI}]")
_BIDI_CHAR = re.compile(f"[{_BIDI}]")


def clean(text: str) -> str:
    """Text fit for the terminal: tabs as spaces, no control character but newline, no
    bidirectional control."""
    return _CONTROL.sub("", text.replace("\t", "    ").replace("\r\n", "\n"))


def shown_json(value: Any) -> str:
    """A tool's input as JSON for the terminal: a bidirectional control as its escape
    (``\\u202e``), so an approval shows the input as it will run, and that it holds one."""
    text = json.dumps(value, ensure_ascii=False)
    return _BIDI_CHAR.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def fold(text: str) -> str:
    """Text on one line: every run of whitespace is one space."""
    return " ".join(clean(text).split())


def fit(text: str, width: int, *, tail: bool = False) -> str:
    """``text`` cut to ``width`` cells with an ellipsis (its end kept when ``tail``)."""
    if cell_len(text) <= width:
        return text
    width = max(width - 1, 0)
    if tail:
        while cell_len(text) > width:
            text = text[1:]
        return "…" + text
    while cell_len(text) > width:
        text = text[:-1]
    return text + "…"


# --- the screen ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One line of the screen (no newline in ``text``), in one SGR ``style``."""

    text: str
    style: str = ""

    def ansi(self, text: str | None = None) -> str:
        shown = self.text if text is None else text
        return f"\x1b[{self.style}m{shown}\x1b[0m" if self.style and shown else shown


class Region:
    """The lines at the bottom of a terminal that may still change (module docstring).

    Writes only what changed. Rows are counted with each line's width in
    cells (a long line wraps), so the cursor can go back up to the first
    changed line; lines that scrolled above the screen cannot be rewritten
    (a terminal's limit), which is why finished lines are settled early.

    Args:
        out: the terminal.
        width: the terminal's width in cells, asked at each redraw.
    """

    def __init__(self, out: TextIO, width: Callable[[], int]) -> None:
        self.out = out
        self.width = width
        self.shown: list[Line] = []
        self.fresh = True  # the cursor is at the start of an empty line

    def show(self, lines: list[Line]) -> None:
        """Make the region ``lines``."""
        old = self.shown
        first = 0
        while first < min(len(old), len(lines)) and old[first] == lines[first]:
            first += 1
        if first == len(old) == len(lines):
            return
        parts: list[str] = []
        if first == len(old):  # only new lines
            if (old or not self.fresh) and lines[first:]:
                parts.append("\n")
            parts.append("\n".join(line.ansi() for line in lines[first:]))
        elif (
            first == len(old) - 1
            and first < len(lines)
            and lines[first].style == old[first].style
            and lines[first].text.startswith(old[first].text)
        ):  # the last line grew, and maybe new lines follow
            grown = lines[first]
            parts.append(grown.ansi(grown.text[len(old[first].text) :]))
            parts.extend("\n" + line.ansi() for line in lines[first + 1 :])
        else:  # rewrite from the first line that changed (or the last kept one, so
            # that the cursor ends where the region ends)
            start = first if first < len(lines) or first == 0 else first - 1
            up = self._row(old, len(old), end=True) - self._row(old, start)
            parts.append("\r" + (f"\x1b[{up}A" if up else "") + "\x1b[J")
            parts.append("\n".join(line.ansi() for line in lines[start:]))
        self.out.write("".join(parts))
        self.out.flush()
        self.shown = list(lines)
        self.fresh = not lines  # an emptied region leaves the cursor where it began

    def settle(self, count: int) -> None:
        """The first ``count`` lines are final: they leave the region, as written."""
        if count <= 0:
            return
        self.shown = self.shown[count:]
        if not self.shown:
            self.fresh = False

    def close(self) -> None:
        """Everything shown is final; the cursor goes to the start of a fresh line."""
        if self.shown or not self.fresh:
            self.out.write("\n")
            self.out.flush()
        self.shown = []
        self.fresh = True

    def _row(self, lines: list[Line], index: int, *, end: bool = False) -> int:
        """The row of the start of ``lines[index]`` (or, with ``end``, of the cursor
        after the last line), counted from the region's first row."""
        width = max(self.width(), 1)
        rows = 0
        stop = len(lines) - 1 if end else index
        for line in lines[:stop]:
            rows += layout(line.text, width)[0]
        if end and lines:
            rows += layout(lines[-1].text, width)[1]
        return rows


def layout(text: str, width: int) -> tuple[int, int]:
    """The rows a line written from the first column takes, and the row its end leaves
    the cursor on, by xterm's rules: a wide character that does not fit in what is left
    of a row goes to the next one; a row filled to its last cell keeps the cursor until
    the next character (the pending wrap)."""
    row = cells = 0
    for char in text:
        size = get_character_cell_size(char)
        if cells + size > width and cells:
            row, cells = row + 1, 0
        cells += size
    return row + 1, row


# --- what each view shows ------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """Lines that belong together, under a ``key`` that stays the same across redraws;
    ``final`` once they will never change (then they are written for good)."""

    key: str
    lines: tuple[Line, ...]
    final: bool


@dataclass(frozen=True)
class Marks:
    """The symbols, plain ASCII where the terminal cannot show more."""

    you: str = "\u203a"  # a single right-pointing angle quotation mark
    thinking: str = "✻"
    tool: str = "⏺"
    ok: str = "✓"
    failed: str = "✗"
    ellipsis: str = "…"

    @classmethod
    def for_encoding(cls, encoding: str | None) -> Marks:
        if encoding and encoding.lower().replace("-", "").startswith("utf"):
            return cls()
        return cls(">", "*", "-", "ok", "x", "...")


def full_items(
    view: FullView,
    tools: dict[str, ToolRun],
    *,
    hidden_turns: set[str],
    width: int,
    marks: Marks,
    compactions: dict[str, ContextCompacted] | None = None,
) -> list[Item]:
    """The full view as screen items: each message, each block (module docstring)."""
    items: list[Item] = []
    for message in view["messages"]:
        if message["role"] == "context":
            replaced = sum(
                len(b["replaces"]) for b in message["blocks"] if b["type"] == "compaction"
            )
            line = compaction_line(replaced, (compactions or {}).get(message["id"]), marks)
            items.append(Item(f"context:{message['id']}", (Line(fit(line, width), DIM),), True))
            continue
        if message["role"] == "user":
            steered = message.get("steered", False)
            if steered or message["turn_id"] not in hidden_turns:
                text = "".join(b["text"] for b in message["blocks"] if b["type"] == "text")
                files = tuple(file_line(b) for b in files_in(message["blocks"]))
                items.append(_user_item(message["id"], text, marks, steered=steered, files=files))
            continue
        for index, block in enumerate(message["blocks"]):
            key = f"block:{message['id']}:{index}"
            items.append(_block_item(key, block, tools, width, marks))
        if message["status"] in ("cancelled", "error"):
            said = "cancelled" if message["status"] == "cancelled" else "stopped by an error"
            items.append(Item(f"end:{message['id']}", (Line(f"({said})", DIM),), True))
    return items + queued_items(view.get("queued", []), width, marks)


def queued_items(queued: list[QueuedView], width: int, marks: Marks) -> list[Item]:
    """The turns waiting to start, one dim line each, next first (module docstring)."""
    return [
        Item(
            f"queued:{q['turn_id']}",
            (Line(fit(f"{marks.ellipsis} queued {q['position']}: {fold(q['text'])}", width), DIM),),
            False,
        )
        for q in queued
    ]


def _tokens(count: int) -> str:
    return f"{round(count / 1000)}k" if count >= 1000 else str(count)


def compaction_line(replaced: int, event: ContextCompacted | None, marks: Marks) -> str:
    """A compaction as one quiet line (docs/protocol.md §12); tokens when the event was seen."""
    what = "summarised"
    if event is not None and event.method == "truncate":
        what = "dropped from the model's view"
    plural = "" if replaced == 1 else "s"
    line = f"· context compacted: {replaced} message{plural} {what}"
    if event is not None:
        line += f" ({_tokens(event.pre_tokens)} → {_tokens(event.post_tokens)} tokens)"
    return line if marks.ok == "✓" else line.replace("·", "-").replace("→", "->")


def _user_item(
    message_id: str, text: str, marks: Marks, *, steered: bool = False, files: tuple[str, ...] = ()
) -> Item:
    lines = clean(text).split("\n") or [""]
    shown = [Line(f"{marks.you} {lines[0]}", BOLD)] + [Line(f"  {x}", BOLD) for x in lines[1:]]
    shown += [Line(f"  {clean(f)}", DIM) for f in files]  # its files, one line each
    if steered:  # the running turn took it (docs/protocol.md §2 "A busy session")
        shown.append(Line("  (steered)", DIM))
    return Item(f"user:{message_id}", tuple(shown), True)


def _block_item(
    key: str, block: BlockView, tools: dict[str, ToolRun], width: int, marks: Marks
) -> Item:
    if block["type"] == "text":
        lines = tuple(Line(x) for x in clean(block["text"]).split("\n"))
        if block.get("truncated"):  # a snapshot sent it cut (docs/protocol.md §15)
            if block["open"]:  # its end, where the live text goes on
                lines = (Line(f"{marks.ellipsis} (the beginning is not shown)", DIM), *lines)
            else:
                lines = (*lines, Line(f"{marks.ellipsis} (truncated)", DIM))
        return Item(key, lines, not block["open"])
    if block["type"] == "thinking":
        prefix = f"{marks.thinking} "
        room = width - cell_len(prefix) - 1
        folded = fold(block["text"])
        text = fit(folded, room, tail=block["open"]) if folded else marks.ellipsis
        return Item(key, (Line(prefix + text, DIM),), not block["open"])
    if block["type"] == "redacted_thinking":
        return Item(key, (Line(f"{marks.thinking} (redacted thinking)", DIM),), not block["open"])
    if block["type"] == "compaction":  # only a context message holds one: full_items
        return Item(key, (Line("· context compacted", DIM),), True)
    if block["type"] == "image" or block["type"] == "document" or block["type"] == "audio":
        return Item(key, (Line(fit(file_line(block), width), DIM),), True)
    run = tools.get(block["id"])
    status = block["status"]
    duration = "" if run is None or run.duration_ms is None else f" {run.duration_ms} ms"
    style = DIM
    match status:
        case "completed":
            said, style = f"{marks.ok}{duration}", GREEN
        case "failed":
            first = fold(block["result"] or "failed")
            said, style = f"{marks.failed} {first}{duration}", RED
        case "awaiting_approval":
            said, style = "awaiting approval", YELLOW
        case "running":
            said, style = f"running{marks.ellipsis}{progress_of(run)}", CYAN
        case "not_run":
            said = "not run"
        case _:  # streaming, pending
            said = marks.ellipsis
    if block.get("truncated"):
        said += " (truncated)"
    call = f"{marks.tool} {fold(block['name'])} {fold(shown_json(block['input']))}"
    room = width - cell_len(said) - 3
    line = Line(f"{fit(call, max(room, 10))}  {said}", style)
    files = [Line(fit(f"  {file_line(f)}", width), DIM) for f in block.get("files", [])]
    return Item(key, (line, *files), status in ("completed", "failed", "not_run"))


def progress_of(run: ToolRun | None) -> str:
    """A running tool's last progress (``tool.progress``), as a chat line ends: `` 3/5 step``."""
    if run is None or run.progress is None:
        return ""
    p = run.progress
    amount = f"{p.progress:g}/{p.total:g}" if p.total else f"{p.progress:g}"
    return f" {amount}" + (f" {fold(p.message)}" if p.message else "")


def simple_items(
    view: SimpleView,
    *,
    hidden_turns: set[str],
    width: int,
    marks: Marks,
    compactions: dict[str, ContextCompacted] | None = None,
) -> list[Item]:
    """The replace-then-append view as screen items (module docstring)."""
    items: list[Item] = []
    for entry in view["thread"]:
        if entry["role"] == "context":
            event = (compactions or {}).get(entry["message_id"])
            line = compaction_line(entry.get("replaces", 0), event, marks)
            items.append(
                Item(f"context:{entry['message_id']}", (Line(fit(line, width), DIM),), True)
            )
            continue
        if entry["role"] == "user":
            steered = entry.get("steered", False)
            if steered or entry["turn_id"] not in hidden_turns:
                files = tuple(file_line(f) for f in entry.get("files", []))
                item = _user_item(
                    entry["message_id"], entry["text"], marks, steered=steered, files=files
                )
                items.append(item)
            continue
        lines = [Line(x) for x in clean(entry["text"]).split("\n")]
        if entry["status"] in ("cancelled", "error"):
            said = "cancelled" if entry["status"] == "cancelled" else "stopped by an error"
            lines.append(Line(f"({said})", DIM))
        key = f"reply:{entry['turn_id'] or entry['message_id']}"
        items.append(Item(key, tuple(lines), entry["status"] != "in_progress"))
    items += queued_items(view.get("queued", []), width, marks)
    status = view["status"]
    if status is not None:
        if status["kind"] == "thinking":
            text = f"{marks.thinking} {fit(fold(status['text']), width - 3, tail=True)}"
        elif status["kind"] == "compacting":
            text = f"compacting context{marks.ellipsis}"
        else:
            state = status["state"].replace("_", " ")
            text = f"{marks.tool} {fold(status['tool_name'])} {state}{marks.ellipsis}"
        items.append(Item("status", (Line(fit(text, width - 1), DIM),), False))
    return items


def question_item(permission: PermissionView, answered: str | None, width: int) -> Item:
    """The inline question for a pending permission, or an elicitation (``y`` opens its form)."""
    tail = "  [y/n]" if answered is None else f"  {answered}"
    room = max(width - len(tail) - 10, 10)
    name = fold(permission["tool_name"])
    if permission["kind"] == "elicitation":
        asks = f"{name} asks: {fold(permission['message'] or '')}"
        line = Line(f"? {fit(asks, room)}{tail}", YELLOW)
    elif permission["kind"] == "elicitation_url":  # y: you went there (docs/protocol.md §11)
        url = fold(str(permission["input"].get("url", "")))
        asks = f"{name} asks you to open {url}: {fold(permission['message'] or '')}"
        line = Line(f"? {fit(asks, room)}{tail}", YELLOW)
    elif permission["kind"] == "sampling":  # y: the model answers the server (section 11)
        said = [m.get("text", "") for m in permission["input"].get("messages", [])]
        asks = f"{name} asks the model: {fold(said[-1] if said else '')}"
        line = Line(f"? {fit(asks, room)}{tail}", YELLOW)
    else:
        call = f"{name} {fold(shown_json(permission['input']))}"
        line = Line(f"? allow {fit(call, room)}{tail}", YELLOW)
    return Item(f"ask:{permission['perm_id']}", (line,), False)


# --- an elicitation's form (docs/protocol.md §11) ---------------------------------------------

FieldKind = Literal["string", "number", "integer", "boolean", "enum"]
_YES = ("y", "yes", "true", "1")
_NO = ("n", "no", "false", "0")


class FormError(ValueError):
    """An answer the requested schema refuses; its message says why, to ask again."""


@dataclass(frozen=True)
class FormField:
    """One property of an elicitation's ``requested_schema``, as one question."""

    name: str
    kind: FieldKind
    schema: dict[str, Any]
    required: bool

    @property
    def prompt(self) -> str:
        """``Priority (low/normal/urgent, required): ``."""
        label = str(self.schema.get("title") or self.name)
        hints: list[str] = []
        if self.kind == "enum":
            hints.append("/".join(str(choice) for choice in self.schema["enum"]))
        elif self.kind == "boolean":
            hints.append("y/n")
        elif self.kind != "string":
            hints.append(self.kind)
        if self.required:
            hints.append("required")
        description = self.schema.get("description")
        head = f"{label} ({', '.join(hints)})" if hints else label
        return f"{head} - {description}: " if description else f"{head}: "


def form_fields(schema: dict[str, Any]) -> list[FormField]:
    """The questions of a ``requested_schema``: a flat object of primitive properties (MCP).

    Raises:
        FormError: a property of a type the form cannot ask (the request is
            then declined).
    """
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    fields: list[FormField] = []
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            raise FormError(f"property {name!r} is not a schema")
        kind: FieldKind
        match "enum" if "enum" in prop else prop.get("type"):
            case "string" | "number" | "integer" | "boolean" | "enum" as known:
                kind = known
            case other:
                raise FormError(f"property {name!r} is of a type this form cannot ask ({other!r})")
        fields.append(FormField(name, kind, prop, name in required))
    return fields


def parse_answer(field: FormField, text: str) -> Any:
    """The value ``text`` gives ``field``, checked against its schema.

    Raises:
        FormError: not a value of the field's type, or out of its bounds.
    """
    text = text.strip()
    value: Any
    match field.kind:
        case "boolean":
            if text.lower() not in _YES + _NO:
                raise FormError("answer y or n")
            value = text.lower() in _YES
        case "integer":
            try:
                value = int(text)
            except ValueError:
                raise FormError("a whole number, please") from None
        case "number":
            try:
                value = float(text)
            except ValueError:
                raise FormError("a number, please") from None
            value = int(value) if value.is_integer() and "." not in text else value
        case "enum":
            choices = field.schema["enum"]
            matches = [c for c in choices if str(c) == text] or [
                c for c in choices if str(c).lower() == text.lower()
            ]
            if len(matches) != 1:
                raise FormError(f"one of {', '.join(str(c) for c in choices)}")
            value = matches[0]
        case _:
            value = text
    check_value(field, value)
    return value


def check_value(field: FormField, value: Any) -> None:
    """``value`` against the field's schema (type, enum, length and bounds)."""
    schema = field.schema
    ok = {
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "enum": value in schema.get("enum", ()),
    }[field.kind]
    if not ok:
        raise FormError(f"{field.name}: not a {field.kind}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise FormError(f"at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise FormError(f"at most {schema['maxLength']} characters")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise FormError(f"at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise FormError(f"at most {schema['maximum']}")


def check_content(schema: dict[str, Any], content: dict[str, Any]) -> None:
    """A whole answer against its ``requested_schema``: required present, each value valid.

    Raises:
        FormError: what is wrong.
    """
    fields = {field.name: field for field in form_fields(schema)}
    for field in fields.values():
        if field.required and field.name not in content:
            raise FormError(f"{field.name} is required")
    for name, value in content.items():
        if name not in fields:
            raise FormError(f"{name} is not asked for")
        check_value(fields[name], value)


async def ask_form(
    permission: PermissionView,
    read_line: Callable[[], Awaitable[str | None]],
    write: Callable[[str], None],
) -> dict[str, Any] | None:
    """Ask an elicitation's questions; the content to send, or ``None`` to decline.

    Prints the server's message, then asks each property of the requested
    schema in turn, again until the schema accepts the answer. An empty
    answer or ``n`` to the first question declines (so does end of input);
    an empty answer to a later optional one leaves it out.
    """
    write(f"{fold(permission['tool_name'])} asks: {clean(permission['message'] or '')}\n")
    try:
        fields = form_fields(permission["requested_schema"] or {})
    except FormError as exc:
        write(f"  (cannot answer: {exc}; declined)\n")
        return None
    content: dict[str, Any] = {}
    for position, field in enumerate(fields):
        while True:
            write(f"  {fold(field.prompt)} ")
            text = await read_line()
            if text is None:
                return None
            answer = text.strip()
            if position == 0 and answer.lower() in ("", "n"):
                return None
            if not answer and not field.required:
                break
            if not answer:
                write("  (required)\n")
                continue
            try:
                content[field.name] = parse_answer(field, answer)
            except FormError as exc:
                write(f"  ({fold(str(exc))})\n")
                continue
            break
    check_content(permission["requested_schema"] or {}, content)
    return content


# --- the keyboard --------------------------------------------------------------------------------


class Keyboard:
    """Standard input: whole lines at the prompt, single keys while a turn runs.

    On a terminal, a turn switches to no echo and no line editing (so one key
    answers a question and typing cannot move the cursor under the region);
    the prompt switches back. The terminal's settings are restored on exit.
    One task, :meth:`pump`, reads the descriptor in a worker thread (blocking
    reads: a non-blocking stdin would make the terminal's stdout, the same
    open file, non-blocking too, and a burst of output could then fail), so a
    read of a line or a key can be cancelled without losing what was typed.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.tty = os.isatty(fd)
        self._send, self._typed = trio.open_memory_channel[bytes](64)
        self._buffer = b""
        self._ended = False
        self._saved: list[Any] | None = None
        if self.tty:
            import termios

            self._saved = termios.tcgetattr(fd)

    async def pump(self) -> None:
        """Read the keyboard until end of input (a task for the length of the chat)."""
        async with self._send:
            while True:
                data = await trio.to_thread.run_sync(os.read, self.fd, 4096, abandon_on_cancel=True)
                if not data:
                    return
                await self._send.send(data)

    async def _more(self) -> bool:
        """Wait for more typed bytes; false at end of input."""
        if self._ended:
            return False
        try:
            self._buffer += await self._typed.receive()
        except trio.EndOfChannel:
            self._ended = True
            return False
        return True

    async def line(self) -> str | None:
        """The next line typed (without its newline), or ``None`` at end of input."""
        self.mode("line")
        while b"\n" not in self._buffer:
            if not await self._more():
                if self._buffer:
                    rest, self._buffer = self._buffer, b""
                    return rest.decode(errors="replace")
                return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace").rstrip("\r")

    async def key(self) -> str | None:
        """The next key (a character, whole in UTF-8), or ``None`` at end of input."""
        self.mode("keys")
        if not self._buffer and not await self._more():
            return None
        lead = self._buffer[0]
        size = 4 if lead >= 0xF0 else 3 if lead >= 0xE0 else 2 if lead >= 0xC0 else 1
        while len(self._buffer) < size and await self._more():
            pass
        key, self._buffer = self._buffer[:size], self._buffer[size:]
        return key.decode(errors="replace")

    def mode(self, mode: Literal["line", "keys"]) -> None:
        """Echo and line editing at the prompt; neither while a turn runs."""
        if self._saved is None:
            return
        import termios

        attrs = termios.tcgetattr(self.fd)
        lflag = self._saved[3]
        if mode == "keys":
            lflag &= ~(termios.ECHO | termios.ICANON)
        attrs[3] = lflag
        attrs[6] = list(attrs[6])
        attrs[6][termios.VMIN], attrs[6][termios.VTIME] = 1, 0
        with suppress(termios.error):
            termios.tcsetattr(self.fd, termios.TCSANOW, attrs)

    def forget_typed(self) -> None:
        """Drop what was typed ahead (it was not echoed)."""
        self._buffer = b""
        while True:
            try:
                self._typed.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        if self.tty:
            import termios

            with suppress(termios.error):
                termios.tcflush(self.fd, termios.TCIFLUSH)

    def restore(self) -> None:
        """The terminal as it was."""
        if self._saved is not None:
            import termios

            with suppress(termios.error):
                termios.tcsetattr(self.fd, termios.TCSANOW, self._saved)


# --- the chat ------------------------------------------------------------------------------------


def rewind_command(line: str, shown: list[tuple[str, str]]) -> tuple[str, str | None]:
    """A line typed at the prompt as a turn: its content and the message it rewinds to.

    ``/edit N TEXT``: ``TEXT`` in place of the N-th of ``shown`` (the user
    messages on screen, oldest first, as (id, text)); ``/retry``: the last of
    them again, its own text; anything else: the line, no rewind.

    Raises:
        ValueError: a command it cannot do (why, in words).
    """
    words = line.strip().split(maxsplit=2)
    if not words or words[0] not in ("/edit", "/retry"):
        return line, None
    if words[0] == "/retry":
        if len(words) > 1:
            raise ValueError("/retry takes nothing after it")
        if not shown:
            raise ValueError("no message of yours to retry")
        message_id, text = shown[-1]
        return text, message_id
    if len(words) < 3 or not words[1].isdigit():
        raise ValueError("/edit N TEXT: N the message's number, 1 the first shown")
    n = int(words[1])
    if not 1 <= n <= len(shown):
        raise ValueError(f"no message {n} of yours: 1 to {len(shown)}")
    return words[2], shown[n - 1][0]


class Chat:
    """One chat: a session, a keyboard, a terminal (module docstring).

    Three tasks share it: :meth:`_follow` applies each update and redraws,
    :meth:`_converse` owns the keyboard (the prompt, then keys while a turn
    runs), :meth:`_interrupts` turns Ctrl-C into a cancel or the end.
    """

    def __init__(
        self,
        session: Session,
        keyboard: Keyboard,
        out: TextIO,
        *,
        view: ViewName = "full",
        width: Callable[[], int] | None = None,
    ) -> None:
        self.session = session
        self.keyboard = keyboard
        self.out = out
        self.view = view
        self.width = width or (lambda: shutil.get_terminal_size((80, 24)).columns)
        self.region = Region(out, self.width)
        self.marks = Marks.for_encoding(getattr(out, "encoding", None))
        self.committed: set[str] = set()
        self.mine: set[str] = set()  # turns sent from here: their user message is on screen
        self.sending = False
        self.cancelling: str | None = None  # the turn a Ctrl-C is cancelling
        self.answered: dict[str, str] = {}  # perm_id -> what was answered
        self.disconnected_at: float | None = None
        self.redrawn = trio.Event()
        self.failure: GatewayError | None = None
        self.form_open = False  # an elicitation's form owns the screen and the keyboard
        self.forked: ForkCreated | None = None  # /fork made it: the chat goes on with it
        self.command: str | None = None  # the command line typed while a turn runs
        self.notice: str | None = None  # what the gateway made of the last command
        # Edit and regenerate (module docstring): the turns sent with a rewind (their
        # user message is shown: what was typed was a command), and the marks of rewinds.
        self.rewinding: set[str] = set()
        self.rewinds: list[Item] = []
        self.shown_users: list[tuple[str, str]] = []  # the user messages on screen (id, text)
        self.attachments = Attachments()  # /attach: the files of the next message

    async def run(self) -> int:
        """Until the person quits (or what retrying cannot fix); the exit status."""
        with trio.open_signal_receiver(signal.SIGINT) as interrupts:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow, nursery.cancel_scope)
                nursery.start_soon(self._interrupts, interrupts, nursery.cancel_scope)
                nursery.start_soon(self._ticker)
                await self._converse()
                nursery.cancel_scope.cancel()
        self.region.close()
        if self.failure is not None:
            print(f"chat: {self.failure.message}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        return EXIT_OK

    # --- drawing

    def items(self) -> list[Item]:
        """What the screen shows now: the view of the state, then the question and status."""
        width = self.width()
        state = self.session.state
        hidden = self.mine - self.rewinding
        if self.sending:  # its turn id is not known yet: hide every new user message
            hidden |= {m.turn_id for m in state.messages if m.turn_id is not None}
            hidden |= {state.running_turn_id} if state.running_turn_id else set()
        if self.view == "full":
            full = self.session.full
            items = full_items(
                full,
                self.session.tools,
                hidden_turns=hidden,
                width=width,
                marks=self.marks,
                compactions=self.session.compactions,
            )
            permissions = full["permissions"]
        else:
            simple = self.session.simple
            items = simple_items(
                simple,
                hidden_turns=hidden,
                width=width,
                marks=self.marks,
                compactions=self.session.compactions,
            )
            permissions = simple["permissions"]
        if state.has_more:  # the snapshot left older messages out (docs/protocol.md §15)
            items.insert(0, Item("earlier", (Line("(earlier messages not shown)", DIM),), True))
        for mark in self.rewinds:  # below what was written for good, before what follows
            if mark.key not in self.committed:
                at = next((i for i, x in enumerate(items) if x.key not in self.committed), None)
                items.insert(len(items) if at is None else at, mark)
        if permissions:
            first = permissions[0]
            items.append(question_item(first, self.answered.get(first["perm_id"]), width))
        status = self._status_line()
        if status:
            items.append(Item("connection", (Line(status, DIM),), False))
        if self.notice:
            items.append(Item("notice", (Line(fit(self.notice, width - 1), DIM),), False))
        if self.command is not None:
            items.append(Item("command", (Line(fit(self.command, width - 1, tail=True)),), False))
        return items

    def _status_line(self) -> str:
        now = trio.current_time()
        if self.disconnected_at is not None and now - self.disconnected_at >= RECONNECTING_AFTER_S:
            return f"reconnecting{self.marks.ellipsis}"
        if self.cancelling is not None and self._in_flight() == self.cancelling:
            return f"cancelling{self.marks.ellipsis}"
        return ""

    def redraw(self, *, final_only: bool = False) -> None:
        """Show the items not yet written for good; settle the finished ones at the top.

        ``final_only`` (before the prompt): the lines that may still change go.
        Nothing is drawn while an elicitation's form is open (it is redrawn after)."""
        if self.form_open:
            self.redrawn.set()
            self.redrawn = trio.Event()
            return
        items = [item for item in self.items() if item.key not in self.committed]
        if final_only:
            items = [item for item in items if item.final]
        self.region.show([line for item in items for line in item.lines])
        settled = 0
        for item in items:
            if not item.final:
                break
            self.committed.add(item.key)
            settled += len(item.lines)
        self.region.settle(settled)
        self.redrawn.set()
        self.redrawn = trio.Event()

    # --- the tasks

    async def _follow(self, scope: trio.CancelScope) -> None:
        """Apply each update and redraw; what retrying cannot fix ends the chat."""
        self.redraw()
        try:
            async for update in self.session:
                self._rewound(update.event)
                if self.session.connected:
                    self.disconnected_at = None
                elif self.disconnected_at is None:
                    self.disconnected_at = trio.current_time()
                for perm_id in list(self.answered):
                    if perm_id not in self.session.pending_permissions:
                        del self.answered[perm_id]
                self.redraw()
        except GatewayError as exc:
            self.failure = exc
        scope.cancel()

    def _rewound(self, event: Event | None) -> None:
        """Mark a ``history.rewound`` (module docstring); keep the user messages shown."""
        if event is not None and isinstance(event.payload, HistoryRewound):
            before = event.payload.before_message_id
            n = next((i for i, (m, _) in enumerate(self.shown_users, 1) if m == before), None)
            which = f"your message {n}" if n is not None else "an earlier message"
            line = f"· rewound: from {which} on, the messages above left the conversation"
            self.rewinds.append(Item(f"rewound:{event.id}", (Line(line, DIM),), True))
        self.shown_users = [
            (m.id, "\n".join(b.text for b in m.content if isinstance(b, TextBlock)))
            for m in self.session.state.messages
            if m.role == "user" and any(isinstance(b, TextBlock) for b in m.content)
        ]

    async def _ticker(self) -> None:
        """Redraw now and then while disconnected (the status line appears after a while)."""
        while True:
            await trio.sleep(RECONNECTING_AFTER_S / 2)
            if self.disconnected_at is not None:
                self.redraw()

    async def _interrupts(self, interrupts: Any, scope: trio.CancelScope) -> None:
        """Ctrl-C: cancel the turn in flight; again (or with none in flight): quit."""
        async for _ in interrupts:
            turn_id = self._in_flight()
            if turn_id is None or self.cancelling == turn_id:
                scope.cancel()
                return
            self.cancelling = turn_id
            self.redraw()
            with suppress(GatewayError):  # it ended meanwhile, or the gateway is away
                await self.session.cancel(turn_id, reason="user")

    def _in_flight(self) -> str | None:
        """The turn a Ctrl-C would cancel: the state's, or the one just sent."""
        running = self.session.state.running_turn_id
        if running is not None:
            return running
        for turn_id in self.mine:
            if not self.session.turn_ended(turn_id):
                return turn_id
        return None

    async def _converse(self) -> None:
        """The prompt, a turn, keys while it runs; again, until the person quits."""
        while True:
            await self._while_busy()
            self.redraw(final_only=True)  # settled above the prompt
            self.region.close()
            self.keyboard.forget_typed()  # before the prompt: what is typed after it stays
            if self.attachments.pending:
                self.out.write(f"\x1b[{DIM}m{clean(self.attachments.summary())}\x1b[0m\n")
            self.out.write(f"\x1b[{BOLD}m{self.marks.you}\x1b[0m ")
            self.out.flush()
            self.region.fresh = False  # a quit from here leaves the line
            line = await self.keyboard.line()
            if not self.keyboard.tty:
                self.out.write("\n")  # nothing echoed the newline
            self.region.fresh = True
            if line is None or line.strip() in ("/quit", "/exit"):
                return
            if not line.strip():
                continue
            if is_attach_command(line):  # /attach PATH, /help (gateway.client.chat_attach)
                note = await self.attachments.command(self.session, line)
                self.out.write(f"\x1b[{DIM}m{clean(note)}\x1b[0m\n")
                continue
            command, *args = line.split()
            if command == "/fork":
                if await self._fork(args):
                    return
                continue
            try:
                content, rewind_to = rewind_command(line, self.shown_users)
            except ValueError as exc:  # /edit or /retry it cannot do
                self.out.write(f"\x1b[{RED}m(not sent: {exc})\x1b[0m\n")
                continue
            self.keyboard.mode("keys")
            self.sending = True
            try:
                if rewind_to is not None:  # /edit, /retry: sent as a turn of its own
                    turn_id: str | None = await self.session.send(content, rewind_to=rewind_to)
                else:
                    turn_id = await self._send_line(line)
            except GatewayError as exc:  # 409 turn_in_progress, the gateway away, ...
                self.out.write(f"\x1b[{RED}m(not sent: {fold(exc.message)})\x1b[0m\n")
                continue
            finally:
                self.sending = False
            if turn_id is not None:
                if rewind_to is not None:
                    self.rewinding.add(turn_id)
                self.mine.add(turn_id)
            self.redraw()
            await self._while_busy(turn_id)

    async def _fork(self, args: list[str]) -> bool:
        """``/fork [MESSAGE_ID]``: whether the session was forked (the chat then ends, and
        :func:`chat` goes on with the fork)."""
        if len(args) > 1:
            self.out.write(f"\x1b[{RED}m(/fork takes one message id at most)\x1b[0m\n")
            return False
        try:
            self.forked = await self.session.client.fork(self.session.id, *args)
        except GatewayError as exc:  # 409 turn_in_progress, not_a_fork_point, 404, ...
            self.out.write(f"\x1b[{RED}m(not forked: {clean(exc.message)})\x1b[0m\n")
            return False
        return True

    async def _send_line(self, line: str) -> str | None:
        """The prompt's line as a turn, or a ``/queue`` or ``/steer`` (module docstring): the id
        of the turn it started, or ``None`` (what the gateway made of it is written)."""
        if not is_command(line):
            turn_id = await self.session.send(self.attachments.content(line))
            self.attachments.sent()
            return turn_id
        command = parse_command(line)
        note = "(/queue and /steer need a text)"
        if command is not None:
            content = self.attachments.content(command[1])
            accepted = await self.session.submit(content, if_busy=command[0])
            self.attachments.sent()
            if not (accepted.queued or accepted.steered):
                return accepted.turn_id  # the session was idle: it started, as a sent line
            note = accepted_note(accepted)
        self.out.write(f"\x1b[{DIM}m{note}\x1b[0m\n")
        return None

    def _busy(self, turn_id: str | None) -> bool:
        """A turn runs or waits (docs/protocol.md §2 "A busy session"), or ``turn_id`` has not
        ended as far as this client knows (its start may not have arrived yet)."""
        state = self.session.state
        if state.running_turn_id is not None or state.queued:
            return True
        return turn_id is not None and not self.session.turn_ended(turn_id)

    async def _while_busy(self, turn_id: str | None = None) -> None:
        """While the session is busy (this chat's turn or another client's): the keys answer
        its questions and open the command line (:meth:`_answer_keys`)."""
        if not self._busy(turn_id):
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._answer_keys)
            while self._busy(turn_id):
                await self.redrawn.wait()
            nursery.cancel_scope.cancel()
        self.command = self.notice = None

    async def _command_key(self, key: str) -> None:
        """A key of the command line (module docstring): typed, edited, dropped or sent."""
        line = self.command or ""
        if key in ("\r", "\n"):
            self.command = None
            self.notice = "(sending…)"
            self.redraw()
            self.notice = await self._command(line)
        elif key == "\x1b" or (key in ("\x7f", "\b") and len(line) <= 1):
            self.command = None
        elif key in ("\x7f", "\b"):
            self.command = line[:-1]
        elif key.isprintable():
            self.command = line + key
            self.notice = None
        self.redraw()

    async def _command(self, line: str) -> str:
        """Send the command line's ``/queue`` or ``/steer``; what to say of it."""
        command = parse_command(line)
        if command is None:
            return "(while a turn runs: /queue TEXT, or /steer TEXT)"
        try:
            accepted = await self.session.submit(command[1], if_busy=command[0])
        except GatewayError as exc:  # 409 queue_full, the gateway away, ...
            return f"(not sent: {fold(exc.message)})"
        return accepted_note(accepted)

    async def _answer_keys(self) -> None:
        """While a turn runs: ``y``/``n`` answer the question shown; ``/`` opens the
        command line, which takes every key until it is sent or dropped."""
        while True:
            key = await self.keyboard.key()
            if key is None:
                await trio.sleep_forever()
            if self.command is not None or key == "/":
                await self._command_key(key)
                continue
            permissions = self.session.pending_permissions
            asked = next(iter(permissions.values()), None)
            if asked is None or asked.perm_id in self.answered or key.lower() not in ("y", "n"):
                continue
            allow = key.lower() == "y"
            content: dict[str, Any] | None = None
            if allow and asked.kind == "elicitation":
                content = await self._form(asked.perm_id)
                allow = content is not None
            self.answered[asked.perm_id] = (
                ("answered" if content else "allowed")
                if allow
                else ("declined" if asked.kind == "elicitation" else "denied")
            )
            self.redraw()
            try:
                await self.session.answer(
                    asked.perm_id, "allow" if allow else "deny", content=content
                )
            except GatewayError as exc:
                self.answered[asked.perm_id] = f"not answered: {fold(exc.message)}"
                self.redraw()

    async def _form(self, perm_id: str) -> dict[str, Any] | None:
        """An elicitation's form, below what is on screen, in line mode (module docstring)."""
        view = next((p for p in self.session.full["permissions"] if p["perm_id"] == perm_id), None)
        if view is None:
            return None
        self.region.show([])  # the region goes; it is drawn again below the form
        self.form_open = True
        self.keyboard.mode("line")

        def write(text: str) -> None:
            self.out.write(text)
            self.out.flush()

        async def read_line() -> str | None:
            line = await self.keyboard.line()
            if not self.keyboard.tty:
                self.out.write("\n")  # nothing echoed the newline
            return line

        try:
            return await ask_form(view, read_line, write)
        finally:
            self.keyboard.mode("keys")
            self.form_open = False
            self.region.fresh = True


def is_command(line: str) -> bool:
    """A line the chat reads as ``/queue`` or ``/steer`` rather than sends as it is."""
    return line.strip().partition(" ")[0] in ("/queue", "/steer")


def parse_command(line: str) -> tuple[IfBusy, str] | None:
    """``/queue TEXT`` or ``/steer TEXT``: the ``if_busy`` and the text; ``None`` otherwise."""
    head, _, text = line.strip().partition(" ")
    if not is_command(head) or not text.strip():
        return None
    return ("queue" if head == "/queue" else "steer"), text.strip()


def accepted_note(accepted: TurnAccepted) -> str:
    """What the gateway made of a ``/queue`` or ``/steer`` (its 202 body), in one line."""
    if accepted.queued:
        return f"(queued: position {accepted.position})"
    if accepted.steered:
        return "(steered: the running turn takes it before its next model call)"
    return "(started: the session was idle)"


# --- the command ---------------------------------------------------------------------------------


async def chat(
    base_url: str,
    session_id: str | None,
    *,
    view: ViewName = "full",
    api_key: str | None = None,
    agent: str | None = None,
    stdin_fd: int = 0,
    out: TextIO | None = None,
    transport: Any = None,
) -> int:
    """Chat with a session (a new one when ``session_id`` is ``None``); the exit status.

    ``agent`` names the agent of the new session (docs/protocol.md §11); an
    unknown one is the gateway's 422 ``unknown_agent``, whose message (the
    names it knows) is printed, exit status 1.
    """
    output = out if out is not None else sys.stdout
    try:
        client = GatewayClient(base_url, api_key=api_key, transport=transport)
    except GatewayError as exc:
        print(f"chat: --url {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    keyboard = Keyboard(stdin_fd)
    try:
        async with client:
            if session_id is None:
                try:
                    session_id = (await client.create_session(agent=agent)).session_id
                except ApiError as exc:
                    if exc.status != 422:
                        raise
                    print(f"chat: {exc.message}", file=sys.stderr)
                    return EXIT_FAILED
                output.write(f"\x1b[{DIM}msession {session_id}\x1b[0m\n")
            failure: GatewayError | None = None  # raised below, out of the nursery's group
            async with trio.open_nursery() as nursery:
                nursery.start_soon(keyboard.pump)  # one keyboard for every session of the chat
                try:
                    status = await _sessions(client, session_id, keyboard, output, view)
                except GatewayError as exc:
                    failure = exc
                nursery.cancel_scope.cancel()
            if failure is not None:
                raise failure
            return status
    except ApiError as exc:
        hint = " (pass --api-key)" if exc.status in (401, 403) else ""
        if exc.status == 404:
            print(f"chat: session {session_id} not found", file=sys.stderr)
        else:
            print(f"chat: the gateway refused: {exc.status} {exc.code}{hint}", file=sys.stderr)
        return EXIT_FAILED
    except GatewayError as exc:
        print(f"chat: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        keyboard.restore()


async def _sessions(
    client: GatewayClient, session_id: str, keyboard: Keyboard, out: TextIO, view: ViewName
) -> int:
    """Chat with the session, then with each fork ``/fork`` makes; the exit status."""
    while True:
        async with client.open_session(session_id) as session:
            chat = Chat(session, keyboard, out, view=view)
            status = await chat.run()
        forked = chat.forked
        if forked is None:
            return status
        session_id = forked.session_id
        at = forked.forked_from.at_message_id or "its start"
        out.write(f"\x1b[{DIM}msession {session_id}, forked from {session.id} at {at}\x1b[0m\n")
        if forked.draft:
            text = "\n".join(b.text for b in forked.draft if isinstance(b, TextBlock))
            out.write(f"\x1b[{DIM}mdraft: {clean(text)}\x1b[0m\n")


def run(args: Any) -> int:
    """``gateway chat`` (the ``chat`` arguments of :mod:`gateway.cli`); the exit status."""
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    status = EXIT_OK
    with suppress(KeyboardInterrupt):  # a Ctrl-C before the signal receiver was in place
        status = trio.run(
            partial(
                chat,
                args.url,
                args.session,
                view=args.view,
                api_key=api_key,
                agent=getattr(args, "agent", None),
            )
        )
    return status
