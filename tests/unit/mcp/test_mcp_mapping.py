"""The result mapping and the tool adapter of docs/protocol.md §11, without a server."""

from __future__ import annotations

import base64
from typing import Any

import mcp_types as types
import pytest

from gateway.errors import ToolError
from gateway.mcp import tools
from gateway.mcp.tools import MAX_RESULT_BYTES, MAX_RESULT_FILES, adapt_tools, map_result
from gateway.tools.registry import ToolContext, ToolOutput


class NoCaller:
    async def call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise AssertionError("not called")


def test_text_is_joined_images_and_audio_are_files_and_other_content_a_placeholder() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(text="one"),
            types.ResourceLink(name="f", uri="file:///tmp/f"),
            types.EmbeddedResource(
                resource=types.TextResourceContents(uri="file:///a", text="inline")
            ),
            types.AudioContent(data="AAAA", mime_type="audio/wav"),
            types.ImageContent(
                data=base64.b64encode(b"\x89PNG...").decode(), mime_type="image/png"
            ),
            types.TextContent(text="two"),
        ]
    )
    out = map_result("s", "t", result)
    # The files' lines are the session's to write (with their ids): gateway.session.tool_round.
    assert out.content == ("one\n[resource link: file:///tmp/f]\n[resource file:///a]\ninline\ntwo")
    assert out.structured is None
    assert out.files == [("audio/wav", b"\x00\x00\x00"), ("image/png", b"\x89PNG...")]


def test_files_not_kept_are_lines_and_a_failed_results_files_placeholders() -> None:
    result = types.CallToolResult(
        content=[
            types.AudioContent(data="AAAA", mime_type="text/html"),  # served as its type: no
            types.ImageContent(data="not base64!", mime_type="image/png"),
            *[types.ImageContent(data="AAAA", mime_type="image/png")] * (MAX_RESULT_FILES + 1),
        ]
    )
    out = map_result("s", "t", result)
    assert len(out.files) == MAX_RESULT_FILES
    assert out.content.splitlines() == [
        "[audio: 'text/html' is not an audio type, not kept]",
        "[image: image/png, not base64, not kept]",
        f"[image: image/png, past the {MAX_RESULT_FILES} files a result keeps, not kept]",
    ]
    failed = types.CallToolResult(
        content=[
            types.TextContent(text="no"),
            types.ImageContent(data="AAAA", mime_type="image/png"),
        ],
        is_error=True,
    )
    with pytest.raises(ToolError) as err:
        map_result("s", "t", failed)
    assert err.value.message == "no\n[image: image/png, 3 bytes, not shown]"


def test_is_error_is_a_tool_error_with_the_text() -> None:
    result = types.CallToolResult(content=[types.TextContent(text="no such ticket")], is_error=True)
    with pytest.raises(ToolError) as err:
        map_result("s", "t", result)
    assert (err.value.error_class, err.value.message) == ("error", "no such ticket")
    with pytest.raises(ToolError) as err:
        map_result("s", "t", types.CallToolResult(content=[], is_error=True))
    assert "t failed" in err.value.message


def test_a_huge_result_is_cut_and_a_huge_structured_result_dropped() -> None:
    text = "é" * MAX_RESULT_BYTES  # two bytes each: cut mid-way, on a character boundary
    result = types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content={"big": "x" * MAX_RESULT_BYTES},
    )
    out = map_result("s", "t", result)
    kept, note = out.content.rsplit("\n", 1)
    assert kept == "é" * (MAX_RESULT_BYTES // 2) and out.structured is None
    assert note.startswith(f"[gateway: result cut at {MAX_RESULT_BYTES} of its")
    assert "structured result was over" in note


def test_tools_with_unusable_names_or_schemas_are_dropped() -> None:
    good = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    listed = [
        {"name": "ok", "description": "d", "inputSchema": good},
        {"name": "a.b", "inputSchema": good},
        {"name": "x" * 60, "inputSchema": good},  # mcp__s__ + 60 > 64
        {"name": "bad_ref", "inputSchema": {"type": "object", "properties": {"n": {"type": 3}}}},
        "not a tool",
    ]
    tools = adapt_tools("s", listed, NoCaller())
    assert list(tools) == ["mcp__s__ok"]
    tool = tools["mcp__s__ok"]
    assert tool.parse({"n": 2}) == {"n": 2}
    with pytest.raises(ToolError) as err:
        tool.parse({"n": 0})
    assert err.value.error_class == "invalid_input" and "at 'n'" in err.value.message


def test_an_audio_type_with_a_line_break_is_not_kept() -> None:
    # Kept, its type would be a file's Content-Type on GET .../files/{file_id}: a line
    # break in a header (refused by h11 as the answer is written, or worse behind another
    # server). ``$`` of a regular expression matches before a final newline.
    result = types.CallToolResult(
        content=[
            types.AudioContent(data="AAAA", mime_type="audio/wav\n"),
            types.AudioContent(data="AAAA", mime_type="audio/wav\r\nSet-Cookie: a=b"),
        ]
    )
    out = map_result("s", "t", result)
    assert out.files == []
    assert out.content.splitlines() == [
        "[audio: 'audio/wav\\n' is not an audio type, not kept]",
        "[audio: 'audio/wav\\r\\nSet-Cookie: a=b' is not an audio type, not kept]",
    ]


def test_an_image_content_typed_as_audio_is_not_kept() -> None:
    # The session keeps a file typed audio/... unchecked, as audio: an image content
    # must not reach that path (its type unchecked, a line break in it included).
    result = types.CallToolResult(
        content=[
            types.ImageContent(data="AAAA", mime_type="audio/wav\r\nSet-Cookie: a=b"),
            types.ImageContent(data="AAAA", mime_type="audio/wav"),
        ]
    )
    out = map_result("s", "t", result)
    assert out.files == []
    assert out.content.splitlines() == [
        "[image: 'audio/wav\\r\\nSet-Cookie: a=b' is not an image type, not kept]",
        "[image: 'audio/wav' is not an image type, not kept]",
    ]


def test_a_results_files_past_its_bytes_are_lines_never_decoded(monkeypatch: Any) -> None:
    """A hostile server's huge images cost no more than ``MAX_RESULT_FILE_BYTES`` to decode:
    the size is read off the base64's length first (docs/protocol.md §2 "Files")."""
    monkeypatch.setattr(tools, "MAX_RESULT_FILE_BYTES", 6)
    decoded: list[str] = []
    real = tools.base64.b64decode
    monkeypatch.setattr(
        tools.base64, "b64decode", lambda d, **kw: decoded.append(d) or real(d, **kw)
    )
    image = types.ImageContent(data="AAAA", mime_type="image/png")  # 3 bytes each
    out = map_result("s", "t", types.CallToolResult(content=[image, image, image]))
    assert len(out.files) == 2 and len(decoded) == 2
    assert "past the 6 a result's files keep, not kept" in out.content
