"""The REST door (docs/protocol.md §2): the gateway itself, ``/sessions`` and their turns.

Its routes, read twice as every door's are: :class:`~gateway.http.router.Router`
routes from them (the path's pattern, the handler per method, the auth and
query rules of its :class:`~gateway.http.openapi.Operation`), and ``GET
/openapi.json`` is built from them (the Structs a handler decodes and answers,
the errors only it gives; gateway.http.openapi). The order is the API
document's. Each ``{name}`` segment is one id, given to the handler in order;
a route's name is its ``route`` label in the ``gateway_http_requests`` metric.
The operations are data, at module level; the routes pair them with their
handlers, one function per resource (:func:`admin_routes`, :func:`session_routes`,
:func:`turn_routes`, :func:`fork_routes`, :func:`page_routes`).

The handlers, one class per resource: :class:`~gateway.doors.rest.admin.Admin`
(probes, metrics, the API document, the agents),
:class:`~gateway.doors.rest.sessions.Sessions` (sessions, a session's attach
token, its messages), :class:`~gateway.doors.rest.turns.Turns` (a turn and
what acts on one), :class:`~gateway.doors.rest.forks.Forks` (a fork of a
session), :class:`~gateway.doors.rest.page.Page` (the web page).

The request size limit is the transport's, the same for every route
(``[server] max_body_bytes``, gateway.http.server).
"""

from __future__ import annotations

from gateway.doors.context import SESSION, DoorContext
from gateway.doors.rest.admin import Admin
from gateway.doors.rest.files import Files
from gateway.doors.rest.forks import Forks
from gateway.doors.rest.page import Page
from gateway.doors.rest.sessions import Sessions
from gateway.doors.rest.turns import Turns
from gateway.http.openapi import Operation, Query
from gateway.http.router import Route, page_route, route
from gateway.media import MEDIA_TYPES
from gateway.protocol.http import (
    Accepted,
    AgentList,
    CancelAccepted,
    CancelTurn,
    Compact,
    CreateSession,
    Feedback,
    FileStored,
    ForkCreated,
    ForkSession,
    Health,
    MessagePage,
    PermissionDecision,
    Ready,
    SessionAttach,
    SessionCreated,
    SessionList,
    SubmitTurn,
    TurnAccepted,
)
from gateway.protocol.shapes import Message

# --- query parameters (for the API document; the handlers read them) --------------

LIMIT = Query(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
    "How many to answer, 1 to 200 (400 `invalid_query` if not an integer, 422 if out of range).",
)
BEFORE_SESSION = Query(
    "before", {"type": "string"}, "A session id: the page of sessions older than it."
)
BEFORE_MESSAGE = Query(
    "before",
    {"type": "string"},
    "A message id: the page of messages before it (a rewound message's too: what the "
    "listing holds that was stored before it).",
)
INCLUDE_REWOUND = Query(
    "include_rewound",
    {"type": "string", "enum": ["true", "false"], "default": "false"},
    'List the rewound messages too, each with `"rewound": true` (docs/protocol.md §2 '
    '"Edit and regenerate"); 400 `invalid_query` if neither `true` nor `false`.',
)


# --- the operations (the API document's), by resource -----------------------------

HEALTHZ = Operation("Liveness probe", Health, auth="none")
READYZ = Operation(
    "Readiness probe",
    Ready,
    auth="none",
    errors={503: ("draining", "store_unavailable")},
    description="200 while the gateway accepts work; 503 `draining` once "
    "a graceful shutdown began (the listener stays open until the turns "
    "in flight are closed), so a load balancer stops sending; 503 "
    "`store_unavailable` (with `Retry-After`) while the store's commits "
    "fail, or for good once its file was deleted or replaced.",
)
METRICS = Operation(
    "Prometheus metrics",
    None,
    media_type="text/plain",
    description="The Prometheus text exposition format.",
)
OPENAPI = Operation("This document (OpenAPI 3.1)", None)
AGENTS = Operation(
    "The agents a session may run",
    AgentList,
    description="Each agent's runtime, model and tools (docs/protocol.md §11); "
    "never its system prompt. `default` marks the agent of a POST /sessions "
    "that names none.",
)

LIST_SESSIONS = Operation(
    "List sessions, newest first",
    SessionList,
    query=(LIMIT, BEFORE_SESSION),
    errors={404: ("session_not_found",)},
)
CREATE_SESSION = Operation(
    "Create a session",
    SessionCreated,
    201,
    body=CreateSession,
    body_required=False,
    errors={
        400: ("invalid_idempotency_key",),
        409: ("idempotency_key_in_use",),
        422: (
            "invalid_workspace",
            "invalid_model",
            "unknown_agent",
            "idempotency_key_reused",
        ),
        429: ("too_many_sessions",),
        503: ("shutting_down", "store_unavailable"),
    },
    idempotent=True,
    description="An empty body takes every default. Answered once the "
    "session is committed; refused 503 `shutting_down` once the gateway "
    "drains.",
)
GET_SESSION = Operation(
    "A session, with a fresh attach token and its stream's URL",
    SessionAttach,
    description="Every call issues a new single-use attach token.",
)
DELETE_SESSION = Operation(
    "Delete a session, its workers, messages and events",
    None,
    204,
    description="docs/protocol.md §13: its turn in flight is cancelled "
    '(`turn.cancelled`, `reason: "session_deleted"`), its clients are closed '
    "with 1000 `session_deleted` (they do not reconnect), its workers, "
    "messages, events and own workspace are deleted, and from then on the "
    "id is 404 on every route and a WebSocket handshake. No body.",
)
LIST_MESSAGES = Operation(
    "A session's messages, oldest first",
    MessagePage,
    query=(LIMIT, BEFORE_MESSAGE, INCLUDE_REWOUND),
    errors={404: ("message_not_found",)},
    description="The conversation, as the views show it: a rewound message "
    '(docs/protocol.md §2 "Edit and regenerate") is listed only with '
    '`include_rewound=true`, then with `"rewound": true`.',
)
GET_MESSAGE = Operation(
    "One message of a session, whole",
    Message,
    errors={404: ("message_not_found",)},
    description="A finished message, every block whole: what a snapshot "
    'sent cut (`"truncated": true`, docs/protocol.md §15). A message '
    "still streaming, another session's message or an unknown id: 404 "
    "`message_not_found` (the streaming one's `message.complete` "
    'carries it whole). A rewound message (docs/protocol.md §2 "Edit and '
    'regenerate") is answered too.',
)

SUBMIT_TURN = Operation(
    "Start a turn",
    TurnAccepted,
    202,
    body=SubmitTurn,
    idempotent=True,
    errors={
        400: ("invalid_idempotency_key",),
        404: ("message_not_found",),  # rewind_to (docs/protocol.md §2 "Edit and regenerate")
        # A file block (docs/protocol.md §2 "Files"); an inline file's errors are the upload's.
        413: ("file_too_large",),
        422: ("idempotency_key_reused", "unknown_file", "unsupported_content", "invalid_file"),
        409: (
            "turn_in_progress",
            "queue_full",
            "session_too_large",
            "subagent_session",
            "idempotency_key_in_use",
            "message_rewound",
            "not_a_user_message",
            "too_many_files",
        ),
        429: ("rate_limited", "quota_exceeded"),
        503: (
            "shutting_down",
            "store_unavailable",
            "session_elsewhere",
            "over_capacity",
        ),
    },
    description="`content` is a string or a list of `text` blocks (other "
    "block types: 422). Answered once the turn is durable. A session holding "
    "`max_session_mb` of stored data or more takes no more turns: 409 "
    "`session_too_large`. A `claude-code` agent's turn first waits (up to "
    "5 s) for one of its `max_processes` on the node: 503 `over_capacity`, "
    "with `Retry-After`, when none came free. A busy session (a turn in "
    "flight, or turns queued) does what `if_busy` says (absent: `[turns] "
    "if_busy`): `reject` (409 `turn_in_progress`), `queue` (202 with `queued` "
    "and `position`; 409 `queue_full` past `[turns] max_queued`), `interrupt` "
    "(the running turn is cancelled, then this one starts) or `steer` (202 with "
    "the running turn's id and `steered`: it joins that turn). "
    "`rewind_to`, one of the session's user messages, rewinds the conversation to before it "
    '(docs/protocol.md §2 "Edit and regenerate"): 404 `message_not_found`, '
    "409 `message_rewound` or `not_a_user_message`; with `if_busy` `queue` "
    "or `steer`, 422 `invalid_body`.",
)
CANCEL_TURN = Operation(
    "Cancel a turn in flight, or a queued one",
    CancelAccepted,
    202,
    body=CancelTurn,
    body_required=False,
    errors={404: ("turn_not_found",), 409: ("turn_not_in_flight",)},
)
DECIDE = Operation(
    "Allow or deny a tool call waiting for permission, or answer an elicitation",
    Accepted,
    202,
    body=PermissionDecision,
    errors={
        404: ("permission_not_found",),
        409: ("permission_resolved",),
        422: ("invalid_content",),
    },
)
COMPACT = Operation(
    "Compact the model's context now",
    Accepted,
    202,
    body=Compact,
    body_required=False,
    errors={
        409: ("turn_in_progress", "nothing_to_compact"),
        503: ("shutting_down", "session_elsewhere", "store_unavailable"),
    },
    description='docs/protocol.md §12, `trigger: "manual"`: the messages '
    "before the latest turn are replaced, for the model only, by one `context` "
    "message (a summary); `context.compacting` and `context.compacted` follow "
    "in the stream (turn_id null). Runs between turns: a turn submitted "
    "meanwhile starts after it. 409 `nothing_to_compact` when the model's "
    "context holds only the latest turn.",
)
FEEDBACK = Operation(
    "Rate a message",
    Accepted,
    202,
    body=Feedback,
    errors={404: ("message_not_found",)},
    description="Emits `feedback.recorded` on the message's turn.",
)

FORK = Operation(
    "Fork a session: a new one from its history and workspace",
    ForkCreated,
    201,
    body=ForkSession,
    body_required=False,
    idempotent=True,
    errors={
        400: ("invalid_idempotency_key",),
        404: ("message_not_found",),
        409: (
            "turn_in_progress",
            "not_a_fork_point",
            "message_rewound",
            "worker_session",
            "workspace_too_large",
            "transcript_unavailable",
            "idempotency_key_in_use",
        ),
        422: ("invalid_workspace", "idempotency_key_reused"),
        429: ("too_many_sessions",),
        503: ("shutting_down", "store_unavailable"),
    },
    description='docs/protocol.md §2, "Forks": a new session of the caller\'s key and '
    "the source's agent, whose history is the source's up to `at_message_id` (absent: "
    "the last message), that message included when it ends a turn; at a user message, "
    "up to it, and the message is the fork's `draft`. Its workspace is a copy of the "
    "source's now (at most `[sessions] fork_copy_max_mb`), its first event "
    "`session.forked`. 409 `turn_in_progress` while the source runs a turn; 409 "
    "`not_a_fork_point` for a message in the middle of a turn. Answered once the fork "
    "is committed.",
)

UPLOAD_FILE = Operation(
    "Store a file of the session",
    FileStored,
    201,
    body_types=MEDIA_TYPES,
    errors={
        404: ("session_not_found",),
        409: ("too_many_files",),
        413: ("file_too_large",),
        422: ("invalid_file",),
        429: ("quota_exceeded",),
        503: ("store_unavailable",),
    },
    description='docs/protocol.md §2 "Files": the body is the file, its `Content-Type` '
    "one of the types listed (others, SVG among them: 415 `unsupported_media_type`), at "
    "most `[files] max_bytes` (413 `file_too_large`). Its bytes are checked against its "
    "type (422 `invalid_file`: an image that does not decode, a decompression bomb, a PDF "
    "without its markers, text that is not UTF-8). Content-addressed: the same bytes are "
    "one file of the session, answered again. At most `[files] max_per_session` files "
    "(409 `too_many_files`) and `[limits] max_file_mb_per_key` MiB of a key's files (429 "
    "`quota_exceeded`). Use the answer's `file_id` in a turn's image or document block.",
)
GET_FILE = Operation(
    "A file of the session, its bytes",
    None,
    media_type="application/octet-stream",
    errors={404: ("file_not_found",)},
    description="The bytes, with the file's own `Content-Type`, as a download "
    "(`Content-Disposition: attachment`, `X-Content-Type-Options: nosniff`). Another "
    "session's file id, another key's included: 404 `file_not_found`.",
)

PAGE = Operation("The web page", None, auth="none")
ASSET = Operation("A file of the web page", None, auth="none")


# --- the routes, a function per resource ---------------------------------------------


def admin_routes(admin: Admin) -> tuple[Route, ...]:
    """The gateway itself: its probes, metrics, API document and agents."""
    return (
        route("/healthz", "healthz", GET=(admin.healthz, HEALTHZ)),
        route("/readyz", "readyz", GET=(admin.readyz, READYZ)),
        route("/metrics", "metrics", GET=(admin.metrics, METRICS)),
        route("/openapi.json", "openapi", GET=(admin.openapi, OPENAPI)),
        route("/agents", "agents", GET=(admin.list_agents, AGENTS)),
    )


def session_routes(sessions: Sessions, files: Files) -> tuple[Route, ...]:
    """The sessions, one session, its messages and files."""
    return (
        route(
            "/sessions",
            "sessions",
            GET=(sessions.list_sessions, LIST_SESSIONS),
            POST=(sessions.create_session, CREATE_SESSION),
        ),
        route(
            SESSION,
            "session",
            GET=(sessions.get_session, GET_SESSION),
            DELETE=(sessions.delete_session, DELETE_SESSION),
        ),
        route(f"{SESSION}/messages", "messages", GET=(sessions.list_messages, LIST_MESSAGES)),
        route(f"{SESSION}/files", "files", POST=(files.upload, UPLOAD_FILE)),
        route(f"{SESSION}/files/{{file_id}}", "file", GET=(files.download, GET_FILE)),
        route(
            f"{SESSION}/messages/{{message_id}}",
            "message",
            GET=(sessions.get_message, GET_MESSAGE),
        ),
    )


def fork_routes(forks: Forks) -> tuple[Route, ...]:
    """A fork of a session."""
    return (route(f"{SESSION}/fork", "fork", POST=(forks.fork, FORK)),)


def turn_routes(turns: Turns) -> tuple[Route, ...]:
    """A session's turns, and what acts on one."""
    return (
        route(f"{SESSION}/turns", "turns", POST=(turns.submit_turn, SUBMIT_TURN)),
        route(
            f"{SESSION}/turns/{{turn_id}}/cancel", "cancel", POST=(turns.cancel_turn, CANCEL_TURN)
        ),
        route(f"{SESSION}/permissions/{{perm_id}}", "permission", POST=(turns.decide, DECIDE)),
        route(f"{SESSION}/compact", "compact", POST=(turns.compact, COMPACT)),
        route(f"{SESSION}/feedback", "feedback", POST=(turns.feedback, FEEDBACK)),
    )


def page_routes(page: Page) -> tuple[Route, ...]:
    """The web page (gateway.ui): public (it holds no data), and not part of the API
    document (it is not the API); its asset names have dots, unlike ids."""
    return (
        page_route("/", "page", page.page, PAGE),
        page_route("/ui/([^/]+)", "ui", page.asset, ASSET),
    )


# --- the door ----------------------------------------------------------------------


class Door:
    """The REST door: the gateway itself, its sessions and their turns, and the web page.

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.routes: tuple[Route, ...] = (
            *admin_routes(Admin(ctx)),
            *session_routes(Sessions(ctx), Files(ctx)),
            *turn_routes(Turns(ctx)),
            *fork_routes(Forks(ctx)),
            *page_routes(Page()),
        )
