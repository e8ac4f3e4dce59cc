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
from gateway.providers.history import rebuild, within_budget

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


def test_a_call_carries_the_newest_files_within_its_budget() -> None:
    old = ImageBlock("file_" + "c" * 32, "image/png", 600)
    new = ImageBlock("file_" + "d" * 32, "image/png", 300)
    result = ToolResultBlock("toolu_1", "two pictures", files=[old, new, AUDIO])
    messages = [
        Message("m1", "s", "t", "user", [TextBlock("see"), old], "complete", 0),
        Message("m2", "s", "t", "assistant", [USE], "complete", 0),
        Message("m3", "s", "t", "user", [result], "complete", 0),
        Message("m4", "s", "t", "user", [TextBlock("again"), new], "complete", 0),
    ]
    sent = within_budget(messages, most=1000)
    # Newest first: m4's 300, then m3's (300 again: counted once; 600 more is 900), m1's
    # 600 again (counted): all within 1,000.
    assert sent == messages
    sent = within_budget(messages, most=800)
    # m4's 300, m3's second (counted), its first 600 over 800: a line; m1's too.
    [line] = sent[0].content[1:]
    assert isinstance(line, TextBlock) and line.text.startswith(f"[image {old.file_id} ")
    kept = sent[2].content[0]
    assert isinstance(kept, ToolResultBlock) and kept.files == [new, AUDIO]
    assert kept.content.startswith("two pictures\n[image " + old.file_id)
    assert sent[1:2] == messages[1:2] and sent[3] is messages[3]
    assert messages[0].content[1] is old  # the session's messages are left as they are
