"""A large inline file is hashed off the event loop, whichever door sends it
(docs/protocol.md §2 "Files", "In a turn": "the node's other clients never wait on a
large file"). Seen by where :mod:`gateway.session.files` takes each SHA-256 of more
than :data:`gateway.doors.attachments.OFF_LOOP_BYTES`: never on the event loop's thread.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

import gateway.session.files as session_files
from gateway.doors.attachments import OFF_LOOP_BYTES
from tests.aisdk_support import gateway as aisdk_gateway
from tests.aisdk_support import read, request
from tests.conftest import Harness
from tests.integration.doors.agui.test_agui_files import image, run_input, text
from tests.integration.doors.agui.test_agui_http import gateway as agui_gateway
from tests.integration.doors.agui.test_agui_http import run_all
from tests.integration.doors.aisdk.test_aisdk_files import data_url, file_part, said
from tests.integration.doors.test_door_files_off_loop import noise_png

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def on_loop(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of what gateway.session.files hashed on the event loop's thread."""
    loop = threading.get_ident()
    seen: list[int] = []

    def sha256(data: bytes = b"") -> Any:
        if threading.get_ident() == loop:
            seen.append(len(data))
        return hashlib.sha256(data)

    monkeypatch.setattr(session_files, "hashlib", types.SimpleNamespace(sha256=sha256))
    return seen


async def test_a_rest_turns_inline_file(gw: Harness, on_loop: list[int]) -> None:
    picture = noise_png()
    sid = await gw.create_session()
    data = base64.b64encode(picture).decode()
    source = {"type": "base64", "media_type": "image/png", "data": data}
    r = await gw.http.post(
        f"/sessions/{sid}/turns", json={"content": [{"type": "image", "source": source}]}
    )
    assert r.status_code == 202, r.text
    assert [n for n in on_loop if n > OFF_LOOP_BYTES] == []


async def test_an_ai_sdk_file_part_to_a_new_chat(tmp_path: Path, on_loop: list[int]) -> None:
    async with aisdk_gateway(tmp_path) as h:
        message = said("look", file_part(data_url(noise_png(), "image/png")))
        body = request(f"chat-{uuid.uuid4()}", message)
        async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            assert (await read(r)).finish_reason == "stop"
    assert [n for n in on_loop if n > OFF_LOOP_BYTES] == []


async def test_an_agui_image_to_a_new_thread(tmp_path: Path, on_loop: list[int]) -> None:
    value = base64.b64encode(noise_png()).decode()
    source = {"type": "data", "value": value, "mimeType": "image/png"}
    async with agui_gateway(tmp_path) as h:
        events = await run_all(
            h, run_input(f"thread-{uuid.uuid4()}", [text("look"), image(source)])
        )
        assert events[-1]["type"] == "RUN_FINISHED"
    assert [n for n in on_loop if n > OFF_LOOP_BYTES] == []
