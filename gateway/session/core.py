"""The session as its parts see it: a module below them, so that none imports the session.

:class:`gateway.session.session.Session` is made of its parts
(gateway.session.admission, runtime, tool_host) and hands each of them
itself. A part sees it as :class:`SessionCore`: exactly what the parts use of
the session, and of its node (:class:`NodeView`). So the import map is a
tree: the session imports its parts, the parts import this module, and no
part names the session, not even for the type checker.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gateway.config import Config
from gateway.protocol.events import Payload, StreamEvent
from gateway.session.call import CallStream
from gateway.session.hub import Emitted
from gateway.session.permissions import Permissions
from gateway.session.turn import Turn
from gateway.store.base import SessionRecord
from gateway.tenancy import Limits


class NodeView(Protocol):
    """What the session's parts use of its node."""

    @property
    def config(self) -> Config: ...

    @property
    def limits(self) -> Limits:
        """The per-key limits (a ``delegate`` worker's turn counts against its key)."""
        ...

    @property
    def shutting_down(self) -> bool:
        """Shutdown began: no new turns."""
        ...

    def runs_here(self, session_id: str) -> bool:
        """Whether this node may run the session's turns (it holds its lease)."""
        ...


class SessionCore(Protocol):
    """What a session's parts use of it: its node, its state, its emission and boundary."""

    @property
    def node(self) -> NodeView: ...

    @property
    def id(self) -> str: ...

    @property
    def record(self) -> SessionRecord: ...

    @property
    def depth(self) -> int:
        """0 for a root session, 1 for its workers, and so on (``max_delegate_depth``)."""
        ...

    @property
    def turn(self) -> Turn | None:
        """The turn in flight (the turn lock)."""
        ...

    @property
    def stored_bytes(self) -> int:
        """What the session holds in the store, in bytes (``max_session_mb``)."""
        ...

    @property
    def permissions(self) -> Permissions: ...

    @property
    def calls(self) -> CallStream: ...

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        """Emit a batch of events in the session's stream."""
        ...

    def stopped_here(self) -> None:
        """After a lost lease: a replica with nothing in flight, ready to run again."""
        ...

    def failed(self, component: str, exc: BaseException, turn_id: str | None = None) -> None:
        """Log and count a failure caught at the session's boundary."""
        ...
