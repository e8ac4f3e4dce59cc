"""The Lua scripts that write a session's keys, each fenced by the session's lease.

Fencing (gateway.store.redis.store's docstring): every write of a session's
keys (its record and indexes, a message, a batch's events and their age
entries, its webhook deliveries) is a small script inside the batch's
``MULTI`` that first reads the session's lease, and writes nothing if another
node holds it.
"""

from __future__ import annotations

from gateway.store.base import SessionRecord
from gateway.store.redis.keys import Keys, index_member

# Every write of a session's keys is fenced by its lease (module docstring): it
# lands unless another node holds the lease (KEYS[1]; ARGV[1] this node's id,
# "" for a store that has no node), else it answers that node's id.
FENCE = """
local holder = redis.call('GET', KEYS[1])
if ARGV[1] ~= '' and holder and holder ~= ARGV[1] then return {holder} end
"""

# A session record and its indexes. KEYS: lease, record, sessions, owner's,
# owners or parent's workers, owner's roots, open; ARGV: node, record, index
# member, id, owner, "w" for a worker, "o" for a turn in flight or queued.
_WRITE_SESSION = """
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], 0, ARGV[3])
redis.call('ZADD', KEYS[4], 0, ARGV[3])
if ARGV[6] == 'w' then
    redis.call('ZADD', KEYS[5], 0, ARGV[3])
else
    redis.call('SADD', KEYS[5], ARGV[5])
    redis.call('SADD', KEYS[6], ARGV[4])
end
if ARGV[7] == 'o' then
    redis.call('SADD', KEYS[7], ARGV[4])
else
    redis.call('SREM', KEYS[7], ARGV[4])
end
return 1
"""

# An upsert never changes a session's owner (Store.put_session): a record of
# another owner is refused whole (records stored before owners existed have none).
PUT_SESSION = (
    FENCE
    + """
local stored = redis.call('GET', KEYS[2])
if stored and (cmsgpack.unpack(stored)['owner'] or '') ~= ARGV[5] then
    return redis.error_reply('the record has another owner, and an owner is never rewritten')
end
"""
    + _WRITE_SESSION
)

# A new session named by its client (Store.insert_session): written only if
# no record has its id, else that record is the answer (whoever holds its
# lease: the node that made it, usually); the same KEYS and ARGV.
INSERT_SESSION = (
    """
local stored = redis.call('GET', KEYS[2])
if stored then return stored end
"""
    + FENCE
    + _WRITE_SESSION
)

# A batch's messages of one session, in order; a message keeps its place when
# rewritten (an in_progress message completed): only a new id takes the next
# number of its session. KEYS: lease, messages, their order; ARGV: node, then
# (message id, message) per message.
UPSERT_MESSAGES = (
    FENCE
    + """
for i = 2, #ARGV, 2 do
    if not redis.call('ZSCORE', KEYS[3], ARGV[i]) then
        local last = redis.call('ZRANGE', KEYS[3], 0, 0, 'REV', 'WITHSCORES')
        local ord = 1
        if last[2] then ord = tonumber(last[2]) + 1 end
        redis.call('ZADD', KEYS[3], ord, ARGV[i])
    end
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return 1
"""
)

# A batch's events of one session, and their entries in the age index. KEYS:
# lease, events, age index; ARGV: node, session id, then (seq, member, ts) per
# event. ZADD takes them in chunks (Lua's unpack has a limit).
ADD_EVENTS = (
    FENCE
    + """
local events, ages = {}, {}
for i = 3, #ARGV, 3 do
    events[#events + 1] = ARGV[i]
    events[#events + 1] = ARGV[i + 1]
    ages[#ages + 1] = ARGV[i + 2]
    ages[#ages + 1] = ARGV[i] .. ':' .. ARGV[2]
    if #events >= 1000 or i + 3 > #ARGV then
        redis.call('ZADD', KEYS[2], unpack(events))
        redis.call('ZADD', KEYS[3], unpack(ages))
        events, ages = {}, {}
    end
end
return 1
"""
)


def session_write(
    k: Keys, rec: SessionRecord, data: bytes, node: str
) -> tuple[list[str], list[str | bytes]]:
    """The KEYS and ARGV of :data:`PUT_SESSION` and :data:`INSERT_SESSION` for ``rec``."""
    sid, worker = rec.id, rec.parent_session_id
    keys = [
        k.lease(sid),
        k.session(sid),
        k.sessions,
        k.owner(rec.owner),
        k.workers(worker) if worker else k.owners,
        k.roots(rec.owner),
        k.open,
    ]
    args: list[str | bytes] = [node, data, index_member(rec), sid, rec.owner]
    args += ["w" if worker else "", "o" if rec.current_turn_id or rec.queued_turns else ""]
    return keys, args
