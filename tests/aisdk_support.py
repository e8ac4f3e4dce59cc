"""A reader of the AI SDK's UI message chunks, for the tests of its doors (docs/doors/aisdk.md).

:class:`UiMessage` applies the chunks of one response as the ``ai`` package's
``processUIMessageStream`` does, and fails on what it would reject: a delta of a
part never started, an approval of an unknown tool call, anything after
``[DONE]``. The package's own schema and transports check the same doors in
tests/system/doors/aisdk/test_aisdk_js.py. :func:`gateway` runs one for a test (30 s at
most), :func:`ws_url` is its ``/ai-sdk/ws``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.conftest import Harness, make_config, running_gateway


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as h:
            yield h


def ws_url(h: Harness, query: str = "") -> str:
    return h.base.replace("http://", "ws://") + "/ai-sdk/ws" + query


class UiMessage:
    """One assistant UI message built from chunks as ``processUIMessageStream`` builds it."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.metadata: dict[str, Any] = {}
        self.parts: list[dict[str, Any]] = []
        self.chunks: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.errors: list[str] = []
        self._text: dict[str, dict[str, Any]] = {}
        self._reasoning: dict[str, dict[str, Any]] = {}
        self._inputs: dict[str, str] = {}
        self.done = False

    def tool(self, call_id: str) -> dict[str, Any]:
        found = [p for p in self.parts if p.get("toolCallId") == call_id]
        assert found, f"no tool invocation {call_id}"
        return found[-1]

    def apply(self, chunk: dict[str, Any]) -> None:
        assert not self.done, f"{chunk} after [DONE]"
        self.chunks.append(chunk)
        kind = chunk["type"]
        if kind == "start":
            if self.id is not None and chunk["messageId"] != self.id:
                raise AssertionError("a second message in one response")
            self.id = chunk["messageId"]
            self.metadata |= chunk.get("messageMetadata") or {}
        elif kind in ("text-start", "reasoning-start"):
            part = {"type": kind.split("-")[0], "text": "", "state": "streaming"}
            (self._text if kind == "text-start" else self._reasoning)[chunk["id"]] = part
            self.parts.append(part)
        elif kind in ("text-delta", "reasoning-delta"):
            active = self._text if kind == "text-delta" else self._reasoning
            active[chunk["id"]]["text"] += chunk["delta"]  # KeyError: never started
        elif kind in ("text-end", "reasoning-end"):
            active = self._text if kind == "text-end" else self._reasoning
            active.pop(chunk["id"])["state"] = "done"
        elif kind == "tool-input-start":
            self._inputs[chunk["toolCallId"]] = ""
            self.parts.append(
                {
                    "type": "dynamic-tool",
                    "toolName": chunk["toolName"],
                    "toolCallId": chunk["toolCallId"],
                    "state": "input-streaming",
                }
            )
        elif kind == "tool-input-delta":
            self._inputs[chunk["toolCallId"]] += chunk["inputTextDelta"]
        elif kind == "tool-input-available":
            part = self.tool(chunk["toolCallId"])
            part.update(state="input-available", input=chunk["input"])
            streamed = self._inputs[chunk["toolCallId"]]
            if _parses(streamed):  # a cancel may cut the deltas: the input is what parses
                assert json.loads(streamed) == chunk["input"]
        elif kind == "tool-approval-request":
            part = self.tool(chunk["toolCallId"])
            part.update(state="approval-requested", approval={"id": chunk["approvalId"]})
        elif kind == "tool-approval-response":
            approval_id = chunk["approvalId"]
            [part] = [p for p in self.parts if (p.get("approval") or {}).get("id") == approval_id]
            part.update(state="approval-responded")
            part["approval"]["approved"] = chunk["approved"]
        elif kind == "tool-output-available":
            part = self.tool(chunk["toolCallId"])
            part.update(state="output-available", output=chunk["output"])
        elif kind == "tool-output-error":
            part = self.tool(chunk["toolCallId"])
            part.update(state="output-error", errorText=chunk["errorText"])
        elif kind == "tool-output-denied":
            self.tool(chunk["toolCallId"]).update(state="output-denied")
        elif kind == "start-step":
            self.parts.append({"type": "step-start"})
        elif kind == "file":
            self.parts.append(
                {"type": "file", "mediaType": chunk["mediaType"], "url": chunk["url"]}
            )
        elif kind == "finish":
            self.finish_reason = chunk.get("finishReason")
            self.metadata = _merge(self.metadata, chunk.get("messageMetadata") or {})
        elif kind == "error":
            self.errors.append(chunk["errorText"])
        elif kind.startswith("data-"):
            same = [p for p in self.parts if p["type"] == kind and p.get("id") == chunk.get("id")]
            if same:
                same[0]["data"] = chunk["data"]
            else:
                self.parts.append(dict(chunk))
        else:
            assert kind in ("finish-step", "abort"), kind

    @property
    def text(self) -> str:
        return "".join(p["text"] for p in self.parts if p["type"] == "text")

    def as_sent(self) -> dict[str, Any]:
        """The message as ``useChat`` sends it back in its next request."""
        return {"id": self.id, "role": "assistant", "parts": self.parts, "metadata": self.metadata}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def user(text: str | dict[str, Any]) -> dict[str, Any]:
    body = text if isinstance(text, str) else json.dumps(text)
    return {"id": f"u-{uuid.uuid4()}", "role": "user", "parts": [{"type": "text", "text": body}]}


def request(chat: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": chat, "messages": list(messages), "trigger": "submit-message",
            "messageId": None, **extra}  # fmt: skip


async def read(r: Any, message: UiMessage | None = None) -> UiMessage:
    """Every chunk of one answer, applied to ``message`` (a new one by default)."""
    m = message or UiMessage()
    m.done = False
    await read_until(r.aiter_lines(), m, lambda: False)
    assert m.done, "the stream ended without [DONE]"
    return m


async def read_until(lines: AsyncIterator[str], m: UiMessage, stop: Callable[[], bool]) -> None:
    """Apply the chunks of ``lines`` to ``m`` until ``stop()`` says so, or the end."""
    async for line in lines:
        if line == "data: [DONE]":
            m.done = True
        elif line.startswith("data: "):
            m.apply(json.loads(line[6:]))
        if stop():
            return


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True
