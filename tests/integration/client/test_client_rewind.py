"""The client library's edit and regenerate (docs/protocol.md §2 "Edit and regenerate").

``Session.send(..., rewind_to=)`` and ``GatewayClient.messages(..., include_rewound=)``
against a running gateway: the session's state (the reference reducer) follows
``history.rewound``, the listing flags what was rewound, a refusal is an
``ApiError`` with the gateway's code.
"""

from __future__ import annotations

import pytest
import trio

from gateway.client import GatewayClient
from gateway.errors import ApiError
from tests.conftest import Harness
from tests.integration.client.test_client_api import until_ended


async def test_an_edit_through_the_client(gw: Harness) -> None:
    with trio.fail_after(20):
        async with GatewayClient(gw.base) as client:
            sid = (await client.create_session()).session_id
            async with client.open_session(sid) as session:
                await session.ready()
                for text in ("The first question", "The second question"):
                    await until_ended(session, await session.send(text), [])
                first = session.state.messages[0]
                reply = session.state.messages[1]
                with pytest.raises(ApiError) as refused:
                    await session.send("no", rewind_to=reply.id)
                assert (refused.value.status, refused.value.code) == (409, "not_a_user_message")
                turn = await session.send("The first question, edited", rewind_to=first.id)
                await until_ended(session, turn, [])
                thread = [(e["role"], e["text"]) for e in session.simple["thread"]]
                assert thread == [
                    ("user", "The first question, edited"),
                    ("assistant", "You said: The first question, edited"),
                ]
            page = await client.messages(sid)
            every = await client.messages(sid, include_rewound=True)
            older = await client.messages(sid, before=first.id)  # a rewound message's id
    assert [m.id for m in page.messages] == [m.id for m in session.state.messages]
    assert [m.rewound for m in every.messages] == [True] * 4 + [False] * 2
    assert every.messages[0].id == first.id
    assert (older.messages, older.has_more) == ([], False)
