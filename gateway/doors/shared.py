"""One mapping per batch for every direct client in the same state (docs/performance.md "Doors").

A door that maps the session's events (the AI SDK's UI message stream,
AG-UI) holds state per response: the AI SDK mapper's open blocks, steps and
approvals, AG-UI's run, message ids and event positions. So its bytes for a
batch are not the filter's alone, as the native stream's are: they are the
batch's *and* the mapping's state's. Decided here: the clients of a filter
whose mappings are in the same state share one mapping while they are
written to straight from the fan-out (:class:`Share`): it maps each batch
once (the events, then the pause that follows a batch taken alone, as an
idle client's pump did), its bytes framed once, written to every one of
them. Clients whose states differ (another turn, another cursor, another
run) are in shares of their own; a share of one costs what a client's own
mapping did, without the task switch.

*The same state* is decided once, when a client becomes direct (its backlog
written): its reader pickled, byte for byte the same as a share's
(:func:`_state`); a reader that cannot be pickled shares with nobody.
Equal pickles are equal object graphs, so sharing can only ever be missed,
never wrong. A client leaving the direct path (a backlog, a close, its body
over) takes a copy of the share's reader, which is exactly its own state:
the share has mapped every batch written to it, and nothing else
(:meth:`Mapped.leave`); the last one takes the reader itself. A share whose
mapping has finished wakes its clients' pumps, which end their responses.

The shares live in the hub's group of their clients
(:attr:`gateway.session.hub.Group.shares`: one filter *and* one rollup
window, so clients whose batches differ never share a mapping), by the
door's kind (its reader's type and framing): nothing of it is the module's.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from gateway.session.hub import Emitted, FrameBatch


class Member(Protocol):
    """A one-way stream in a share (:class:`gateway.doors.oneway.OneWayQueue`)."""

    def wake(self) -> None:
        """Wake the stream's pump (its response has finished)."""
        ...


class SharedReader(Protocol):
    """The reader a share maps with (:class:`gateway.doors.oneway.Reader`)."""

    @property
    def finished(self) -> bool: ...

    def live(self, events: list[Emitted]) -> bytes: ...

    def replay(self, frames: bytes) -> bytes: ...

    def pause(self) -> bytes: ...

    def closed(self, code: str | None) -> bytes | None: ...


class Share:
    """One mapping for the direct clients of a filter in the same state (module docstring)."""

    __slots__ = ("encode", "frame", "kind", "members", "place", "reader")

    def __init__(
        self,
        reader: SharedReader,
        frame: Callable[[bytes], bytes],
        place: dict[Hashable, list[Any]],
        kind: Hashable,
    ) -> None:
        self.reader = reader
        self.frame = frame
        self.place = place  # the group's shares (gateway.session.hub.Group.shares)
        self.kind = kind
        self.members: dict[Member, None] = {}
        # The hub's encoder (gateway.session.hub.encoded): one entry per batch.
        self.encode: Callable[[FrameBatch], bytes] = self._encode

    def _encode(self, batch: FrameBatch) -> bytes:
        reader = self.reader
        data = reader.live(list(batch.events))
        data += reader.pause()
        if reader.finished:
            for member in self.members:
                member.wake()
        return self.frame(data) if data else b""


def _state(reader: SharedReader) -> bytes | None:
    try:
        return pickle.dumps(reader, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # (a reader holding what cannot be pickled shares with nobody)
        return None


class Mapped:
    """A stream's reader: its own, or its share's while it is direct (module docstring).

    What the pump reads with (a :class:`gateway.doors.oneway.Reader`).
    """

    __slots__ = ("frame", "inner", "share")

    def __init__(self, reader: SharedReader, frame: Callable[[bytes], bytes]) -> None:
        self.inner = reader
        self.frame = frame
        self.share: Share | None = None

    @property
    def finished(self) -> bool:
        return self.inner.finished

    def live(self, events: Any) -> bytes:
        return self.inner.live(events)

    def replay(self, frames: bytes) -> bytes:
        return self.inner.replay(frames)

    def pause(self) -> bytes:
        return self.inner.pause()

    def closed(self, code: str | None) -> bytes | None:
        return self.inner.closed(code)

    def join(
        self, member: Member, place: dict[Hashable, list[Any]], kind: Hashable
    ) -> Callable[[FrameBatch], bytes]:
        """``member`` becomes direct: into the share of its state among ``place``'s (its
        hub group's shares) of ``kind`` (its door's); its encoder."""
        shares: list[Share] = place.setdefault(kind, [])
        mine = _state(self.inner) if shares else None
        for share in shares:
            if mine is not None and _state(share.reader) == mine:
                break
        else:
            share = Share(self.inner, self.frame, place, kind)
            shares.append(share)
        share.members[member] = None
        self.inner = share.reader
        self.share = share
        return share.encode

    def leave(self, member: Member) -> None:
        """``member`` is no longer direct: its own reader again, in the share's state."""
        share = self.share
        if share is None:
            return
        self.share = None
        share.members.pop(member, None)
        if share.members:
            self.inner = copy.deepcopy(share.reader)
            return
        shares = share.place.get(share.kind, [])
        if share in shares:
            shares.remove(share)
        if not shares:
            share.place.pop(share.kind, None)
