"""MCP's stdio framing on the pipes of a tool process (docs/protocol.md §11).

The SDK's ``stdio_client`` spawns its server itself, with its own environment
and no watchdog; the gateway's stdio servers are tool processes instead
(gateway.tools.process: minimal environment, own group, limits, killed with
the daemon). This module is the other half of ``stdio_client``: the same
framing (one JSON-RPC message per line, UTF-8, ``by_alias`` and
``exclude_unset`` on the way out) between a running :class:`trio.Process`'s
pipes and the pair of memory streams of ``SessionMessage`` a
``ClientSession`` takes.

A line that is not a JSON-RPC message reaches the session as an exception
value (as the SDK does), which is its business; the end of the server's
stdout closes the session's read stream, so every request in flight fails at
once (``CONNECTION_CLOSED``): a server that dies fails its calls within the
time the kernel takes to tell us.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from gateway.mcp.inbound import MAX_MESSAGE_BYTES, finite_progress

log = logging.getLogger("gateway.mcp")

MAX_LINE_BYTES = MAX_MESSAGE_BYTES
"""A line longer than this ends the connection: a server cannot make us buffer without bound."""

_READ_CHUNK = 65536


class LineTooLong(Exception):
    """The server sent more than :data:`MAX_LINE_BYTES` without a newline."""


@asynccontextmanager
async def stdio_streams(
    proc: trio.Process, closed: trio.Event
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """The session's streams over ``proc``'s pipes; ``closed`` is set when either ends."""
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_stdout() -> None:
        buffer = b""
        try:
            async with to_session:
                while True:
                    chunk = await stdout.receive_some(_READ_CHUNK)
                    if not chunk:
                        return  # end of file: the server exited or closed its stdout
                    *lines, buffer = (buffer + chunk).split(b"\n")
                    if len(buffer) > MAX_LINE_BYTES:
                        await to_session.send(LineTooLong(f"a line over {MAX_LINE_BYTES} bytes"))
                        return
                    for line in lines:
                        if line.strip():
                            await to_session.send(_parse(line))
        except (trio.ClosedResourceError, trio.BrokenResourceError, anyio.BrokenResourceError):
            pass
        except anyio.ClosedResourceError:
            pass
        finally:
            closed.set()

    async def write_stdin() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send_all(data.encode() + b"\n")
        except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
            pass
        finally:
            closed.set()
            await to_session.aclose()  # the session sees the end, not a request hanging

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_stdout, name="mcp-stdout")
        nursery.start_soon(write_stdin, name="mcp-stdin")
        try:
            yield read_stream, write_stream
        finally:
            nursery.cancel_scope.cancel()
            read_stream.close()
            write_stream.close()


def _parse(line: bytes) -> SessionMessage | Exception:
    """One line as a message, or the ValueError the session is given for a line that is not one.

    A line that is not a JSON object is refused before pydantic sees it: a
    server chattering on stdout cost a full union validation a line.
    """
    if not line.lstrip().startswith(b"{"):
        return ValueError(f"not a JSON-RPC message: {line[:200]!r}")
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    finite_progress(message)  # a progress no float can hold (gateway.mcp.inbound)
    return SessionMessage(message)
