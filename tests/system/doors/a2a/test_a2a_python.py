"""The A2A door driven by the official Python client, ``a2a-sdk`` 1.x (docs/doors/a2a.md).

A real gateway on 127.0.0.1 port 0, the scripted model; the client is
asyncio, so each scenario runs in a worker thread of its own
(``trio.to_thread.run_sync``, ``asyncio.run``) against the gateway's real
socket. Nothing here parses the wire: the SDK reads the card, picks the
transport, sends the JSON-RPC and parses every event into its protobuf
types, as a user's agent would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from a2a.client import A2ACardResolver, Client, ClientCallContext, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError
from google.protobuf import json_format, struct_pb2

from gateway.config import load_config
from tests.conftest import TOOL_SCRIPT, Harness, running_gateway
from tests.scripts import LONG_NAP, SLOW_TEXT
from tests.webhook_support import SECRET, Receiver

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

T = TypeVar("T")
KEYS = ["key-a", "key-b"]


async def in_asyncio(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run an asyncio scenario (the SDK's) in a worker thread, to its end."""
    return await trio.to_thread.run_sync(lambda: asyncio.run(scenario()))  # type: ignore[arg-type]


AGENTS = """
[agents.helper]
system = "You help."
"""


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    path = tmp_path / "gateway.toml"
    path.write_text(AGENTS)
    flat = {
        "server.port": 0,
        "store.path": str(tmp_path / "gateway.db"),
        "sessions.workspace_root": str(tmp_path / "workspaces"),
        "auth.api_keys": KEYS,
        **overrides,
    }
    config = load_config(str(path), {}, flat)
    with trio.fail_after(120):
        async with running_gateway(config) as h:
            yield h


@asynccontextmanager
async def sdk(base: str, key: str = "key-a") -> AsyncIterator[tuple[Client, AgentCard]]:
    """The official client, as its factory makes it from the card."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        yield client, card


def ask(content: Any, **fields: Any) -> SendMessageRequest:
    text = content if isinstance(content, str) else json.dumps(content)
    message = Message(message_id=f"m-{id(content)}", role=Role.ROLE_USER, parts=[Part(text=text)])
    for name, value in fields.items():
        setattr(message, name, value)
    return SendMessageRequest(message=message)


def cursor_of(event: StreamResponse) -> str:
    inner = getattr(event, str(event.WhichOneof("payload")))
    return str(json_format.MessageToDict(inner.metadata)["cursor"])


def text_of(events: list[StreamResponse]) -> str:
    return "".join(
        p.text
        for e in events
        if e.HasField("artifact_update")
        for p in e.artifact_update.artifact.parts
    )


def states(events: list[StreamResponse]) -> list[str]:
    out = []
    for e in events:
        if e.HasField("status_update"):
            out.append(TaskState.Name(e.status_update.status.state))
        elif e.HasField("task"):
            out.append("task:" + TaskState.Name(e.task.status.state))
    return out


async def test_the_card_and_a_task_streamed_to_its_end(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:

        async def scenario() -> tuple[AgentCard, list[StreamResponse], Task, Task]:
            async with sdk(h.base) as (client, card):
                events = [e async for e in client.send_message(ask(SLOW_TEXT))]
                task_id = events[0].task.id
                task = await client.get_task(GetTaskRequest(id=task_id))
                request = ask("hello")
                request.message.metadata.update({"skill": "helper"})
                helped = [e async for e in client.send_message(request)]
                return card, events, task, helped[0].task

        card, events, task, helped = await in_asyncio(scenario)
        helper = h.node.sessions[helped.context_id]
    assert [s.id for s in card.skills] == ["default", "helper"]
    assert card.capabilities.streaming and not card.capabilities.push_notifications
    assert card.supported_interfaces[0].url == f"{h.base}/a2a"
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert states(events) == [
        "task:TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    streamed = text_of(events)
    assert len(streamed.split()) == 400
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == streamed  # what was streamed is the reply
    stored = [m for m in await h.node.messages_of(h.node.sessions[task.context_id])]
    assert stored[-1].content[0].text == streamed  # type: ignore[union-attr]
    assert helper.record.agent == "helper"  # the skill a message names is its context's agent


async def test_a_dropped_stream_resubscribed_from_its_cursor_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:

        async def scenario() -> tuple[
            list[StreamResponse], list[StreamResponse], list[StreamResponse], str
        ]:
            async with sdk(h.base) as (client, _):
                first: list[StreamResponse] = []
                async for event in client.send_message(ask(SLOW_TEXT)):
                    first.append(event)
                    if len([e for e in first if e.HasField("artifact_update")]) == 25:
                        break  # the stream dropped mid-reply
                task_id = first[0].task.id
                cursor = cursor_of(first[-1])
                # While nobody reads, the reply goes on: a watcher follows it to its end.
                watched = [e async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]
                context = ClientCallContext(service_parameters={"Last-Event-ID": cursor})
                request = SubscribeToTaskRequest(id=task_id)
                rest = [e async for e in client.subscribe(request, context=context)]
                task = await client.get_task(GetTaskRequest(id=task_id))
                return first, rest, watched, task.artifacts[0].parts[0].text

        first, rest, watched, whole = await in_asyncio(scenario)
    assert text_of(first) and text_of(rest)
    assert text_of(first) + text_of(rest) == whole  # nothing lost, nothing repeated
    assert states(rest)[0] == "task:TASK_STATE_WORKING"  # the task as the client left it
    assert states(rest)[1:] == ["TASK_STATE_COMPLETED"]  # WORKING was had already
    assert text_of(watched) == whole  # without a cursor: the whole task again
    assert states(watched) == [
        "task:TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]


async def test_a_task_cancelled_ends_canceled_through_the_turns_cancel(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:

        async def scenario() -> tuple[list[StreamResponse], Task]:
            async with sdk(h.base) as (client, _):
                events: list[StreamResponse] = []
                cancelled: Task | None = None
                async for event in client.send_message(ask(LONG_NAP)):
                    events.append(event)
                    if text_of(events) == "Napping." and cancelled is None:
                        cancelled = await client.cancel_task(
                            CancelTaskRequest(id=events[0].task.id)
                        )
                assert cancelled is not None
                return events, cancelled

        events, cancelled = await in_asyncio(scenario)
        session = h.node.sessions[cancelled.context_id]
        summary = await h.node.live_summary(session)
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert states(events)[-1] == "TASK_STATE_CANCELED"  # the stream ends with it
    assert summary.current_turn_id is None


async def test_an_input_required_task_answered_by_the_next_message(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as h:

        async def scenario() -> tuple[list[StreamResponse], list[StreamResponse], Task]:
            async with sdk(h.base) as (client, _):
                asked = [e async for e in client.send_message(ask(TOOL_SCRIPT))]
                task = asked[0].task
                answer = ask("", task_id=task.id, context_id=task.context_id)
                del answer.message.parts[:]
                decision = struct_pb2.Value()
                decision.struct_value.update({"decision": "allow"})
                answer.message.parts.append(Part(data=decision))
                rest = [e async for e in client.send_message(answer)]
                return asked, rest, await client.get_task(GetTaskRequest(id=task.id))

        asked, rest, task = await in_asyncio(scenario)
    assert states(asked)[-1] == "TASK_STATE_INPUT_REQUIRED"
    question = asked[-1].status_update.status.message
    data = json_format.MessageToDict(question.parts[1].data)
    assert data["toolName"] == "sleep" and data["answer"] == {"decision": ["allow", "deny"]}
    assert text_of(asked) == "Running it now."
    assert states(rest) == [
        "task:TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    assert text_of(rest) == "\n\nAll done."
    assert task.artifacts[0].parts[0].text == "Running it now.\n\nAll done."


async def test_another_keys_task_and_context_are_not_found(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:

        async def scenario() -> list[str]:
            async with sdk(h.base, "key-a") as (a, _):
                done = [e async for e in a.send_message(ask("mine"))]
            task = done[0].task
            failures = []
            async with sdk(h.base, "key-b") as (b, _):
                calls: list[Callable[[], Awaitable[Any]]] = [
                    lambda: b.get_task(GetTaskRequest(id=task.id)),
                    lambda: b.cancel_task(CancelTaskRequest(id=task.id)),
                    lambda: _drain(b.subscribe(SubscribeToTaskRequest(id=task.id))),
                    lambda: _drain(b.send_message(ask("yours", context_id=task.context_id))),
                    lambda: _drain(b.send_message(ask("yes", task_id=task.id))),
                ]
                for call in calls:
                    try:
                        await call()
                    except TaskNotFoundError as exc:
                        failures.append(type(exc).__name__)
            return failures

        failures = await in_asyncio(scenario)
    assert failures == ["TaskNotFoundError"] * 5


async def _drain(events: Any) -> None:
    async for _ in events:
        pass


async def test_a_push_config_set_by_the_client_gets_the_tasks_notifications(
    tmp_path: Path,
) -> None:
    """docs/doors/a2a.md "Push notifications": the SDK's config methods, and the POSTs a
    receiver on loopback gets (its signature verified), with the config's token."""
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        prefix = f"http://127.0.0.1:{receiver.port}/hooks/"
        settings = {
            "tools.require_approval": ["sleep"],
            "a2a.push_url_prefixes": [prefix],
            "a2a.push_secret": SECRET,
        }
        async with gateway(tmp_path, **settings) as h:

            async def scenario() -> tuple[Any, ...]:
                async with sdk(h.base) as (client, card):
                    asked = [e async for e in client.send_message(ask(TOOL_SCRIPT))]
                    task = asked[0].task
                    config = TaskPushNotificationConfig(
                        task_id=task.id, url=prefix + "sdk", token="t-sdk"
                    )
                    made = await client.create_task_push_notification_config(config)
                    got = await client.get_task_push_notification_config(
                        GetTaskPushNotificationConfigRequest(task_id=task.id, id=made.id)
                    )
                    listed = await client.list_task_push_notification_configs(
                        ListTaskPushNotificationConfigsRequest(task_id=task.id)
                    )
                    answer = ask("yes", task_id=task.id, context_id=task.context_id)
                    rest = [e async for e in client.send_message(answer)]
                    async with sdk(h.base, "key-b") as (other, _):
                        try:
                            await other.list_task_push_notification_configs(
                                ListTaskPushNotificationConfigsRequest(task_id=task.id)
                            )
                            theirs = "listed"
                        except TaskNotFoundError:
                            theirs = "not found"
                    await client.delete_task_push_notification_config(
                        DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=made.id)
                    )
                    return card, task, made, got, listed, rest, theirs

            card, task, made, got, listed, rest, theirs = await in_asyncio(scenario)
            accepted = await receiver.wait_accepted(3)
        nursery.cancel_scope.cancel()
    assert card.capabilities.push_notifications
    assert (made.task_id, made.url, made.token) == (task.id, prefix + "sdk", "t-sdk")
    assert got == made and list(listed.configs) == [made]
    assert theirs == "not found"
    assert states(rest)[-1] == "TASK_STATE_COMPLETED"
    pushed = [json_format.ParseDict(r.event, StreamResponse()) for r in accepted]
    assert states(pushed) == ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
    assert text_of(pushed) == "All done."
    assert all(r.headers["x-a2a-notification-token"] == "t-sdk" for r in accepted)
    assert [r.url_path for r in accepted] == ["/hooks/sdk"] * 3
