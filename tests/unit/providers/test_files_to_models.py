"""Files in a model request, sans-IO (docs/protocol.md §2 "Files", "To the model").

- The history (rule 2 of :mod:`gateway.providers.history`): a user message
  keeps its images and documents, a tool result the images of its files;
  audio and an assistant's file blocks are dropped; :func:`model_files` names
  the files whose bytes a call needs.
- Anthropic's ``messages``: image and document blocks with the bytes in
  base64, text documents as ``text/plain`` text sources, a tool result's
  images inside the ``tool_result``, a file whose bytes are gone as text.
- OpenAI's ``messages``: content parts with ``data:`` URLs, a tool result's
  images in a user message right after the ``tool`` messages.
- The scripted model's ``{"files": true}`` block and its default answer.
- What each provider refuses at ``POST .../turns`` (:func:`refusal`), and a
  file's tokens.
"""

from __future__ import annotations

import base64
import hashlib
import json

import msgspec

from gateway.protocol.shapes import (
    AudioBlock,
    ContentBlock,
    DocumentBlock,
    ImageBlock,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.providers.anthropic import messages_param
from gateway.providers.attachments import (
    ANTHROPIC_IMAGE_MAX_BYTES,
    IMAGE_TOKENS,
    file_tokens,
    refusal,
)
from gateway.providers.base import ModelRequest
from gateway.providers.history import HistoryMessage, model_files, rebuild
from gateway.providers.openai import chat_messages
from gateway.providers.raw import RawContentBlockDelta, RawMessageStart, RawTextDelta
from gateway.providers.scripted import ScriptedProvider
from tests.files_support import PDF, png

PNG = png()
IMAGE = ImageBlock("file_img", "image/png", len(PNG))
PDF_DOC = DocumentBlock("file_pdf", "application/pdf", len(PDF))
NOTES = DocumentBlock("file_txt", "text/markdown", 5)
AUDIO = AudioBlock("file_wav", "audio/wav", 44)
FILES = {
    "file_img": ("image/png", PNG),
    "file_pdf": ("application/pdf", PDF),
    "file_txt": ("text/markdown", b"# Hi\n"),
    "file_wav": ("audio/wav", b"RIFF" + b"\0" * 40),
}


def message(role: Role, *content: ContentBlock) -> Message:
    return Message("msg_x", "sess_1", "turn_1", role, list(content), "complete", 0)


def request(*messages: Message, files: dict[str, tuple[str, bytes]] | None = None) -> ModelRequest:
    return ModelRequest(
        model="m",
        messages=list(messages),
        tools=[],
        max_tokens=10,
        files=FILES if files is None else files,
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


USE = ToolUseBlock("tu_1", "shot", {})
SHOT = ToolResultBlock("tu_1", "a screenshot", files=[IMAGE, AUDIO])


def tool_round() -> list[Message]:
    """A user asks, the model calls a tool, the tool returns an image and audio."""
    return [
        message("user", TextBlock("take one")),
        message("assistant", USE),
        message("user", SHOT),
    ]


# --- the history ---------------------------------------------------------------


def test_a_user_message_keeps_its_files_and_audio_is_dropped_everywhere() -> None:
    history = rebuild(
        [
            message("user", TextBlock("look"), IMAGE, PDF_DOC, AUDIO),
            message("assistant", TextBlock("seen"), IMAGE),  # a model writes no file
        ]
    )
    assert history == [
        HistoryMessage("user", [TextBlock("look"), IMAGE, PDF_DOC]),
        HistoryMessage("assistant", [TextBlock("seen")]),
    ]


def test_a_user_message_of_a_file_alone_is_still_sent() -> None:
    assert rebuild([message("user", IMAGE)]) == [HistoryMessage("user", [IMAGE])]
    assert rebuild([message("user", AUDIO)]) == []  # nothing left to say


def test_a_tool_result_keeps_the_images_of_its_files() -> None:
    *_, last = rebuild(tool_round())
    [result] = last.content
    assert isinstance(result, ToolResultBlock) and result.files == [IMAGE]
    audio_only = msgspec.structs.replace(SHOT, files=[AUDIO])
    *_, last = rebuild([*tool_round()[:2], message("user", audio_only)])
    [result] = last.content
    assert isinstance(result, ToolResultBlock) and result.files is msgspec.UNSET


def test_model_files_names_what_a_call_sends_once_each() -> None:
    messages = [
        message("user", IMAGE, AUDIO, PDF_DOC),
        message("assistant", USE),
        message("user", SHOT, IMAGE),
    ]
    assert model_files(messages) == ["file_img", "file_pdf"]
    in_progress = msgspec.structs.replace(message("user", NOTES), status="in_progress")
    assert model_files([in_progress]) == []


# --- Anthropic -------------------------------------------------------------------


def test_anthropic_gets_image_and_document_blocks_with_the_bytes() -> None:
    [user] = messages_param(request(message("user", TextBlock("look"), IMAGE, PDF_DOC, NOTES)))
    assert user == {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
            },
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
            },
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "# Hi\n"},
            },
        ],
    }


def test_anthropic_gets_a_tool_results_image_inside_the_tool_result() -> None:
    *_, result_message = messages_param(request(*tool_round()))
    assert result_message["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "tu_1",
            "content": [
                {"type": "text", "text": "a screenshot"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
                },
            ],
            "is_error": False,
        }
    ]
    # No empty text block (the API refuses one) when the tool said nothing else.
    quiet = msgspec.structs.replace(SHOT, content="")
    *_, result_message = messages_param(request(*tool_round()[:2], message("user", quiet)))
    [block] = list(result_message["content"])
    assert isinstance(block, dict)
    assert [part["type"] for part in block["content"]] == ["image"]


def test_a_file_whose_bytes_are_gone_is_said_in_text() -> None:
    [user] = messages_param(request(message("user", IMAGE), files={"none": ("x", b"")}))
    assert user["content"] == [{"type": "text", "text": "[file file_img is no longer stored]"}]


# --- OpenAI-compatible -------------------------------------------------------------


def test_openai_gets_content_parts_with_a_data_url_and_the_text_of_a_document() -> None:
    [user] = chat_messages(request(message("user", TextBlock("look"), IMAGE, NOTES)))
    assert user == {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            {"type": "text", "text": "[document file_txt text/markdown]\n# Hi\n"},
        ],
    }
    # Without files, the content stays a string.
    [plain] = chat_messages(request(message("user", TextBlock("hi"))))
    assert plain == {"role": "user", "content": "hi"}


def test_openai_gets_a_tool_results_image_in_a_user_message_after_the_tool_message() -> None:
    messages = [*tool_round(), message("assistant", TextBlock("a cat"))]
    messages.append(message("user", TextBlock("and?")))
    sent = chat_messages(request(*messages))
    assert sent[2:5] == [
        {"role": "tool", "tool_call_id": "tu_1", "content": "a screenshot"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "[images of tool call tu_1]"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            ],
        },
        {"role": "assistant", "content": "a cat"},
    ]


def test_a_pdf_that_reaches_openai_all_the_same_is_said_in_text() -> None:
    [user] = chat_messages(request(message("user", PDF_DOC)))
    assert user["content"] == [
        {"type": "text", "text": "[file file_pdf (application/pdf) cannot be sent to this model]"}
    ]


# --- the scripted model ----------------------------------------------------------------


def said(kind: str, media_type: str, data: bytes) -> str:
    return f"[{kind} {media_type} {len(data)} bytes sha256:{hashlib.sha256(data).hexdigest()[:8]}]"


async def reply(req: ModelRequest) -> str:
    return "".join(
        [
            raw.delta.text
            async for raw in ScriptedProvider().stream(req)
            if isinstance(raw, RawContentBlockDelta) and isinstance(raw.delta, RawTextDelta)
        ]
    )


async def test_the_scripted_model_says_back_a_tool_results_image_from_its_bytes() -> None:
    script = {"script": {"rounds": [[{"tool_use": {"name": "shot"}}], [{"files": True}]]}}
    messages = tool_round()
    messages[0] = message("user", TextBlock(json.dumps(script)))
    assert await reply(request(*messages)) == said("image", "image/png", PNG)  # audio: never
    # The bytes it received, not the block's claims: other bytes, another line.
    other = png(9, 9)
    got = await reply(request(*messages, files={"file_img": ("image/png", other)}))
    assert got == said("image", "image/png", other)
    assert await reply(request(*messages, files={})) == "[file file_img is no longer stored]"


async def test_the_scripted_default_answer_lists_the_files_of_the_turn() -> None:
    got = await reply(request(message("user", TextBlock("hi"), PDF_DOC, IMAGE)))
    assert got == "\n".join(
        ["You said: hi", said("document", "application/pdf", PDF), said("image", "image/png", PNG)]
    )


async def test_the_scripted_input_tokens_count_the_files() -> None:
    events = [raw async for raw in ScriptedProvider().stream(request(message("user", IMAGE)))]
    start = events[0]
    assert isinstance(start, RawMessageStart)
    assert start.message.usage.input_tokens == IMAGE_TOKENS  # no text, one image


# --- what each model takes ----------------------------------------------------------


def test_what_each_provider_refuses() -> None:
    for provider in ("anthropic", "scripted"):
        assert [refusal("native", provider, b) for b in (IMAGE, PDF_DOC, NOTES)] == [None] * 3
    assert refusal("native", "openai", IMAGE) is None
    assert refusal("native", "openai", NOTES) is None
    reason = refusal("native", "openai", PDF_DOC)
    assert reason is not None and "file_pdf" in reason and "application/pdf" in reason
    assert refusal("claude-code", "openai", PDF_DOC) is None  # the CLI takes Anthropic blocks
    assert all(refusal("native", p, AUDIO) for p in ("anthropic", "openai", "scripted"))


def test_an_image_over_what_anthropic_takes_is_refused_or_said_in_text() -> None:
    most = ANTHROPIC_IMAGE_MAX_BYTES
    assert most == 3_932_160  # 5 MiB of base64
    big = ImageBlock("file_big", "image/png", most + 1)
    for runtime, provider in [("native", "anthropic"), ("claude-code", "anthropic")]:
        reason = refusal(runtime, provider, big)
        assert reason is not None and str(most) in reason
        assert refusal(runtime, provider, msgspec.structs.replace(big, size=most)) is None
    assert refusal("native", "openai", big) is None
    assert refusal("native", "scripted", big) is None
    # One that comes another way (a tool's) is a line of text, not a refused call.
    files = {"file_big": ("image/png", b"\0" * (most + 1))}
    [user] = messages_param(request(message("user", big), files=files))
    assert user["content"] == [
        {
            "type": "text",
            "text": f"[image file_big is {most + 1} bytes; this model takes an image"
            f" of at most {most} bytes]",
        }
    ]


def test_a_files_tokens() -> None:
    assert file_tokens(IMAGE) == IMAGE_TOKENS == 1600
    assert file_tokens(DocumentBlock("file_d", "application/pdf", 4001)) == 1001
    assert file_tokens(AUDIO) == 0
