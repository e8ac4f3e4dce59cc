"""Several gateway nodes on one Redis, loaded and measured as one server (docs/scale-out.md).

:class:`NodesServer` starts one redis-server (:mod:`bench.redis_server`) and
``count`` ``gateway serve`` processes naming it (``[store] backend =
"redis"``: one deployment, docs/reference.md "Command line"), and spreads the
fan-out's sessions and clients over them by a *shape*:

``local``
    session ``i`` is created on node ``i mod N`` (its owner: it holds the
    session's lease and runs its turns) and its clients attach to that node;
    the nodes share nothing but Redis.
``remote``
    the same owners, but each session's clients attach to the next node
    (``i + 1 mod N``), which gets the owner's batches over Redis pub/sub and
    fans them out to its own clients (docs/scale-out.md, "live fan-out
    between nodes"): every delivered event crosses nodes.
``split``
    every session on node 0, every client on the other nodes: node 0 only
    runs turns and publishes each batch once, the others only receive and
    fan out, so each side's cost is measured apart (the owner's CPU per
    published batch, the receiving node's CPU per delivered event).

Each node's turns are driven by its own :class:`bench.driver.GatewayDriver`
(turns go to the owner), with the sessions' time slots spread over all of
them as on one node. A window also reads (:meth:`NodesServer.counters`) each
node's CPU seconds and redis-server's ``INFO commandstats``: the calls of
``PUBLISH`` and ``SPUBLISH`` and Redis's own microseconds in them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench.redis_server import RedisProcess, nodes_window
from bench.servers import GatewayServer, Server, process_cpu_seconds
from bench.worker import Target

SHAPES = ("local", "remote", "split")


class NodesServer(Server):
    """``count`` gateway nodes on one redis-server, in one ``shape`` (module docstring)."""

    def __init__(
        self, workdir: Path, config_text: str, *, count: int, shape: str, words: int = 200
    ) -> None:
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; choose from {SHAPES}")
        if count < 2 and shape != "local":
            raise ValueError(f"the {shape} shape needs two nodes or more")
        self.name = f"{count} nodes, {shape}"
        self.count = count
        self.shape = shape
        self.redis = RedisProcess(workdir / "redis")
        self.nodes = [
            GatewayServer(
                workdir / f"node{i}", config_text, words=words, backend="redis", store_url=""
            )  # the shared redis-server's URL once it runs
            for i in range(count)
        ]
        self.owner: dict[str, int] = {}  # session -> the node it was created on
        self.index: dict[str, int] = {}  # session -> its place in the order of creation

    async def start(self) -> None:
        await self.redis.start()
        try:
            for node in self.nodes:
                node.store_url = self.redis.url
            await asyncio.gather(*(node.start() for node in self.nodes))
        except BaseException:
            await self.stop()
            raise
        self.port = self.nodes[0].port

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes))
        await self.redis.stop()

    @property
    def first(self) -> GatewayServer:
        """Node 0 (where the bench records its load turn)."""
        return self.nodes[0]

    # --- where sessions and clients go ------------------------------------------------

    def _owner_of(self, index: int) -> int:
        return 0 if self.shape == "split" else index % self.count

    def client_node(self, session: str) -> int:
        """The node the clients of ``session`` attach to."""
        owner = self.owner[session]
        if self.shape == "local":
            return owner
        if self.shape == "remote":
            return (owner + 1) % self.count
        return 1 + self.index[session] % (self.count - 1)  # split: the nodes but the owner

    def placement(self) -> dict[str, Any]:
        """How many sessions each node owns and how many of them it has clients of."""
        owned = [0] * self.count
        served = [0] * self.count
        for session, owner in self.owner.items():
            owned[owner] += 1
            served[self.client_node(session)] += 1
        return {"shape": self.shape, "sessions_owned": owned, "sessions_served": served}

    async def open_sessions(self, count: int) -> list[str]:
        sessions = []
        for _ in range(count):
            place = len(self.owner)
            owner = self._owner_of(place)
            (session,) = await self.nodes[owner].open_sessions(1)
            self.owner[session], self.index[session] = owner, place
            sessions.append(session)
        return sessions

    async def load(self, sessions: list[str], rate: float) -> None:
        for index, node in enumerate(self.nodes):
            own = [s for s in sessions if self.owner[s] == index]
            if own:
                assert node.driver is not None
                await node.driver.run(own, rate, spread=sessions)

    async def unload(self) -> None:
        await asyncio.gather(*(node.unload() for node in self.nodes))

    def target(self, session: str, subscribe: bytes, **kw: Any) -> Target:
        return self.nodes[self.client_node(session)].target(session, subscribe, **kw)

    # --- measuring --------------------------------------------------------------------

    def cpu_seconds(self) -> float | None:
        """Every node's CPU seconds together (each one apart: :meth:`counters`)."""
        parts = [node.cpu_seconds() for node in self.nodes]
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)

    def store_cpu_seconds(self) -> float | None:
        return None if self.redis.pid is None else process_cpu_seconds(self.redis.pid)

    def rss_bytes(self) -> int | None:
        parts = [node.rss_bytes() for node in self.nodes]
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)

    async def counters(self) -> dict[str, Any]:
        return {
            "node_cpu_s": [node.cpu_seconds() or 0.0 for node in self.nodes],
            "commands": await self.redis.command_stats(),
        }

    def window_figures(self, before: Any, after: Any, wall_s: float) -> dict[str, Any]:
        """Each node's CPU seconds over the window, and redis-server's commands.

        (:func:`bench.redis_server.window_commands`: the publishes among them.)
        """
        return nodes_window(before, after, wall_s)
