"""A2A push notifications on the webhook outbox (docs/doors/a2a.md "Push notifications").

A task's push config (``CreateTaskPushNotificationConfig``) is kept in its
session's record (``SessionRecord.push_configs``: gone with the session), changed
where the session runs (gateway.node.push_configs) and read from the store. Each
event of the task's turn in :data:`PUSHED` is made into the task's A2A event (a
:class:`~gateway.doors.a2a.feed.TaskFeed` per config, in memory) when the
session emits it, and that ``StreamResponse`` is put in the webhook outbox in
the same write as the event (gateway.store.outbox), on the lane
``a2a.{config id}`` of the session: delivered by the node's webhook loop
(gateway.webhooks.delivery) in order, at least once, retried, signed, with
the config's token as ``X-A2A-Notification-Token``.

A client names the URL, so only the operator's prefixes are taken
(``[a2a] push_url_prefixes``; gateway.webhooks.a2a_push.url_problem), and the delivery loop
checks the URL again against the config of the day before each POST.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any, cast

import msgspec

from gateway.cluster import ops
from gateway.config import A2aConfig
from gateway.doors.a2a import shapes as a2
from gateway.doors.a2a.feed import TaskFeed
from gateway.doors.a2a.rpc import (
    INVALID_PARAMS,
    PUSH_NOT_SUPPORTED,
    TASK_NOT_FOUND,
    UNSUPPORTED_OPERATION,
    RpcFailure,
)
from gateway.doors.a2a.tasks import FoundTask, TaskNotFound, task_id
from gateway.ids import format_event_id
from gateway.logs import event
from gateway.node.node import Node
from gateway.protocol.events import Envelope, Payload, PermissionResolved
from gateway.session.hub import Emitted
from gateway.session.session import Session
from gateway.store.base import PushConfig
from gateway.webhooks.a2a_push import HOOK_PREFIX, PushDelivery, url_problem

PUSHED = frozenset(
    {
        "turn.started",
        "permission.requested",
        "permission.resolved",
        "message.complete",
        "tool.completed",
        "llm.call_failed",
        "turn.completed",
        "turn.cancelled",
    }
)
"""The events a task's notifications are made of: its states, each assistant message's
text once complete (never its deltas), its files."""
log = logging.getLogger("gateway.a2a")

MAX_TOKEN = 512
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOKEN = re.compile(r"[\x21-\x7e]*")  # visible ASCII: a header's value, nothing to inject


class Push:
    """The door's push notifications (module docstring): the configs' RPC methods, and
    :meth:`notes`, the node's ``push_notes`` (what an event puts in the outbox)."""

    def __init__(self, node: Node, config: A2aConfig, base: str) -> None:
        self.node = node
        self.config = config
        self.base = base  # what a file's URL begins with ([server] public_url)
        self.feeds: dict[tuple[str, str, str], TaskFeed] = {}  # (session, turn, config id)

    @property
    def offered(self) -> bool:
        return bool(self.config.push_url_prefixes)

    # --- the outbox's side -------------------------------------------------------------

    def notes(self, session: Session, em: Emitted, payload: Payload) -> list[tuple[str, bytes]]:
        """The deliveries made of one event of ``session`` (module docstring). Called in
        the session's emission: a failure here costs the notification only (logged
        ``a2a_push_failed``), never the event."""
        if em.turn_id is None or em.type not in PUSHED:
            return []
        try:
            return self._notes(session, em, payload)
        except Exception as exc:  # fault isolation: the session's step goes on
            event(
                log, logging.ERROR, "a2a_push_failed",
                f"a2a: no push notification of {em.type} of {session.id}: {exc!r}",
                session_id=session.id, event_id=format_event_id(em.seq), error=repr(exc),
            )  # fmt: skip
            return []

    def _notes(self, session: Session, em: Emitted, payload: Payload) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        actor: Any = em.actor
        envelope: Envelope[Any] = Envelope(
            format_event_id(em.seq), em.type, em.session_id, em.turn_id, em.ts, actor, payload
        )
        for config in session.record.push_configs:
            if config.turn_id != em.turn_id:
                continue
            key = (session.id, config.turn_id, config.id)
            feed = self.feeds.get(key) or self._feed(session, config, payload)
            self.feeds[key] = feed
            for _, response in feed.receive(envelope):
                body = msgspec.Raw(a2.encoder.encode(response))
                delivery = PushDelivery(config.url, config.token, body)
                out.append((HOOK_PREFIX + config.id, msgspec.json.encode(delivery)))
            if feed.finished:
                del self.feeds[key]
        return out

    def _feed(self, session: Session, config: PushConfig, first: Payload) -> TaskFeed:
        """A config's feed, from its first event on, knowing the task's state then: the
        turn running, its open approvals (and the one ``first`` resolves)."""
        tid = task_id(session.id, config.turn_id)
        feed = TaskFeed(tid, session.id, config.turn_id, 0, base=self.base)
        feed.opened = True  # no opening Task: one notification per event at most
        if session.turn is not None and session.turn.id == config.turn_id:
            feed.state, feed.started = "TASK_STATE_WORKING", True
            asked = [p.perm_id for p in session.pending_permissions()]
            if isinstance(first, PermissionResolved):
                asked.append(first.perm_id)
            for perm_id in asked:
                feed.state = "TASK_STATE_INPUT_REQUIRED"
                feed.pending[perm_id] = cast(Any, None)  # only its id is read
        return feed

    def forget(self, session_id: str) -> None:
        """Drop what is kept for a session's configs (its tasks ended here)."""
        for key in [k for k in self.feeds if k[0] == session_id]:
            del self.feeds[key]

    # --- the methods -------------------------------------------------------------------

    async def create(self, found: FoundTask, raw: dict[str, Any]) -> dict[str, Any]:
        """``CreateTaskPushNotificationConfig``: the config kept (docs/doors/a2a.md)."""
        if not (found.in_flight or found.queued):
            raise RpcFailure(
                UNSUPPORTED_OPERATION, f"task {found.id} has ended", "task_not_active", 409
            )
        op = self.checked(raw, found.turn_id)
        await self.put(found.session, op)
        return shown(found.id, PushConfig(op.id, op.turn_id, op.url, op.token))

    def checked(self, raw: Any, turn_id: str) -> ops.ChangePushConfig:
        """A client's ``TaskPushNotificationConfig`` as the change that keeps it, for the
        task of ``turn_id`` (docs/doors/a2a.md "Push notifications").

        Raises:
            RpcFailure: -32003 where push is not offered; -32602 a URL not allowed, a
                token or id out of its bounds, authentication credentials.
        """
        if not self.offered:
            raise not_offered()
        if not isinstance(raw, dict):
            raise RpcFailure(INVALID_PARAMS, "a push config is an object", "invalid_params")
        url, token = raw.get("url"), raw.get("token") or ""
        if not isinstance(url, str) or not isinstance(token, str):
            raise RpcFailure(INVALID_PARAMS, "url and token are strings", "invalid_params")
        if problem := url_problem(url, self.config.push_url_prefixes):
            raise RpcFailure(INVALID_PARAMS, problem, "push_url_not_allowed")
        if len(token) > MAX_TOKEN or not _TOKEN.fullmatch(token):
            problem = f"token: at most {MAX_TOKEN} visible ASCII characters"
            raise RpcFailure(INVALID_PARAMS, problem, "invalid_params")
        auth = raw.get("authentication")
        if isinstance(auth, dict) and auth.get("credentials"):
            raise RpcFailure(
                INVALID_PARAMS,
                "authentication credentials are not kept: use the token "
                "(X-A2A-Notification-Token) and the gateway's signature",
                "push_authentication_not_supported",
            )
        config_id = raw.get("id") or "pc_" + secrets.token_hex(8)
        if not isinstance(config_id, str) or not _ID.fullmatch(config_id):
            raise RpcFailure(INVALID_PARAMS, "id: 1 to 64 of A-Z a-z 0-9 _ -", "invalid_params")
        limit = self.config.push_max_configs
        return ops.ChangePushConfig(turn_id, config_id, url, token, limit)

    async def put(self, session: Session, op: ops.ChangePushConfig) -> None:
        """Keep the config ``op`` puts, where the session runs (-32004 past the bound)."""
        if (await self._change(session, op)).problem:
            raise RpcFailure(
                UNSUPPORTED_OPERATION,
                f"a context holds at most {op.max_configs} push configs of tasks not ended",
                "too_many_push_configs",
                409,
            )

    async def drop(self, session: Session, turn_id: str, config_id: str) -> bool:
        """Delete a task's config; whether there was one."""
        op = ops.ChangePushConfig(turn_id, config_id)
        return not (await self._change(session, op)).problem

    async def get(self, found: FoundTask, config_id: str) -> dict[str, Any]:
        for config in await self._configs(found):
            if config.id == config_id:
                return shown(found.id, config)
        raise not_found(found, config_id)

    async def listed(self, found: FoundTask) -> dict[str, Any]:
        return {"configs": [shown(found.id, c) for c in await self._configs(found)]}

    async def delete(self, found: FoundTask, config_id: str) -> None:
        if not await self.drop(found.session, found.turn_id, config_id):
            raise not_found(found, config_id)

    async def _change(self, session: Session, op: ops.ChangePushConfig) -> ops.PushChanged:
        """``op`` made where the session runs (gateway.node.push_configs), once durable."""
        answer = ops.expect(await self.node.act(session, op), ops.PushChanged)
        self.feeds.pop((session.id, op.turn_id, op.id), None)
        return answer

    async def _configs(self, found: FoundTask) -> list[PushConfig]:
        """The task's configs, as stored (wherever the session runs)."""
        record = await self.node.store.get_session(found.session.id)
        if record is None:
            raise TaskNotFound(found.id)
        return [c for c in record.push_configs if c.turn_id == found.turn_id]


def not_offered() -> RpcFailure:
    """-32003: the operator allows no URL (docs/doors/a2a.md "Push notifications")."""
    return RpcFailure(
        PUSH_NOT_SUPPORTED,
        "push notifications are not offered: the operator allows no URL"
        " ([a2a] push_url_prefixes, docs/doors/a2a.md)",
        "push_notification_not_supported",
    )


def not_found(found: FoundTask, config_id: str) -> RpcFailure:
    return RpcFailure(
        TASK_NOT_FOUND,
        f"no push config {config_id[:64]!r} of task {found.id[:200]!r}",
        "push_config_not_found",
        404,
    )


def shown(task: str, config: PushConfig) -> dict[str, Any]:
    """A config as A2A's ``TaskPushNotificationConfig`` JSON."""
    out = {"id": config.id, "taskId": task, "url": config.url}
    if config.token:
        out["token"] = config.token
    return out
