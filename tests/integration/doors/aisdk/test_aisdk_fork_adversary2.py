"""``useChat`` on a fork of its chat (docs/protocol.md §2 "Forks", docs/doors/aisdk.md).

A fork's messages keep their source's ids (derived from the source chat's id
and the client's), so a client that goes on with the fork (``useChat`` with
the fork's id, its messages as they were) names the copied messages by its
own ids, as it did in the source chat.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.aisdk_support import gateway, request, user
from tests.integration.doors.aisdk.test_aisdk_rewind import chat, edited, said, stored


async def test_regenerate_and_edit_on_a_fork_of_the_chat(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        first, second = user("The first question"), user("The second question")
        a1 = await chat(h, request(chat_id, first))
        a2 = await chat(h, request(chat_id, first, a1.as_sent(), second))
        r = await h.http.post(f"/sessions/{chat_id}/fork", json={})
        assert r.status_code == 201, r.text
        fork_id = r.json()["session_id"]
        # regenerate() on the fork: the fork holds the client's second message (a copy)
        body = request(fork_id, first, a1.as_sent(), second, trigger="regenerate-message")
        again = await chat(h, {**body, "messageId": a2.id})
        assert again.text == "You said: The second question"
        assert len(await stored(h, fork_id)) == 4
        # an edit of the first message on the fork rewinds to its copy
        body = request(fork_id, edited(first, "The first question, edited"))
        body["messageId"] = first["id"]
        answer = await chat(h, body)
        assert answer.text == "You said: The first question, edited"
        assert said(await stored(h, fork_id)) == [
            ("user", "The first question, edited"),
            ("assistant", "You said: The first question, edited"),
        ]
        assert len(await stored(h, chat_id)) == 4  # the source is unchanged
