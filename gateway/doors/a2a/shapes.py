"""The A2A wire shapes (docs/doors/a2a.md): JSON-RPC 2.0 and A2A 1.0's JSON, as msgspec Structs.

A2A 1.0 defines its messages in protobuf; their JSON is protobuf's JSON
mapping (camelCase names, enums as their names: ``TASK_STATE_WORKING``,
``ROLE_AGENT``), which is what the official clients (``a2a-sdk`` 1.x,
``@a2a-js/sdk`` 1.x) send and parse. A ``Part`` is one of ``text``, ``raw``
(base64), ``url`` or ``data``, with ``mediaType``, ``filename`` and
``metadata`` beside it. Fields a client sends that are not here are
ignored, as protobuf's lenient parse ignores them (forward compatibility).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

TaskState = Literal[
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_AUTH_REQUIRED",
]
"""A task's state (A2A 1.0 ``TaskState``); the gateway gives the first six."""

TERMINAL: frozenset[str] = frozenset(
    {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"}
)
"""The states a task never leaves."""


class Wire(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """An A2A shape: camelCase on the wire, unset fields left out."""


class Part(Wire):
    text: str | None = None
    raw: str | None = None  # base64
    url: str | None = None
    data: Any = None
    media_type: str | None = None
    filename: str | None = None
    metadata: dict[str, Any] | None = None


class Message(Wire):
    message_id: str = ""
    context_id: str | None = None
    task_id: str | None = None
    role: str = "ROLE_UNSPECIFIED"
    parts: list[Part] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] | None = None
    extensions: list[str] | None = None
    reference_task_ids: list[str] | None = None


class TaskStatus(Wire):
    state: str
    message: Message | None = None
    timestamp: str | None = None


class Artifact(Wire):
    artifact_id: str
    name: str | None = None
    description: str | None = None
    parts: list[Part] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] | None = None


class Task(Wire):
    id: str
    context_id: str
    status: TaskStatus
    artifacts: list[Artifact] | None = None
    history: list[Message] | None = None
    metadata: dict[str, Any] | None = None


class TaskStatusUpdateEvent(Wire):
    task_id: str
    context_id: str
    status: TaskStatus
    metadata: dict[str, Any] | None = None


class TaskArtifactUpdateEvent(Wire):
    task_id: str
    context_id: str
    artifact: Artifact
    append: bool = False
    last_chunk: bool = False
    metadata: dict[str, Any] | None = None


class StreamResponse(Wire):
    """One event of a stream: exactly one field set (A2A 1.0 ``StreamResponse``)."""

    task: Task | None = None
    message: Message | None = None
    status_update: TaskStatusUpdateEvent | None = None
    artifact_update: TaskArtifactUpdateEvent | None = None


class SendMessageResponse(Wire):
    task: Task | None = None
    message: Message | None = None


class ListTasksResponse(Wire):
    tasks: list[Task]
    next_page_token: str = ""
    page_size: int = 0
    total_size: int = 0


# --- requests ------------------------------------------------------------------------


class SendMessageConfiguration(Wire):
    accepted_output_modes: list[str] | None = None
    task_push_notification_config: dict[str, Any] | None = None
    history_length: int | None = None
    return_immediately: bool = False


class SendMessageRequest(Wire):
    message: Message
    tenant: str = ""
    configuration: SendMessageConfiguration | None = None
    metadata: dict[str, Any] | None = None


class GetTaskRequest(Wire):
    id: str
    tenant: str = ""
    history_length: int | None = None


class CancelTaskRequest(Wire):
    id: str
    tenant: str = ""
    metadata: dict[str, Any] | None = None


class SubscribeToTaskRequest(Wire):
    id: str
    tenant: str = ""


class ListTasksRequest(Wire):
    context_id: str = ""
    tenant: str = ""
    status: str | int | None = None
    page_size: int | None = None
    page_token: str = ""
    history_length: int | None = None
    include_artifacts: bool = False


# --- JSON-RPC 2.0 -----------------------------------------------------------------------

RequestId = str | int | None


class RpcRequest(msgspec.Struct, omit_defaults=True):
    """A JSON-RPC 2.0 request as read first: its params are read by its method's Struct."""

    jsonrpc: Any = None
    method: Any = None
    params: msgspec.Raw = msgspec.Raw(b"{}")
    id: Any = msgspec.UNSET  # none at all: a notification (not run; rpc.read_request)


class RpcError(msgspec.Struct, omit_defaults=True):
    code: int
    message: str
    data: Any = None


class RpcErrorResponse(msgspec.Struct):
    id: RequestId
    error: RpcError
    jsonrpc: str = "2.0"


class RpcResult(msgspec.Struct):
    id: RequestId
    result: Any
    jsonrpc: str = "2.0"


encoder = msgspec.json.Encoder()
