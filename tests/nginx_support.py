"""A real nginx in front of a real ``gateway serve``, for tests/system/deploy/test_nginx.py.

(And in front of several nodes, for tests/system/deploy/test_nginx_cluster.py:
:func:`nodes_site_config` does the same for ``deploy/nginx/gateway-nodes.conf``,
its upstream's ports replaced by the nodes'; :func:`nginx_serving` runs any site.)

nginx runs from ``deploy/nginx/gateway.conf`` itself: the generated main
config wraps that file's directives unchanged in an ``http {}`` block, and
changes only what must differ on a test machine: the ``listen`` line (a free
loopback port), the upstream's port (the gateway's), and nginx's own files
(pid, logs, temp directories) in the test's temporary directory, so that it
runs without root and without touching the system's nginx.

Debian's nginx is installed if it is missing (quietly; once: the second run
finds it); the tests skip, saying why, only where it cannot be installed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

from tests.debian import debian_binary

REPO = Path(__file__).resolve().parent.parent
SITE_CONF = REPO / "deploy" / "nginx" / "gateway.conf"
READY = re.compile(rb"gateway listening on http://127\.0\.0\.1:(\d+)")
"""The readiness line; under ``[log] format = "json"`` it is the ``gateway_started`` record."""

# --- nginx itself ----------------------------------------------------------------------


def ensure_nginx() -> str:
    """The nginx binary, installed from Debian's archive if missing (or the test skips)."""
    return debian_binary("nginx", "nginx")


def site_config(
    listen: str, upstream_port: int, *, stream_extra: str = "", site: str | None = None
) -> str:
    """deploy/nginx/gateway.conf with its listen address and upstream port replaced.

    ``stream_extra``: directives added to the stream's location (a test's own
    tuning, e.g. smaller buffers); the file's own directives stay as they are.
    """
    text = SITE_CONF.read_text() if site is None else site
    text, listens = re.subn(r"^(\s*)listen\s+[^;]*;", rf"\1listen {listen};", text, flags=re.M)
    text, upstreams = re.subn(
        r"^(\s*)server\s+127\.0\.0\.1:8421;",
        rf"\1server 127.0.0.1:{upstream_port};",
        text,
        flags=re.M,
    )
    stream = "location ~ ^/sessions/[^/]+/stream$ {"
    assert (listens, upstreams, text.count(stream)) == (1, 1, 1), "gateway.conf changed shape"
    return text.replace(stream, f"{stream}\n{stream_extra}")


NODES_CONF = REPO / "deploy" / "nginx" / "gateway-nodes.conf"
NODE_LINE = re.compile(r"^(\s*)server\s+127\.0\.0\.1:842\d(\s[^;]*)?;", re.M)


def nodes_site_config(listen: str, node_ports: list[int], *, server_extra: str = "") -> str:
    """deploy/nginx/gateway-nodes.conf with its listen address and its nodes' ports replaced.

    The file's upstream lists three nodes (``server 127.0.0.1:8421 ...;`` to
    8423, options kept); ``node_ports`` gives as many. ``server_extra``:
    directives added at the top of the ``server {}`` block (a test's own, e.g.
    a header naming the node that answered).
    """
    text = NODES_CONF.read_text()
    text, listens = re.subn(r"^(\s*)listen\s+[^;]*;", rf"\1listen {listen};", text, flags=re.M)
    ports = iter(node_ports)
    text, nodes = NODE_LINE.subn(
        lambda m: f"{m[1]}server 127.0.0.1:{next(ports)}{m[2] or ''};", text
    )
    server = "\nserver {\n"
    assert (listens, nodes, text.count(server)) == (1, len(node_ports), 1), (
        "gateway-nodes.conf changed shape"
    )
    return text.replace(server, f"{server}{server_extra}\n")


def main_config(workdir: Path, site: str) -> str:
    """A whole nginx.conf: the site inside ``http {}``, nginx's own files in ``workdir``."""
    user = "user root;" if os.geteuid() == 0 else ""  # workers must reach workdir
    temp = "\n".join(
        f"    {kind}_temp_path {workdir / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""\
daemon off;
worker_processes 1;
{user}
pid {workdir / "nginx.pid"};
lock_file {workdir / "nginx.lock"};
error_log stderr notice;
events {{
    worker_connections 128;
}}
http {{
    access_log {workdir / "access.log"};
{temp}
{site}
}}
"""


@dataclass
class Nginx:
    """A running nginx: its port and what it wrote to stderr."""

    port: int
    log: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@asynccontextmanager
async def running_nginx(
    workdir: Path,
    upstream_port: int,
    port: int,
    *,
    listen_options: str = "",
    stream_extra: str = "",
) -> AsyncIterator[Nginx]:
    """nginx on ``127.0.0.1:port`` in front of the gateway on ``upstream_port``.

    ``listen_options`` go on the listen line (e.g. ``sndbuf=4096``);
    ``stream_extra`` into the stream's location (:func:`site_config`).
    """
    listen = f"127.0.0.1:{port} {listen_options}".strip()
    site = site_config(listen, upstream_port, stream_extra=stream_extra)
    async with nginx_serving(workdir, port, site) as nginx:
        yield nginx


@asynccontextmanager
async def nginx_serving(workdir: Path, port: int, site: str) -> AsyncIterator[Nginx]:
    """nginx running ``site`` (directives of the ``http {}`` context) and listening on ``port``.

    Raises :class:`PortTaken` if someone else took ``port`` first.
    """
    binary = ensure_nginx()
    conf = trio.Path(workdir / "nginx.conf")
    await conf.parent.mkdir(parents=True, exist_ok=True)
    await conf.write_text(main_config(workdir, site))
    proc = await trio.lowlevel.open_process(
        [binary, "-p", str(workdir), "-c", str(conf), "-e", "stderr"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    nginx = Nginx(port)
    assert proc.stderr is not None
    stderr = proc.stderr
    ready = False
    try:
        async with trio.open_nursery() as nursery:
            settled = trio.Event()

            async def read_log() -> None:
                nonlocal ready
                pending = b""
                while chunk := await stderr.receive_some():
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        nginx.log.append(line.decode(errors="replace"))
                        if b"start worker process" in line:  # listening, workers up
                            ready = True
                            settled.set()
                settled.set()  # nginx exited

            nursery.start_soon(read_log, name="nginx stderr")
            with trio.fail_after(10):
                await settled.wait()
            if ready:
                try:
                    yield nginx
                finally:
                    proc.terminate()  # nginx's fast shutdown
                    with trio.move_on_after(10):
                        await proc.wait()
            nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await stderr.aclose()
    if not ready:
        log = "\n".join(nginx.log)
        if "Address already in use" in log:
            raise PortTaken(port)
        raise AssertionError(f"nginx did not start:\n{log}")


class PortTaken(Exception):
    """Someone took the port :func:`free_port` found before nginx could listen on it."""


# --- the gateway -------------------------------------------------------------------------


@dataclass
class GatewayProcess:
    """A ``gateway serve`` subprocess: its port, and its log file (stderr)."""

    proc: trio.Process
    port: int
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@asynccontextmanager
async def gateway_process(workdir: Path, config: str) -> AsyncIterator[GatewayProcess]:
    """``python -m gateway serve --config`` (the config text) with the store in ``workdir``."""
    await trio.Path(workdir).mkdir(parents=True, exist_ok=True)
    await trio.Path(workdir / "gateway.toml").write_text(config)
    # The shell's GATEWAY_* variables would override the test's config.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    log = workdir / "gateway.log"
    with log.open("wb") as log_file:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "gateway", "serve", "--config", "gateway.toml"],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
        )
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                assert chunk, "the gateway exited before its readiness line:\n" + log.read_text()
                line += chunk
        if line.startswith(b"{"):  # format = "json": the gateway_started record
            record = json.loads(line)
            assert record["event"] == "gateway_started", line
            port = int(record["port"])
        else:
            match = READY.fullmatch(line.strip())
            assert match, line
            port = int(match.group(1))
        yield GatewayProcess(proc, port, log)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if proc.stdout is not None:
            await proc.stdout.aclose()


# --- clients from another loopback address -------------------------------------------------


@asynccontextmanager
async def open_ws_from(
    url: str, source: str, *, receive_buffer: int = 0, **kw: Any
) -> AsyncIterator[WebSocketConnection]:
    """A trio-websocket client of ``url`` whose socket is bound to ``source`` (e.g. 127.0.0.2).

    The proxy then sees a client address that differs from its own
    (127.0.0.1), so the gateway's view of the client shows which one it took.
    ``receive_buffer``: the socket's SO_RCVBUF (0: the kernel's, which grows).
    """
    parts = re.fullmatch(r"ws://([^/:]+):(\d+)(/.*)", url)
    assert parts is not None, url
    host, port, resource = parts[1], int(parts[2]), parts[3]
    stream = await trio.open_tcp_stream(host, port, local_address=source)
    if receive_buffer:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    try:
        async with trio.open_nursery() as nursery:
            ws = await wrap_client_stream(nursery, stream, f"{host}:{port}", resource, **kw)
            try:
                yield ws
            finally:
                await ws.aclose()
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)
