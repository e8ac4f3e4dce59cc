"""A Claude Code session when its node dies, on Redis (docs/protocol.md §9; docs/agents.md).

With ``[store] backend = "redis"`` a surviving node takes over the session of
a dead one: the gateway's side of it (the record, the messages, the events)
is in Redis. Claude Code's side is not: the CLI keeps its conversation in a
transcript under the session's state directory,
``<workspace_root>/.claude-code/<session id>``
(:func:`gateway.runtimes.claude_code.options.state_dir`), and the Claude Code session
id is derived from the gateway's (:func:`~gateway.runtimes.claude_code.options.claude_session_id`),
so whichever node starts the next CLI looks for the transcript there. So:

- **The state directory is on storage every node shares** (here: one
  machine, so one directory; in a deployment, ``workspace_root``, which
  holds the state directories too): the
  surviving node's CLI resumes the transcript, and the model sees the whole
  conversation.
- **It is not** (each node's own disk): the takeover starts a new Claude Code
  conversation. The turn runs and the gateway's history still shows every
  earlier message, but the model sees none of them (here the dead node's
  state directory is removed before the takeover: what a survivor with a disk
  of its own finds).

Either way the dead node's CLI died with it (the watchdog of docs/protocol.md
§15; its pid is in the node's ``claude_code_started`` log line).

One test, two takeovers (the first node's session to the second node, shared;
then the second's to the third, not; between them a turn forwarded to the
owner of the first session, whose one process slot it holds), on real ``gateway serve``
processes on one redis-server (tests/cluster_support.py, ``lease_s`` = 1 s),
whose default agent is Claude Code (the real CLI of the claude-code extra) on
the fake Anthropic API, which is also its proxy: nothing leaves the machine.
Needs redis-server and the extra; skips, saying which, without either.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from bench.fake_api import Cut, FakeServer, Replay, transcript
from tests.claude_code_support import alive
from tests.cluster_support import FIRST_ID, LEASE_S, Cluster, Node, Peer, peers
from tests.conftest import types
from tests.redis_support import RedisServer, ensure_redis_server

pytestmark = [
    pytest.mark.slow,  # slow: redis-server and Claude Code CLI processes
    pytest.mark.skipif(
        importlib.util.find_spec("claude_agent_sdk") is None,
        reason="needs the claude-code extra: pip install 'gateway[claude-code]'",
    ),
    *[
        pytest.mark.filterwarnings(f"ignore:Async generator '{package}.:ResourceWarning")
        for package in ("httpx", "httpcore")
    ],
    pytest.mark.slow,  # real gateway processes on a real Redis, real CLIs
]

KEY = "sk-ant-failover"
IDS = (b"msg_01FailoverFirst00001", b"msg_01FailoverLast000001", b"msg_01FailoverCut0000001")


def cluster_config(base_url: str, store: str = "", agent: str = "", tools: str = "") -> str:
    """tests/cluster_support.CONFIG with a Claude Code default agent (a ``str.format`` template).

    ``store``, ``tools``, ``agent``: more lines of ``[store]``, ``[tools]`` and of the agent.
    """
    proxy = (
        f'{{{{ HTTPS_PROXY = "{base_url}", HTTP_PROXY = "{base_url}", NO_PROXY = "127.0.0.1" }}}}'
    )
    return f"""\
[server]
host = "127.0.0.1"
port = {{port}}
shutdown_grace_s = 2.0
[store]
backend = "redis"
url = "{{url}}"
lease_s = {{lease_s}}
{store}
[model]
provider = "anthropic"
name = "anthropic:claude-sonnet-4-6"
base_url = "{base_url}"
max_retries = 0
[sessions]
workspace_root = "{{workdir}}/workspaces"
[tools]
kill_grace_s = 1
{tools}
[agents.default]
runtime = "claude-code"
system = "You work for the failover test."
tools = ["Bash"]
require_approval = ["Bash"]
env = {proxy}
{agent}
[log]
format = "json"
"""


def cli_pids(node: Node, session_id: str) -> list[int]:
    """The pids of the session's CLIs this node started (its ``claude_code_started`` lines)."""
    return [
        int(line["pid"])
        for line in node.log_events()
        if line["event"] == "claude_code_started" and line.get("session_id") == session_id
    ]


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry))
    return out


async def turn(peer: Peer, session_id: str, content: str) -> list[Any]:
    """A turn on this node (retried while the dead owner's lease holds: 503), to its end."""
    with trio.fail_after(10 * LEASE_S):
        while True:
            r = await peer.post_turn(session_id, content)
            if r.status_code != 503:
                break
            assert r.json()["error"]["code"] == "session_owner_unreachable", r.text
            await trio.sleep(0.2)
    assert r.status_code == 202, r.text
    turn_id = r.json()["turn_id"]
    async with peer.watch(session_id, since=FIRST_ID) as w:
        with trio.fail_after(60):
            events = await w.turn(turn_id)
    return events


@contextlib.asynccontextmanager
async def claude_code_cluster(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count: int,
    later: int = 0,
    **config: str,
) -> AsyncIterator[tuple[Cluster, FakeServer]]:
    """``count`` nodes on one redis-server, their API and proxy one fake server; ``later``
    more booting meanwhile (``Cluster.ensure`` waits for them). ``config``: the
    keywords of :func:`cluster_config`."""
    binary = ensure_redis_server()
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)  # the nodes pass it on to their CLIs
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        base_url = await nursery.start(server.serve)
        redis = RedisServer(binary, tmp_path / "redis")
        await trio.to_thread.run_sync(redis.start)
        nodes = Cluster(redis, tmp_path, cluster_config(base_url, **config))
        try:
            await trio.to_thread.run_sync(nodes.start, count)  # the fake API answers meanwhile
            nodes.boot(later)
            yield nodes, server
        finally:
            await trio.to_thread.run_sync(nodes.close)
            await trio.to_thread.run_sync(redis.stop)
            nursery.cancel_scope.cancel()
    calls = {(r.method, r.path) for r in server.requests}
    assert calls <= {("POST", "/v1/messages?beta=true")}, calls  # nothing left the machine


async def takeover(
    server: FakeServer,
    nodes: Cluster,
    a_node: Node,
    b_node: Node,
    tmp_path: Path,
    *,
    shared: bool,
    mid_turn: bool,
) -> tuple[str, list[Any], list[Any], str, str]:
    """A turn on ``a_node``, kill -9 of it, the next turn through ``b_node``: the session,
    both turns' events and the first and last requests the model got (as text).

    The next turn runs on whichever survivor holds the session then (the one
    that closed the cut turn, when there was one): its CLI, a new process.

    ``mid_turn``: ``a_node`` dies in a second turn, while the model's answer
    streams (it stalls there); a survivor closes that turn (docs/protocol.md §9).
    """
    asked = len(server.requests)
    text = transcript("anthropic/text.sse")  # each reply a message id of its own, as the API's
    first_reply, last_reply, cut_reply = (
        text.replace(b"msg_01XFDUDYJgAACzvnptvVoYEL", m) for m in IDS
    )
    server.enqueue(Replay(first_reply))
    if mid_turn:
        server.enqueue(Replay(cut_reply, cut=Cut(cut_reply.index(b", world"), "stall")))
    server.enqueue(Replay(last_reply))
    async with peers([a_node, b_node]) as (a, b):
        sid = await a.create_session()
        first = await turn(a, sid, "first words APPLE")
        [pid] = cli_pids(a_node, sid)
        assert alive(pid)
        state = tmp_path / "workspaces" / ".claude-code" / sid
        assert list(state.glob(".claude/projects/*/*.jsonl")), "the CLI wrote no transcript"
        if mid_turn:
            async with b.watch(sid) as survivor:
                cut_turn = await a.submit(sid, "cut short CHERRY")
                with trio.fail_after(30):
                    await survivor.until_type("text.delta")
                    kids = children(a_node.proc.pid)  # the CLI, streaming; the watchdog
                    [cli] = [k for k in kids if b"claude" in cmdline(k)]
                    assert cli == pid and os.getpgid(cli) == cli  # a group of its own
                    a_node.kill()
                    assert a_node.proc.returncode == -signal.SIGKILL
                    closed = await survivor.turn(cut_turn)
            assert closed[-1].type == "turn.cancelled", types(closed)
            assert closed[-1].payload.reason == "server_restart"
        else:
            kids = children(a_node.proc.pid)
            a_node.kill()
        with trio.fail_after(5):  # the watchdog stops the dead daemon's CLI: no child outlives it
            while alive(pid) or any(alive(k) for k in kids):  # noqa: ASYNC110
                await trio.sleep(0.05)
        if not shared:  # what a survivor whose disk is its own finds: nothing
            await trio.to_thread.run_sync(shutil.rmtree, state)
        second = await turn(b, sid, "second words BANANA")
        survivors = [n for n in nodes.live if n is not a_node]
        assert any(cli_pids(n, sid) for n in survivors), "no survivor started a CLI"
        history = (await b.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    said = [str(r.body["messages"]) for r in server.requests[asked:]]
    assert len(said) == 2 + mid_turn, said
    texts = [str(m["content"]) for m in history]
    assert "APPLE" in texts[0] and "BANANA" in texts[-2], texts
    assert len(texts) == 4 + 2 * mid_turn, texts
    return sid, first, second, said[0], said[-1]


async def no_slot(server: FakeServer, nodes: list[Node], busy: str) -> tuple[Any, float]:
    """A turn of ``busy`` keeps its owner's one CLI busy (it is running already: no
    new CLI); a turn of another of the owner's sessions posted on the other node:
    that POST's answer and how long it took. The busy turn is then cancelled, so
    the owner's CLI is idle again (a later turn there stops it to make room)."""
    [owner] = [n for n in nodes if cli_pids(n, busy)]
    [elsewhere] = [n for n in nodes if n is not owner]
    body = transcript("anthropic/text.sse")
    server.enqueue(Replay(body, cut=Cut(body.index(b", world"), "stall")))
    async with peers([owner, elsewhere]) as (o, e):
        other = await o.create_session()
        async with o.watch(busy) as w:
            busy_turn = await o.submit(busy, "keep the CLI busy")
            with trio.fail_after(30):
                await w.until_type("text.delta")
            started = trio.current_time()
            r = await e.post_turn(other, "no slot for me")
            waited = trio.current_time() - started
            cancelled = await o.cancel(busy, busy_turn)
            assert cancelled.status_code in (200, 202), cancelled.text
            with trio.fail_after(10):
                ended = await w.turn(busy_turn)
    assert ended[-1].type == "turn.cancelled", types(ended)
    return r, waited


async def test_takeovers_resume_only_from_a_shared_state_directory_and_no_slot_is_over_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared: the survivor's CLI resumes the transcript. Not: a new conversation.

    Between the two, on the same cluster (``max_processes = 1``, ``commit_timeout_s = 1.5``):
    the owner's one CLI busy, a turn posted on another node waits on the owner for a slot
    (``process_slot_wait_s = 2``, longer than ``commit_timeout_s``) and answers what the
    owner says, 503 ``over_capacity`` with ``Retry-After``, not ``session_owner_unreachable``.

    The first takeover's node is kill -9'd mid-turn: no CLI outlives the daemon.
    Three nodes in all (each boot imports the SDKs, seconds of CPU): the third boots
    while the first takeover runs; the busy CLI is the first takeover's, on whichever
    survivor resumed it.
    """
    config = {
        "store": "commit_timeout_s = 1.5",
        "tools": "process_slot_wait_s = 2.0",
        "agent": "max_processes = 1",
    }
    async with claude_code_cluster(tmp_path, monkeypatch, 2, 1, **config) as (nodes, server):
        a, b = nodes.live
        sid, first, second, asked_first, asked_second = await takeover(
            server, nodes, a, b, tmp_path, shared=True, mid_turn=True
        )
        assert first[-1].type == second[-1].type == "turn.completed"
        assert second[-1].payload.stop_reason == "end_turn"
        assert "APPLE" in asked_first and "BANANA" not in asked_first
        assert "APPLE" in asked_second and "BANANA" in asked_second  # the same conversation
        # The interrupted turn is in the gateway's history (its prompt, its partial
        # answer); what the model sees of it depends on how far the killed CLI got:
        # its prompt, if the CLI had written it to the transcript (then followed by
        # Claude Code's own filler answer), never the partial answer.
        if "CHERRY" in asked_second:
            assert "Hello" not in asked_second.split("CHERRY")[1].split("BANANA")[0]

        b, c = await trio.to_thread.run_sync(nodes.ensure, 2)  # the third node, booted
        r, waited = await no_slot(server, [b, c], busy=sid)  # the survivor's CLI, busy again
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "over_capacity", r.text
        assert r.headers["Retry-After"] == "2"
        assert waited >= 1.9, waited  # the owner's wait for a slot, past commit_timeout_s

        _, first, second, asked_first, asked_second = await takeover(
            server, nodes, b, c, tmp_path, shared=False, mid_turn=False
        )
        assert first[-1].type == second[-1].type == "turn.completed"
        assert second[-1].payload.stop_reason == "end_turn"  # the turn runs...
        assert "APPLE" in asked_first
        assert "BANANA" in asked_second and "APPLE" not in asked_second  # ...without what was said
