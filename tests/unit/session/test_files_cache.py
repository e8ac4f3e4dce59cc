"""The bytes cache of :meth:`gateway.session.files.Files.read` (docs/protocol.md §2 "Files",
"To the model"): reads of one file at once count its bytes once."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import trio

from gateway.session import files as files_module
from gateway.session.files import Files
from gateway.store.base import FileRecord, Store
from tests.conftest import make_config


class SlowStore:
    """A store whose file reads take a moment (as a real one's do: a thread, a socket)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads = 0

    async def get_file(self, session_id: str, file_id: str) -> tuple[FileRecord, bytes]:
        self.reads += 1
        await trio.sleep(0.01)
        rec = FileRecord(file_id, session_id, "k", "0" * 64, "text/plain", len(self.data), 0)
        return rec, self.data


async def test_concurrent_reads_of_one_file_are_cached_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files_module, "CACHE_BYTES", 100)
    store = SlowStore(b"x" * 25)  # a quarter of the cache: kept
    files = Files(cast(Store, store), make_config(tmp_path))
    got: list[dict[str, tuple[str, bytes]]] = []

    async def read(file_id: str) -> None:
        got.append(await files.read("sess_a", [file_id]))

    # Six calls of one session need one file at once (say, a turn's and a steer's):
    # its 25 bytes are in the cache once, not counted six times against its 100.
    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(read, "file_a")
    assert [g["file_a"][1] for g in got] == [b"x" * 25] * 6
    # The cache still works: a second file, then the first, read from memory.
    await files.read("sess_a", ["file_b"])
    reads = store.reads
    assert (await files.read("sess_a", ["file_a", "file_b"])).keys() == {"file_a", "file_b"}
    assert store.reads == reads
