"""What the code's prose cites exists: docs, their sections, and modules.

The code cites the contract where it implements it (``docs/protocol.md §14``)
and names the modules it works with (``gateway.node.registry``). Nothing
checked those citations, and one named a module that no longer existed.
Here every docstring and comment of ``gateway/``, ``bench/`` and ``tests/``
is read, and each of these must name something that is there:

- ``docs/NAME.md``: a file under docs/, or under a folder of it
  (``docs/doors/agui.md``: a door's page);
- ``docs/NAME.md §N`` (or ``section N``): a numbered heading ``N.`` of it;
- ``docs/NAME.md "Name"`` (or ``§N, "Name"``): a heading of it, or a bold
  lead (``**Name.**``), that begins with that name;
- ``gateway.PACKAGE...``: a module of the package, and where the name goes on
  past the module, a name that module defines or imports (one level: a
  function, class, constant or import).

And a door's code cites its door's page (``docs/doors/agui.md``), not the section of
docs/protocol.md that lists the doors (§14), whose content moved there. The links
between the docs (``[x](doors/agui.md#anchor)``) are checked in tests/unit/test_docs.py.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.paths import ROOT

DOCS = ROOT / "docs"
_DOC = re.compile(r"docs/([a-z0-9_/-]+\.md)(?:\s?(?:§\s?|section )(\d+))?")
_NAMED = re.compile(r"docs/([a-z0-9_/-]+\.md),?\s(?:(?:§\s?|section )\d+,?\s)?\"([^\"\n]{2,60})\"")
_DOTTED = re.compile(r"(?<![\w./])(gateway(?:\.\w+)+)")


def _sources() -> list[Path]:
    return sorted(
        path
        for folder in ("gateway", "bench", "tests")
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def prose(source: str) -> Iterator[str]:
    """The docstrings and comments of a module's source."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            yield str(node.value.value)  # an attribute's docstring
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.string


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "gateway").rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


@cache
def defined(module: str) -> frozenset[str]:
    """The names a module binds at any level (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(modules()[module].read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    if modules()[module].name == "__init__.py":  # a package's submodules are its names too
        prefix = f"{module}."
        names.update(m[len(prefix) :].split(".")[0] for m in modules() if m.startswith(prefix))
    return frozenset(names)


@cache
def sections(doc: str) -> frozenset[str]:
    return frozenset(re.findall(r"^#+ (\d+)\.", (DOCS / doc).read_text(), re.M))


@cache
def names(doc: str) -> tuple[str, ...]:
    """The headings (their number left out) and bold leads of a doc, in lower case."""
    text = (DOCS / doc).read_text()
    headings = re.findall(r"^#+ (?:\d+\. )?(.*?)\s*$", text, re.M)
    leads = re.findall(r"\*\*([^*\n]+)\*\*", text)
    return tuple(name.strip(" .:").lower() for name in [*headings, *leads])


def wrong_citations(text: str) -> Iterator[str]:
    """What ``text`` cites that is not there (module docstring)."""
    for match in _DOC.finditer(text):
        doc, section = match.groups()
        if not (DOCS / doc).is_file():
            yield f"{match.group(0)}: no such file"
        elif section and section not in sections(doc):
            yield f"{match.group(0)}: {doc} has no section {section}"
    for match in _NAMED.finditer(text):
        doc, name = match.groups()
        if (DOCS / doc).is_file() and not any(
            known.startswith(name.lower()) for known in names(doc)
        ):
            yield f'{match.group(0)}: {doc} has no heading "{name}"'
    for match in _DOTTED.finditer(text):
        parts = match.group(1).split(".")
        if f"gateway.{parts[1]}" not in modules():
            continue  # gateway.db, gateway.toml: a file's name, not a module
        cut = next(i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules())
        module, rest = ".".join(parts[:cut]), parts[cut:]
        if cut == 1:
            yield f"{match.group(1)}: no such module"
        elif rest and rest[0] not in defined(module):
            yield f"{match.group(1)}: {module} has no {rest[0]!r}"


def test_every_citation_in_the_code_names_what_is_there() -> None:
    wrong = sorted(
        {
            f"{path.relative_to(ROOT)}: {what}"
            for path in _sources()
            for text in prose(path.read_text())
            for what in wrong_citations(text)
        }
    )
    assert not wrong, "citations of what is not there:\n" + "\n".join(wrong)


def test_the_check_finds_what_is_wrong() -> None:
    assert list(wrong_citations("docs/protocol.md §14, gateway.node.registry.Registry")) == []
    assert list(wrong_citations("see docs/protocol.md §99")) == [
        "docs/protocol.md §99: protocol.md has no section 99"
    ]
    assert list(wrong_citations("docs/nowhere.md")) == ["docs/nowhere.md: no such file"]
    assert list(wrong_citations("gateway.session.cancel does it")) == [
        "gateway.session.cancel: gateway.session has no 'cancel'"
    ]
    assert list(wrong_citations("gateway.node.registry.Nothing")) == [
        "gateway.node.registry.Nothing: gateway.node.registry has no 'Nothing'"
    ]
    assert list(wrong_citations("gateway.db in the working directory")) == []


def test_a_citation_by_name_names_a_heading() -> None:
    assert list(wrong_citations('docs/doors/agui.md "Re-attaching"')) == []
    assert list(wrong_citations('docs/protocol.md §3 "Backpressure"')) == []
    assert list(wrong_citations('docs/protocol.md, "Views"')) == []  # "10. Views"
    assert list(wrong_citations('docs/protocol.md §11, "The key"')) == []  # a bold lead
    assert list(wrong_citations('docs/protocol.md "AG-UI"')) == [
        'docs/protocol.md "AG-UI": protocol.md has no heading "AG-UI"'
    ]


def test_a_citation_of_a_page_in_a_folder_of_docs_is_checked() -> None:
    assert list(wrong_citations("docs/doors/agui.md, docs/doors/aisdk.md")) == []
    assert list(wrong_citations("see docs/doors/nowhere.md")) == [
        "docs/doors/nowhere.md: no such file"
    ]
    assert list(wrong_citations("docs/doors/agui.md §3")) == [
        "docs/doors/agui.md §3: doors/agui.md has no section 3"
    ]


DOOR_CODE = {
    "a2a": "gateway/doors/a2a",
    "agui": "gateway/doors/agui",
    "aisdk": "gateway/doors/aisdk",
    "sse": "gateway/doors/sse",
    "webhooks": "gateway/webhooks",
}
"""Each page of docs/doors/, and the package that implements it."""


def test_each_door_page_has_its_code() -> None:
    assert sorted(page.stem for page in (DOCS / "doors").glob("*.md")) == sorted(DOOR_CODE)


@pytest.mark.parametrize("door", sorted(DOOR_CODE))
def test_a_doors_code_cites_its_page_not_section_14(door: str) -> None:
    """The door's modules cite ``docs/doors/DOOR.md`` (at least one of them), none §14."""
    package = ROOT / DOOR_CODE[door]
    texts = {
        path.name: "\n".join(prose(path.read_text()))
        for path in sorted(package.rglob("*.py"))
        if "__pycache__" not in path.parts
    }
    assert any(f"docs/doors/{door}.md" in text for text in texts.values()), door
    section_14 = re.compile(r"docs/protocol\.md\s?(?:§\s?|section )14\b")
    assert sorted(name for name, text in texts.items() if section_14.search(text)) == []


_PATH = re.compile(
    r"(?<![\w/.])((?:gateway|bench|tests|deploy|examples)/[\w/.-]+\.(?:py|mjs|js|md|toml))"
)


def test_every_path_the_docs_name_is_there() -> None:
    """README.md and docs/ (docs/doors/ too): each repository path they name (CHANGELOG.md is
    history)."""
    wrong = sorted(
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
        for path in set(_PATH.findall(doc.read_text()))
        if not (ROOT / path).exists()
    )
    assert not wrong, "paths that are not there:\n" + "\n".join(wrong)
