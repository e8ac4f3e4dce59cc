"""Edit and regenerate (docs/protocol.md §2 "Edit and regenerate"), on a running gateway.

A provider that records every model request shows what the model is sent;
the stream, ``GET .../messages`` (with and without ``include_rewound``) and a
snapshot show what clients see:

- after turns A, B, C, a turn that rewinds to B's user message: its model
  request holds A's messages then the new content; ``history.rewound`` comes
  right before its ``turn.started``; B and C leave the listing, the snapshot
  and the reducer's views, and stay stored (``include_rewound``, by id);
- a crash (the committed store copied, as a ``kill -9`` leaves it) and a
  restart keep the edited branch, for the model and for clients; a
  permission of the rewound branch is still ``permission_resolved``;
- regenerate (the last user message, its own content) leaves one answer;
- a replay from before the rewind leaves a resumed client on the edited branch;
- a compaction's summary stored after the message rewound to leaves with it;
- the adversary: another session's message, a rewound one, an assistant's, a
  tool result's, a turn in flight, ``queue``/``steer``, another key's session.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import trio

from gateway.client.views import full_view, simple_view
from gateway.protocol.events import Event
from gateway.protocol.frames import Snapshot, SubscribeAck
from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from gateway.providers.scripted import ScriptedProvider
from gateway.session.compaction import SUMMARY_SYSTEM
from tests.conftest import Client, Harness, make_config, running_gateway, types
from tests.integration.store.test_restart import crash_copy


class Recording:
    """The scripted model, recording every request it is sent."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.requests: list[ModelRequest] = []
        self.hold = trio.Event()
        self.held = False  # the next call waits for hold (a turn kept in flight)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        self.requests.append(request)
        if self.held:
            self.held = False
            await self.hold.wait()
        async for raw in self.inner.stream(request):
            yield raw

    async def aclose(self) -> None:
        pass

    @property
    def calls(self) -> list[ModelRequest]:
        """The conversation's calls (not a compaction's summary calls)."""
        return [r for r in self.requests if r.system != SUMMARY_SYSTEM]


def texts(request: ModelRequest) -> list[str]:
    """Each message of a request as its role and text (a tool's blocks by their kind)."""
    out = []
    for m in request.messages:
        parts = [
            getattr(b, "text", None) or getattr(b, "summary", None) or b.__struct_config__.tag
            for b in m.content
        ]
        out.append(f"{m.role}: {' '.join(parts)}")
    return out


async def turn(gw: Harness, client: Client, sid: str, content: Any, **body: Any) -> list[Event]:
    """A turn, posted with ``body`` besides its content; its events, to its end."""
    r = await post_turn(gw.http, sid, content, **body)
    assert r.status_code == 202, r.text
    with trio.fail_after(10):
        return await client.until_turn_ends()


async def post_turn(http: httpx.AsyncClient, sid: str, content: Any, **body: Any) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/turns", json={"content": content, **body})


async def listing(gw: Harness, sid: str, **query: str) -> list[dict[str, Any]]:
    r = await gw.http.get(f"/sessions/{sid}/messages", params=query)
    assert r.status_code == 200, r.text
    return list(r.json()["messages"])


def user_of(events: list[Event]) -> str:
    """The user message id of the turn these events are of."""
    [started] = [e for e in events if e.type == "turn.started"]
    return str(started.payload.user_message.id)  # type: ignore[attr-defined]


TOOL_TURN = '{"script": {"rounds": [[{"text": "Napping."}, {"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}}], [{"text": "Rested."}]]}}'  # noqa: E501


async def three_turns(gw: Harness, client: Client, sid: str) -> list[list[Event]]:
    return [
        await turn(gw, client, sid, "Question A"),
        await turn(gw, client, sid, TOOL_TURN),
        await turn(gw, client, sid, "Question C"),
    ]


def config(tmp_path: Path, **overrides: Any) -> Any:
    return make_config(tmp_path, **{"tools.require_approval": ["sleep"], **overrides})


async def allow_each(gw: Harness, client: Client, sid: str, content: str) -> list[Event]:
    """A turn whose tool waits for approval: allowed, to its end."""
    r = await post_turn(gw.http, sid, content)
    assert r.status_code == 202, r.text
    with trio.fail_after(10):
        events = await client.until(lambda e: e.type == "permission.requested")
        perm_id = events[-1].payload.perm_id  # type: ignore[attr-defined]
        r = await gw.http.post(f"/sessions/{sid}/permissions/{perm_id}", json={"decision": "allow"})
        assert r.status_code == 202, r.text
        return events + await client.until_turn_ends()


async def test_a_rewind_sends_the_model_the_history_before_then_the_edit(tmp_path: Path) -> None:
    provider = Recording()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(filter="preset:chat")
            a = await turn(gw, client, sid, "Question A")
            b = await allow_each(gw, client, sid, TOOL_TURN)
            c = await turn(gw, client, sid, "Question C")
            before = await listing(gw, sid)
            d = await turn(gw, client, sid, "Question B, edited", rewind_to=user_of(b))
            after = await listing(gw, sid)
            every = await listing(gw, sid, include_rewound="true")
            async with gw.client(sid) as late:
                await late.subscribe(snapshot=True)
                snap = await late.recv()
            # B's assistant message: rewound, still readable by id
            b_turn = b[0].turn_id
            b_reply = next(m for m in before if m["turn_id"] == b_turn and m["role"] == "assistant")
            r = await gw.http.get(f"/sessions/{sid}/messages/{b_reply['id']}")
            assert r.status_code == 200 and r.json() == b_reply
            # a rewound id pages the conversation stored before it
            r = await gw.http.get(f"/sessions/{sid}/messages", params={"before": user_of(c)})
            assert [m["id"] for m in r.json()["messages"]] == [m["id"] for m in after[:2]]

        # The model: A's messages, then the edit; neither B nor C.
        assert texts(provider.calls[-1]) == [
            "user: Question A",
            "assistant: You said: Question A",
            "user: Question B, edited",
        ]
        # history.rewound right before turn.started, in one commit (adjacent ids)
        assert types(d)[:2] == ["history.rewound", "turn.started"]
        rewound, started = d[0], d[1]
        assert int(started.id[4:]) == int(rewound.id[4:]) + 1
        assert rewound.payload.before_message_id == user_of(b)  # type: ignore[attr-defined]
        assert rewound.payload.turn_id == started.turn_id == rewound.turn_id  # type: ignore[attr-defined]
        # The listing, the snapshot and the live reducer: the edited branch.
        a_ids = [m["id"] for m in before if m["turn_id"] == a[0].turn_id]
        d_ids = [m["id"] for m in after if m["turn_id"] == d[1].turn_id]
        assert [m["id"] for m in after] == a_ids + d_ids and len(d_ids) == 2
        assert isinstance(snap, Snapshot)
        assert [m.id for m in snap.messages] == a_ids + d_ids
        thread = [(e["role"], e["text"]) for e in simple_view(client.reducer)["thread"]]
        assert thread == [
            ("user", "Question A"),
            ("assistant", "You said: Question A"),
            ("user", "Question B, edited"),
            ("assistant", "You said: Question B, edited"),
        ]
        # include_rewound: every message in the stored order, B's and C's flagged
        assert [m["id"] for m in every] == [m["id"] for m in before] + d_ids
        flagged = {m["id"] for m in every if m.get("rewound")}
        assert flagged == {m["id"] for m in before} - set(a_ids)
        assert all(m.get("rewound") is True for m in every if m["id"] in flagged)
        assert all("rewound" not in m for m in after)


async def test_a_crash_and_a_restart_keep_the_edited_branch(tmp_path: Path) -> None:
    provider = Recording()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            b = await allow_each(gw, client, sid, TOOL_TURN)
            await turn(gw, client, sid, "Question C")
            await turn(gw, client, sid, "Question B, edited", rewind_to=user_of(b))
        perm_id = next(e for e in b if e.type == "permission.requested").payload.perm_id  # type: ignore[attr-defined]
        live = await listing(gw, sid)
        every = await listing(gw, sid, include_rewound="true")
        await gw.node.store.flush()
        crashed = str(tmp_path / "crashed.db")
        crash_copy(gw.node.config.store.path, crashed)

    again = Recording()
    async with running_gateway(config(tmp_path, **{"store.path": crashed}), again) as gw:
        assert await listing(gw, sid) == live
        assert await listing(gw, sid, include_rewound="true") == every
        # a permission of the rewound branch: resolved, not unknown (asked_before)
        r = await gw.http.post(f"/sessions/{sid}/permissions/{perm_id}", json={"decision": "allow"})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "permission_resolved")
        # B's message is rewound for good: not a target any more
        r = await post_turn(gw.http, sid, "again", rewind_to=user_of(b))
        assert (r.status_code, r.json()["error"]["code"]) == (409, "message_rewound")
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question E")
    assert texts(again.calls[-1]) == [
        "user: Question A",
        "assistant: You said: Question A",
        "user: Question B, edited",
        "assistant: You said: Question B, edited",
        "user: Question E",
    ]


async def test_regenerate_leaves_one_answer_in_place_of_the_old(tmp_path: Path) -> None:
    provider = Recording()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            last = await turn(gw, client, sid, "Question B")
            old = await listing(gw, sid)
            again = await turn(gw, client, sid, "Question B", rewind_to=user_of(last))
            new = await listing(gw, sid)
        assert [m["role"] for m in new] == ["user", "assistant", "user", "assistant"]
        assert new[:2] == old[:2] and new[2]["id"] != old[2]["id"]
        assert new[3]["turn_id"] == again[1].turn_id != old[3]["turn_id"]
        assert len(provider.calls[-1].messages) == 3
        thread = simple_view(client.reducer)["thread"]
        assert [(e["role"], e["text"]) for e in thread][2:] == [
            ("user", "Question B"),
            ("assistant", "You said: Question B"),
        ]


async def test_a_replay_from_before_the_rewind_ends_on_the_edited_branch(tmp_path: Path) -> None:
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []})) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            a, b, _c = await three_turns(gw, client, sid)
            await turn(gw, client, sid, "Question B, edited", rewind_to=user_of(b))
        async with gw.client(sid) as resumed:
            seen = client.events[: client.events.index(a[-1]) + 1]
            for e in seen:  # the same client, back after turn A
                resumed.reducer.apply_event(e)
            ack = await resumed.subscribe(since=a[-1].id)
            assert isinstance(ack, SubscribeAck)
            for _ in range(ack.replay_event_count):
                await resumed.recv()
        # B's and C's answers were rebuilt (message.complete) though rewound since
        completes = [e for e in resumed.events if e.type == "message.complete"]
        assert len(completes) == 4  # B's two rounds, C's, the edit's
        assert "history.rewound" in types(resumed.events)
        assert simple_view(resumed.reducer) == simple_view(client.reducer)
        assert full_view(resumed.reducer) == full_view(client.reducer)
        assert len(resumed.reducer.messages) == 4


async def test_a_summary_stored_after_the_message_rewound_to_leaves_with_it(
    tmp_path: Path,
) -> None:
    provider = Recording()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(filter="preset:full")
            await turn(gw, client, sid, "Question A")
            b = await turn(gw, client, sid, "Question B")
            r = await gw.http.post(f"/sessions/{sid}/compact", json={})
            assert r.status_code == 202, r.text
            with trio.fail_after(10):
                await client.until(lambda e: e.type == "context.compacted")
            c = await turn(gw, client, sid, "Question C")
            assert texts(provider.calls[-1])[0].startswith("context: ")  # the summary, then B, C
            # rewound to C (after the summary): the summary stays
            await turn(gw, client, sid, "Question C, edited", rewind_to=user_of(c))
            assert texts(provider.calls[-1])[0].startswith("context: ")
            assert texts(provider.calls[-1])[1:] == [
                "user: Question B",
                "assistant: You said: Question B",
                "user: Question C, edited",
            ]
            # rewound to B (the summary was stored after it): it leaves, A is sent whole
            await turn(gw, client, sid, "Question B, edited", rewind_to=user_of(b))
            assert texts(provider.calls[-1]) == [
                "user: Question A",
                "assistant: You said: Question A",
                "user: Question B, edited",
            ]
            roles = [m["role"] for m in await listing(gw, sid)]
            assert roles == ["user", "assistant", "user", "assistant"]


async def test_the_adversary_cases(tmp_path: Path) -> None:
    keys = {"auth.api_keys": ["key-a", "key-b"], "tools.require_approval": []}
    provider = Recording()
    async with running_gateway(config(tmp_path, **keys), provider) as gw:
        gw.http.headers["Authorization"] = "Bearer key-a"
        sid = await gw.create_session()
        other = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            a, b, c = await three_turns(gw, client, sid)
            async with gw.client(other) as other_client:
                await other_client.subscribe()
                o = await turn(gw, other_client, other, "Another session's question")
            msgs = await listing(gw, sid)
            reply = next(m for m in msgs if m["role"] == "assistant")
            results = next(
                m for m in msgs if m["role"] == "user" and m["content"][0]["type"] == "tool_result"
            )

            async def refused(rewind_to: str, status: int, code: str, **body: Any) -> None:
                r = await post_turn(gw.http, sid, "edit", rewind_to=rewind_to, **body)
                assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text

            await refused(user_of(o), 404, "message_not_found")  # another session's message
            await refused("msg_00000000000000000000", 404, "message_not_found")
            await refused(reply["id"], 409, "not_a_user_message")
            await refused(results["id"], 409, "not_a_user_message")
            await refused(user_of(b), 422, "invalid_body", if_busy="queue")
            await refused(user_of(b), 422, "invalid_body", if_busy="steer")
            # another key: the session does not exist
            r = await gw.http.post(
                f"/sessions/{sid}/turns",
                json={"content": "edit", "rewind_to": user_of(b)},
                headers={"Authorization": "Bearer key-b"},
            )
            assert (r.status_code, r.json()["error"]["code"]) == (404, "session_not_found")
            # racing a running turn: reject
            provider.held = True
            r = await post_turn(gw.http, sid, "a long one")
            assert r.status_code == 202
            await refused(user_of(b), 409, "turn_in_progress")
            await refused(user_of(b), 409, "turn_in_progress", if_busy="reject")
            provider.hold.set()
            with trio.fail_after(10):
                await client.until_turn_ends()
            # none of those rewound anything, nor ran a turn
            assert await listing(gw, sid, include_rewound="true") == await listing(gw, sid)
            await turn(gw, client, sid, "B, edited", rewind_to=user_of(b))
            # a message of the rewound branch; its turn is one the session had
            await refused(user_of(c), 409, "message_rewound")
            r = await gw.http.post(f"/sessions/{sid}/turns/{c[0].turn_id}/cancel", json={})
            assert (r.status_code, r.json()["error"]["code"]) == (409, "turn_not_in_flight")
            await refused(user_of(b), 409, "message_rewound")
        r = await gw.http.get(f"/sessions/{sid}/messages", params={"include_rewound": "yes"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_query")
    last_two = [texts(call)[-1] for call in provider.calls[-2:]]
    assert last_two == ["user: a long one", "user: B, edited"]
    assert texts(provider.calls[-1])[:2] == ["user: Question A", "assistant: You said: Question A"]
    assert a[0].type == "turn.started"  # turn A stays: the rewind was to B


async def test_a_rewind_that_interrupts_applies_after_the_cancel(tmp_path: Path) -> None:
    """``if_busy: "interrupt"`` (docs/protocol.md §2): the running turn is cancelled, then
    the rewind applies to the history after it; a bad target refuses before anything."""
    provider = Recording()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            a = await turn(gw, client, sid, "Question A")
            provider.held = True
            r = await post_turn(gw.http, sid, "Question B, running")
            assert r.status_code == 202
            running = r.json()["turn_id"]
            r = await post_turn(gw.http, sid, "x", rewind_to="msg_nope", if_busy="interrupt")
            assert (r.status_code, r.json()["error"]["code"]) == (404, "message_not_found")
            assert gw.node.sessions[sid].turn is not None  # not cancelled by the refusal
            body = {"rewind_to": user_of(a), "if_busy": "interrupt"}
            r = await post_turn(gw.http, sid, "Question A, edited", **body)
            assert r.status_code == 202, r.text
            with trio.fail_after(10):
                events = await client.until(
                    lambda e: e.type == "turn.completed" and e.turn_id != running
                )
            provider.hold.set()
        kinds = [(e.type, e.turn_id == running) for e in events]
        cancelled = kinds.index(("turn.cancelled", True))
        assert kinds[cancelled + 1 : cancelled + 3] == [
            ("history.rewound", False),
            ("turn.started", False),
        ]
        assert texts(provider.calls[-1]) == ["user: Question A, edited"]
        said = [(m["role"], m["content"][0]["text"]) for m in await listing(gw, sid)]
        assert said == [
            ("user", "Question A, edited"),
            ("assistant", "You said: Question A, edited"),
        ]
