"""A session's files on the Redis store (docs/protocol.md §2 "Files").

A mixin of :class:`gateway.store.redis.store.RedisStore`, kept apart so the store
class stays about one thing. Keys (:class:`gateway.store.redis.keys.Keys`),
under the deployment's prefix (``gw:``)::

    gw:fm:{sid}    HASH: file id -> the FileRecord as JSON (its size read by the scripts)
    gw:f:{sid}     HASH: file id -> the bytes
    gw:fbytes      HASH: owner -> the bytes of its files, every session's

Written at once by :data:`PUT_SCRIPT`, outside the group commit, in one atomic
step across every node: the session's record must exist, a file already there
is the answer, the session's count and the owner's bytes are checked and
counted. ``DELETE /sessions/{id}`` runs :data:`DROP_SCRIPT` inside its own
``MULTI`` (gateway.store.redis.store), so the owner's count goes down by
exactly what the session held, whatever landed before it; so does the deletion
of a fork refused after its files were copied, before its record was stored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import coredis
import msgspec

from gateway.store.base import FileRecord, FileRefusal
from gateway.store.redis.keys import Keys

PUT_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'session_not_found'} end
local have = redis.call('HGET', KEYS[2], ARGV[1])
if have then return {'stored', have} end
local most = tonumber(ARGV[4])
if most > 0 and redis.call('HLEN', KEYS[2]) >= most then return {'too_many_files'} end
local quota = tonumber(ARGV[5])
local used = tonumber(redis.call('HGET', KEYS[4], ARGV[6]) or '0')
if quota > 0 and used + tonumber(ARGV[7]) > quota then return {'quota_exceeded'} end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[4], ARGV[6], ARGV[7])
return {'stored', ARGV[2]}
"""
"""KEYS: the session's record, fm, f, fbytes; ARGV: file id, record JSON, bytes,
max per session, owner quota, owner, size."""

DROP_SCRIPT = """
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
    local rec = cjson.decode(v)
    redis.call('HINCRBY', KEYS[3], rec.owner, -rec.size)
    total = total + rec.size
end
redis.call('DEL', KEYS[1], KEYS[2])
return total
"""
"""KEYS: fm, f, fbytes. Each file's bytes go back to the owner it was counted against
(its record's): a session with no record, a refused fork's copies, is dropped too."""

COPY_SCRIPT = """
local metas = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 1, #metas, 2 do
    if redis.call('HEXISTS', KEYS[3], metas[i]) == 0 then
        local rec = cjson.decode(metas[i + 1])
        rec.session_id = ARGV[1]
        rec.owner = ARGV[2]
        redis.call('HSET', KEYS[3], metas[i], cjson.encode(rec))
        redis.call('HSET', KEYS[4], metas[i], redis.call('HGET', KEYS[2], metas[i]))
        total = total + rec.size
    end
end
if total > 0 then redis.call('HINCRBY', KEYS[5], ARGV[2], total) end
return total
"""
"""KEYS: source fm, source f, target fm, target f, fbytes; ARGV: target id, owner."""

_record = msgspec.json.Decoder(FileRecord).decode


class RedisFiles:
    """The file methods of :class:`gateway.store.base.Store` on Redis."""

    _keys: Keys

    async def _read(self, query: Callable[[coredis.Redis[bytes]], Awaitable[Any]]) -> Any:
        raise NotImplementedError  # the store's: a command, its failures as StoreError

    async def put_file(
        self, rec: FileRecord, data: bytes, *, max_per_session: int, owner_quota_bytes: int
    ) -> FileRecord | FileRefusal:
        k = self._keys
        keys = [k.session(rec.session_id), k.file_meta(rec.session_id), k.files(rec.session_id)]
        keys.append(k.file_bytes)
        args: list[str | bytes | int] = [rec.file_id, msgspec.json.encode(rec), data]
        args += [max_per_session, owner_quota_bytes, rec.owner, rec.size]
        answer = await self._read(lambda c: c.eval(PUT_SCRIPT, keys, args))
        outcome = answer[0].decode() if isinstance(answer[0], bytes) else str(answer[0])
        if outcome == "stored":
            return _record(answer[1])
        return outcome  # type: ignore[return-value]

    async def get_file(self, session_id: str, file_id: str) -> tuple[FileRecord, bytes] | None:
        k = self._keys

        async def both(c: coredis.Redis[bytes]) -> tuple[Any, Any]:
            async with c.pipeline(transaction=True) as p:
                meta = p.hget(k.file_meta(session_id), file_id)
                data = p.hget(k.files(session_id), file_id)
            return await meta, await data

        meta, data = await self._read(both)
        return None if meta is None or data is None else (_record(meta), bytes(data))

    async def files_of(self, session_id: str) -> list[FileRecord]:
        metas = await self._read(lambda c: c.hvals(self._keys.file_meta(session_id)))
        return sorted((_record(m) for m in metas), key=lambda r: (r.created_at, r.file_id))

    async def copy_files(self, source_id: str, target_id: str, owner: str) -> None:
        k = self._keys
        keys = [k.file_meta(source_id), k.files(source_id), k.file_meta(target_id)]
        keys += [k.files(target_id), k.file_bytes]
        await self._read(lambda c: c.eval(COPY_SCRIPT, keys, [target_id, owner]))
