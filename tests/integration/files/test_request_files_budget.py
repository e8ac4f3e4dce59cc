"""What one model call carries of a session's files (docs/protocol.md §2 "Files", "To the
model"): a session may hold 100 files of 20 MiB, and every call sends the files of the
whole conversation, each image counted as 1,600 tokens whatever its size. Read whole,
they would be gigabytes in memory per call (and a request no API takes, on every
retry); a call carries the newest files up to ``REQUEST_FILE_BYTES``, and each older one
is a line of text saying it was not sent."""

from __future__ import annotations

import io
import os

from PIL import Image

from tests.conftest import Harness
from tests.files_support import said_back
from tests.integration.files.test_file_routes import upload
from tests.integration.files.test_files_to_models import reply, turn


def noise(side: int) -> bytes:
    """A PNG of random pixels, ``side`` square: about 3 bytes a pixel, compressed or not."""
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(
        out, "PNG", compress_level=0
    )
    return out.getvalue()


async def test_a_call_carries_files_up_to_its_budget(gw: Harness) -> None:
    sid = await gw.create_session()
    first, second = noise(2100), noise(2100)  # 13 MiB each: 26 MiB, over the 24 a call carries
    ids = [(await upload(gw, sid, data, "image/png"))["file_id"] for data in (first, second)]
    content = [{"type": "text", "text": "see"}]
    content += [{"type": "image", "file_id": i} for i in ids]
    text = reply(await turn(gw, sid, content))
    assert said_back("image", "image/png", first) in text
    assert said_back("image", "image/png", second) not in text
    assert f"[image {ids[1]} image/png {len(second)} bytes: not sent" in text
    stored = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    assert [b.get("file_id") for b in stored[0]["content"]] == [None, *ids]  # kept as sent
