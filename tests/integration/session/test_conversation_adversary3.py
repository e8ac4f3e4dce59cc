"""Adversary cases of edit and regenerate and a busy session (docs/protocol.md §2), a third
review: each test is a defect's reproduction."""

from __future__ import annotations

import base64
from pathlib import Path

from tests.conftest import running_gateway
from tests.files_support import png
from tests.integration.session.test_rewind import (
    Recording,
    config,
    listing,
    post_turn,
    texts,
    turn,
    user_of,
)

IMAGE = {
    "type": "image",
    "source": {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(png()).decode(),
    },
}


async def test_a_user_message_of_an_image_alone_is_rewound_to(tmp_path: Path) -> None:
    """A turn's content may be an image alone (docs/protocol.md §2 ``POST .../turns``): its
    user message is a user's message, which an edit names (``rewind_to``). It was refused
    409 ``not_a_user_message`` (a user message was one with text), while a fork at it
    takes it as the prompt it is (its draft)."""
    provider = Recording()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            pictured = await turn(gw, client, sid, [IMAGE])
            r = await post_turn(gw.http, sid, "Describe it, edited", rewind_to=user_of(pictured))
            assert r.status_code == 202, r.text
            await client.until_turn_ends()
        assert texts(provider.calls[-1]) == [
            "user: Question A",
            "assistant: You said: Question A",
            "user: Describe it, edited",
        ]
        roles = [m["role"] for m in await listing(gw, sid)]
        assert roles == ["user", "assistant", "user", "assistant"]
