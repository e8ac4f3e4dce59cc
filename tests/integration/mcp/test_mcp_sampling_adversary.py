"""A hostile MCP server's sampling and URL-mode questions: the edges (docs/protocol.md §11).

The MCP side alone (gateway.mcp.questions, gateway.mcp.sampling), with a
recording session in place of a real one: what is refused before anyone is
asked, and what is asked.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from gateway.mcp.questions import MAX_URL_MESSAGE_CHARS, Questions, url_problem
from gateway.tools.registry import ToolContext


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://xn--pple-43d.com/login", None),  # an IDN host in its ASCII form: shown as is
        ("HTTPS://auth.example.com/", None),  # a scheme's case is nothing
        ("https://auth.example.com/\x9b31m", "control"),  # a C1 control (CSI)
        ("https://auth.example.com/\x85", "whitespace"),  # NEL
        ("https://auth.example.com/\u202egnp.exe", "control"),  # right-to-left override
        ("https://auth.example\u200b.com/", "control"),  # a zero-width space in the host
        ("https://auth.example.com/\u2066x\u2069", "control"),  # bidi isolates
        ("https://\u0430pple.com/login", "host"),  # a Cyrillic a: reads as apple.com
        ("https://auth.example.com\\@evil.example/", "user name"),
        ("https://evil.example\\.auth.example.com/", "host"),  # a browser goes to evil.example
        ("https://%65vil.example/", "host"),  # a browser reads evil.example
        ("http://127.0.0.1.evil.example/", "loopback"),
        ("http://localhost.evil.example/", "loopback"),
        ("https:/\\evil.example/", "no host"),
    ],
)
def test_urls_that_read_as_another_are_refused(url: str, problem: str | None) -> None:
    found = url_problem(url)
    if problem is None:
        assert found is None, found
    else:
        assert found is not None and problem in found, (url, found)


class _Asked:
    """A ToolSession whose elicit_url() records what it was asked and allows."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def elicit_url(
        self, ctx: ToolContext, message: str, url: str, completed: trio.Event | None = None
    ) -> str:
        self.asked.append((message, url))
        return "allow"


def _required(message: str, url: str = "https://auth.example.com/grant") -> dict[str, Any]:
    item = {"mode": "url", "url": url, "message": message, "elicitationId": "gate-1"}
    return {"elicitations": [item]}


async def test_a_required_url_elicitation_with_a_huge_message_asks_nobody() -> None:
    """-32042's URLs are checked as a question's are: the message's length too."""
    session = _Asked()
    ctx = ToolContext("ses_a", "turn_a", "toolu_a", "", session=session)  # type: ignore[arg-type]
    questions = Questions("srv", {object(): ctx})
    assert await questions.required(ctx, _required("Authorize first"))
    assert session.asked == [("Authorize first", "https://auth.example.com/grant")]
    session.asked.clear()
    huge = "x" * (MAX_URL_MESSAGE_CHARS + 1)
    assert not await questions.required(ctx, _required(huge))
    assert session.asked == []
