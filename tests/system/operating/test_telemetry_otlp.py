"""Traces end to end (docs/operating.md "Traces"): ``gateway serve`` exports OTLP/HTTP.

A tiny OTLP/HTTP receiver on loopback (h11 on a Trio socket) takes each
``POST /v1/traces`` and decodes it with opentelemetry-proto's
``ExportTraceServiceRequest``; the daemon, configured by ``[telemetry]``, runs
a turn with a tool round and is stopped with SIGTERM, which flushes its spans.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import trio

from tests.conftest import Client, open_ws, ready_port

pytest.importorskip("opentelemetry.sdk", reason="the otel extra: pip install 'gateway[otel]'")
pytest.importorskip("opentelemetry.proto", reason="the otel extra: pip install 'gateway[otel]'")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

pytestmark = pytest.mark.slow  # gateway serve as a process


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it was sent, by name, with its attributes."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.paths: list[str] = []
        self.services: dict[bytes, str] = {}  # span id -> its resource's service.name

    async def serve(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        body = b""
        target = ""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                if not data:
                    return
                continue
            if isinstance(event, h11.Request):
                target = event.target.decode()
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.paths.append(target)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    service = attributes(resource.resource).get("service.name", "")
                    for scope in resource.scope_spans:
                        self.spans += scope.spans
                        self.services.update((span.span_id, service) for span in scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                headers = [("Content-Type", "application/x-protobuf")]
                headers.append(("Content-Length", str(len(answer))))
                await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
                await stream.send_all(conn.send(h11.Data(data=answer)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
                conn.start_next_cycle()
                body = b""
            elif isinstance(event, h11.ConnectionClosed):
                return


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [v.string_value for v in value.array_value.values]
        else:
            out[kv.key] = getattr(value, kind)
    return out


async def test_serve_exports_the_turn_s_spans_over_otlp_http(tmp_path: Path) -> None:
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listener.socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, receiver.serve, [listener])
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[store]\npath = "{tmp_path / "gateway.db"}"\n'
            f'[sessions]\nworkspace_root = "{tmp_path / "workspaces"}"\n'
            f'[telemetry]\ntraces = "otlp"\nendpoint = "http://127.0.0.1:{port}/v1/traces"\n'
            'service_name = "gateway-under-test"\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            gw_port = await ready_port(proc, 20)
            sid = await _one_turn(gw_port)
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    await pipe.aclose()
        nursery.cancel_scope.cancel()
    assert set(receiver.paths) == {"/v1/traces"}
    by_name = {s.name: s for s in receiver.spans}
    assert {"invoke_agent default", "chat echo", "execute_tool sleep"} <= set(by_name)
    assert len([s for s in receiver.spans if s.name == "chat echo"]) == 2
    turn = by_name["invoke_agent default"]
    tool = by_name["execute_tool sleep"]
    assert tool.parent_span_id == turn.span_id and tool.trace_id == turn.trace_id
    a = attributes(turn)
    assert a["gen_ai.conversation.id"] == sid and a["gen_ai.operation.name"] == "invoke_agent"
    chat = attributes(by_name["chat echo"])
    assert chat["gen_ai.request.model"] == "echo" and "gen_ai.usage.output_tokens" in chat
    assert attributes(tool)["gen_ai.tool.name"] == "sleep"


async def _one_turn(port: int) -> str:
    script = {
        "script": {
            "rounds": [
                [{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}],
                [{"text": "Done."}],
            ]
        }
    }
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        sid = str((await http.post("/sessions", json={})).json()["session_id"])
        url = (await http.get(f"/sessions/{sid}")).json()["ws_url"]
        async with open_ws(url) as ws:
            client = Client(ws, sid)
            await client.subscribe()
            r = await http.post(f"/sessions/{sid}/turns", json={"content": json.dumps(script)})
            assert r.status_code == 202, r.text
            with trio.fail_after(20):
                await client.until_turn_ends()
    return sid
