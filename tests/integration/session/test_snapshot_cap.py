"""Snapshots that fit (docs/protocol.md §15): ``[stream] snapshot_max_bytes``.

The attack as reported: after twelve turns of a large scripted ``lorem`` the
snapshot frame grew past what clients accept (64 MiB), and ``gateway attach
--snapshot``, ``gateway chat --session`` and ``open_session`` failed for good
with close 1009. Here at the smallest cap the config allows (64 KiB), with
clients whose frame limit is that cap: the snapshot fits, says ``has_more``,
and a block too big for it comes cut, whole from ``GET
/sessions/{id}/messages/{message_id}``.

First the capping on its own (sans-IO: messages in, frame out), then a real
gateway on 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from trio_websocket import ConnectionClosed

import gateway.client.stream as client_stream
import gateway.protocol.fit as fit
from gateway.client import GatewayClient, decode_server_frame
from gateway.client.attach import attach
from gateway.client.chat import Marks, full_items
from gateway.client.reducer import Reducer
from gateway.client.views import full_view
from gateway.doors.agui import shapes as ag
from gateway.doors.agui.mapping import RunMapper
from gateway.protocol.events import Event, MessageSnapshot, TextDelta
from gateway.protocol.fit import cut_string, fit_message_snapshot, fit_snapshot
from gateway.protocol.frames import EventFrame, Snapshot, encode
from gateway.protocol.shapes import (
    Message,
    PendingPermission,
    SessionSummary,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tests.conftest import Client, Harness, make_config, running_gateway
from tests.integration.client.test_attach_cli import _Output
from tests.paths import ROOT

CAP = 65_536  # the smallest snapshot_max_bytes the config takes
_snapshot = msgspec.json.Decoder(Snapshot)


def event_of(data: bytes) -> Event:
    frame = decode_server_frame(data)
    assert isinstance(frame, EventFrame)
    return frame.event


def summary(pending: list[PendingPermission] | None = None) -> SessionSummary:
    return SessionSummary("sess_1", "w", "scripted", "v1", 0.0, 3, None, None, None, pending or [])


def msg(n: int, *blocks: Any, status: str = "complete", open_block: Any = msgspec.UNSET) -> Message:
    return Message(
        f"msg_{n:04d}", "sess_1", "turn_1", "assistant", list(blocks), status,  # type: ignore[arg-type]
        1_700_000_000_000 + n, open_block_index=open_block,
    )  # fmt: skip


def text(size: int, fill: str = "x") -> TextBlock:
    return TextBlock((fill * size)[:size])


# --- the capping on its own ------------------------------------------------------------


def test_older_messages_are_left_out_first_and_has_more_says_so() -> None:
    history = [msg(n, text(5_000)) for n in range(40)]
    data = fit_snapshot(summary(), history, "evt_9", limit=50, max_bytes=CAP)
    frame = _snapshot.decode(data)
    assert len(data) <= CAP
    assert frame.has_more is True
    # the newest that fit, oldest first, none cut
    assert [m.id for m in frame.messages] == [m.id for m in history[-len(frame.messages) :]]
    assert 10 <= len(frame.messages) < 14
    assert all(b.truncated is msgspec.UNSET for m in frame.messages for b in m.content)
    # one more message would not have fit
    with_one_more = Snapshot(summary(), history[-len(frame.messages) - 1 :], "evt_9", True)
    assert len(encode(with_one_more)) > CAP


def test_a_snapshot_that_fits_is_the_frame_it_always_was_plus_has_more() -> None:
    history = [msg(n, text(100)) for n in range(5)]
    data = fit_snapshot(summary(), history, "evt_9", limit=50, max_bytes=CAP)
    assert data == encode(Snapshot(summary(), history, "evt_9", False))
    assert json.loads(data)["has_more"] is False
    # snapshot_messages leaves older ones out too: has_more whatever the reason
    data = fit_snapshot(summary(), history, "evt_9", limit=3, max_bytes=CAP)
    assert data == encode(Snapshot(summary(), history[-3:], "evt_9", True))
    data = fit_snapshot(summary(), history, None, limit=0, max_bytes=CAP)
    assert data == encode(Snapshot(summary(), [], None, True))


def test_each_message_is_encoded_once_and_older_ones_never(monkeypatch: Any) -> None:
    encoded: list[str] = []

    def counting(obj: Any) -> bytes:
        if isinstance(obj, Message):
            encoded.append(obj.id)
        return encode(obj)

    monkeypatch.setattr(fit, "encode", counting)
    history = [msg(n, text(5_000)) for n in range(1_000)]
    frame = _snapshot.decode(fit_snapshot(summary(), history, None, limit=50, max_bytes=CAP))
    kept = [m.id for m in frame.messages]
    assert sorted(encoded) == sorted(
        {*kept, history[-len(kept) - 1].id}
    )  # + the one that did not fit


def test_a_block_too_big_even_alone_comes_cut_and_marked() -> None:
    big = msg(1, ThinkingBlock("t" * 50_000, "sig"), text(200_000, "hello "), text(10))
    older = msg(0, text(10))
    data = fit_snapshot(summary(), [older, big], "evt_9", limit=50, max_bytes=CAP)
    frame = _snapshot.decode(data)
    assert len(data) <= CAP and len(data) > CAP - 100  # cut only as much as needed
    assert frame.has_more is True and [m.id for m in frame.messages] == [big.id]
    thinking, cut_text, small = frame.messages[0].content
    assert isinstance(cut_text, TextBlock) and cut_text.truncated is True
    assert cut_text.text and "hello hello".startswith(cut_text.text[:11])  # its beginning
    assert small == text(10)  # the largest block is cut first, the rest only if needed
    assert isinstance(thinking, ThinkingBlock) and thinking.signature == "sig"


def test_what_can_be_cut_and_how() -> None:
    blocks = [
        ToolUseBlock("toolu_1", "write_file", {"content": "y" * 100_000}),
        ToolResultBlock("toolu_1", "r" * 100_000, True),
    ]
    data = fit_snapshot(summary(), [msg(1, *blocks)], None, limit=50, max_bytes=CAP)
    tool_use, result = _snapshot.decode(data).messages[0].content
    assert len(data) <= CAP
    assert tool_use == ToolUseBlock(
        "toolu_1", "write_file", {}, truncated=True
    )  # {}: not a JSON prefix
    assert isinstance(result, ToolResultBlock) and result.truncated is True
    assert result.is_error is True and result.content == "r" * len(result.content)
    assert json.loads(data)["messages"][0]["content"][0]["truncated"] is True


def test_the_open_block_of_a_streaming_message_keeps_its_end() -> None:
    """Its live deltas continue after what was sent: the client's text stays contiguous."""
    head, tail = "H" * 100_000, "...and the end so far"
    streaming = msg(
        2, text(100_000, "done "), TextBlock(head + tail), status="in_progress", open_block=1
    )
    data = fit_snapshot(summary(), [msg(1, text(10)), streaming], "evt_9", limit=50, max_bytes=CAP)
    assert len(data) <= CAP
    (sent,) = _snapshot.decode(data).messages
    assert sent.status == "in_progress" and sent.open_block_index == 1
    closed, open_ = sent.content
    assert isinstance(open_, TextBlock) and open_.truncated is True and open_.text.endswith(tail)
    assert isinstance(closed, TextBlock) and closed.truncated is True
    assert closed.text.startswith("done done")


@pytest.mark.parametrize("fill", ["é", "\n", '"', "\x01", "日本", "😀a"])
def test_cut_strings_fit_exactly_whatever_their_escapes(fill: str) -> None:
    whole = fill * 40_000
    for keep_end in (False, True):
        for limit in (2, 3, 17, 1_000, 30_001):
            part = cut_string(whole, limit, keep_end=keep_end)
            assert len(encode(part)) <= limit
            assert whole.endswith(part) if keep_end else whole.startswith(part)
            longer = whole[-len(part) - 1 :] if keep_end else whole[: len(part) + 1]
            assert len(encode(longer)) > limit  # the longest that fits
    data = fit_snapshot(summary(), [msg(1, TextBlock(whole * 4))], None, limit=50, max_bytes=CAP)
    assert len(data) <= CAP and _snapshot.decode(data).messages[0].content[0].truncated is True


def test_a_pending_permission_too_big_is_sent_without_its_input() -> None:
    pending = [
        PendingPermission(
            "perm_1", "sess_1", "tool", "toolu_1", "write_file", {"content": "z" * 100_000}, 1
        ),
        PendingPermission("perm_2", "sess_1", "tool", "toolu_2", "shell", {"command": "ls"}, 1),
    ]
    data = fit_snapshot(summary(pending), [msg(1, text(100))], None, limit=50, max_bytes=CAP)
    frame = _snapshot.decode(data)
    assert len(data) <= CAP and len(frame.messages) == 1
    first, second = frame.session.pending_permissions
    assert (first.input, first.truncated) == ({}, True)
    assert second == pending[1]


def test_a_message_snapshot_event_is_cut_the_same_way() -> None:
    streaming = msg(2, TextBlock("a" * 100_000 + "TAIL"), status="in_progress", open_block=0)
    event = Event(
        "evt_7", "message.snapshot", "sess_1", "turn_1", 1, "llm", MessageSnapshot(streaming)
    )
    data = fit_message_snapshot(event, CAP)
    frame = b'{"type":"event","event":' + data + b"}"
    assert len(frame) <= CAP
    decoded = event_of(frame)
    assert isinstance(decoded.payload, MessageSnapshot)
    (block,) = decoded.payload.message.content
    assert isinstance(block, TextBlock) and block.truncated is True and block.text.endswith("TAIL")
    small = msgspec.structs.replace(event, payload=MessageSnapshot(msg(2, text(5))))
    assert fit_message_snapshot(small, CAP) == encode(small)


# --- a real gateway -------------------------------------------------------------------------


def lorem_turn(words: int, *, delay_ms: int = 0, chunk_chars: int = 8_000) -> dict[str, Any]:
    rounds = [[{"lorem": words}]]
    return {"script": {"chunk_chars": chunk_chars, "delay_ms": delay_ms, "rounds": rounds}}


@asynccontextmanager
async def capped(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    config = make_config(tmp_path, **{"stream.snapshot_max_bytes": CAP, **overrides})
    with trio.fail_after(60):
        async with running_gateway(config) as harness:
            yield harness


async def grow(gw: Harness, sid: str, turns: int, words: int) -> None:
    """``turns`` turns of ``words`` of lorem, each waited for."""
    async with gw.client(sid) as client:
        await client.subscribe()
        for _ in range(turns):
            await gw.submit(sid, lorem_turn(words))
            await client.until_turn_ends()


async def raw_recv(client: Client) -> bytes:
    """One frame as it came (its size), applied as :meth:`Client.recv` would."""
    raw = await client.ws.get_message()
    data = raw.encode() if isinstance(raw, str) else raw
    frame = decode_server_frame(data)
    if isinstance(frame, EventFrame):
        client.events.append(frame.event)
    client.reducer.apply(frame)
    return data


async def snapshot_of(gw: Harness, sid: str) -> tuple[bytes, Snapshot]:
    """The snapshot frame as a client whose frame limit is the cap receives it."""
    async with gw.client(sid, max_message_size=CAP) as client:
        await client.send({"type": "subscribe", "filter": "preset:full", "snapshot": True})
        await client.ws.get_message()  # the ack
        raw = await client.ws.get_message()
    data = raw.encode() if isinstance(raw, str) else raw
    return data, _snapshot.decode(data)


async def test_twelve_large_turns_still_give_a_snapshot_that_fits(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The attack as reported, at a 64 KiB cap; before, the frame grew with the session."""
    async with capped(tmp_path) as gw:
        sid = await gw.create_session()
        await grow(gw, sid, turns=12, words=2_000)  # ~14 KB of text a turn
        data, frame = await snapshot_of(gw, sid)
        assert len(data) <= CAP
        assert frame.has_more is True and frame.messages[-1].role == "assistant"
        assert all(b.truncated is msgspec.UNSET for m in frame.messages for b in m.content)
        # Older messages page with GET .../messages?before=<the first one sent>.
        first = frame.messages[0].id
        page = (await gw.http.get(f"/sessions/{sid}/messages", params={"before": first})).json()
        assert page["messages"] and len(page["messages"]) + len(frame.messages) == 24
        assert page["has_more"] is False
        # A later ``since`` resume from the snapshot's cut works.
        async with gw.client(sid, max_message_size=CAP) as client:
            ack = await client.subscribe(since=frame.snapshot_at_event_id)
            assert ack.since == frame.snapshot_at_event_id  # not cursor_expired
            await gw.submit(sid, "and one more")
            events = await client.until_turn_ends()
            assert events[0].id > (frame.snapshot_at_event_id or "")
        # The clients of the attack, with their frame limit at the cap: no 1009.
        monkeypatch.setattr(client_stream, "MAX_FRAME_BYTES", CAP)
        async with GatewayClient(gw.base) as client, client.open_session(sid) as session:
            assert full_view(session.state)["messages"][-1]["role"] == "assistant"
            assert session.state.has_more is True
            while await session.load_earlier(limit=5):
                pass
            assert session.state.has_more is False
            assert len(session.state.messages) == 26  # 13 turns, each a user message and a reply
        out, err = _Output(), _Output()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: attach(gw.base, sid, snapshot=True, out=out, err=err))
            await out.until(lambda: '"type":"snapshot"' in out.getvalue())
            nursery.cancel_scope.cancel()
        assert err.getvalue() == ""
        assert json.loads(out.getvalue().splitlines()[1])["has_more"] is True


async def test_the_uncapped_frame_was_over_what_such_a_client_takes(tmp_path: Path) -> None:
    """The same session with a cap far above: the client at 64 KiB closes 1009 (the attack)."""
    async with capped(tmp_path, **{"stream.snapshot_max_bytes": 64 * 2**20}) as gw:
        sid = await gw.create_session()
        await grow(gw, sid, turns=12, words=2_000)
        with pytest.raises(ConnectionClosed) as closed:
            await snapshot_of(gw, sid)
        assert closed.value.reason.code == 1009


async def test_a_block_bigger_than_the_cap_comes_cut_and_is_whole_by_id(tmp_path: Path) -> None:
    async with capped(tmp_path) as gw:
        sid = await gw.create_session()
        await grow(gw, sid, turns=1, words=20_000)  # ~140 KB in one text block
        data, frame = await snapshot_of(gw, sid)
        assert len(data) <= CAP and frame.has_more is True  # the user message is left out
        (reply,) = frame.messages
        (block,) = reply.content
        assert isinstance(block, TextBlock) and block.truncated is True
        r = await gw.http.get(f"/sessions/{sid}/messages/{reply.id}")
        assert r.status_code == 200, r.text
        whole = msgspec.json.decode(r.content, type=Message)
        (full,) = whole.content
        assert isinstance(full, TextBlock) and full.truncated is msgspec.UNSET
        assert full.text.startswith(block.text) and len(full.text) > 100_000
        assert whole.id == reply.id and whole.status == "complete"
        # the client library: the cut block shows as such, and is fetched whole
        async with GatewayClient(gw.base) as client, client.open_session(sid) as session:
            (view,) = full_view(session.state)["messages"]
            assert view["blocks"][0].get("truncated") is True
            await session.fetch_whole(reply.id)
            (view,) = full_view(session.state)["messages"]
            assert "truncated" not in view["blocks"][0] and view["blocks"][0]["text"] == full.text


async def test_the_message_route_answers_only_the_sessions_own_messages(tmp_path: Path) -> None:
    async with capped(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]}) as gw:
        a = {"Authorization": "Bearer key-a"}
        b = {"Authorization": "Bearer key-b"}
        gw.http.headers.update(a)
        mine, other = await gw.create_session(), await gw.create_session()
        await grow(gw, mine, turns=1, words=5)
        page = (await gw.http.get(f"/sessions/{mine}/messages")).json()["messages"]
        user, reply = page[0]["id"], page[1]["id"]
        r = await gw.http.get(f"/sessions/{mine}/messages/{user}")
        assert r.status_code == 200 and r.json() == page[0]
        for sid, mid in [(mine, "msg_nope"), (other, reply)]:
            r = await gw.http.get(f"/sessions/{sid}/messages/{mid}")
            assert r.status_code == 404
            assert r.json()["error"]["code"] == "message_not_found"
        # another key: the session does not exist (docs/protocol.md §2)
        r = await gw.http.get(f"/sessions/{mine}/messages/{reply}", headers=b)
        assert (r.status_code, r.json()["error"]["code"]) == (404, "session_not_found")
        r = await gw.http.get(f"/sessions/{mine}/messages/{reply}", headers={"Authorization": ""})
        assert r.status_code == 401


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_streaming_message_too_big_resumes_cut_and_ends_whole(tmp_path: Path) -> None:
    """The open block keeps its end in a snapshot and in a replay's ``message.snapshot``;
    the deltas continue after it and ``message.complete`` makes it whole."""
    async with capped(tmp_path) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as live:
            await live.subscribe()
            await gw.submit(sid, lorem_turn(40_000, delay_ms=150, chunk_chars=30_000))
            await live.until(lambda e: e.type == "text.start")
            cursor = live.events[-1].id
            # enough deltas that the block alone is over the cap
            streamed = [0]

            def over_the_cap(event: Event) -> bool:
                if isinstance(event.payload, TextDelta):
                    streamed[0] += len(event.payload.text)
                return streamed[0] > CAP + 10_000

            await live.until(over_the_cap)
            # (the default limit, 1 MiB: message.complete comes whole, over the cap)
            async with (
                gw.client(sid) as snap,
                gw.client(sid) as replay,
            ):
                await snap.subscribe(snapshot=True)
                ack = await replay.subscribe(since=cursor)
                frames = [await raw_recv(snap)]
                for _ in range(ack.replay_event_count):
                    frames.append(await raw_recv(replay))
                assert all(len(f) <= CAP for f in frames)
                snapshot = _snapshot.decode(frames[0])
                restored = [event_of(f) for f in frames[1:] if b"message.snapshot" in f]
                assert len(restored) == 1 and isinstance(restored[0].payload, MessageSnapshot)
                for message in (snapshot.messages[-1], restored[0].payload.message):
                    assert message.status == "in_progress" and message.open_block_index == 0
                    (block,) = message.content
                    assert isinstance(block, TextBlock) and block.truncated is True
                # Still streaming: not a message of GET .../messages/{id} yet.
                streaming_id = snapshot.messages[-1].id
                r = await gw.http.get(f"/sessions/{sid}/messages/{streaming_id}")
                assert (r.status_code, r.json()["error"]["code"]) == (404, "message_not_found")
                # The client library, from the same cut snapshot: its chunks of the
                # block are the end the snapshot kept, then the deltas, once each.
                async with GatewayClient(gw.base) as gateway, gateway.open_session(sid) as session:
                    chunks = []
                    async for update in session:
                        chunks += [c.text for c in update.chunks]
                        if session.turn_ended(snapshot.session.current_turn_id or ""):
                            break
                await snap.until_turn_ends()
                await replay.until_turn_ends()
            await live.until_turn_ends()
        whole = live.reducer.state()["messages"]
        for client in (snap, replay):
            assert client.reducer.state()["messages"][-1] == whole[-1]
        final = whole[-1]["content"][0]["text"]
        r = await gw.http.get(f"/sessions/{sid}/messages/{streaming_id}")
        assert r.status_code == 200 and r.json()["content"][0]["text"] == final
        joined = "".join(chunks)
        assert final.endswith(joined) and CAP // 2 < len(joined) < len(final)


# --- the clients: reducers, views, chat, AG-UI -------------------------------------------


def _cut_session_frames() -> list[dict[str, Any]]:
    """A snapshot cut every way it can be, then the live end of its streaming message."""
    history = [
        Message("msg_0001", "sess_1", "turn_1", "user", [TextBlock("hi")], "complete", 1),
        msg(2, text(30_000, "old "), ToolUseBlock("toolu_1", "write_file", {"c": "y" * 30_000})),
        Message(
            "msg_0003",
            "sess_1",
            "turn_1",
            "user",
            [ToolResultBlock("toolu_1", "r" * 30_000)],
            "complete",
            3,
        ),
        msg(4, TextBlock("w" * 100_000 + " the end so far"), status="in_progress", open_block=0),
    ]
    summary_ = msgspec.structs.replace(summary(), current_turn_id="turn_1")
    summary_ = msgspec.structs.replace(summary_, current_turn_status="in_flight")
    # each message cut as a snapshot cuts its newest (the reducers see every kind at once)
    cut = [fit.cut_message(m, 20_000)[0] for m in history]
    snapshot = msgspec.to_builtins(Snapshot(summary_, cut, "evt_00000000000000000010", True))
    assert sum(b.get("truncated", False) for m in snapshot["messages"] for b in m["content"]) == 4
    delta = {
        "id": "evt_00000000000000000011", "type": "text.delta", "session_id": "sess_1",
        "turn_id": "turn_1", "ts": 5, "actor": "llm",
        "payload": {"message_id": "msg_0004", "content_block_index": 0, "text": " and more"},
    }  # fmt: skip
    return [snapshot, {"type": "event", "event": delta}]


def test_both_reducers_show_a_cut_snapshot_alike() -> None:
    """The Python reference and gateway/ui/reducer.js: the same views of cut blocks."""
    from tests.integration.client.test_conformance import _node

    frames = _cut_session_frames()
    reducer = Reducer("sess_1")
    python_views = []
    for frame in frames:
        reducer.apply(decode_server_frame(json.dumps(frame)))
        python_views.append(full_view(reducer))
    whole = msg(2, text(30_000, "old "), ToolUseBlock("toolu_1", "write_file", {"c": "y"}))
    reducer.replace_message(whole)
    python_views.append(full_view(reducer))
    reducer.prepend_history(
        [Message("msg_0000", "sess_1", None, "user", [TextBlock("0")], "complete", 0)], False
    )
    python_views.append(
        {**full_view(reducer), "has_more": reducer.has_more, "oldest": reducer.oldest_message_id}
    )
    script = """
    import { Reducer, fullView } from "./gateway/ui/reducer.js";
    const [frames, whole, older] = JSON.parse(process.argv[1]);
    const reducer = new Reducer("sess_1");
    const views = frames.map((f) => fullView(reducer.apply(f)));
    views.push(fullView(reducer.replaceMessage(whole)));
    reducer.prependHistory(older, false);
    const more = { has_more: reducer.hasMore, oldest: reducer.oldestMessageId };
    views.push({ ...fullView(reducer), ...more });
    console.log(JSON.stringify(views));
    """
    older_message = Message("msg_0000", "sess_1", None, "user", [TextBlock("0")], "complete", 0)
    older = [msgspec.to_builtins(older_message)]
    args = json.dumps([frames, msgspec.to_builtins(whole), older])
    run = subprocess.run(
        [_node(), "--input-type=module", "-e", script, args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == python_views
    after_snapshot, after_delta = python_views[0], python_views[1]
    tool = after_snapshot["messages"][1]["blocks"][1]
    assert tool["truncated"] is True and tool["input"] == {} and len(tool["result"]) < 30_000
    assert after_snapshot["messages"][1]["blocks"][0]["truncated"] is True
    streaming = after_delta["messages"][-1]["blocks"][0]
    assert streaming["open"] and streaming["truncated"] is True
    assert streaming["text"].endswith(" the end so far and more")  # the deltas go on after its end
    assert "truncated" not in python_views[2]["messages"][1]["blocks"][0]  # fetched whole
    assert python_views[3]["has_more"] is False and python_views[3]["oldest"] == "msg_0000"


def test_chat_marks_cut_blocks() -> None:
    reducer = Reducer("sess_1")
    for frame in _cut_session_frames():
        reducer.apply(decode_server_frame(json.dumps(frame)))
    items = full_items(full_view(reducer), {}, hidden_turns=set(), width=80, marks=Marks())
    lines = [line.text for item in items for line in item.lines]
    assert "… (truncated)" in lines
    assert any(line.startswith("⏺ write_file {}") and "(truncated)" in line for line in lines)
    assert lines[lines.index("… (the beginning is not shown)") + 1].startswith("www")


def test_agui_messages_snapshot_fits_too() -> None:
    history = [msg(n, text(5_000)) for n in range(40)]
    (_, event) = RunMapper("sess_1", "run_1", "turn_1").start(history, 1, max_bytes=CAP)
    assert isinstance(event, ag.MessagesSnapshot)
    assert len(ag.encode(event)) <= CAP and 10 <= len(event.messages) < 14
    assert [m.id for m in event.messages] == [m.id for m in history[-len(event.messages) :]]
    huge = [msg(1, text(10)), msg(2, TextBlock("q" * 200_000), text(100_000))]
    (_, event) = RunMapper("sess_1", "run_1", "turn_1").start(huge, 1, max_bytes=CAP)
    assert isinstance(event, ag.MessagesSnapshot)
    assert len(ag.encode(event)) <= CAP
    assert [m.id for m in event.messages] == ["msg_0002", "msg_0002:1"]
    # without a cap (a mapper of its own, as the tests of the mapping use it): whole
    (_, event) = RunMapper("sess_1", "run_1", "turn_1").start(huge, 1)
    assert isinstance(event, ag.MessagesSnapshot) and len(ag.encode(event)) > 300_000
