"""How much streamed text a kill -9 costs: ``python -m bench.crash_loss``.

docs/protocol.md §9 keeps "whatever of its content was durable" of the
assistant message a crash interrupts. Catalog events are durable before any
client sees them; the text deltas of a block are not: they stream live, and
the message is stored as its blocks end and, while a block streams, every
``[store] checkpoint_ms`` (docs/protocol.md "Crashes and restarts"). So a
kill can cost the text a client was shown since the last checkpoint.

Each round: a real ``gateway serve`` (scripted model, embedded defaults but
for ``[store] checkpoint_ms`` when given), one client on the stream, one turn
that streams ``--words`` words of lorem in one text block at ``--rate`` words
a second; after a random number of deltas the daemon gets SIGKILL; a new one
opens the same store, closes the turn (``server_restart``), and the stored
message's text is compared with what the client was shown. The stored text
must be a prefix of it (checked: nothing made up, nothing reordered); the
loss is the rest, in characters and in seconds of streaming.

Prints one line per kill and a summary; exit status 1 if a stored text was not
a prefix of what was shown.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from gateway.client.attach import open_websocket

READY = re.compile(rb"gateway listening on http://[^:]+:(\d+)\n")


@dataclass
class Kill:
    """One kill: what the client was shown of the block, and what the store kept."""

    shown: int  # characters
    kept: int
    prefix: bool  # the kept text is a prefix of the shown one
    streamed_s: float  # how long the text shown took to stream

    @property
    def lost(self) -> int:
        return self.shown - self.kept

    @property
    def lost_s(self) -> float:
        """The loss in seconds of streaming."""
        return self.streamed_s * self.lost / max(1, self.shown)


async def _start(workdir: Path) -> tuple[trio.Process, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "gateway", "serve", "--config", "gateway.toml", "--port", "0"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = b""
    with trio.fail_after(30):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(1)
            if not chunk:
                raise RuntimeError("the gateway exited before its listening line")
            line += chunk
    match = READY.fullmatch(line)
    if match is None:
        raise RuntimeError(f"unexpected first line: {line!r}")
    return proc, int(match.group(1))


async def _kill(proc: trio.Process) -> None:
    proc.kill()
    await proc.wait()
    if proc.stdout is not None:
        await proc.stdout.aclose()


async def one_kill(workdir: Path, words: int, rate: float, after_deltas: int) -> Kill:
    """Stream one turn, kill the daemon after ``after_deltas`` text deltas, restart, compare."""
    proc, port = await _start(workdir)
    base = f"http://127.0.0.1:{port}"
    shown: list[str] = []
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            session_id = (await http.post("/sessions", json={})).json()["session_id"]
            ws_url = (await http.get(f"/sessions/{session_id}")).json()["ws_url"]
            async with open_websocket(ws_url) as ws:
                subscribe = {"type": "subscribe", "filter": "preset:chat", "since": None}
                await ws.send_message(json.dumps({**subscribe, "snapshot": False}))
                json.loads(await ws.get_message())  # subscribe_ack
                script = {"delay_ms": 1000 / rate, "rounds": [[{"lorem": words}]]}
                content = json.dumps({"script": script})
                turn = await http.post(f"/sessions/{session_id}/turns", json={"content": content})
                turn.raise_for_status()
                while len(shown) < after_deltas:
                    frame = json.loads(await ws.get_message())
                    if frame.get("type") == "event" and frame["event"]["type"] == "text.delta":
                        shown.append(frame["event"]["payload"]["text"])
                await _kill(proc)
    finally:
        if proc.returncode is None:
            await _kill(proc)
    proc, port = await _start(workdir)  # closes the interrupted turn, then listens
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            page = (await http.get(f"/sessions/{session_id}/messages")).json()
    finally:
        await _kill(proc)
    assistant = [m for m in page["messages"] if m["role"] == "assistant"]
    kept = "".join(b["text"] for m in assistant for b in m["content"] if b["type"] == "text")
    text = "".join(shown)
    return Kill(len(text), len(kept), text.startswith(kept), after_deltas / rate)


async def run(kills: int, words: int, rate: float, checkpoint_ms: int | None, seed: int) -> int:
    rng = random.Random(seed)
    results: list[Kill] = []
    with tempfile.TemporaryDirectory(prefix="crash-loss-") as tmp:
        workdir = Path(tmp)
        toml = '[store]\npath = "gateway.db"\n'
        if checkpoint_ms is not None:
            toml += f"checkpoint_ms = {checkpoint_ms}\n"
        (workdir / "gateway.toml").write_text(toml)
        for n in range(kills):
            after = rng.randint(1, max(1, words - 1))
            kill = await one_kill(workdir, words, rate, after)
            results.append(kill)
            print(
                f"kill {n + 1}: after {after} deltas ({after / rate:.2f} s of text):"
                f" shown {kill.shown} chars, kept {kill.kept}, lost {kill.lost}"
                f" ({kill.lost_s:.2f} s){'' if kill.prefix else '  NOT A PREFIX'}"
            )
    chars = [k.lost for k in results]
    seconds = [k.lost_s for k in results]
    setting = "the default" if checkpoint_ms is None else f"{checkpoint_ms}"
    print(
        f"{kills} kills, {words} words at {rate:g} words/s, checkpoint_ms {setting}:"
        f" lost median {statistics.median(chars):g} chars ({statistics.median(seconds):.2f} s"
        f" of streaming), max {max(chars)} chars ({max(seconds):.2f} s)"
    )
    return 0 if all(k.prefix for k in results) else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.crash_loss", description=__doc__)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--words", type=int, default=600)
    parser.add_argument("--rate", type=float, default=50.0, help="words (deltas) per second")
    parser.add_argument("--checkpoint-ms", type=int, default=None)
    parser.add_argument("--seed", type=int, default=19)
    args = parser.parse_args()
    return trio.run(run, args.kills, args.words, args.rate, args.checkpoint_ms, args.seed)


if __name__ == "__main__":
    sys.exit(main())
