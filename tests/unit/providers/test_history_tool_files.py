"""A tool result's files stay inside the tool_result every provider is given
(:func:`gateway.providers.history.rebuild`; docs/protocol.md §2 "Files"): an MCP
tool's image reaches the model inside its ``tool_result``. Sans-IO."""

from __future__ import annotations

import msgspec

from gateway.protocol.shapes import (
    AudioBlock,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.providers.history import rebuild

IMAGE = ImageBlock("file_" + "a" * 32, "image/png", 4033)
AUDIO = AudioBlock("file_" + "b" * 32, "audio/wav", 12)
USE = ToolUseBlock("toolu_1", "pic", {})


def test_a_tool_results_image_is_kept_inside_it_and_its_structured_content_is_not() -> None:
    result = ToolResultBlock("toolu_1", "[image: ...]", files=[IMAGE, AUDIO])
    result.structured_content = {"x": 1}
    history = rebuild(
        [
            Message("m1", "s", "t", "user", [TextBlock("show me")], "complete", 0),
            Message(
                "m2", "s", "t", "assistant", [ToolUseBlock("toolu_1", "pic", {})], "complete", 0
            ),
            Message("m3", "s", "t", "user", [result], "complete", 0),
        ]
    )
    [sent] = [b for m in history for b in m.content if isinstance(b, ToolResultBlock)]
    assert sent.files == [IMAGE]  # its image, inside it; audio no model takes (rule 2)
    assert sent.content == "[image: ...]" and sent.tool_use_id == "toolu_1"
    assert sent.structured_content is msgspec.UNSET
