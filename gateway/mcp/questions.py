"""An MCP server's questions (``elicitation/create``) during its tool calls (docs/protocol.md §11).

A question is asked of the session whose call is in flight on the
connection (:meth:`gateway.tools.registry.ToolSession.elicit`: a
``permission.requested`` of kind ``elicitation``; a URL-mode one,
:meth:`~gateway.tools.registry.ToolSession.elicit_url`, of kind
``elicitation_url``, its URL checked first by :func:`url_problem`); when calls of several
sessions are in flight on a shared server at once, the question cannot be
tied to one of them (MCP's stdio carries no request it relates to) and is
cancelled, with a warning (``mcp_elicitation_ambiguous``). A session's
questions end with its last call on the connection (:meth:`Questions.end`).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import unicodedata
from collections import deque
from contextlib import suppress
from urllib.parse import urlsplit

import mcp_types as types
import pydantic
import trio
from mcp.client.session import ClientRequestContext

from gateway.logs import event
from gateway.mcp.quiet import Quiet, more
from gateway.mcp.tools import elicitation_problem
from gateway.tools.registry import ToolContext

log = logging.getLogger("gateway.mcp")

MAX_QUESTIONS = 4
"""A session's elicitations in flight on one connection; a server asking more at once is cancelled.

Each is a pending permission in every snapshot of the session: a server that
sends a thousand ``elicitation/create`` at once must not make a thousand."""

MAX_URL_CHARS = 2048
"""The longest URL of a URL-mode elicitation (a longer one is refused)."""

MAX_URL_MESSAGE_CHARS = 4096
"""The longest message of a URL-mode elicitation (a longer one is refused)."""

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""The hosts a URL-mode elicitation may name over plain ``http``."""

EARLY_COMPLETION_S = 5.0
"""How long a ``notifications/elicitation/complete`` for no question waiting may answer the
question of its id still to come (the SDK's race); an older one answers nothing."""

_HOST_NAME = re.compile(r"[a-z0-9._-]+")  # an ASCII host name, as urlsplit lowers it


def url_problem(url: str) -> str | None:
    """Why ``url`` may not be shown to a user to open, or None (docs/protocol.md §11).

    ``https``, or ``http`` to a loopback host only; a host; no user or
    password part (``https://bank.example@evil.example`` reads as the bank);
    no whitespace or control characters (C0, C1, and the invisible format
    characters: bidi overrides and isolates, zero-width spaces); a host that
    is an ASCII host name (an IDN in its ``xn--`` form: ``apple.com`` with a
    Cyrillic ``a`` reads as another's) or an IPv6 literal, nothing
    percent-encoded or backslashed in it (a browser decodes the one and
    reads the other as ``/``); at most :data:`MAX_URL_CHARS`.
    ``javascript:``, ``data:``, ``file:`` and every other scheme are refused.
    """
    if len(url) > MAX_URL_CHARS:
        return f"the URL is over {MAX_URL_CHARS} characters"
    if any(c.isspace() or unicodedata.category(c) in ("Cc", "Cf") for c in url):
        return "the URL holds whitespace or control characters"
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError as exc:
        return f"the URL cannot be read: {exc}"
    if parts.scheme not in ("https", "http"):
        return f"the URL's scheme is {parts.scheme or 'missing'!r}, not https"
    if not host:
        return "the URL names no host"
    if not _HOST_NAME.fullmatch(host) and not _ipv6(host):
        return f"the URL's host {host[:100]!r} is not an ASCII host name (an IDN: its xn-- form)"
    if parts.username is not None or parts.password is not None:
        return "the URL holds a user name or password"
    if parts.scheme == "http" and host not in LOOPBACK_HOSTS:
        return "a plain http URL is allowed to a loopback host only"
    return None


def url_question_problem(params: types.ElicitRequestURLParams) -> str | None:
    """Why a URL-mode question may not be asked (its URL, its message's length), or None."""
    problem = url_problem(params.url)
    if problem is None and len(params.message) > MAX_URL_MESSAGE_CHARS:
        problem = f"the message is over {MAX_URL_MESSAGE_CHARS} characters"
    return problem


def _ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


class Questions:
    """The questions of one server connection, by the session they are asked of.

    Args:
        server: the server's name (in log lines).
        calls: the connection's calls in flight (the caller's context each), oldest first.
    """

    def __init__(self, server: str, calls: dict[object, ToolContext]) -> None:
        self.server = server
        self._calls = calls
        # Questions being asked, by session: each ended with that session's last call here.
        self._asked: dict[str, list[tuple[trio.CancelScope, trio.Event]]] = {}
        # URL-mode questions waiting, by their elicitation id: set by the server's
        # notifications/elicitation/complete (:meth:`completed`).
        self._urls: dict[str, trio.Event] = {}
        # Completions that came before their question was asked (the SDK serves a
        # request and a notification in tasks of their own): a few kept, the oldest
        # dropped, each for EARLY_COMPLETION_S (then it was a late one, for a question
        # answered before it came, and must not answer a new question of its id).
        self._early: deque[tuple[str, float]] = deque(maxlen=16)
        self._quiet = Quiet()  # a flood of refusals: a line a second (gateway.mcp.quiet)
        self._quiet_ambiguous = Quiet()

    def completed(self, elicitation_id: str) -> None:
        """The server says the URL-mode question ``elicitation_id`` is done (its notification)."""
        done = self._urls.get(elicitation_id)
        if done is not None:
            done.set()
        else:
            self._early.append((elicitation_id, trio.current_time()))

    async def ask(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """A server's question during a call: asked of the calling session's user."""
        if isinstance(params, types.ElicitRequestURLParams):
            problem = self._url_problem(params)
            if problem is not None:
                return self._refused(problem, None)
        elif not isinstance(params, types.ElicitRequestFormParams):
            return types.ErrorData(
                code=types.INVALID_REQUEST, message="only form and URL elicitations are supported"
            )
        sessions = {ctx.session_id for ctx in self._calls.values()}
        if len(sessions) != 1:
            left_out = self._quiet_ambiguous.due()
            if left_out is not None:
                event(
                    log, logging.WARNING, "mcp_elicitation_ambiguous",
                    f"MCP server {self.server} asked a question while calls of {len(sessions)}"
                    f" sessions were in flight: cancelled{more(left_out)}",
                    server=self.server, count=len(sessions), left_out=left_out or None,
                )  # fmt: skip
            return types.ElicitResult(action="cancel")
        ctx = next(iter(self._calls.values()))
        if ctx.session is None:
            return types.ElicitResult(action="cancel")
        if isinstance(params, types.ElicitRequestURLParams):
            return await self._ask_url(ctx, params)
        schema = params.requested_schema
        if isinstance(schema, pydantic.BaseModel):
            schema = schema.model_dump(by_alias=True, exclude_none=True)
        problem = elicitation_problem(params.message, schema)
        if problem is not None:
            return self._refused(problem, ctx.session_id)
        question = self._question(ctx.session_id)
        if question is None:
            return types.ElicitResult(action="cancel")
        try:
            with question[0]:
                decision, content = await ctx.session.elicit(ctx, params.message, dict(schema))
        finally:
            self._done(ctx.session_id, question)
        if question[0].cancelled_caught:
            return types.ElicitResult(action="cancel")
        if decision == "allow":
            return types.ElicitResult(action="accept", content=content or {})
        if decision == "deny":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="cancel")

    def _question(self, session_id: str) -> tuple[trio.CancelScope, trio.Event] | None:
        """A new question of the session, or None past MAX_QUESTIONS (logged)."""
        asked = self._asked.setdefault(session_id, [])
        if len(asked) >= MAX_QUESTIONS:
            self._log_refused(f"over {MAX_QUESTIONS} questions at once: cancelled", session_id)
            return None
        question = (trio.CancelScope(), trio.Event())
        asked.append(question)
        return question

    def _done(self, session_id: str, question: tuple[trio.CancelScope, trio.Event]) -> None:
        question[1].set()
        with suppress(ValueError):
            self._asked.get(session_id, []).remove(question)

    def _refused(self, problem: str, session_id: str | None) -> types.ErrorData:
        self._log_refused(problem, session_id)
        return types.ErrorData(code=types.INVALID_PARAMS, message=f"refused: {problem}")

    def _log_refused(self, problem: str, session_id: str | None) -> None:
        """``mcp_elicitation_refused``, at most a line a second (gateway.mcp.quiet)."""
        left_out = self._quiet.due()
        if left_out is not None:
            event(
                log, logging.WARNING, "mcp_elicitation_refused",
                f"MCP server {self.server} asked a question that cannot be asked: {problem}"
                f"{more(left_out)}",
                server=self.server, session_id=session_id, error=problem,
                left_out=left_out or None,
            )  # fmt: skip

    async def _ask_url(
        self, ctx: ToolContext, params: types.ElicitRequestURLParams
    ) -> types.ElicitResult:
        """A URL-mode question: ``allow`` accepts (the user went), ``deny`` declines.

        The server's ``notifications/elicitation/complete`` for it while it
        waits answers it ``allow`` (the user went: the server saw it).
        """
        assert ctx.session is not None
        question = self._question(ctx.session_id)
        if question is None:
            return types.ElicitResult(action="cancel")
        key = params.elicitation_id
        if key:
            self._urls[key] = trio.Event()
            if self._came_early(key):
                self._urls[key].set()
        try:
            with question[0]:
                decision = await ctx.session.elicit_url(
                    ctx, params.message, params.url, self._urls.get(key or "")
                )
        finally:
            self._done(ctx.session_id, question)
            if key:
                self._urls.pop(key, None)
        if question[0].cancelled_caught:
            return types.ElicitResult(action="cancel")
        if decision == "allow":
            return types.ElicitResult(action="accept")
        if decision == "deny":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="cancel")

    def _url_problem(self, params: types.ElicitRequestURLParams) -> str | None:
        """:func:`url_question_problem`, or its id is a question's still waiting (a
        completion could answer one of them only)."""
        problem = url_question_problem(params)
        if problem is None and params.elicitation_id in self._urls:
            problem = f"the elicitation id {params.elicitation_id[:100]!r} is waiting already"
        return problem

    def _came_early(self, key: str) -> bool:
        """Whether the question ``key``'s completion came just before it (taken once)."""
        now = trio.current_time()
        early = [(k, at) for k, at in self._early if k == key]
        for item in early:
            self._early.remove(item)
        return any(now - at <= EARLY_COMPLETION_S for _, at in early)

    async def required(self, ctx: ToolContext, data: object) -> bool:
        """A call failed ``-32042`` (URL elicitation required): ask each URL it names, in order.

        Whether every one was accepted (the call is then made again, once:
        gateway.mcp.connection). The error's ``data`` is the server's: at most
        :data:`MAX_QUESTIONS` well-formed URL elicitations, each checked as a
        question is (:func:`url_question_problem`: its URL, its message's
        length); anything else asks nobody.
        """
        items = data.get("elicitations") if isinstance(data, dict) else None
        if ctx.session is None or not isinstance(items, list) or not items:
            return False
        if len(items) > MAX_QUESTIONS:
            self._refused(f"over {MAX_QUESTIONS} URL elicitations required", ctx.session_id)
            return False
        for item in items:
            try:
                params = types.ElicitRequestURLParams.model_validate(item)
            except pydantic.ValidationError:
                self._refused("a required URL elicitation is malformed", ctx.session_id)
                return False
            problem = self._url_problem(params)
            if problem is not None:
                self._refused(problem, ctx.session_id)
                return False
            if (await self._ask_url(ctx, params)).action != "accept":
                return False
        return True

    async def end(self, session_id: str) -> None:
        """The session's last call here ended (done, failed, cancelled): so do its questions.

        The server's question runs in the SDK's task, not the call's, so a
        turn's cancel or the call's timeout would leave it open (a pending
        permission, answered by nobody, until approval_timeout_s). Cancelled
        here, it is resolved ``cancelled`` (docs/protocol.md §11) before the
        call's own ``tool.failed`` (waited for, shielded, a second at most).
        """
        questions = self._asked.pop(session_id, [])
        for scope, _ in questions:
            scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            for _, done in questions:
                await done.wait()
