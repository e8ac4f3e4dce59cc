"""A2A push configs changed on the node that runs the session (docs/doors/a2a.md "Push
notifications").

A task's push configs are its session's record's (``SessionRecord.push_configs``):
the A2A door asks for a change with :class:`gateway.cluster.ops.ChangePushConfig`
(gateway.node.operations carries it out where the session runs, so on a cluster the
owner writes its own record), and :func:`change` makes it: a put replaces the task's
config of its id, and keeps at most ``max_configs`` configs of turns that may still
emit (in flight or queued: an ended task's are dropped then); a delete removes one.
"""

from __future__ import annotations

from gateway.cluster import ops
from gateway.session.session import Session
from gateway.store.base import PushConfig


def change(session: Session, op: ops.ChangePushConfig) -> ops.PushChanged:
    """Change the session's record as ``op`` says, and store it (module docstring)."""
    record = session.record
    others = [c for c in record.push_configs if not (c.turn_id == op.turn_id and c.id == op.id)]
    if not op.url:
        if len(others) == len(record.push_configs):
            return ops.PushChanged("not_found")
        record.push_configs = others
    else:
        live = {q.turn_id for q in record.queued_turns} | {op.turn_id}
        if session.turn is not None:
            live.add(session.turn.id)
        kept = [c for c in others if c.turn_id in live]
        if len(kept) >= op.max_configs:
            return ops.PushChanged("too_many")
        record.push_configs = [*kept, PushConfig(op.id, op.turn_id, op.url, op.token)]
    session.save_record()
    return ops.PushChanged()
