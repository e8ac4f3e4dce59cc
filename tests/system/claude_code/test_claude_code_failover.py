"""A Claude Code session when its node dies, on Redis (docs/protocol.md §9; docs/agents.md).

With ``[store] backend = "redis"`` a surviving node takes over the session of
a dead one: the gateway's side of it (the record, the messages, the events)
is in Redis. Claude Code's side is not: the CLI keeps its conversation in a
transcript under the session's state directory,
``<workspace_root>/.claude-code/<session id>``
(:func:`gateway.runtimes.claude_code.paths.state_dir`), and the Claude Code session
id is derived from the gateway's (:func:`~gateway.runtimes.claude_code.paths.claude_session_id`),
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

One test, one kill -9, two sessions taken over (one state directory shared,
one not; before the kill, a turn forwarded to the owner, whose one process
slot is busy), on real ``gateway serve``
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
    **config: str,
) -> AsyncIterator[tuple[Cluster, FakeServer]]:
    """``count`` nodes on one redis-server, their API and proxy one fake server.

    ``config``: the keywords of :func:`cluster_config`."""
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
            yield nodes, server
        finally:
            await trio.to_thread.run_sync(nodes.close)
            await trio.to_thread.run_sync(redis.stop)
            nursery.cancel_scope.cancel()
    calls = {(r.method, r.path) for r in server.requests}
    assert calls <= {("POST", "/v1/messages?beta=true")}, calls  # nothing left the machine


def replies(*cut: bool) -> list[Replay]:
    """``anthropic/text.sse`` once per call, each a message id of its own (as the API's);
    a ``cut`` one stalls after its first words."""
    text = transcript("anthropic/text.sse")
    out = []
    for n, stalls in enumerate(cut):
        body = text.replace(b"msg_01XFDUDYJgAACzvnptvVoYEL", b"msg_01Failover%010d" % n)
        out.append(Replay(body, cut=Cut(body.index(b", world"), "stall") if stalls else None))
    return out


async def test_a_takeover_resumes_only_from_a_shared_state_directory_and_no_slot_is_over_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions of the first node, X and Y, its one process slot (``max_processes = 1``)
    going from X's CLI to Y's and back: X's turn streams when the node is kill -9'd.

    - Before that, while X's CLI is busy, a turn of Y posted on the second node waits on the
      owner for a slot (``process_slot_wait_s = 2``, longer than ``commit_timeout_s =
      1.5``) and answers what the owner says, 503 ``over_capacity`` with ``Retry-After``,
      not ``session_owner_unreachable``.
    - No CLI outlives the killed daemon; the survivor closes X's cut turn.
    - X's state directory is where the survivor finds it (shared): its CLI resumes the
      transcript. Y's is removed (what a survivor with a disk of its own finds): a new
      conversation, whose history the gateway still has.

    Two nodes (each boot imports the SDKs, seconds of CPU), one kill.
    """
    config = {
        "store": "commit_timeout_s = 1.5",
        "tools": "process_slot_wait_s = 2.0",
        "agent": "max_processes = 1",
    }
    async with claude_code_cluster(tmp_path, monkeypatch, 2, **config) as (nodes, server):
        a_node, b_node = nodes.live
        # X's first turn, Y's, X's cut one; then X's and Y's on the survivor.
        server.enqueue(*replies(False, False, True, False, False))
        async with peers([a_node, b_node]) as (a, b):
            x, y = await a.create_session(), await a.create_session()
            await turn(a, x, "first words APPLE")
            await turn(a, y, "first words DATE")  # X's idle CLI is stopped to make room
            x_state, y_state = (tmp_path / "workspaces" / ".claude-code" / s for s in (x, y))
            for state in (x_state, y_state):
                assert list(state.glob(".claude/projects/*/*.jsonl")), "the CLI wrote no transcript"
            async with b.watch(x) as survivor:
                cut_turn = await a.submit(x, "cut short CHERRY")  # Y's CLI stopped, X's resumes
                with trio.fail_after(30):
                    await survivor.until_type("text.delta")
                started = trio.current_time()
                refused = await b.post_turn(y, "no slot for me")  # forwarded to a: X's CLI busy
                waited = trio.current_time() - started
                with trio.fail_after(30):
                    kids = children(a_node.proc.pid)  # X's CLI, streaming; the watchdog
                    [cli] = [k for k in kids if b"claude" in cmdline(k)]
                    assert cli == cli_pids(a_node, x)[-1] and os.getpgid(cli) == cli
                    a_node.kill()
                    assert a_node.proc.returncode == -signal.SIGKILL
                    closed = await survivor.turn(cut_turn)
            with trio.fail_after(5):  # the watchdog stops the dead daemon's CLI
                while any(alive(k) for k in kids):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            await trio.to_thread.run_sync(shutil.rmtree, y_state)
            x_after = await turn(b, x, "second words BANANA")
            y_after = await turn(b, y, "second words ELDER")  # X's idle CLI stopped on b
            assert cli_pids(b_node, x) and cli_pids(b_node, y), "the survivor started no CLI"
            x_history, y_history = [
                [
                    str(m["content"])
                    for m in (await b.http.get(f"/sessions/{s}/messages")).json()["messages"]
                ]
                for s in (x, y)
            ]
    assert len(cli_pids(a_node, x)) == 2 and len(cli_pids(a_node, y)) == 1
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "over_capacity", refused.text
    assert refused.headers["Retry-After"] == "2"
    assert waited >= 1.9, waited  # the owner's wait for a slot, past commit_timeout_s
    assert closed[-1].type == "turn.cancelled", types(closed)
    assert closed[-1].payload.reason == "server_restart"
    assert x_after[-1].type == y_after[-1].type == "turn.completed"
    assert x_after[-1].payload.stop_reason == y_after[-1].payload.stop_reason == "end_turn"
    said = [str(r.body["messages"]) for r in server.requests]
    assert len(said) == 5, said  # the refused turn never reached the model
    assert "APPLE" in said[0] and "DATE" in said[1] and "CHERRY" in said[2]
    # X: the same conversation. The interrupted turn is in the gateway's history (its
    # prompt, its partial answer); what the model sees of it depends on how far the killed
    # CLI got: its prompt, if the CLI had written it to the transcript (then followed by
    # Claude Code's own filler answer), never the partial answer.
    assert "APPLE" in said[3] and "BANANA" in said[3]
    if "CHERRY" in said[3]:
        assert "Hello" not in said[3].split("CHERRY")[1].split("BANANA")[0]
    # Y: the turn runs, without what was said before.
    assert "ELDER" in said[4] and "DATE" not in said[4]
    assert len(x_history) == 6 and "APPLE" in x_history[0] and "BANANA" in x_history[-2]
    assert len(y_history) == 4 and "DATE" in y_history[0] and "ELDER" in y_history[-2]
