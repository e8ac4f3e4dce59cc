"""A session's files on SQLite (docs/protocol.md §2 "Files").

A table of its own, ``files``: one row per (session, file id), the bytes in a
BLOB beside the record's columns; written at once in a write transaction of
its own (:meth:`gateway.store.base.Store.put_file`), not through the group
commit, so a 20 MiB upload is never a batch of the sessions' events. The
per-key quota sums an owner's rows (an index on ``owner``).
"""

from __future__ import annotations

import sqlite3

from gateway.store.base import FileRecord, FileRefusal

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS files (
        session_id TEXT NOT NULL,
        file_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        media_type TEXT NOT NULL,
        size INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (session_id, file_id)
    )""",
    "CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner)",
)
"""Added to any store when it opens: a table an older gateway never reads."""

_COLUMNS = "file_id, session_id, owner, sha256, media_type, size, created_at"


def _record(row: tuple[str, str, str, str, str, int, int]) -> FileRecord:
    return FileRecord(*row)


def put_file(
    w: sqlite3.Connection,
    rec: FileRecord,
    data: bytes,
    max_per_session: int,
    owner_quota_bytes: int,
) -> FileRecord | FileRefusal:
    """:meth:`gateway.store.base.Store.put_file` in the caller's write transaction."""
    if w.execute("SELECT 1 FROM sessions WHERE id = ?", (rec.session_id,)).fetchone() is None:
        return "session_not_found"
    sql = f"SELECT {_COLUMNS} FROM files WHERE session_id = ? AND file_id = ?"
    found = w.execute(sql, (rec.session_id, rec.file_id)).fetchone()
    if found is not None:
        return _record(found)
    if max_per_session:
        sql = "SELECT count(*) FROM files WHERE session_id = ?"
        (count,) = w.execute(sql, (rec.session_id,)).fetchone()
        if count >= max_per_session:
            return "too_many_files"
    if owner_quota_bytes:
        sql = "SELECT coalesce(sum(size), 0) FROM files WHERE owner = ?"
        (used,) = w.execute(sql, (rec.owner,)).fetchone()
        if used + rec.size > owner_quota_bytes:
            return "quota_exceeded"
    w.execute(
        f"INSERT INTO files ({_COLUMNS}, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (rec.file_id, rec.session_id, rec.owner, rec.sha256, rec.media_type, rec.size,
         rec.created_at, data),
    )  # fmt: skip
    return rec


def get_file(
    r: sqlite3.Connection, session_id: str, file_id: str
) -> tuple[FileRecord, bytes] | None:
    sql = f"SELECT {_COLUMNS}, data FROM files WHERE session_id = ? AND file_id = ?"
    row = r.execute(sql, (session_id, file_id)).fetchone()
    return None if row is None else (_record(row[:7]), bytes(row[7]))


def files_of(r: sqlite3.Connection, session_id: str) -> list[FileRecord]:
    sql = f"SELECT {_COLUMNS} FROM files WHERE session_id = ? ORDER BY created_at, file_id"
    return [_record(row) for row in r.execute(sql, (session_id,))]


def copy_files(w: sqlite3.Connection, source_id: str, target_id: str, owner: str) -> None:
    """:meth:`gateway.store.base.Store.copy_files` in the caller's write transaction."""
    w.execute(
        f"""INSERT OR IGNORE INTO files ({_COLUMNS}, data)
            SELECT file_id, ?, ?, sha256, media_type, size, created_at, data
            FROM files WHERE session_id = ?""",
        (target_id, owner, source_id),
    )


def sweep(w: sqlite3.Connection) -> None:
    """Remove the files of sessions that are not, as the store opens (in its transaction).

    A fork's files are copied before its record is stored (gateway.node.forking): a
    process that died in between left copies of a session that never was, counted
    against its key's quota. Only then: the store is one process's, and no fork is
    under way while it opens (docs/protocol.md §2 "Files").
    """
    gone = "SELECT DISTINCT session_id FROM files WHERE session_id NOT IN (SELECT id FROM sessions)"
    w.execute(f"DELETE FROM files WHERE session_id IN ({gone})")  # read by its index, not its rows


def delete_files(w: sqlite3.Connection, session_ids: list[str]) -> None:
    """The sessions' files, in the caller's transaction (``delete_sessions``)."""
    w.executemany("DELETE FROM files WHERE session_id = ?", [(sid,) for sid in session_ids])
