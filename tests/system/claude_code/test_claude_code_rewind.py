"""A rewound turn of a ``claude-code`` session (docs/protocol.md §2 "Edit and regenerate", §11).

The real Claude Code CLI on the fake Anthropic API (tests/claude_code_support.py):
after three turns, a turn that rewinds to the second's message restarts the
CLI with ``resume_session_at`` the transcript entry before that prompt, so the
model is sent the first turn, then the edit; a later turn (after an idle stop:
a plain resume) goes on from the edited branch; a rewind to the first message
starts the CLI's conversation anew.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from gateway.runtimes.claude_code.paths import claude_session_id, state_dir
from gateway.runtimes.claude_code.rewind import prompt_uuid, transcript_path
from tests.claude_code_support import CLAUDE_CODE_MARKS, gateway, only_model_calls
from tests.claude_code_support import server as server
from tests.conftest import Harness, running_gateway, types

pytestmark = CLAUDE_CODE_MARKS


async def turn(gw: Harness, sid: str, content: str, rewind_to: str | None = None) -> list[str]:
    """A turn to its end: its user message's id, then its events' types."""
    async with gw.client(sid) as client:
        await client.subscribe()
        body = {"content": content, **({"rewind_to": rewind_to} if rewind_to else {})}
        r = await gw.http.post(f"/sessions/{sid}/turns", json=body)
        assert r.status_code == 202, r.text
        with trio.fail_after(30):
            events = await client.until_turn_ends()
    started = next(e for e in events if e.type == "turn.started")
    assert events[-1].type == "turn.completed", types(events)
    return [started.payload.user_message.id, *types(events)]  # type: ignore[attr-defined]


def said(request_body: dict[str, object]) -> str:
    return str(request_body["messages"])


async def test_a_rewound_turn_resumes_the_cli_before_that_message(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.enqueue(*[Replay(transcript("anthropic/text.sse"))] * 6)
    config, providers = await gateway(tmp_path, server, monkeypatch, idle_process_s="0.5")
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        await turn(gw, sid, "first words APPLE")
        second = await turn(gw, sid, "second words BANANA")
        await turn(gw, sid, "third words CHERRY")
        edited = await turn(gw, sid, "second words DAMSON", rewind_to=second[0])
        at = edited.index("history.rewound")
        assert edited[at + 1] == "turn.started"
        runtime = gw.node.sessions[sid].agent.runtime  # type: ignore[union-attr]
        assert runtime is not None
        with trio.fail_after(5):  # idle: stopped; the next turn resumes plainly
            while runtime.client is not None:  # noqa: ASYNC110
                await trio.sleep(0.1)
        await turn(gw, sid, "fifth words ELDER")
        first = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"][0]
        await turn(gw, sid, "first words FIG", rewind_to=first["id"])
    await providers.aclose()
    # The prompts are named after the gateway's messages: the rewind found B's by its id.
    home = state_dir(config.sessions.workspace_root, sid)
    claude_id = claude_session_id(sid)
    [aside] = glob.glob(f"{home}/.claude/projects/*/{claude_id}.rewound-1.jsonl")
    text = await trio.Path(aside).read_text()  # the conversation before the rewind to A
    lines = text.splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]
    assert prompt_uuid(second[0]) in {e.get("uuid") for e in entries}
    assert transcript_path(home, claude_id) is not None  # the one begun anew
    bodies = [r.body for r in server.requests]
    assert len(bodies) == 6
    rewound, later, anew = said(bodies[3]), said(bodies[4]), said(bodies[5])
    assert "APPLE" in rewound and "DAMSON" in rewound
    assert "BANANA" not in rewound and "CHERRY" not in rewound
    assert "APPLE" in later and "DAMSON" in later and "ELDER" in later
    assert "BANANA" not in later and "CHERRY" not in later
    assert "FIG" in anew and not any(w in anew for w in ("APPLE", "DAMSON", "ELDER"))
    only_model_calls(server)
