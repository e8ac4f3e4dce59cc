"""A small MCP server for the README's worked example: notes, kept in a JSON file.

Uses only the ``mcp`` SDK (``MCPServer``). Run over stdio::

    python examples/mcp_notes.py

and name it in the gateway's config::

    [mcp_servers.notes]
    command = ["python", "examples/mcp_notes.py"]
    scope = "session"          # one process per session, in its workspace

Its notes live in ``notes.json`` in its working directory (with ``scope =
"session"``: the session's workspace). Tools, as an agent sees them:
``mcp__notes__add_note``, ``mcp__notes__list_notes``, ``mcp__notes__search``
and ``mcp__notes__clear_notes``, which asks the user first (an MCP
elicitation: a ``permission.requested`` with ``kind: "elicitation"`` in the
gateway's stream).
"""

from __future__ import annotations

import json
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

NOTES = Path("notes.json")

server = MCPServer("notes", instructions="A notebook: add, list, search and clear notes.")


def load() -> list[str]:
    return list(json.loads(NOTES.read_text())) if NOTES.exists() else []


def save(notes: list[str]) -> None:
    NOTES.write_text(json.dumps(notes, indent=1))


@server.tool()
def add_note(text: str) -> str:
    """Add a note; returns its number."""
    notes = load()
    notes.append(text)
    save(notes)
    return f"note {len(notes)} added"


@server.tool()
def list_notes() -> str:
    """Every note, numbered."""
    notes = load()
    return "\n".join(f"{i}. {n}" for i, n in enumerate(notes, 1)) or "no notes yet"


@server.tool()
def search(query: str) -> str:
    """The notes that contain the query (case-insensitive)."""
    found = [f"{i}. {n}" for i, n in enumerate(load(), 1) if query.lower() in n.lower()]
    return "\n".join(found) or f"no note mentions {query!r}"


class Confirm(BaseModel):
    confirm: bool = Field(description="Delete every note?")


@server.tool()
async def clear_notes(ctx: Context) -> str:
    """Delete every note, once the user confirms."""
    count = len(load())
    answer = await ctx.elicit(f"Delete all {count} notes?", Confirm)
    if answer.action == "accept" and answer.data.confirm:
        save([])
        return f"deleted {count} notes"
    return f"kept the notes ({answer.action})"


if __name__ == "__main__":
    server.run()
