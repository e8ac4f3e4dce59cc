"""A large file sent inline through the AI SDK's or AG-UI's door is read off the event loop.

docs/protocol.md §2 "Files": a message whose request carries more than
:data:`gateway.doors.attachments.OFF_LOOP_BYTES` has its base64 decoded and its
bytes hashed in a worker thread (as ``POST /sessions/{id}/files`` checks a
file), so the node's other clients do not wait for it; a small one is read in
place (a thread hop would cost it more than the work). Seen by where the
content address (the SHA-256) of each inline file is taken.
"""

from __future__ import annotations

import base64
import io
import os
import threading
import uuid
from pathlib import Path

import pytest
from PIL import Image

import gateway.doors.attachments as attachments
from tests.aisdk_support import gateway as aisdk_gateway
from tests.aisdk_support import read, request
from tests.files_support import png
from tests.integration.doors.agui.test_agui_files import image, run_input, text
from tests.integration.doors.agui.test_agui_http import gateway as agui_gateway
from tests.integration.doors.agui.test_agui_http import run_all
from tests.integration.doors.aisdk.test_aisdk_files import data_url, file_part, said

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def noise_png(side: int = 200) -> bytes:
    """A PNG that does not compress: over OFF_LOOP_BYTES."""
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, "PNG")
    assert len(out.getvalue()) > attachments.OFF_LOOP_BYTES
    return out.getvalue()


@pytest.fixture
def hashed_in(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each inline file read: whether it was read on the event loop's thread."""
    loop = threading.get_ident()
    seen: list[bool] = []
    address = attachments.file_id_of

    def recorded(digest: str) -> str:
        seen.append(threading.get_ident() == loop)
        return address(digest)

    monkeypatch.setattr(attachments, "file_id_of", recorded)
    return seen


@pytest.mark.parametrize("large", [True, False])
async def test_ai_sdk_file_part(tmp_path: Path, hashed_in: list[bool], large: bool) -> None:
    picture = noise_png() if large else png(3, 3)
    async with aisdk_gateway(tmp_path) as h:
        message = said("look", file_part(data_url(picture, "image/png")))
        body = request(f"chat-{uuid.uuid4()}", message)
        async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            assert (await read(r)).finish_reason == "stop"
    assert hashed_in == [not large]


@pytest.mark.parametrize("large", [True, False])
async def test_agui_image_part(tmp_path: Path, hashed_in: list[bool], large: bool) -> None:
    picture = noise_png() if large else png(3, 3)
    source = {"type": "data", "value": base64.b64encode(picture).decode(), "mimeType": "image/png"}
    async with agui_gateway(tmp_path) as h:
        body = run_input(f"thread-{uuid.uuid4()}", [text("look"), image(source)])
        events = await run_all(h, body)
        assert events[-1]["type"] == "RUN_FINISHED"
    assert hashed_in == [not large]
