"""The contract lives in the repository: the docs name everything the code defines.

- Every event type (gateway/protocol/events.py), close (gateway/protocol/closes.py,
  its name and its WebSocket code) and error code the gateway raises appears in
  the wire protocol: docs/protocol.md and its doors' pages, docs/doors/*.md.
- Every config key (the msgspec structs of gateway/config.py, walked) appears in
  docs/reference.md, the operator's reference.
- Every relative link of README.md and docs/ (docs/doors/ too) resolves: the
  file exists and, where the link names an anchor, a heading of that file makes it.
- README.md, the front door, stays under 16 KB: detail goes to docs/.
- No file of the repository cites a document outside it.
- CI (.ci/run) installs and runs the tests with the README's test command,
  line for line.
- docs/operating.md "Logs" lists exactly the log events the gateway emits
  (their names read from the source with :mod:`ast`: :func:`logged_events`).

The error codes are read from the source with :mod:`ast`: the first string of
each call to an error class (``ApiError(409, "turn_in_progress", ...)``,
``SubscribeRejected("cursor_expired", ...)``) and each ``code=`` keyword, plus
the error classes of ``llm.call_failed`` and ``tool.failed``. The client
library's own errors (gateway/client/) are not wire codes.
"""

from __future__ import annotations

import ast
import functools
import re
import typing
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gateway.config import Config
from gateway.protocol.closes import CLOSES
from gateway.protocol.events import EVENT_TYPES, LlmErrorClass, ToolErrorClass
from tests.paths import ROOT

ROOT = ROOT
DOCS = ROOT / "docs"
PROTOCOL = DOCS / "protocol.md"
DOORS = DOCS / "doors"
REFERENCE = DOCS / "reference.md"

_CODE = re.compile(r"^[a-z]+(?:_[a-z0-9]+)*$")
_RAISES_CODE = re.compile(r"(?:Error|Rejected|Refused|Refusal)$")
# Error classes whose first argument is a message, not a code.
_NOT_CODES = {"ConfigError", "StartupError", "StoreError", "ClientError", "GatewayError"}


def mentions(text: str, name: str) -> bool:
    """``name`` appears as a whole name (``tool.called`` is not ``tool.called_x``)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


def missing(names: typing.Iterable[str], *docs: Path) -> list[str]:
    text = "\n".join(doc.read_text(encoding="utf-8") for doc in docs)
    return sorted({name for name in names if not mentions(text, name)})


def contract() -> list[Path]:
    """The wire protocol: docs/protocol.md, and a page per door under docs/doors/."""
    return [PROTOCOL, *sorted(DOORS.glob("*.md"))]


# --- the wire protocol ----------------------------------------------------------------


def raised_error_codes() -> dict[str, str]:
    """Every error code the gateway raises, with one place that raises it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if "client" in path.relative_to(ROOT / "gateway").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = str(getattr(func, "id", None) or getattr(func, "attr", ""))
            if not _RAISES_CODE.search(name) or name in _NOT_CODES:
                continue
            strings = [a.value for a in node.args if isinstance(a, ast.Constant)]
            first = next((s for s in strings if isinstance(s, str)), None)
            keyword = [
                k.value.value
                for k in node.keywords
                if k.arg in ("code", "error_class") and isinstance(k.value, ast.Constant)
            ]
            for code in [first, *keyword]:
                if isinstance(code, str) and _CODE.match(code):
                    found.setdefault(code, f"{path.relative_to(ROOT)}:{node.lineno}")
    for literal in (LlmErrorClass, ToolErrorClass):
        for code in typing.get_args(literal):
            found.setdefault(code, "gateway/protocol/events.py")
    return found


def test_error_codes_are_found() -> None:
    """The scan sees the codes it is meant to see (a guard on the scan itself)."""
    codes = raised_error_codes()
    assert {"turn_in_progress", "cursor_expired", "invalid_frame", "unknown_tool"} <= set(codes)
    assert "http_error" not in codes  # the client library's, not the wire's


def test_every_event_type_is_in_the_protocol() -> None:
    assert missing(EVENT_TYPES, PROTOCOL) == []


def test_every_close_is_in_the_protocol() -> None:
    names = missing(CLOSES, PROTOCOL)
    codes = missing((str(close.ws_code) for close in CLOSES.values()), PROTOCOL)
    assert (names, codes) == ([], [])


def test_every_error_code_is_in_the_protocol() -> None:
    """In docs/protocol.md or the page of the door that answers it (``invalid_resume``:
    docs/doors/agui.md)."""
    codes = raised_error_codes()
    assert {code: codes[code] for code in missing(codes, *contract())} == {}


def test_the_protocol_has_its_doors() -> None:
    """Each door's page is there, and section 14 of docs/protocol.md links to each."""
    pages = {page.name for page in contract()[1:]}
    assert {"sse.md", "agui.md", "aisdk.md", "webhooks.md"} <= pages
    text = PROTOCOL.read_text(encoding="utf-8")
    section = text.split("\n## 14. ", 1)[1].split("\n## ", 1)[0]
    assert sorted(p for p in pages if f"](doors/{p})" not in section) == []


# --- the operator's reference ---------------------------------------------------------


def config_keys(struct: type, prefix: str = "") -> Iterator[str]:
    """Every key of a config struct, dotted, walking sections and tables of structs.

    ``[agents.NAME]`` and ``[mcp_servers.NAME]`` are ``agents.*`` and
    ``mcp_servers.*``; ``default_agent`` is what ``[agents] default`` is read into.
    """
    for field in msgspec.structs.fields(struct):
        name = "agents.default" if field.name == "default_agent" else f"{prefix}{field.name}"
        declared = field.type
        if typing.get_origin(declared) is dict:
            declared = typing.get_args(declared)[1]
            if isinstance(declared, type) and issubclass(declared, msgspec.Struct):
                yield from config_keys(declared, f"{name}.*.")
                continue
        if isinstance(declared, type) and issubclass(declared, msgspec.Struct):
            yield from config_keys(declared, f"{name}.")
            continue
        yield name


def test_every_config_key_is_in_the_reference() -> None:
    keys = list(config_keys(Config))
    assert {"server.host", "model.prices.*.input_per_mtok", "agents.*.runtime"} <= set(keys)
    assert "mcp_servers.*.tool_timeout_s" in keys and "agents.default" in keys
    text = REFERENCE.read_text(encoding="utf-8")
    tables = {key.rsplit(".", 1)[0].replace(".*", "") for key in keys if "." in key}
    absent = [f"[{table}]" for table in sorted(tables) if f"[{table}" not in text]
    for key in keys:
        last = key.rsplit(".", 1)[-1]
        if not re.search(rf"(?m)^\s*#?\s*{re.escape(last)}\s*=|`{re.escape(last)}`", text):
            absent.append(key)
    assert absent == []


# --- links ------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"(?ms)^```.*?^```")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"(?m)^#{1,6}\s+(.*?)\s*#*\s*$", text)}


def documents() -> list[Path]:
    """README.md and every page of docs/, its subfolders' (docs/doors/) included."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_the_documents_include_the_doors() -> None:
    assert DOORS / "agui.md" in documents()


def test_a_link_into_a_subfolder_resolves_and_one_to_nothing_does_not() -> None:
    """The link check itself, on a page of docs/ and one of docs/doors/."""
    assert broken_links(PROTOCOL, "[a](doors/agui.md#re-attaching) [b](#14-other-front-ends)") == []
    assert broken_links(DOORS / "agui.md", "[c](../protocol.md#8-cancellation) [d](aisdk.md)") == []
    assert broken_links(PROTOCOL, "[e](doors/nowhere.md) [f](doors/agui.md#no-such-heading)") == [
        "doors/nowhere.md",
        "doors/agui.md#no-such-heading",
    ]


def broken_links(doc: Path, text: str) -> list[str]:
    """The relative links of ``text``, read as ``doc``'s, whose file or heading is not there."""
    broken = []
    for target in _LINK.findall(_FENCE.sub("", text)):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in anchors(linked)
        ):
            broken.append(target)
    return broken


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert broken_links(doc, doc.read_text(encoding="utf-8")) == []


def test_slugs_are_githubs() -> None:
    assert slug("The scripted model") == "the-scripted-model"
    assert slug("`gateway attach`") == "gateway-attach"
    assert slug("3. WebSocket frames") == "3-websocket-frames"
    assert slug("Health and readiness") == "health-and-readiness"


# --- no citation of a document outside the repository ---------------------------------

_OUTSIDE = re.compile(
    r"PROTOCOL\.md|RUNNING\.md|STYLE\.md|\.\./shared|(?<![\w/])shared/|(?<![\w-])seeds/"
    r"|PROTOCOL (?:section|§)|PROTOCOL §|\bRUNNING (?:\"|section)"
)
_SWEPT = ("gateway", "tests", "bench", "docs", ".ci")
_FILES = ("README.md", "CHANGELOG.md", "pyproject.toml")


def repository_files() -> Iterator[Path]:
    for name in _FILES:
        yield ROOT / name
    for top in _SWEPT:
        for path in sorted((ROOT / top).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if not path.is_file() or "__pycache__" in parts or parts[:2] == ("bench", "results"):
                continue
            if path == Path(__file__).resolve():
                continue
            yield path


def test_no_file_cites_a_document_outside_the_repository() -> None:
    citing = []
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # an image, a binary trace
        for number, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE.search(line):
                citing.append(f"{path.relative_to(ROOT)}:{number}")
    assert citing == []


# --- the README: the front door ------------------------------------------------------

README_MAX_BYTES = 16 * 1024


def test_the_readme_stays_under_16_kb() -> None:
    """What it is, the two commands, a short tour, the config's most used keys and the
    measured performance; the code map and every detail live in docs/."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move detail to docs/"


# --- the README's commands are CI's ---------------------------------------------------


def readme_commands() -> list[list[str]]:
    """The lines of each ``sh`` block of the README's "The two commands": serve, then test."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## The two commands\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip().splitlines() for block in re.findall(r"(?ms)^```sh\n(.*?)^```", section)]


def test_ci_runs_the_readmes_test_command_as_written() -> None:
    """.ci/run holds each line of the README's test command, byte for byte, and installs
    and runs the tests no other way: what passes in CI is what a reader runs."""
    [_serve, test] = readme_commands()
    assert test and any("-m pytest" in line for line in test), test
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert [line for line in test if line not in ci] == [], ".ci/run lacks the README's lines"
    code = [line for line in ci if not line.lstrip().startswith("#")]
    installs_or_tests = [line for line in code if re.search(r"\bpip\b|\bpytest\b|-m venv", line)]
    assert installs_or_tests == test, "what .ci/run installs and runs, not the README's command"


# --- the log's events -------------------------------------------------------------------

OPERATING = DOCS / "operating.md"


_Function = ast.FunctionDef | ast.AsyncFunctionDef


class _Calls(ast.NodeVisitor):
    """Every call of a module, with the function it is in (None: at module level)."""

    def __init__(self) -> None:
        self.calls: list[tuple[ast.Call, _Function | None]] = []
        self._function: _Function | None = None

    def visit_FunctionDef(self, node: _Function) -> None:
        outer, self._function = self._function, node
        self.generic_visit(node)
        self._function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        self.calls.append((node, self._function))
        self.generic_visit(node)


def _event_names(call: ast.Call, helpers: dict[str, int]) -> Iterator[ast.expr]:
    """What names a log event in a call: the ``helpers``' argument at its position
    (``event(log, level, "name", …)``), the ``"event"`` of ``extra={"event": …}``, or an
    ``extra=`` this cannot read."""
    func = call.func
    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    position = helpers.get(called)
    if position is not None and len(call.args) > position:
        yield call.args[position]
    for keyword in call.keywords:
        if keyword.arg != "extra":
            continue
        if not isinstance(keyword.value, ast.Dict):
            yield keyword.value  # unread: reported as such
            continue
        for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "event":
                yield value


def _positional(function: _Function) -> list[str]:
    names = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


@functools.cache
def logged_events() -> tuple[dict[str, str], list[str]]:
    """Every event name the gateway logs, with one place that logs it; and the places whose
    event's name this cannot read.

    Read from the source with :mod:`ast`. A logging call's ``extra={"event": name}``
    names an event; a function that passes one of its parameters on as a name is a
    helper whose callers name events at that position: :func:`gateway.logs.event`,
    :func:`gateway.logs.json_line`, the auth module's ``_event``, the CLI's ``_say``
    (found, not listed). A name is a string literal, or ``exc.event``: the ``event``
    class attribute of the store's refusals (``WritesRefused``).
    """
    calls: list[tuple[str, ast.Call, _Function | None]] = []
    attributes: dict[str, str] = {}  # a class's ``event = "name"``: where
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        visitor = _Calls()
        visitor.visit(tree)
        calls += [(where, call, function) for call, function in visitor.calls]
        for cls in ast.walk(tree):
            for node in cls.body if isinstance(cls, ast.ClassDef) else []:
                target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                value = getattr(node, "value", None)
                if (
                    isinstance(target, ast.Name)
                    and target.id == "event"
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                ):
                    attributes[value.value] = f"{where}:{node.lineno}"

    def passed_on(name: ast.expr, function: _Function | None) -> int | None:
        """The position of the parameter ``name`` is, if it is one of ``function``'s."""
        if not isinstance(name, ast.Name) or function is None:
            return None
        params = _positional(function)
        return params.index(name.id) if name.id in params else None

    helpers: dict[str, int] = {}
    while True:  # until no new helper: a helper of a helper is one too
        before = dict(helpers)
        for _, call, function in calls:
            for name in _event_names(call, helpers):
                position = passed_on(name, function)
                if function is not None and position is not None:
                    helpers[function.name] = position
        if helpers == before:
            break
    events: dict[str, str] = {}
    unread: list[str] = []
    for where, call, function in calls:
        for name in _event_names(call, helpers):
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                events.setdefault(name.value, f"{where}:{name.lineno}")
            elif isinstance(name, ast.Attribute) and name.attr == "event" and attributes:
                for value, place in attributes.items():
                    events.setdefault(value, place)
            elif passed_on(name, function) is None:
                unread.append(f"{where}:{name.lineno}: {ast.unparse(name)}")
    return events, unread


def documented_events() -> set[str]:
    """The events of docs/operating.md's "Logs" table (its first column; a row may name several)."""
    text = OPERATING.read_text(encoding="utf-8")
    section = text.split("\n## Logs\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}


def test_log_events_are_found() -> None:
    events, unread = logged_events()
    assert unread == [], "event names this test cannot read (a literal, please):\n" + "\n".join(
        unread
    )
    for name in ("turn_ended", "config_invalid", "api_keys_loaded", "store_file_replaced"):
        assert name in events, name  # event(), _say(), auth's _event, a refusal's attribute
    assert {"http_handler_failed", "log_lines_dropped", "gateway_started"} <= set(events)


def test_every_log_event_is_in_operating() -> None:
    """docs/operating.md "Logs" lists exactly the events the code logs: none missing, none
    stale."""
    events, _ = logged_events()
    documented = documented_events()
    missing = sorted(set(events) - documented)
    stale = sorted(documented - set(events))
    assert (missing, stale) == ([], []), (
        'docs/operating.md "Logs" and the code disagree.\n'
        + "".join(f"  missing from the docs: {n} (logged at {events[n]})\n" for n in missing)
        + "".join(f"  in the docs, logged nowhere: {n}\n" for n in stale)
    )
