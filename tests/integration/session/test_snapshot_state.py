"""What a snapshot says besides its messages (docs/protocol.md §6): pending permissions, open block.

A client attaching mid-approval finds the request in ``pending_permissions``
and can answer it; one attaching mid-block learns from ``open_block_index``
which block is still streaming (every other one has ended).
"""

from __future__ import annotations

from pathlib import Path

import trio

from gateway.protocol.frames import Snapshot
from tests.conftest import make_config, running_gateway

SLEEP = {"name": "sleep", "input": {"seconds": 0.01}}


async def test_a_snapshot_mid_approval_lists_the_pending_permission(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    script = {"script": {"rounds": [[{"tool_use": SLEEP}], [{"text": "done"}]]}}
    with trio.fail_after(10):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                await gw.submit(sid, script)
                asked = (await live.until(lambda e: e.type == "permission.requested"))[-1]
                async with gw.client(sid) as late:
                    await late.subscribe(snapshot=True)
                    snap = await late.recv()
                assert isinstance(snap, Snapshot)
                [pending] = snap.session.pending_permissions
                p = asked.payload
                assert (pending.perm_id, pending.tool_use_id, pending.tool_name) == (
                    p.perm_id, p.tool_use_id, "sleep",
                )  # fmt: skip
                assert (pending.input, pending.expires_at) == (p.input, p.expires_at)
                # the late client answers it, as a live one would
                r = await gw.http.post(
                    f"/sessions/{sid}/permissions/{pending.perm_id}", json={"decision": "allow"}
                )
                assert r.status_code == 202
                await live.until_turn_ends()
                async with gw.client(sid) as after:
                    await after.subscribe(snapshot=True)
                    snap = await after.recv()
                assert snap.session.pending_permissions == []


async def test_a_snapshot_mid_block_names_the_open_block(tmp_path: Path) -> None:
    script = {"script": {"delay_ms": 20, "rounds": [[{"thinking": "hmm"}, {"lorem": 200}]]}}
    with trio.fail_after(10):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                await gw.submit(sid, script)
                await live.until(lambda e: e.type == "text.delta")
                async with gw.client(sid) as late:
                    await late.subscribe(snapshot=True)
                    snap = await late.recv()
                assert isinstance(snap, Snapshot)
                streaming = snap.messages[-1]
                assert streaming.status == "in_progress"
                assert [type(b).__name__ for b in streaming.content] == [
                    "ThinkingBlock",
                    "TextBlock",
                ]
                assert streaming.open_block_index == 1  # the thinking block has ended
                # on the wire, only the in_progress message carries the field
                r = await gw.http.get(f"/sessions/{sid}/messages")
                assert all("open_block_index" not in m for m in r.json()["messages"])
