"""``useChat``'s regenerate and edit through the AI SDK's HTTP door (docs/doors/aisdk.md).

The requests are what ``useChat`` sends (``regenerate()``: the history up to
the user message, ``trigger: "regenerate-message"``; an edit: the message
again with its id and new text, ``messageId``); each answer is read by
:class:`tests.aisdk_support.UiMessage` as the ``ai`` package reads it. The
package's own chat does the same in tests/system/doors/aisdk/test_aisdk_js.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tests.aisdk_support import UiMessage, gateway, read, request, user
from tests.conftest import Harness


async def chat(h: Harness, body: dict[str, Any]) -> UiMessage:
    async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        return await read(r)


async def stored(h: Harness, chat_id: str, **query: str) -> list[dict[str, Any]]:
    r = await h.http.get(f"/sessions/{chat_id}/messages", params=query)
    assert r.status_code == 200, r.text
    return list(r.json()["messages"])


def said(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"][0].get("text", "")) for m in messages]


def edited(message: dict[str, Any], text: str) -> dict[str, Any]:
    return {**message, "parts": [{"type": "text", "text": text}]}


async def test_regenerate_answers_one_message_in_place_of_the_old(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        first, second = user("The first question"), user("The second question")
        a1 = await chat(h, request(chat_id, first))
        a2 = await chat(h, request(chat_id, first, a1.as_sent(), second))
        # useChat's regenerate(): the history without the answer, the user message last
        body = request(chat_id, first, a1.as_sent(), second, trigger="regenerate-message")
        again = await chat(h, {**body, "messageId": a2.id})
        assert again.text == "You said: The second question" and again.finish_reason == "stop"
        assert again.id not in (a1.id, a2.id)  # a message of its own, in place of a2
        assert [c["type"] for c in again.chunks].count("start") == 1
        assert said(await stored(h, chat_id)) == [
            ("user", "The first question"),
            ("assistant", "You said: The first question"),
            ("user", "The second question"),
            ("assistant", "You said: The second question"),
        ]
        every = await stored(h, chat_id, include_rewound="true")
        assert [m.get("rewound", False) for m in every] == [False, False, True, True, False, False]
        # regenerated again: the message as the chat holds it now (its id is the client's)
        third = await chat(h, request(chat_id, first, a1.as_sent(), second,
                                      trigger="regenerate-message"))  # fmt: skip
        assert third.id not in (again.id, a2.id)
        assert len(await stored(h, chat_id)) == 4
        assert len(await stored(h, chat_id, include_rewound="true")) == 8


async def test_an_edited_message_rewinds_to_it_and_a_repeat_is_that_turn(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        first, second = user("The first question"), user("The second question")
        a1 = await chat(h, request(chat_id, first))
        await chat(h, request(chat_id, first, a1.as_sent(), second))
        # useChat's sendMessage({text, messageId: first.id}): the history up to it, edited
        body = request(chat_id, edited(first, "The first question, edited"))
        body["messageId"] = first["id"]
        answer = await chat(h, body)
        assert answer.text == "You said: The first question, edited"
        assert said(await stored(h, chat_id)) == [
            ("user", "The first question, edited"),
            ("assistant", "You said: The first question, edited"),
        ]
        # sent again after a lost answer: that turn, not another
        repeat = await chat(h, body)
        assert repeat.id == answer.id and repeat.text == answer.text
        assert len(await stored(h, chat_id, include_rewound="true")) == 6
        # a client still showing the old branch sends its second message again: refused
        r = await h.http.post("/ai-sdk/chat", json=request(chat_id, first, a1.as_sent(), second))
        assert (r.status_code, r.json()["error"]["code"]) == (409, "message_rewound")
        # the chat goes on from the edited branch
        third = user("The third question")
        m = await chat(h, request(chat_id, edited(first, "The first question, edited"),
                                  answer.as_sent(), third))  # fmt: skip
        assert m.text == "You said: The third question"
        assert [role for role, _ in said(await stored(h, chat_id))] == ["user", "assistant"] * 2
