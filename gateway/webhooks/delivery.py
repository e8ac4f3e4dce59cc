"""The node's webhook delivery loop (docs/doors/webhooks.md): the outbox, POSTed, in order.

The store puts a delivery in its outbox in the same write as the event
(gateway.store.outbox); this loop, one task per node (``webhooks``), sends it:

- A *lane* is one webhook and one session: its deliveries go one at a time,
  in event order, the next only once the one before was accepted or dropped.
  Lanes run side by side (at most :data:`MAX_POSTS` POSTs at once per
  webhook, each its own), so a failing receiver or a slow session holds up
  only itself: a receiver that hangs on many sessions takes its own
  webhook's slots, never another's.
- An attempt is a POST of the event's wire JSON, signed
  (gateway.webhooks.signing), that must answer 2xx within ``timeout_s``.
  The answer's status is all that counts: its body is read (raw, never
  decoded, never kept) only when it says it holds at most
  :data:`ANSWER_BYTES` (its ``Content-Length``, or a 204), so that its
  connection serves the next POST; any other is never read, its connection
  closed: a receiver answering a huge or endless body costs no more than a
  small one. A
  failed attempt is retried after ``retry_first_s``, doubling up to
  ``retry_max_s``; after ``max_attempts`` the delivery is dropped and logged
  (``webhook_dropped``). Attempts are counted in memory: a restart gives a
  delivery its attempts anew.
- A delivery accepted (or dropped) is deleted from the outbox; should the
  daemon die between the answer and the delete, it is sent again after the
  restart: at least once, and ``webhook-id`` (the event id) lets a receiver
  drop the duplicate.
- A lane is delivered by one node at a time: the one holding its *claim*
  (``Store.outbox_claim``; on Redis a key that lapses after ``[store]
  lease_s`` unless renewed, gateway.store.redis.outbox; on SQLite every
  lane is the one node's). A node claims a lane before starting its task,
  renews its claims every third of the lease time, stops a lane whose claim
  it lost (or could not renew for a whole lease time), and releases a lane's
  claim when the lane is empty or the node stops. So when a node dies, a
  survivor takes its lanes over, from the delivery it had in flight: in
  order, at least once.
- The loop reads the outbox when the store commits deliveries
  (``Store.on_outbox``), when a lane ends, at start-up (what a previous
  process left) and every :data:`POLL_S` or half lease time, whichever is
  shorter, whatever happens (so a dead node's lanes are taken over within one
  and a half lease times of its death).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping

import httpx
import msgspec
import trio

from gateway.config import A2aConfig, Config, WebhookConfig
from gateway.errors import StoreError
from gateway.ids import format_event_id
from gateway.logs import event
from gateway.metrics import Metrics
from gateway.store.base import Store
from gateway.store.outbox import Lane, OutboxEntry, Routes
from gateway.webhooks import signing
from gateway.webhooks.a2a_push import HOOK_PREFIX, TOKEN_HEADER, PushDelivery, url_problem

log = logging.getLogger("gateway.webhooks")

MAX_POSTS = 32  # POSTs in flight at once per webhook, its lanes together
MAX_PUSH_POSTS = 16  # and A2A push notifications', apart (gateway.webhooks.a2a_push)
POLL_S = 10.0  # the outbox is read at least this often
PAGE = 100  # entries per read of a lane
STORE_RETRY_S = 1.0  # a failed outbox read or delete is tried again after this
ANSWER_BYTES = 4096  # a receiver's answer's body is read only if no longer (module docstring)
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=20)
"""The POST slots bound the connections (httpx's 100 would make webhooks wait on each other)."""
PUSH_LABEL = "a2a.push"  # the metrics' ``webhook`` of every A2A push lane (:func:`label`)


def routes(hooks: Mapping[str, WebhookConfig]) -> Routes:
    """Event type -> the webhooks sent it (what the store puts in its outbox)."""
    table: dict[str, tuple[str, ...]] = {}
    for name, hook in hooks.items():
        for type_ in hook.events:
            if name not in table.get(type_, ()):
                table[type_] = (*table.get(type_, ()), name)
    return table


class Deliveries:
    """The delivery loop of one node (module docstring); :meth:`run` is its task.

    Built with the node, before the store's first write: it tells the store
    which events go to the outbox (``webhook_routes``) and asks to be woken
    by the commits that put some there (``on_outbox``).
    """

    def __init__(
        self,
        store: Store,
        hooks: Mapping[str, WebhookConfig],
        metrics: Metrics,
        *,
        node_id: str,
        lease_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._lease_s = lease_s
        self._hooks = dict(hooks)
        self._keys = {name: signing.secret_key(hook.secret) for name, hook in hooks.items()}
        self._metrics = metrics
        self._transport = transport
        self._posts = {name: trio.CapacityLimiter(MAX_POSTS) for name in hooks}
        # A2A push notifications go where clients say: slots of their own, so a client's
        # receiver that hangs never holds up the operator's webhooks.
        self._push_posts = trio.CapacityLimiter(MAX_PUSH_POSTS)
        self._wake = trio.Event()
        self._running: dict[Lane, trio.CancelScope] = {}  # the lanes with a task (claimed)
        self._push: A2aConfig | None = None  # A2A push notifications: offer_push
        self._push_hook: WebhookConfig | None = None
        self._push_key = b""
        if self._hooks:
            store.webhook_routes = routes(self._hooks)
            store.on_outbox = self.wake

    @classmethod
    def of(cls, config: Config, store: Store, metrics: Metrics, node_id: str) -> Deliveries:
        """A node's loop: its ``[webhooks.NAME]``, and A2A's push notifications where
        ``[a2a] push_url_prefixes`` names any (owed ones too, from its start)."""
        loop = cls(store, config.webhooks, metrics, node_id=node_id, lease_s=config.store.lease_s)
        if config.a2a.push_url_prefixes:
            loop.offer_push(config.a2a)
        return loop

    def offer_push(self, push: A2aConfig) -> None:
        """Deliver A2A push notifications too (gateway.webhooks.a2a_push), before the
        store's first write: each as a webhook of ``push``'s policy, signed with its
        ``push_secret``, to the URL of its entry."""
        self._push = push
        self._push_hook = WebhookConfig(
            url=push.push_url_prefixes[0],
            events=(),
            secret=push.push_secret,
            timeout_s=push.push_timeout_s,
            max_attempts=push.push_max_attempts,
            retry_first_s=push.push_retry_first_s,
            retry_max_s=push.push_retry_max_s,
        )
        self._push_key = signing.secret_key(push.push_secret)
        self._store.on_outbox = self.wake

    def wake(self) -> None:
        """Read the outbox again soon (new deliveries were committed)."""
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with (
            httpx.AsyncClient(
                transport=self._transport, follow_redirects=False, limits=LIMITS
            ) as client,
            trio.open_nursery() as lanes,
        ):
            lanes.start_soon(self._keep_claims, name="webhook claims")
            task_status.started()
            while True:
                self._wake = trio.Event()
                try:
                    await self._dispatch(client, lanes)
                except StoreError as exc:
                    self._store_failed("be read", exc)
                    await trio.sleep(STORE_RETRY_S)
                    continue
                with trio.move_on_after(min(POLL_S, self._lease_s / 2)):
                    await self._wake.wait()

    async def _dispatch(self, client: httpx.AsyncClient, lanes: trio.Nursery) -> None:
        """Start a lane task for each lane pending that has none yet and that this node claims."""
        self._metrics.webhook_outbox.set(await self._store.outbox_depth())
        free = [lane for lane in await self._store.outbox_lanes() if lane not in self._running]
        claimed = await self._store.outbox_claim(free, self._node_id, self._ttl_ms)
        for lane in claimed:
            if lane not in self._running:
                self._running[lane] = scope = trio.CancelScope()
                lanes.start_soon(self._lane, client, lane, scope, name=f"webhook {lane[0]}")

    @property
    def _ttl_ms(self) -> int:
        return max(1, round(self._lease_s * 1000))

    async def _lane(self, client: httpx.AsyncClient, lane: Lane, scope: trio.CancelScope) -> None:
        """Deliver the lane's entries in order until none is left (read page by page).

        Each is deleted before the next is read, and a new task for the lane
        starts only once this one has ended, so none is sent twice by one
        process. The lane's claim is released at the end (another node may
        take it at once), and ``scope`` is cancelled should the claim be lost.
        """
        try:
            with scope:
                after = 0
                while page := await self._read_lane(lane, after):
                    for entry in page:
                        await self._deliver(client, entry)
                        await self._delete(entry)
                        after = entry.seq
        finally:
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(STORE_RETRY_S),
                contextlib.suppress(StoreError),  # it lapses on its own
            ):
                await self._store.outbox_release([lane], self._node_id)
            del self._running[lane]  # only now: a new task's claim is not the one released
            self._wake.set()  # anything committed for the lane meanwhile gets a new task

    async def _keep_claims(self) -> None:
        """Renew this node's claims every third of the lease time; stop the lanes it lost.

        A lane whose claim lapsed (another node may hold it now, or may have
        delivered past this node's place in the lane), or that could not be
        renewed for a whole lease time (the store away), is stopped; the
        next read of the outbox claims it afresh if it is free, from its
        lowest delivery.
        """
        renewed = trio.current_time()
        while True:
            await trio.sleep(self._lease_s / 3)
            held = list(self._running)
            try:
                kept = set(
                    await self._store.outbox_claim(held, self._node_id, self._ttl_ms, renew=True)
                )
            except StoreError as exc:
                self._store_failed("have its claims renewed", exc)
                if trio.current_time() - renewed >= self._lease_s:
                    kept = set()
                else:
                    continue
            renewed = trio.current_time()
            for lane in held:
                if lane not in kept and lane in self._running:
                    self._running[lane].cancel()

    async def _deliver(self, client: httpx.AsyncClient, entry: OutboxEntry) -> None:
        """Attempt ``entry`` until accepted, or dropped after ``max_attempts``."""
        target = self._target(entry)
        if isinstance(target, str):  # not (or no longer) to be sent
            self._dropped(entry, 0, target)
            return
        hook, url, key, body, extra = target
        delay = hook.retry_first_s
        for attempt in range(1, hook.max_attempts + 1):
            push = entry.hook.startswith(HOOK_PREFIX)
            async with self._push_posts if push else self._posts[entry.hook]:
                problem = await self._post(client, hook, entry, url, key, body, extra)
            if problem is None:
                self._metrics.webhook_deliveries.labels(label(entry.hook)).inc()
                return
            self._metrics.webhook_failures.labels(label(entry.hook)).inc()
            if attempt == hook.max_attempts:
                self._dropped(entry, attempt, problem)
                return
            event(
                log, logging.WARNING, "webhook_attempt_failed",
                f"webhook {entry.hook}: {format_event_id(entry.seq)} failed ({problem});"
                f" attempt {attempt} of {hook.max_attempts}, next in {delay:g} s",
                webhook=entry.hook, event_id=format_event_id(entry.seq),
                session_id=entry.session_id, attempt=attempt, error=problem,
            )  # fmt: skip
            await trio.sleep(delay)
            delay = min(delay * 2, hook.retry_max_s)

    def _target(
        self, entry: OutboxEntry
    ) -> tuple[WebhookConfig, str, bytes, bytes, dict[str, str]] | str:
        """Where ``entry`` goes: its policy, URL, signing key, body and extra headers (an
        A2A push notification's are its own: gateway.webhooks.a2a_push); or why it is not sent."""
        if entry.hook.startswith(HOOK_PREFIX):
            if self._push is None or self._push_hook is None:
                return "A2A push notifications are no longer offered"
            try:
                push = msgspec.json.decode(entry.data, type=PushDelivery)
            except msgspec.DecodeError:
                return "not an A2A push notification"
            if problem := url_problem(push.url, self._push.push_url_prefixes):
                return problem
            extra = {TOKEN_HEADER: push.token} if push.token else {}
            return self._push_hook, push.url, self._push_key, bytes(push.body), extra
        hook = self._hooks.get(entry.hook)
        if hook is None:  # its [webhooks.NAME] left the config since it was put there
            return "the webhook is no longer configured"
        return hook, hook.url, self._keys[entry.hook], entry.data, {}

    async def _post(
        self,
        client: httpx.AsyncClient,
        hook: WebhookConfig,
        entry: OutboxEntry,
        url: str,
        key: bytes,
        body: bytes,
        extra: dict[str, str],
    ) -> str | None:
        """One attempt: ``None`` if the receiver answered 2xx in time, else what went wrong."""
        msg_id = format_event_id(entry.seq)
        headers = signing.headers(key, msg_id, int(time.time()), body) | extra
        status: int | None = None
        try:
            with trio.fail_after(hook.timeout_s):
                async with client.stream(
                    "POST", url, content=body, headers=headers, timeout=hook.timeout_s
                ) as answer:
                    status = answer.status_code
                    await read_if_small(answer, ANSWER_BYTES)
        except (trio.TooSlowError, httpx.TimeoutException):
            if status is None:
                return f"no answer within {hook.timeout_s:g} s"
        except httpx.HTTPError as exc:
            if status is None:
                return f"{type(exc).__name__}: {exc}"
        assert status is not None  # the body's end (a timeout, a reset) does not change it
        if 200 <= status < 300:
            return None
        return f"HTTP {status}"

    def _dropped(self, entry: OutboxEntry, attempts: int, problem: str) -> None:
        self._metrics.webhook_dropped.labels(label(entry.hook)).inc()
        event(
            log, logging.ERROR, "webhook_dropped",
            f"webhook {entry.hook}: {format_event_id(entry.seq)} dropped after"
            f" {attempts} attempts: {problem}",
            webhook=entry.hook, event_id=format_event_id(entry.seq),
            session_id=entry.session_id, attempts=attempts, error=problem,
        )  # fmt: skip

    async def _read_lane(self, lane: Lane, after: int) -> list[OutboxEntry]:
        """The lane's next page, insisting while the store does not answer."""
        while True:
            try:
                return await self._store.outbox_lane(lane, after, PAGE)
            except StoreError as exc:
                self._store_failed("be read", exc)
            await trio.sleep(STORE_RETRY_S)

    async def _delete(self, entry: OutboxEntry) -> None:
        """Take ``entry`` out of the outbox, insisting while the store does not answer."""
        while True:
            try:
                await self._store.outbox_delete([entry])
                return
            except StoreError as exc:
                self._store_failed("be written", exc)
            await trio.sleep(STORE_RETRY_S)

    def _store_failed(self, what: str, exc: StoreError) -> None:
        event(
            log, logging.ERROR, "webhook_outbox_failed",
            f"webhooks: the outbox could not {what}: {exc}", error=str(exc),
        )  # fmt: skip


def label(hook: str) -> str:
    """The metrics' ``webhook`` label of a lane's hook (docs/operating.md, "Metrics"): its
    ``[webhooks.NAME]``, or :data:`PUSH_LABEL` for every A2A push notification (``a2a.{config
    id}``: a client names the id, one label each would grow without bound)."""
    return PUSH_LABEL if hook.startswith(HOOK_PREFIX) else hook


async def read_if_small(answer: httpx.Response, limit: int) -> bool:
    """Read ``answer``'s raw body to its end if it says it holds at most ``limit`` bytes.

    Whether it was read: one that says nothing of its length (chunked, or
    until the connection closes) or says more is never read, and closing the
    answer then closes its connection. Read to its end, never stopped in the
    middle (that would leave httpx's and httpcore's iterators half-run).
    """
    length = answer.headers.get("content-length", "")
    small = answer.status_code == 204 or (
        length.isascii() and length.isdecimal() and int(length) <= limit
    )
    if small:
        async for _ in answer.aiter_raw():  # h11 stops at Content-Length, whatever follows
            pass
    return small
