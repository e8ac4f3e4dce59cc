"""``POST /sessions/{id}/fork``: a new session from a session's history and workspace.

docs/protocol.md §2, "Forks". The fork is made on the node that runs the
source (gateway.node.forking); this handler checks the caller and the body,
and makes it at most once per ``Idempotency-Key``, as ``POST /sessions``
makes a session (gateway.doors.rest.idempotency): the fork's id is chosen
first and kept with the key.
"""

from __future__ import annotations

from gateway.cluster import ops
from gateway.doors.context import DoorContext
from gateway.doors.rest import idempotency
from gateway.http.parsing import decode_optional
from gateway.http.server import Request, Response, json_response
from gateway.ids import new_session_id
from gateway.node.forking import answer_of
from gateway.protocol.http import ForkSession
from gateway.tenancy import NO_OWNER


class Forks:
    """The handler of ``POST /sessions/{id}/fork`` (module docstring).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx

    async def fork(self, req: Request, session_id: str) -> Response:
        """``POST /sessions/{id}/fork``: 201 once the fork is committed, owned by the caller."""
        caller = self.ctx.authenticate(req)
        source = await self.ctx.session(session_id, caller)  # another key's: 404, as unknown
        body = decode_optional(req, ForkSession) or ForkSession()
        owner = caller or NO_OWNER
        node = self.ctx.node

        async def make(fork_id: str) -> Response:
            # On the node that runs the source (gateway.node.forking), wherever that is.
            answer = await node.act(source, ops.Fork(fork_id, body.at_message_id, owner))
            return json_response(201, ops.expect(answer, ops.Forked).fork)

        async def find(fork_id: str) -> Response | None:
            # Made by an attempt that died before answering, or answered 503.
            live = node.sessions.get(fork_id)
            record = live.record if live else await node.store.get_session(fork_id)
            if record is None or record.owner != owner:
                return None
            await node.durable_or_503()
            return json_response(201, answer_of(record))

        return await idempotency.once(self.ctx, req, owner, new_session_id(), make, find)
