"""The node as its parts see it: a module below them all, so that none imports the node.

:class:`gateway.node.node.Node` is made of its parts (gateway.node.registry,
placement, failover, recovery, operations) and hands each of them itself. A
part sees it as :class:`NodeCore`: exactly what the parts use of the node, and
of the other parts they reach through it (:class:`FailoverPart`,
:class:`PlacementPart`, :class:`RegistryPart`). So the import map is a tree:
the node imports its parts, the parts import this module, and no part names
the node, not even for the type checker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import trio

from gateway.node.attach_tokens import Tokens
from gateway.session.files import Files
from gateway.session.session import NodeServices, Session
from gateway.store.lease import LeaseKeeper, Taken
from gateway.tenancy import Limits
from gateway.tools.workspace import Workspaces

if TYPE_CHECKING:
    from gateway.cluster.link import Cluster  # coredis: imported only where used


class Connection(Protocol):
    """An open stream connection, as shutdown and a deletion see it.

    A WebSocket (gateway.doors.websocket.connection) or an SSE stream
    (gateway.doors.sse.events).
    """

    def request_close(self, code: str) -> None:
        """Close with the close named ``code`` (gateway.protocol.closes)."""
        ...

    @property
    def session(self) -> Session:
        """The session it streams."""
        ...

    @property
    def subscribed(self) -> bool:
        """Past its subscribe (``gateway_ws_connections_by_state``)."""
        ...

    @property
    def closing(self) -> str | None:
        """The name of the close decided for it, if any."""
        ...


class FailoverPart(Protocol):
    """The lease hand-over (gateway.node.failover), as placement and recovery use it."""

    @property
    def claiming(self) -> dict[str, trio.Event]:
        """Sessions whose lease a request (or a recovery pass) is taking, set once it is done."""
        ...

    async def claim(self, session: Session) -> None:
        """Take the session's lease if nobody holds it (every request for a session)."""
        ...

    async def ids_above(self, taken: Taken) -> None:
        """Issue the next ids above every id the lease's previous holder could have issued."""
        ...

    async def take_over(self, session: Session, taken: Taken | None) -> int:
        """Close the turns a session's family left in flight here, workers first; how many."""
        ...


class PlacementPart(Protocol):
    """Where sessions run (gateway.node.placement), as failover and operations use it."""

    def runs_here(self, session_id: str) -> bool:
        """Whether this node may run the session's turns (it holds the session's lease)."""
        ...

    def heard(self, root_id: str) -> None:
        """This node took a family over: the nodes that watched it still do."""
        ...

    def watched_elsewhere(self, root_id: str) -> bool:
        """Whether another node may have clients of the family (it is then not idle)."""
        ...

    def unloaded(self, root_id: str) -> None:
        """The family left this node's memory: what the placement kept for it goes too."""
        ...

    def relayed_up_to(self, root_id: str) -> int:
        """The highest id of the family that another node's live batches brought here (0: none)."""
        ...

    def joined(self, root_id: str, cut: int) -> None:
        """The family's only client here has everything up to ``cut`` (its snapshot's or
        replay's): :meth:`relayed_up_to` counts from there at least."""
        ...


class RegistryPart(Protocol):
    """The live sessions (gateway.node.registry), as the other parts load and start them."""

    @property
    def nursery(self) -> trio.Nursery:
        """The node's ``sessions`` nursery (a forwarded operation's task runs there too)."""
        ...

    async def load(self, session_id: str) -> Session | None:
        """A live session, loading a stored one (and its workers); ``None`` if unknown."""
        ...

    async def start(self, session: Session) -> None:
        """Run a session made here (a fork: gateway.node.forking) in the ``sessions`` nursery."""
        ...

    @property
    def deleting(self) -> set[str]:
        """Sessions being deleted: every request finds them unknown already."""
        ...

    async def loaded(self, session_id: str) -> None:
        """Wait for a load of the session in progress, if any."""
        ...

    def forget(self, session: Session) -> None:
        """End a deleted session's tasks for good and drop it from this node."""
        ...

    def busy(self, session: Session) -> bool:
        """Whether the session is being loaded or unloaded."""
        ...

    def unload(self, family: list[Session]) -> None:
        """A family leaves memory: unknown to requests (they wait), its tasks cancelled."""
        ...

    def unloaded(self, family: list[Session]) -> None:
        """The family is out of memory: a request for it loads it from the store now."""
        ...


class NodeCore(NodeServices, Protocol):
    """What the node's parts use of it: what its sessions use (:class:`NodeServices`: the
    registry makes them with it), its leases and sessions, and its other parts."""

    tokens: Tokens  # replaced by the Redis ones once the placement is clustered
    connections: set[Connection]  # open streams
    workspaces: Workspaces  # docs/protocol.md §15
    files: Files  # docs/protocol.md §2 "Files"
    cluster: Cluster | None  # the link to the other nodes, set by a clustered placement

    @property
    def limits(self) -> Limits:
        """The per-key limits (gateway.tenancy)."""
        ...

    @property
    def node_id(self) -> str:
        """This process, in the session leases."""
        ...

    @property
    def leases(self) -> LeaseKeeper: ...

    @property
    def sessions(self) -> dict[str, Session]: ...

    @property
    def registry(self) -> RegistryPart: ...

    @property
    def failover(self) -> FailoverPart: ...

    @property
    def placement(self) -> PlacementPart: ...

    async def get_session(self, session_id: str) -> Session | None:
        """A live session, loading a stored one and taking its lease if free; ``None``: unknown."""
        ...
