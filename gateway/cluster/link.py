"""The cluster link: operations to a session's owner, live batches to its watchers.

docs/reference.md "Command line" (any node serves any session; turns and cancels can
be sent to any node); the design is docs/scale-out.md. A node
whose store is Redis runs one :class:`Cluster`: its link to the other nodes of
the deployment, over Redis pub/sub on one connection of its own::

    cluster                   Cluster.run: the coredis client and the pub/sub connection
    ├── cluster-listener      what arrives: requests and replies for this node,
    │                         live batches of the session families it watches
    ├── cluster-publisher     sends the queued live batches, in order, pipelined
    └── cluster-request <id>  one per request being served for another node

Channels (under the store's prefix, ``gw:`` by default):

- ``gw:node:<node id>``: what is sent to one node: a :class:`Request` (an
  operation on a session whose lease it holds, :mod:`gateway.cluster.ops`: a
  turn, a cancel, a permission decision, feedback, a snapshot, a replay, its
  state...) or a :class:`Reply` (the operation's answer, or its refusal).
  A request sent to a channel nobody listens on (the node is dead) fails at
  once: ``PUBLISH`` answers how many received it.
- ``gw:live:{<root session id>}``: every batch the owner of a session family
  releases (after its commit: docs/protocol.md §9), published ONCE however many
  clients and nodes watch it (:class:`LiveBatch`), and only while some other
  node does (:meth:`Cluster.heard`). A node subscribes while some client of
  its own watches that family, and fans each batch out locally with the same
  shared frames as the owner.

Pub/sub delivers at most once: a subscriber whose connection drops misses what
was published meanwhile. Each family's batches carry a number that follows on
from the last one of the same owner; a watcher that sees a jump closes its
clients of that family (close ``relay_gap``, 1001), and they resume with
``since`` from the store, as on any reconnect. Requests are at most once too: a
request or reply lost is a timeout (503 ``session_owner_unreachable``); a turn
whose answer was lost may have started (a retry is then 409 ``turn_in_progress``).

Attach tokens live in Redis too (:class:`gateway.node.attach_tokens.RedisAttachTokens`,
through :meth:`Cluster.redis_call`): a token issued by one node is redeemed by
whichever node the client's WebSocket reaches.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import coredis
import msgspec
import trio
from coredis.exceptions import RedisError
from coredis.retry import NoRetryPolicy

from gateway.cluster.ops import Answer, Operation, Refusal
from gateway.errors import Refused, StoreError, first_leaf

log = logging.getLogger("gateway.cluster")

CONNECT_TIMEOUT_S = 2.0
START_TIMEOUT_S = 5.0  # the pub/sub connection must be up within this at start-up
RETRY_FIRST_S = 0.05  # a failed pub/sub connection is opened again after this, doubling...
RETRY_MAX_S = 5.0  # ...up to this
MAX_QUEUED_BATCHES = 10_000  # live batches waiting for the publisher; past it they are dropped

_TRANSIENT = (RedisError, OSError, TimeoutError, trio.TooSlowError)


class Request(msgspec.Struct, array_like=True, tag="q"):
    """An operation on a session, sent to the node holding its lease.

    ``op``: an :data:`~gateway.cluster.ops.Operation`, decoded by the owner
    once it has the request's id: one it cannot read is answered (refused),
    not dropped.
    """

    req_id: int
    reply_to: str  # the sender's node id
    session_id: str
    op: msgspec.Raw


class Reply(msgspec.Struct, array_like=True, tag="r"):
    """The owner's answer to one request (a :class:`~gateway.cluster.ops.Refusal` too)."""

    req_id: int
    answer: Answer


LiveEvent = tuple[int, str, str, str | None, int, bytes]
"""One event of a live batch: ``(seq, type, actor, turn_id, ts, data)``."""


class LiveBatch(msgspec.Struct, array_like=True, tag="b"):
    """One released batch of one session, as its owner emitted it.

    ``events``: ``(seq, type, actor, turn_id, ts, data)`` each, ``data`` the
    event's JSON exactly as the owner encoded it (the frame around it is
    rebuilt once per node, not per client).
    """

    node: str
    batch_no: int
    session_id: str
    events: list[LiveEvent]
    deleted: bool = False  # the session was deleted (after its last events): clients close


Message = Request | Reply | LiveBatch
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Message).decode
_decode_op = msgspec.msgpack.Decoder(Operation).decode

RequestHandler = Callable[[str, Operation], Awaitable[Answer]]
"""``handler(session_id, op)``: the answer; raises :class:`Refused` to refuse."""


class Cluster:
    """This node's link to the other nodes of its deployment (module docstring).

    Args:
        url: the Redis URL of the store (every node names the same one).
        prefix: the store's key prefix.
        node_id: this node (its lease holder id).
        on_request: serves a request from another node.
        on_live: takes a live batch of a watched family (``root`` session id, batch).
        on_gap: told each watched family whose batches may have been lost.
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        node_id: str,
        on_request: RequestHandler,
        on_live: Callable[[str, LiveBatch], None],
        on_gap: Callable[[str], None],
    ) -> None:
        self.node_id = node_id
        self._on_gap = on_gap
        self._url = url
        self._prefix = prefix
        self._on_request = on_request
        self._on_live = on_live
        self._client: coredis.Redis[bytes] | None = None
        self._pubsub: Any = None
        self._waiting: dict[int, tuple[trio.Event, list[Reply]]] = {}
        # (family root, audience epoch, LiveBatch) to publish
        self._queue: deque[tuple[str, int, bytes]] = deque()
        self.audience: dict[str, int] = {}  # families other nodes watch -> epoch (heard)
        self._epoch = 0
        self._queued = trio.Event()
        self._emptied = trio.Event()  # set and replaced each time the publisher empties the queue
        self._batch_no: dict[str, int] = {}  # family root -> the last batch number published
        self.watched: dict[str, None] = {}  # family roots this node is subscribed to
        self._locks: dict[str, trio.Lock] = {}  # family roots being (un)subscribed
        self._nursery: trio.Nursery | None = None
        self.published = 0  # batches PUBLISHed (bench and tests)
        self.dropped = 0  # batches dropped: the publisher could not keep up

    # --- channels -------------------------------------------------------------------

    def node_channel(self, node_id: str) -> str:
        return f"{self._prefix}node:{node_id}"

    def live_channel(self, root_id: str) -> str:
        return f"{self._prefix}live:{{{root_id}}}"

    # --- lifecycle ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the client and the pub/sub connection; serve until cancelled.

        Raises:
            StoreError: Redis did not take the subscription within
                :data:`START_TIMEOUT_S` at start-up (one line, as for the store).
        """
        client: coredis.Redis[bytes] = coredis.Redis.from_url(
            self._url, connect_timeout=CONNECT_TIMEOUT_S
        )
        async with client, trio.open_nursery() as nursery:
            self._client, self._nursery = client, nursery
            try:
                with trio.fail_after(START_TIMEOUT_S):
                    await nursery.start(self._keep_pubsub, client, name="cluster-listener")
            except trio.TooSlowError:
                raise StoreError(
                    f"cluster: Redis did not take this node's subscription within"
                    f" {START_TIMEOUT_S:g} s"
                ) from None
            nursery.start_soon(self._publisher, name="cluster-publisher")
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._client = self._pubsub = self._nursery = None
                for done, _ in self._waiting.values():
                    done.set()  # callers see no reply: unreachable

    async def _keep_pubsub(
        self, client: coredis.Redis[bytes], *, task_status: trio.TaskStatus[None]
    ) -> None:
        """The ``cluster-listener``: the pub/sub connection, opened again whenever it fails.

        A connection that fails is opened again here (not by coredis), with
        backoff, subscribed to this node's channel and every watched family.
        What was published meanwhile is lost: the clients of every watched
        family are told (``on_gap``) and resume.
        """
        delay = RETRY_FIRST_S
        started = False
        while True:
            channels = [self.node_channel(self.node_id)]
            channels += [self.live_channel(root) for root in self.watched]
            try:
                async with client.pubsub(
                    ignore_subscribe_messages=True,
                    channels=channels,
                    max_idle_seconds=5,
                    # Not coredis's own reconnection: it would subscribe again
                    # silently, and a batch lost meanwhile would go unnoticed.
                    retry_policy=NoRetryPolicy(),
                ) as pubsub:
                    self._pubsub = pubsub
                    if not started:
                        started = True
                        task_status.started()
                    else:
                        log.warning("cluster: the pub/sub connection to Redis is back")
                        for root in list(self.watched):
                            self._on_gap(root)
                    delay = RETRY_FIRST_S
                    await self._listen(pubsub)
            except* anyio.ClosedResourceError:
                pass  # coredis 6.9, cancelled: it unsubscribes on a connection already closed
            except* Exception as group:
                log.warning(
                    "cluster: the pub/sub connection to Redis failed: %s; reconnecting",
                    first_leaf(group),
                )
            self._pubsub = None
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _listen(self, pubsub: Any) -> None:
        """Dispatch what arrives (never raises for one bad message)."""
        while True:
            message = await pubsub.get_message()
            if message is None or message.get("type") != "message":
                continue
            data = message["data"]
            try:
                decoded = _decode(data)
            except msgspec.DecodeError:
                log.warning("cluster: dropped an undecodable message on %r", message["channel"])
                continue
            if isinstance(decoded, LiveBatch):
                if decoded.node == self.node_id:
                    continue  # its own batch (this node took the lease while watching)
                channel = message["channel"]
                root = channel.decode()[len(self._prefix) + 6 : -1]  # live:{<root>}
                try:
                    self._on_live(root, decoded)
                except Exception:
                    log.exception("cluster: a live batch of %s failed to fan out", root)
            elif isinstance(decoded, Reply):
                waiting = self._waiting.get(decoded.req_id)
                if waiting is not None:
                    waiting[1].append(decoded)
                    waiting[0].set()
            elif self._nursery is not None:
                self._nursery.start_soon(
                    self._serve, decoded, name=f"cluster-request {decoded.session_id}"
                )

    # --- requests ---------------------------------------------------------------------

    async def call(
        self, node_id: str, session_id: str, op: Operation, wait_s: float, retry_s: float
    ) -> Answer:
        """Run ``op`` on ``node_id`` (the session's owner) and return its answer.

        Raises:
            Refused: the owner's own refusal (its code, message and
                ``Retry-After``, exactly as it would have answered);
                ``session_owner_unreachable`` when it does not answer within
                ``wait_s`` (or nobody listens on its channel: it is dead), with
                ``Retry-After: retry_s`` (the lease time: its lease lapses by then).
        """
        # Random, not counted: a reply is matched by its id alone, and no other
        # request (another node's, a stale one, a forged one) may share it.
        req_id = secrets.randbits(63)
        while req_id in self._waiting:
            req_id = secrets.randbits(63)
        done = trio.Event()
        replies: list[Reply] = []
        self._waiting[req_id] = (done, replies)
        try:
            request = _encode(Request(req_id, self.node_id, session_id, msgspec.Raw(_encode(op))))
            receivers = await self.redis_call(
                lambda c: c.publish(self.node_channel(node_id), request)
            )
            if receivers:
                with trio.move_on_after(wait_s):
                    await done.wait()
        finally:
            del self._waiting[req_id]
        if not replies:
            wait = max(1, math.ceil(retry_s))
            raise Refused(
                "session_owner_unreachable",
                f"the node running session {session_id} did not answer; retry in {wait} s"
                " (if it died, another node takes the session once its lease lapses)",
                retry_after_s=wait,
            )
        answer = replies[0].answer
        if isinstance(answer, Refusal):
            raise Refused(answer.code, answer.message, retry_after_s=answer.retry_after_s)
        return answer

    async def _serve(self, request: Request) -> None:
        answer: Answer
        try:
            answer = await self._on_request(request.session_id, _decode_op(request.op))
        except Refused as exc:
            answer = Refusal(exc.code, exc.message, exc.retry_after_s)
        except Exception as exc:  # a bug serving it: the caller is refused, this node goes on
            log.exception("cluster: serving a request on %s failed", request.session_id)
            answer = Refusal("session_owner_unreachable", str(exc))
        reply = Reply(request.req_id, answer)
        with contextlib.suppress(StoreError):  # else the caller times out
            await self.redis_call(
                lambda c: c.publish(self.node_channel(request.reply_to), _encode(reply))
            )

    async def redis_call(self, command: Callable[[coredis.Redis[bytes]], Awaitable[Any]]) -> Any:
        """Run ``command`` on this node's Redis client.

        Raises:
            StoreError: not connected, or Redis did not answer.
        """
        client = self._client
        if client is None:
            raise StoreError("cluster: not connected to Redis")
        try:
            return await command(client)
        except _TRANSIENT as exc:
            raise StoreError(f"cluster: Redis: {exc or type(exc).__name__}") from exc

    # --- live batches -------------------------------------------------------------------

    def heard(self, root_id: str) -> None:
        """Another node has clients of this family: publish its batches from now on.

        Said by a replica before it takes its cut (the ``watch``, ``snapshot``
        and ``replay`` operations), and by a node taking a family over (the
        nodes that watched its previous owner still do). Publishing stops by
        itself once a ``PUBLISH`` queued after the last of these reaches nobody.
        """
        self._epoch += 1
        self.audience[root_id] = self._epoch

    def has_audience(self, root_id: str) -> bool:
        """Whether some node said it watches the family, and no batch since reached nobody."""
        return root_id in self.audience

    def forget(self, root_id: str) -> None:
        """The family left this node's memory: its numbering and its subscription go.

        Published again later, it is numbered from 1: a node that watches it
        again starts afresh (gateway.node.placement).
        """
        self._batch_no.pop(root_id, None)
        self.audience.pop(root_id, None)
        self.unwatch(root_id)

    def publish(
        self, root_id: str, session_id: str, events: list[LiveEvent], *, deleted: bool = False
    ) -> None:
        """Queue one released batch of a family for the other nodes (never blocks).

        Only for a family some other node watches (:meth:`heard`): a batch
        nobody would receive costs nothing. Numbered per family; a batch the
        publisher has no room for is dropped and its number skipped, so that
        watchers see the gap (module docstring). ``deleted``: no events, but the
        notice that the session was deleted (docs/protocol.md §13), after its last batch.
        """
        epoch = self.audience.get(root_id)
        if epoch is None:
            return
        no = self._batch_no[root_id] = self._batch_no.get(root_id, 0) + 1
        if len(self._queue) >= MAX_QUEUED_BATCHES:
            self.dropped += 1
            return
        batch = LiveBatch(self.node_id, no, session_id, events, deleted)
        self._queue.append((root_id, epoch, _encode(batch)))
        self._queued.set()

    async def _publisher(self) -> None:
        """The ``cluster-publisher``: everything queued, in order, one pipeline per round.

        A ``PUBLISH`` that reached no node ends the family's audience, unless
        a node said it watches since that batch was queued (its epoch).
        """
        delay = 0.05
        while True:
            await self._queued.wait()
            self._queued = trio.Event()
            while self._queue:
                batch = list(self._queue)
                sends = [(self.live_channel(root).encode(), data) for root, _, data in batch]
                try:
                    reached = await self.redis_call(lambda c, b=sends: _publish_all(c, b))  # type: ignore[misc]
                except StoreError as exc:
                    log.warning("cluster: publishing live batches failed: %s (retrying)", exc)
                    await trio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay = 0.05
                for (root, epoch, _), receivers in zip(batch, reached, strict=True):
                    self._queue.popleft()
                    if not receivers and self.audience.get(root) == epoch:
                        del self.audience[root]
                self.published += len(batch)
            self._emptied.set()
            self._emptied = trio.Event()

    async def flush(self) -> None:
        """Return once every live batch queued so far is published (the caller bounds the wait).

        A node that stops cleanly publishes its last batches (the closing of
        its turns, its clients' goodbyes) before it gives its leases up, so the
        other nodes' clients get them live (docs/protocol.md §9).
        """
        while self._queue and self._nursery is not None:
            await self._emptied.wait()

    async def watch(self, root_id: str) -> None:
        """Receive the family's live batches from now on (returns once Redis confirmed).

        Raises:
            StoreError: Redis did not confirm the subscription.
        """
        async with self._family_lock(root_id):
            if root_id in self.watched:
                return
            pubsub = self._pubsub
            if pubsub is None:
                raise StoreError("cluster: not connected to Redis")
            try:
                await pubsub.subscribe(self.live_channel(root_id))
            except _TRANSIENT as exc:
                raise StoreError(f"cluster: watching {root_id} failed: {exc}") from exc
            self.watched[root_id] = None

    def unwatch(self, root_id: str) -> None:
        """Stop receiving the family's batches (no client of it is left here)."""
        if root_id in self.watched and self._nursery is not None:
            del self.watched[root_id]
            self._nursery.start_soon(self._unsubscribe, root_id, name="cluster-unwatch")

    async def _unsubscribe(self, root_id: str) -> None:
        async with self._family_lock(root_id):  # not across a watch of it
            pubsub = self._pubsub
            if pubsub is not None and root_id not in self.watched:
                with contextlib.suppress(*_TRANSIENT):  # what still comes is dropped again
                    await pubsub.unsubscribe(self.live_channel(root_id))

    @contextlib.asynccontextmanager
    async def _family_lock(self, root_id: str) -> AsyncIterator[None]:
        """One watch or unwatch of a family at a time (their Redis confirmations interleave)."""
        lock = self._locks.get(root_id)
        if lock is None:
            lock = self._locks[root_id] = trio.Lock()
        try:
            async with lock:
                yield
        finally:
            if not lock.statistics().tasks_waiting and not lock.locked():
                self._locks.pop(root_id, None)


async def _publish_all(
    client: coredis.Redis[bytes], batches: list[tuple[bytes, bytes]]
) -> list[int]:
    """``PUBLISH`` each, in one pipeline; how many nodes each reached."""
    async with client.pipeline(transaction=False) as pipe:
        answers = [pipe.publish(channel, data) for channel, data in batches]
    return [await answer for answer in answers]


__all__ = ["Cluster", "LiveBatch", "Reply", "Request"]
