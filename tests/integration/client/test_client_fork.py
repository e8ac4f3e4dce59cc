"""A fork through the client library and ``gateway chat`` (docs/protocol.md §2, "Forks").

- :meth:`GatewayClient.fork`: the answer decoded (a draft at a user message),
  the gateway's refusals as :class:`ApiError`, one fork per call even when it
  is sent again (its ``Idempotency-Key``); a :class:`Session` of the fork
  starts from its snapshot with the copied history.
- ``gateway chat``'s ``/fork``: the chat goes on with the fork (its turns are
  the fork's, the source keeps its own), a refused ``/fork`` says why and
  stays; ``/fork MESSAGE_ID`` at a user message shows the draft.

``gateway chat`` runs in this process against a real gateway, its standard
input a pipe written one line at a time, each once the chat shows its prompt
(it drops what was typed ahead of one).
"""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
import trio

from gateway.client import GatewayClient
from gateway.client.chat import chat
from gateway.errors import ApiError
from tests.conftest import Harness

PROMPT = "\x1b[1m\u203a\x1b[0m "
"""The chat's prompt (a user message it shows is styled otherwise)."""


async def messages(gw: Harness, sid: str) -> list[dict[str, Any]]:
    r = await gw.http.get(f"/sessions/{sid}/messages")
    assert r.status_code == 200, r.text
    return list(r.json()["messages"])


async def test_the_client_forks_and_the_fork_opens_on_its_copied_history(gw: Harness) -> None:
    source = await gw.create_session()
    async with GatewayClient(gw.base) as client:
        async with client.open_session(source) as session:
            turn_id = await session.send("alpha")
            async for _ in session:
                if session.turn_ended(turn_id):
                    break
        user, reply = await messages(gw, source)
        forked = await client.fork(source)
        assert forked.forked_from.at_message_id == reply["id"] and not forked.draft
        drafted = await client.fork(source, user["id"])
        assert [b.text for b in drafted.draft] == ["alpha"]  # type: ignore[union-attr]
        with pytest.raises(ApiError) as refused:
            await client.fork(source, "msg_00000000000000000000")
        assert (refused.value.status, refused.value.code) == (404, "message_not_found")
        async with client.open_session(forked.session_id) as fork:
            await fork.ready()
            assert [m.id for m in fork.state.messages] == [user["id"], reply["id"]]
            assert fork.simple["thread"][-1]["text"] == "You said: alpha"
        listed = await client.list_sessions()
    assert len(listed.sessions) == 3


class Screen(io.StringIO):
    """What the chat writes; each write wakes whoever waits for a prompt."""

    encoding = "utf-8"

    def __init__(self) -> None:
        super().__init__()
        self.wrote = trio.Event()

    def write(self, text: str) -> int:
        self.wrote.set()
        self.wrote = trio.Event()
        return super().write(text)

    async def prompts(self, count: int) -> None:
        with trio.fail_after(15):
            while self.getvalue().count(PROMPT) < count:
                await self.wrote.wait()


async def test_chat_forks_and_goes_on_with_the_fork(gw: Harness) -> None:
    source = await gw.create_session()
    screen = Screen()
    read, write = os.pipe()
    status: list[int] = []

    async def chatting() -> None:
        status.append(await chat(gw.base, source, stdin_fd=read, out=screen))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(chatting)
            lines = ["alpha", "/fork no such things", "/fork msg_unknown", "/fork", "beta"]
            for count, line in enumerate(lines, start=1):
                await screen.prompts(count)
                os.write(write, f"{line}\n".encode())
            await screen.prompts(len(lines) + 1)
            user = (await messages(gw, source))[0]["id"]
            os.write(write, f"/fork {user}\n".encode())
            await screen.prompts(len(lines) + 2)
            os.close(write)  # end of input: the chat ends
            write = -1
    finally:
        os.close(read)
        if write != -1:
            os.close(write)
    assert status == [0]
    shown = screen.getvalue()
    assert "(/fork takes one message id at most)" in shown
    assert "(not forked: no message 'msg_unknown'" in shown
    listed = (await gw.http.get("/sessions")).json()["sessions"]
    forks = [s["session"]["id"] for s in listed if s["session"]["id"] != source]
    assert len(forks) == 2
    held = {f: [m["content"][0]["text"] for m in await messages(gw, f)] for f in forks}
    [first] = [f for f in forks if len(held[f]) == 4]
    [second] = [f for f in forks if f != first]
    assert f"session {first}, forked from {source} at " in shown
    assert held[first] == ["alpha", "You said: alpha", "beta", "You said: beta"]
    assert held[second] == []  # forked from the first at its first message: the draft
    assert f"session {second}, forked from {first} at " in shown
    assert len(await messages(gw, source)) == 2  # the source kept its own
    assert "draft: alpha" in shown


async def test_chat_with_an_unknown_session_is_one_line_and_exit_1(
    gw: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the chat cannot fix still ends it with one line (not a traceback of the
    keyboard's nursery, which the chat's sessions run beside)."""
    read, write = os.pipe()
    try:
        status = await chat(gw.base, "sess_00000000000000000000", stdin_fd=read, out=Screen())
    finally:
        os.close(read)
        os.close(write)
    assert status == 1
    assert capsys.readouterr().err == "chat: session sess_00000000000000000000 not found\n"
