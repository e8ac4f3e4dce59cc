"""``python -m bench.mcp_overhead``: what the gateway adds to an MCP tool call.

One trivial tool (``echo`` of tests/mcp_servers/everything.py), called over
each transport two ways, in one run:

- ``sdk``: the ``mcp`` SDK's ``ClientSession.call_tool`` on its own transport
  (``stdio_client`` / ``streamable_http_client``), straight to the server.
- ``gateway``: the gateway's path without the model: ``SessionTools.execute``
  (lookup, ``jsonschema`` check of the input) through :class:`McpServers`'
  connection (its own stdio framing on a tool process, or the SDK's HTTP
  transport with its headers), then the result mapping.

Each path has its own server process (the same script), started and warmed up
before the clock runs. The calls go in rounds, one of each path per round, so
whatever else the machine does weighs on both alike; ``--warmup`` rounds are
discarded. Prints p50 and p99 per path and the gateway's overhead. Example::

    python -m bench.mcp_overhead --calls 500
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import msgspec
import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from gateway.config import Config, McpServerConfig
from gateway.mcp.servers import McpServers
from gateway.metrics import Metrics
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import ToolContext, ToolRegistry

SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "everything.py"

Call = Callable[[], Awaitable[object]]


@asynccontextmanager
async def http_server() -> AsyncIterator[str]:
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(SERVER), "--http"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        data = b""
        with trio.fail_after(60):
            while b"\n" not in data:
                data += await proc.stdout.receive_some(100)
        yield f"http://127.0.0.1:{int(data.split()[1])}/mcp"
    finally:
        proc.kill()
        await proc.wait()


@asynccontextmanager
async def sdk_stdio() -> AsyncIterator[Call]:
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
    async with stdio_client(params) as streams, ClientSession(*streams) as session:
        await session.initialize()
        await session.list_tools()
        yield lambda: session.call_tool("echo", {"text": "hi"})


@asynccontextmanager
async def sdk_http(url: str) -> AsyncIterator[Call]:
    async with streamable_http_client(url) as streams, ClientSession(*streams) as session:
        await session.initialize()
        await session.list_tools()
        yield lambda: session.call_tool("echo", {"text": "hi"})


@asynccontextmanager
async def gateway(server: McpServerConfig) -> AsyncIterator[Call]:
    config = msgspec.structs.replace(Config(), mcp_servers={"ev": server})
    processes = ToolProcesses(config.tools)
    manager = McpServers(config, processes, Metrics())
    ctx = ToolContext("ses_bench", "turn_bench", "toolu_bench", "/tmp")
    async with trio.open_nursery() as nursery:
        await nursery.start(processes.run)
        await nursery.start(manager.run)
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_bench")
        try:
            yield lambda: tools.execute("mcp__ev__echo", {"text": "hi"}, ctx)
        finally:
            nursery.cancel_scope.cancel()


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


async def main(calls: int, warmup: int) -> None:
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(http_server())
        paths: dict[str, Call] = {
            "stdio sdk": await stack.enter_async_context(sdk_stdio()),
            "stdio gateway": await stack.enter_async_context(
                gateway(
                    msgspec.convert({"command": [sys.executable, str(SERVER)]}, McpServerConfig)
                )
            ),
            "http sdk": await stack.enter_async_context(sdk_http(url)),
            "http gateway": await stack.enter_async_context(
                gateway(
                    msgspec.convert(
                        {"url": url, "headers": {"Authorization": "Bearer bench"}},
                        McpServerConfig,
                    )
                )
            ),
        }
        samples: dict[str, list[float]] = {name: [] for name in paths}
        for round_ in range(warmup + calls):
            for name, call in paths.items():
                started = time.perf_counter()
                await call()
                if round_ >= warmup:
                    samples[name].append((time.perf_counter() - started) * 1000)
    print(f"{calls} calls per path after {warmup} warm-up rounds; latency in ms")
    print(f"{'path':<15}{'p50':>9}{'p99':>9}")
    stats = {n: (quantile(v, 0.5), quantile(v, 0.99)) for n, v in samples.items()}
    for name, (p50, p99) in stats.items():
        print(f"{name:<15}{p50:>9.3f}{p99:>9.3f}")
    print()
    print(f"{'overhead':<15}{'p50':>9}{'p99':>9}")
    for transport in ("stdio", "http"):
        sdk, gw = stats[f"{transport} sdk"], stats[f"{transport} gateway"]
        print(f"{transport:<15}{gw[0] - sdk[0]:>+9.3f}{gw[1] - sdk[1]:>+9.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    trio.run(main, args.calls, args.warmup)
