"""The store's group-commit writer: one copy, for every backend (docs/protocol.md §9).

A put is a synchronous enqueue into the pending :class:`Batch`; one writer
task commits what is pending in batches, one transaction each (a group
commit). A backend only says how a batch is applied (:meth:`GroupCommit._apply`)
and how it reads; the rules below are the same whatever holds the data:

- The writer wakes when something is pending, gathers for up to
  ``flush_interval_s`` (0, the default: not at all; what comes while a commit
  runs makes the next batch), and an event, which clients wait for, or a
  caller waiting for a commit, or ``max_batch`` pending puts, cuts the
  gathering short.
- Every put takes a ticket (:meth:`GroupCommit.ticket`); once a commit lands,
  :attr:`GroupCommit.committed` covers it and ``on_commit`` is called with it,
  in the Trio thread: that is when the gateway lets the events of the batch
  reach clients. Nothing is ever reported committed that is not.
- A failed write never loses the batch. A failure (:class:`StoreError` from
  ``_apply``) is reported to ``on_write_error``, held, and retried with
  backoff (:data:`RETRY_FIRST_S` doubling to :data:`RETRY_MAX_S`) until it
  lands; everything after it waits, in order. While writes fail,
  :attr:`GroupCommit.failure` says why (``/readyz`` answers 503 meanwhile); the
  first write that lands after failed ones is logged once
  (``store_reconnected``: how many attempts failed, over how long), so an
  outage has an end in the log as well as a beginning. Rows the backend
  refused on their own (``_apply``'s answer) cost only themselves: each is
  reported, the rest of the batch landed.
- :class:`WritesRefused` from ``_apply`` is for good (the SQLite store's file
  was deleted or replaced): it is logged once under its ``event`` name, the
  store refuses every write from then on (:attr:`GroupCommit.refusing`), and
  what is pending stays there, never committed. ``on_refusing`` is told, once,
  and whoever waits for a commit (:meth:`GroupCommit.wait_committed`) is
  answered at once with the refusal: nothing they wait for will ever land.
- An event whose type is in ``webhook_routes`` is put in the webhook outbox
  (gateway.store.outbox) in the same batch, hence the same transaction, one
  entry per webhook; ``on_outbox`` is told after a commit that put some.
- A closing store keeps retrying what is left for :data:`CLOSE_RETRY_S`, then
  gives up: no write is tried from then on (the writer task's retries end
  too, its batch counted with the rest), and the close says how many writes
  were not made durable. Puts after close raise: a write that cannot land
  must be loud.
- A backend that writes in a worker thread may take the answer of a batch
  nobody waits for quietly (:meth:`GroupCommit._answer_for`,
  gateway.store.answer): a batch of streaming messages' checkpoints alone
  lands without waking an idle loop; its answer is taken when the loop is
  awake anyway, at the next put, a wait for a commit or for the writer, or a
  close. A batch with events or webhook deliveries (:attr:`Batch.wanted`),
  one written while someone waits, a failed one and its retries (:attr:`failure`
  holds until one lands) are answered at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar

import trio

from gateway.errors import StoreError
from gateway.logs import event
from gateway.store.answer import QuietAnswer
from gateway.store.base import SessionRecord, StoredEvent, StoredMessage
from gateway.store.outbox import Routes

log = logging.getLogger("gateway.store")

RETRY_FIRST_S = 0.05  # a failed write is retried after this, doubling...
RETRY_MAX_S = 5.0  # ...up to this
CLOSE_RETRY_S = 10.0  # how long a closing store keeps retrying what is left


class WritesRefused(StoreError):
    """The store refuses every write from now on; ``event`` is the log line's name."""

    event: ClassVar[str] = "store_writes_refused"


class _GaveUp(StoreError):
    """The store was closing and its writes kept failing for :data:`CLOSE_RETRY_S`."""


class Batch:
    """The writes enqueued since the writer last took a batch, as rows in enqueue order.

    A backend's batch adds its row lists (:meth:`rows`) and how a record
    becomes a row, encoded when enqueued: msgspec Structs are mutable, and
    what is stored must be what the caller had at put time.
    """

    def __init__(self) -> None:
        self.ceiling: int | None = None  # the event id ceiling to raise the store's to
        self.size = 0  # puts in the batch
        self.outbox = 0  # webhook deliveries in the batch (gateway.store.outbox)
        self.wanted = False  # someone waits for it: events (clients), deliveries (webhooks)

    def rows(self) -> tuple[list[Any], ...]:
        """Every row list of the batch, in a fixed order (:meth:`then` joins them)."""
        return ()

    def add_session(self, rec: SessionRecord) -> None:
        raise NotImplementedError

    def add_message(self, msg: StoredMessage) -> int:
        """Add ``msg``; its encoded size in bytes."""
        raise NotImplementedError

    def add_event(self, ev: StoredEvent) -> None:
        raise NotImplementedError

    def add_outbox(self, hook: str, ev: StoredEvent, data: bytes | None = None) -> None:
        """A delivery of ``ev`` to webhook ``hook``, in the same write as the event
        (``data``: the delivery's own body, an A2A push notification's; else the event's)."""
        raise NotImplementedError

    def raise_ceiling(self, ceiling: int) -> None:
        self.ceiling = ceiling if self.ceiling is None else max(self.ceiling, ceiling)
        self.size += 1

    def then(self, later: Self) -> Self:
        """This batch followed by ``later`` (a failed batch goes before what came next)."""
        for mine, theirs in zip(self.rows(), later.rows(), strict=True):
            mine += theirs
        if later.ceiling is not None:
            self.raise_ceiling(later.ceiling)
            self.size -= 1  # counted in later.size
        self.size += later.size
        self.outbox += later.outbox
        self.wanted |= later.wanted
        return self


B = TypeVar("B", bound=Batch)


class GroupCommit(Generic[B]):
    """The writer half of a store: pending batch, tickets, commits, retries (module docstring).

    A backend subclasses it, names itself in ``label`` (``store '<path>'``)
    and in the log fields ``where`` (``{"path": ...}``), and implements
    :meth:`_new_batch` and :meth:`_apply`.
    """

    def __init__(
        self, label: str, where: dict[str, str], *, flush_interval_s: float, max_batch: int
    ) -> None:
        self._label = label
        self._log_fields: dict[str, Any] = dict(where)  # names the store in a log line
        self._flush_interval_s = flush_interval_s
        self._max_batch = max_batch
        self._pending = self._new_batch()
        self._enqueued = 0  # tickets handed out: one per put
        self.committed = 0  # every ticket up to this one is durable
        self.on_commit: Callable[[int], None] | None = None
        self.on_write_error: Callable[[StoreError], None] | None = None
        self.on_flush: Callable[[float, int], None] | None = None  # (seconds, rows) per commit
        self.on_refusing: Callable[[StoreError], None] | None = None  # once, when it refuses
        self.on_fenced: Callable[[str], None] | None = None  # writes of a session dropped (Redis)
        # Webhooks (gateway.store.outbox): which events also go to the outbox, and
        # who is told once deliveries are committed (the delivery loop).
        self.webhook_routes: Routes = {}
        self.on_outbox: Callable[[], None] | None = None
        self.failure: StoreError | None = None  # while writes fail: the last failure
        self.refusing: StoreError | None = None  # for good (WritesRefused)
        self._failing_since: float | None = None  # when the writes began to fail (Trio's clock)
        self._failed_writes = 0  # failed attempts since then
        self._committed_event = trio.Event()  # set and replaced at each commit
        self._write_lock = trio.Lock()  # one batch in flight at a time (taken by _writer())
        self._wanting = 0  # tasks waiting for a commit or for the writer
        self._in_flight: QuietAnswer[Any] | None = None  # a write answered quietly, if any
        self._answered_at: float | None = None  # when it was (perf_counter), for on_flush
        self._wakeup = trio.Event()  # set: something is pending, or close was asked
        self._batch_ready = trio.Event()  # set: stop gathering, write now
        self._closing = False
        self._given_up = trio.Event()  # closing, and past CLOSE_RETRY_S: no write is tried
        self._closed = trio.Event()

    # --- what a backend provides ---------------------------------------------

    def _new_batch(self) -> B:
        raise NotImplementedError

    async def _apply(self, batch: B) -> list[str]:
        """Apply ``batch`` as one transaction; the rows refused on their own (a line each).

        Runs shielded: once sent, a write runs to its answer.

        Raises:
            StoreError: nothing of the batch is applied (or, its answer lost,
                all of it, and applying it again changes nothing): retried.
            WritesRefused: the store takes no write from now on.
        """
        raise NotImplementedError

    # --- the writer task -----------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            if self._flush_interval_s > 0:
                with trio.move_on_after(self._flush_interval_s):
                    await self._batch_ready.wait()
            # Only the writer re-arms its events, and only here, right before it
            # takes the batch: a put or close from now on sets the new ones. (A
            # put while this round waits for the lock is taken by this round and
            # costs one empty round later, never a lost wakeup.)
            self._wakeup, self._batch_ready = trio.Event(), trio.Event()
            # Once close was asked no put is accepted, so a write that starts
            # after that leaves nothing behind.
            closing = self._closing
            try:
                await self._write_pending()
            except _GaveUp:
                return  # the close counts what is left
            except StoreError:
                if self.refusing is None:
                    raise
                # Refusing for good: what is pending stays there, never committed.
            if closing:
                return

    async def _close_writer(self, release: Callable[[], Awaitable[None]], *, drain: bool) -> None:
        """Stop accepting, write what is left (``drain``), then ``release`` the backend.

        Shielded: shutdown usually happens in a scope that is already
        cancelled, and the writer task may be gone. A second caller waits for
        the first.
        """
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        self._signal()
        with trio.CancelScope(shield=True):
            try:
                if drain and self.refusing is None:  # refusing: nothing lands, no retrying
                    with trio.move_on_after(CLOSE_RETRY_S):
                        await self._write_pending()
                # No write is tried from now on; one in flight (the writer task's,
                # retrying) puts its batch back at its next attempt, and is waited for.
                self._given_up.set()
                self._committed_event.set()  # the waiters learn it now (wait_committed)
                self._committed_event = trio.Event()
                async with self._writer():
                    left = self._pending.size
                if drain and left and self.refusing is not None:
                    raise StoreError(f"{self.refusing}; {left} writes were not made durable")
                if drain and left:
                    raise StoreError(
                        f"{self._label}: {left} writes could not be"
                        f" made durable within {CLOSE_RETRY_S:g} s of closing"
                    )
            finally:
                await release()
                self._closed.set()

    # --- puts and tickets ----------------------------------------------------

    def _enqueue(self, add: Callable[[B], Any]) -> Any:
        """Put one write into the pending batch (``add`` puts it there); its answer."""
        if self._closing:
            raise StoreError(f"{self._label} is closed")
        answer = add(self._pending)
        self._enqueued += 1
        self._signal()
        return answer

    def put_session(self, rec: SessionRecord) -> None:
        self._enqueue(lambda batch: batch.add_session(rec))

    def put_message(self, msg: StoredMessage) -> int:
        size: int = self._enqueue(lambda batch: batch.add_message(msg))
        return size

    def put_event(self, ev: StoredEvent, pushes: Sequence[tuple[str, bytes]] = ()) -> None:
        hooks = self.webhook_routes.get(ev.type) if self.webhook_routes else None
        if hooks is None and not pushes:
            self._enqueue(lambda batch: batch.add_event(ev))
        else:

            def add(batch: B) -> None:
                batch.add_event(ev)
                for hook in hooks or ():  # the same batch, so the same transaction (store.outbox)
                    batch.add_outbox(hook, ev)
                for hook, data in pushes:  # A2A push notifications (docs/doors/a2a.md)
                    batch.add_outbox(hook, ev, data)

            self._enqueue(add)
        self._pending.wanted = True  # clients wait for it: answered at once...
        self._batch_ready.set()  # ...and no gathering

    def put_pushes(self, ev: StoredEvent, pushes: Sequence[tuple[str, bytes]]) -> None:
        """``pushes`` in the webhook outbox, made of streaming-only event ``ev`` (not stored:
        its ``data`` is not read), as :meth:`put_event` puts a catalog event's."""

        def add(batch: B) -> None:
            for hook, data in pushes:
                batch.add_outbox(hook, ev, data)

        self._enqueue(add)
        self._pending.wanted = True  # the deliveries wait for it

    def ticket(self) -> int:
        """The ticket of the last put: durable once :attr:`committed` reaches it."""
        return self._enqueued

    async def wait_committed(self, ticket: int) -> None:
        """Return once every put up to ``ticket`` is durable (the writer does the work).

        Raises:
            StoreError: :attr:`refusing`, at once, should the store refuse
                writes for good before it is; or the store closed and gave
                up on it (module docstring).
        """
        self._wanting += 1
        try:
            while self.committed < ticket:
                if self.refusing is not None:
                    raise self.refusing
                if self._given_up.is_set():
                    raise _GaveUp(f"{self._label} closed before the write was made durable")
                self._batch_ready.set()  # no gathering: someone is waiting
                self._hurry()
                await self._committed_event.wait()
        finally:
            self._wanting -= 1

    async def flush(self) -> None:
        # Whoever held the lock before us has finished its batch; we take the rest.
        self._wanting += 1  # the caller waits for what is written: answered at once
        try:
            await self._write_pending()
        finally:
            self._wanting -= 1

    def _signal(self) -> None:
        """Wake the writer for what is pending now: the one place its events are set.

        A write in flight answered quietly is asked for: what is pending goes next.
        """
        if self._closing or self._pending.size:
            self._wakeup.set()
            self._hurry()
        if self._closing or self._pending.size >= self._max_batch:
            self._batch_ready.set()

    def _hurry(self) -> None:
        if self._in_flight is not None:
            self._in_flight.hurry()

    @contextlib.asynccontextmanager
    async def _writer(self) -> AsyncIterator[None]:
        """Hold the write connection: one batch (or backend transaction) at a time.

        Whoever waits for it wants the write in flight answered now.
        """
        self._wanting += 1
        try:
            self._hurry()
            await self._write_lock.acquire()
        finally:
            self._wanting -= 1
        try:
            yield
        finally:
            self._write_lock.release()

    @contextlib.contextmanager
    def _answer_for(self, batch: B) -> Iterator[QuietAnswer[Any]]:
        """The answer of ``batch``'s write in a thread: quiet unless wanted (module docstring)."""
        wanted = (
            batch.wanted
            or self.failure is not None  # a retry: /readyz says 503 until one lands
            or self._wanting > 0
            or self._closing
            or self._pending.size > 0
        )
        answer: QuietAnswer[Any] = QuietAnswer(urgent=wanted)
        self._in_flight = answer
        try:
            yield answer
        finally:
            self._in_flight = None
            self._answered_at = answer.answered_at

    def _check_writable(self) -> None:
        if self.refusing is not None:
            raise self.refusing

    # --- the commit ----------------------------------------------------------

    async def _write_pending(self) -> None:
        """Take everything pending and write it; return once it is durable.

        A failure is retried for as long as the caller's scope lets it; if
        the caller is cancelled first, the batch goes back in front of what
        is pending, never lost.
        """
        async with self._writer():
            self._check_writable()
            if self._given_up.is_set():
                raise _GaveUp(f"{self._label} is closed")
            batch, self._pending = self._pending, self._new_batch()
            ticket = self._enqueued
            if batch.size:
                started = time.perf_counter()  # real time: the work is the backend's, not Trio's
                self._answered_at = None
                try:
                    await self._write_with_retries(batch)
                except BaseException:
                    self._pending = batch.then(self._pending)
                    raise
                if self.on_flush is not None:  # to its answer, not to when it was taken
                    ended = self._answered_at or time.perf_counter()
                    self.on_flush(ended - started, batch.size)
            if ticket > self.committed:
                self.committed = ticket
                self._committed_event.set()
                self._committed_event = trio.Event()
        on_commit = self.on_commit
        if on_commit is not None:
            on_commit(self.committed)
        if batch.outbox and self.on_outbox is not None:  # deliveries owed, durable now
            self.on_outbox()

    async def _write_with_retries(self, batch: B) -> None:
        """Apply ``batch``, retrying until it lands (module docstring).

        Raises:
            WritesRefused: the store refuses every write from now on, this one included.
        """
        delay = RETRY_FIRST_S
        while True:
            try:
                with trio.CancelScope(shield=True):  # once sent, a write runs to its answer
                    refused = await self._apply(batch)
            except WritesRefused as exc:
                self._refuse(exc)
                raise
            except StoreError as exc:  # anything else: held, and retried
                self._failing(exc)
                self._report(exc)
            else:
                self._writing_again()
                for what in refused:
                    self._report(StoreError(f"{self._label} refused {what}; it was skipped"))
                return
            # Cancellable: the caller decides how long to insist, and a close for all.
            with trio.move_on_after(delay):
                await self._given_up.wait()
            if self._given_up.is_set():
                raise _GaveUp(f"{self._label}: closed while its writes failed")
            delay = min(delay * 2, RETRY_MAX_S)

    def _refuse(self, exc: WritesRefused) -> None:
        """No write from now on (module docstring), said once."""
        if self.refusing is not None:
            return
        self.refusing = self.failure = exc
        event(
            log, logging.ERROR, exc.event,
            f"{exc}; requests that write get 503 store_unavailable, /readyz 503",
            error=str(exc), **self._log_fields,
        )  # fmt: skip
        if self.on_refusing is not None:
            self.on_refusing(exc)
        self._committed_event.set()  # the waiters learn it now (wait_committed), not at a timeout
        self._committed_event = trio.Event()

    def _failing(self, exc: StoreError) -> None:
        """A write attempt failed: :attr:`failure` says so until one lands."""
        if self._failing_since is None:
            self._failing_since = trio.current_time()
        self._failed_writes += 1
        self.failure = exc

    def _writing_again(self) -> None:
        """A write landed: after failed ones, said once, with how long it failed."""
        if self._failing_since is None:
            return
        outage_ms = round((trio.current_time() - self._failing_since) * 1000)
        attempts, self._failed_writes, self._failing_since = self._failed_writes, 0, None
        self.failure = None
        event(
            log, logging.INFO, "store_reconnected",
            f"{self._label}: writing again after {attempts} failed attempts"
            f" over {outage_ms / 1000:.1f} s",
            attempts=attempts, outage_ms=outage_ms,
        )  # fmt: skip

    def _report(self, exc: StoreError) -> None:
        if self.on_write_error is not None:
            self.on_write_error(exc)
