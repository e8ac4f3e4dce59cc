"""A stand-in daemon for the kill -9 test: the tool-process watchdog and one stdio MCP server.

Prints ``PID <server pid>`` once the server is up, then waits to be killed.
"""

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent.parent.parent))

from tests.mcp_support import EVERYTHING, running, server


async def main() -> None:
    async with running(ev=server(command=EVERYTHING)) as manager:
        await manager.wait_ready()
        connection = manager.connection("ev")
        assert connection is not None
        print(f"PID {connection.pid}", flush=True)
        await trio.sleep_forever()


trio.run(main)
