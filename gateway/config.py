"""The daemon's configuration: TOML file, then environment, then flags, into one ``Config``.

docs/reference.md ("Configuration file") fixes every key and its default; this module adds
keys, never renames one. The layers apply in order, each overriding the last::

    defaults  <-  TOML file  <-  GATEWAY_<SECTION>_<KEY> variables  <-  command-line flags

Every layer is validated as it is applied: the file as a whole, then each
variable and each flag on its own. Defaults are valid and no key constrains
another, so the first layer that makes the config invalid is the one at fault
and the error names it: docs/reference.md asks for "one clear line naming the key and
the problem", and an operator also needs to know *where* to fix it::

    config error: gateway.toml: stream.queue_max_events: expected an integer >= 1, got "lots"
    config error: environment GATEWAY_STREAM_PING_INTERVAL_S: expected a number > 0, got "soon"
    config error: command line: server.port: expected an integer in 0..65535, got 70000

A value overridden by a later layer is still checked: a bad file is reported
even when a variable happens to mask the bad key. Types and ranges are declared
once, on the structs below; the error messages are derived from those
declarations, so they cannot drift apart.

There is no implicit config file: without ``--config`` the daemon runs on the
defaults (docs/reference.md "Command line").
"""

from __future__ import annotations

import base64
import binascii
import datetime
import ipaddress
import math
import os
import re
import tomllib
import typing
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import httpx
import msgspec
import msgspec.inspect as mi

from gateway.errors import ConfigError
from gateway.protocol import claude_code_tools as claude_code_tools
from gateway.protocol.events import CATALOG_TYPES
from gateway.protocol.http import IfBusy

# --- value types ---------------------------------------------------------------

ToolName = Literal["sleep", "read_file", "shell", "delegate"]
"""The built-in tools of docs/reference.md ("Built-in tools")."""

BUILTIN_TOOLS: tuple[str, ...] = typing.get_args(ToolName)

ToolPattern = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9_*?\[\]-]+(\([^()]*\))?$",
        extra={
            "expected": "a tool name or glob (letters, digits, _, -, *, ?, [])"
            " or a Claude Code rule such as Bash(git:*)"
        },
    ),
]
"""A built-in tool's name, ``mcp__<server>__<tool>``, a glob, or (``claude-code``) a Claude
Code tool's name or rule, ``Bash(git:*)`` (docs/reference.md "Agents")."""

Name = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$",
        max_length=64,
        extra={"expected": "a name of letters, digits, - and single _ (at most 64)"},
    ),
]
"""An agent's or an MCP server's name: it is part of ``mcp__<server>__<tool>``, so no ``__``."""

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Count = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
GraceSeconds = Annotated[float, msgspec.Meta(ge=0)]
Rate = Annotated[float, msgspec.Meta(ge=0)]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
HttpUrl = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(https?://\S+)?$",
        extra={"expected": "an http:// or https:// URL, or empty"},
    ),
]
HostName = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?|[0-9A-Fa-f]*:[0-9A-Fa-f:.]*"
        r"|[A-Za-z0-9_-][A-Za-z0-9_.-]*(:[0-9]{1,5})?)$",
        extra={"expected": "a host name or IP address (no scheme, no path)"},
    ),
]
AbsolutePath = Annotated[str, msgspec.Meta(pattern=r"^/", extra={"expected": "an absolute path"})]
EnvName = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        extra={"expected": "a variable name (letters, digits, _)"},
    ),
]
RedisUrl = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(rediss?|unix)://\S+$",
        extra={"expected": "a redis://, rediss:// or unix:// URL"},
    ),
]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every section: immutable, and an unknown key is an error.

    Subclasses repeat ``frozen=True``: msgspec inherits it, but mypy's
    dataclass_transform needs it spelled on each class.
    """


# --- sections --------------------------------------------------------------------


class ServerConfig(_Section, frozen=True):
    """``[server]``: the listener and its HTTP limits."""

    host: NonEmptyStr = "127.0.0.1"
    port: Port = 8421  # 0 picks a free port
    public_url: HttpUrl = ""  # base of ws_url when behind a proxy; "" = the listen address
    max_body_bytes: Count = 1_048_576
    read_timeout_s: Seconds = 10.0  # reading a request's header and body
    # Reading a body larger than max_body_bytes, on the routes that take one (a file,
    # a turn with inline files): docs/protocol.md §2 "Files".
    body_timeout_s: Seconds = 60.0
    keepalive_timeout_s: Seconds = 60.0  # an idle keep-alive connection is closed after this
    shutdown_grace_s: GraceSeconds = 5.0  # shutdown waits this long for turns and sockets
    max_header_bytes: Count = 16_384
    send_buffer_bytes: NonNegativeInt = 0  # SO_SNDBUF of accepted sockets; 0 = the OS default
    # Peers whose X-Forwarded-For / -Proto are believed (IPs or CIDRs): the proxy in front.
    trusted_proxies: tuple[NonEmptyStr, ...] = ()
    # Host names (a request's Host, port aside) answered; others: 421 (docs/protocol.md §15).
    # Empty: the loopback names, plus public_url's host.
    allowed_hosts: tuple[HostName, ...] = ()


class StreamConfig(_Section, frozen=True):
    """``[stream]``: the WebSocket stream (docs/protocol.md §3)."""

    queue_max_events: Count = 1000  # per-connection outbound bound; overflow closes with 1008
    ping_interval_s: Seconds = 30.0
    ping_max_missed: Count = 3
    replay_max_events: Count = 10_000
    # A session's in-memory tail of recent events (replays read older ones from the
    # store) holds at most replay_max_events and at most this many bytes.
    tail_max_bytes: Count = 1_048_576
    snapshot_messages: Count = 50
    # A snapshot frame never exceeds this (docs/protocol.md §15); 64 KiB to 64 MiB (the
    # reference client's frame limit).
    snapshot_max_bytes: Annotated[int, msgspec.Meta(ge=65_536, le=67_108_864)] = 8_388_608
    subscribe_timeout_s: Seconds = 10.0
    attach_token_ttl_s: Seconds = 60.0
    max_client_frame_bytes: Count = 65_536
    close_grace_s: GraceSeconds = 5.0  # a close frame's time to reach a slow client
    # When a session's events come within this of its last batch (it streams
    # faster than the fan-out), how long the translator may hold the next batch
    # open while the writers finish (it goes out as soon as they have); 0 = off.
    batch_window_ms: Annotated[float, msgspec.Meta(ge=0, le=100)] = 2.0
    # A subscription's default delta rollup window (docs/protocol.md §3 "Delta
    # rollup"): consecutive deltas of one block within it go out as one; 0 = off.
    coalesce_ms: Annotated[int, msgspec.Meta(ge=0, le=250)] = 0


class StoreConfig(_Section, frozen=True):
    """``[store]``: where events and messages are persisted."""

    backend: Literal["sqlite", "redis"] = "sqlite"
    path: NonEmptyStr = "gateway.db"  # sqlite
    url: RedisUrl = "redis://127.0.0.1:6379/0"  # redis: every node of a deployment names the same
    retention_hours: Count = 168  # older events: subscribe_error cursor_expired
    # The longest the writer gathers a batch before it commits. 0: it commits as
    # soon as something is pending (what comes meanwhile is the next batch);
    # live events wait for their commit (docs/protocol.md §9), so this is latency.
    flush_interval_ms: NonNegativeInt = 0
    commit_timeout_s: Seconds = 10.0  # a request waiting for a commit gives up (503) after this
    # A streaming message is stored at most this long after it changed (text streamed,
    # a block ended): a kill -9 loses about this much of it (bench/crash_loss.py).
    # 0 = at each block's end only.
    checkpoint_ms: NonNegativeInt = 500
    # redis: a session's lease (the node running it) lasts this long unless
    # renewed; when its node dies, its sessions are free for another node after this.
    lease_s: Seconds = 10.0


class Price(_Section, frozen=True):
    """USD per million tokens of one model, for ``Usage.cost_usd``."""

    input_per_mtok: Rate
    output_per_mtok: Rate
    cache_read_per_mtok: Rate = 0.0
    cache_write_per_mtok: Rate = 0.0


Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]


class ModelConfig(_Section, frozen=True):
    """``[model]``: the default agent's provider, model, prompt (docs/reference.md "Agents")."""

    provider: Literal["scripted", "anthropic", "openai"] = "scripted"
    name: NonEmptyStr = "scripted:echo"
    base_url: HttpUrl = ""  # provider endpoint override; "" = the provider's own
    max_tokens: Count = 4096
    thinking_budget_tokens: NonNegativeInt = 0  # 0 = extended thinking off
    # The default agent's system prompt (docs/protocol.md §11): one of the two, or neither.
    system: str = ""
    system_file: str = ""  # read at start-up and on SIGHUP
    temperature: Temperature | None = None  # None: the provider's own default
    context_max_tokens: Count = 150_000  # compaction threshold (docs/protocol.md §12)
    max_retries: NonNegativeInt = 2
    timeout_s: Seconds = 600.0  # one model call
    # Keyed by model name as in ``name``; a model without an entry costs 0.
    prices: dict[str, Price] = msgspec.field(default_factory=dict)


class TurnsConfig(_Section, frozen=True):
    """``[turns]``: limits of one turn."""

    timeout_s: Seconds = 600.0
    max_rounds: Count = 25  # LLM calls per turn; then turn.completed stop_reason "max_rounds"
    # A turn sent to a busy session, when it does not say (docs/protocol.md §2 "A busy session").
    if_busy: IfBusy = "reject"
    max_queued: Count = 8  # queued turns per session; one more is 409 queue_full


class FilesConfig(_Section, frozen=True):
    """``[files]``: a session's files (docs/protocol.md §2 "Files")."""

    max_bytes: Count = 20_971_520  # one file; over it: 413 file_too_large
    max_per_session: Count = 100  # files one session holds; one more: 409 too_many_files
    # The pixels of an image (width x height); over it: 422 invalid_file (a decompression bomb).
    max_image_pixels: Count = 40_000_000


class SessionsConfig(_Section, frozen=True):
    """``[sessions]``: where sessions work (docs/protocol.md §15), how long they stay loaded."""

    # A session unused this long leaves memory (docs/protocol.md §13): its tasks end,
    # its session-scope MCP servers stop, it is loaded again on its next request.
    idle_unload_s: Seconds = 600.0
    # Every session's own directory is made here (relative: to the daemon's working directory).
    workspace_root: NonEmptyStr = "workspaces"
    # Absolute directories a client may name as workspace_path (or a directory under one).
    allowed_workspaces: tuple[AbsolutePath, ...] = ()
    # A fork copies its source's workspace up to this many MiB of files (0: no limit);
    # past it, 409 workspace_too_large (docs/protocol.md §2, "Forks").
    fork_copy_max_mb: NonNegativeInt = 100


McpSampling = Literal["ask", "allow", "deny"]


class ToolsConfig(_Section, frozen=True):
    """``[tools]``: which built-in tools exist, which wait for permission, what they inherit."""

    # Built-in names, mcp__<server>__<tool>, globs (docs/reference.md "Agents"); "shell" is opt-in.
    enabled: tuple[ToolPattern, ...] = ("sleep", "read_file", "delegate")
    require_approval: tuple[ToolPattern, ...] = ()
    approval_timeout_s: Seconds = 300.0
    kill_grace_s: GraceSeconds = 5.0  # SIGTERM, then SIGKILL after this
    # The only variables a tool process gets beyond PATH, HOME (its workspace) and LANG.
    env: dict[EnvName, str] = msgspec.field(default_factory=dict)
    # Resource limits of a tool process (setrlimit); 0 = none.
    rlimit_cpu_s: NonNegativeInt = 0  # CPU seconds (RLIMIT_CPU)
    rlimit_memory_mb: NonNegativeInt = 0  # address space (RLIMIT_AS)
    rlimit_file_mb: NonNegativeInt = 0  # largest file it may write (RLIMIT_FSIZE)
    # A claude-code turn's wait for one of its agent's max_processes (gateway.tools.process_slots).
    process_slot_wait_s: Seconds = 5.0
    # An MCP server's sampling request (docs/protocol.md §11): asked of the user, allowed, refused.
    mcp_sampling: McpSampling = "ask"


class AgentConfig(_Section, frozen=True):
    """``[agents.NAME]``: an agent (docs/protocol.md §11, docs/reference.md "Agents").

    A key left out (None) takes the value of ``[model]``, ``[tools]`` and
    ``[turns]``: :func:`gateway.agents.resolve_agents` fills them in.
    """

    runtime: Literal["native", "claude-code"] = "native"
    model: NonEmptyStr | None = None  # "<provider>:<model>"
    base_url: HttpUrl | None = None
    system: str | None = None
    system_file: str | None = None
    tools: tuple[ToolPattern, ...] | None = None
    require_approval: tuple[ToolPattern, ...] | None = None
    delegate_agent: Name | None = None  # the agent a delegate tool's worker runs; None = this one
    max_tokens: Count | None = None
    temperature: Temperature | None = None
    thinking_budget_tokens: NonNegativeInt | None = None
    max_rounds: Count | None = None
    context_max_tokens: Count | None = None
    turn_timeout_s: Seconds | None = None
    mcp_sampling: McpSampling | None = None  # an MCP server's sampling requests (section 11)
    # claude-code runtime only
    permission_mode: Literal["default", "acceptEdits", "plan", "bypassPermissions"] = "default"
    max_processes: Count = 8
    idle_process_s: Seconds = 300.0
    # Claude Code's Bash in its sandbox (bubblewrap): off is the operator's choice, logged at start.
    sandbox: bool = True
    env: dict[EnvName, str] = msgspec.field(default_factory=dict)


class McpServerConfig(_Section, frozen=True):
    """``[mcp_servers.NAME]``: an MCP server whose tools agents use (docs/reference.md).

    Exactly one of ``command`` (stdio: the gateway starts and owns the process)
    and ``url`` (streamable HTTP).
    """

    command: tuple[NonEmptyStr, ...] = ()
    url: HttpUrl = ""
    env: dict[EnvName, str] = msgspec.field(default_factory=dict)
    headers: dict[NonEmptyStr, str] = msgspec.field(default_factory=dict)
    cwd: str = ""  # "" = the daemon's working directory
    scope: Literal["node", "session"] = "node"
    startup_timeout_s: Seconds = 20.0
    tool_timeout_s: Seconds = 300.0


class AuthConfig(_Section, frozen=True):
    """``[auth]``: who may connect."""

    api_keys: tuple[NonEmptyStr, ...] = ()  # empty: no auth (loopback use); else Bearer required
    api_keys_file: str = ""  # more keys, one a line; re-read on SIGHUP; "" = none
    # Origins besides the gateway's own whose requests are answered, CORS included
    # (docs/protocol.md §15); empty: the gateway's own only.
    allowed_origins: tuple[NonEmptyStr, ...] = ()


class LimitsConfig(_Section, frozen=True):
    """``[limits]``: what keeps one client from starving the rest; 0 = no limit."""

    max_connections: NonNegativeInt = 0  # open streams in total (503 over_capacity)
    max_connections_per_key: NonNegativeInt = 0  # open streams per API key (503 over_capacity)
    max_sessions_per_key: NonNegativeInt = 0  # sessions an API key may own (429 too_many_sessions)
    turns_per_minute_per_key: NonNegativeInt = 0  # turns submitted per key (429, Retry-After)
    # What one turn may make the host do (docs/protocol.md §15); beyond: tool.failed "limit".
    max_tool_uses_per_turn: NonNegativeInt = 64  # tool uses of one turn, its workers' apart
    max_workers_per_turn: NonNegativeInt = 8  # delegate workers one turn starts
    max_delegate_depth: NonNegativeInt = 2  # workers of workers: how deep delegation goes
    max_session_mb: NonNegativeInt = 256  # stored data of a session; past it 409 session_too_large
    max_file_mb_per_key: NonNegativeInt = 0  # a key's files, all sessions (429 quota_exceeded)


class LogConfig(_Section, frozen=True):
    """``[log]``: how the daemon writes its log (to stderr)."""

    format: Literal["text", "json"] = "text"  # json: one object a line (ts, level, event, ...)
    level: Literal["debug", "info", "warning", "error"] = "info"
    queue_lines: Count = 10_000  # lines waiting for a slow reader; past it: dropped, counted


class TelemetryConfig(_Section, frozen=True):
    """``[telemetry]``: OpenTelemetry traces (docs/operating.md "Traces"; the otel extra)."""

    # "": as the OTEL_* environment says (off when it says nothing); "otlp": export; "none": never
    traces: Literal["", "otlp", "none"] = ""
    endpoint: HttpUrl = ""  # OTLP/HTTP traces URL; "": from OTEL_EXPORTER_OTLP_*, else local
    service_name: str = ""  # "": OTEL_SERVICE_NAME, else "gateway"
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0  # of the turns traced
    shutdown_timeout_s: Seconds = 5.0  # export timeout, and the flush bound at stop


WebhookUrl = Annotated[
    str,
    msgspec.Meta(pattern=r"^https?://\S+$", extra={"expected": "an http:// or https:// URL"}),
]
WebhookSecret = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^whsec_[A-Za-z0-9+/]+={0,2}$",
        extra={"expected": "a Standard Webhooks secret: whsec_ and base64"},
    ),
]


class WebhookConfig(_Section, frozen=True):
    """``[webhooks.NAME]``: catalog events POSTed, signed, to a receiver (docs/reference.md)."""

    url: WebhookUrl
    events: tuple[NonEmptyStr, ...]  # catalog event types (docs/protocol.md §4)
    secret: WebhookSecret
    timeout_s: Seconds = 10.0  # one attempt
    max_attempts: Count = 12  # then the delivery is dropped and logged (webhook_dropped)
    retry_first_s: Seconds = 1.0  # the first retry's wait, doubling...
    retry_max_s: Seconds = 600.0  # ...up to this


class A2aConfig(_Section, frozen=True):
    """``[a2a]``: the A2A door's push notifications (docs/doors/a2a.md "Push notifications")."""

    # The URLs a push config may name begin with one of these (https://HOST/...; http:// for
    # a loopback host only); empty: push notifications are not offered.
    push_url_prefixes: tuple[NonEmptyStr, ...] = ()
    push_secret: str = ""  # whsec_...: signs each notification (Standard Webhooks); required
    push_max_configs: Count = 10  # push configs per context (session)
    push_timeout_s: Seconds = 10.0  # one attempt (as [webhooks.NAME]'s)
    push_max_attempts: Count = 12  # then the notification is dropped and logged
    push_retry_first_s: Seconds = 1.0  # the first retry's wait, doubling...
    push_retry_max_s: Seconds = 600.0  # ...up to this


class Config(_Section, frozen=True, weakref=True):
    """The whole configuration; ``Config()`` is the embedded defaults.

    The file it was read from is :func:`config_file` (not a key).
    """

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    stream: StreamConfig = msgspec.field(default_factory=StreamConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    turns: TurnsConfig = msgspec.field(default_factory=TurnsConfig)
    sessions: SessionsConfig = msgspec.field(default_factory=SessionsConfig)
    files: FilesConfig = msgspec.field(default_factory=FilesConfig)
    tools: ToolsConfig = msgspec.field(default_factory=ToolsConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    # ``[agents] default = "NAME"`` and the ``[agents.NAME]`` tables (docs/reference.md
    # "Agents"); the file's one string key is lifted into ``default_agent`` when
    # the file is read (:func:`_lift_default_agent`).
    agents: dict[Name, AgentConfig] = msgspec.field(default_factory=dict)
    default_agent: Name = "default"
    mcp_servers: dict[Name, McpServerConfig] = msgspec.field(default_factory=dict)
    webhooks: dict[Name, WebhookConfig] = msgspec.field(default_factory=dict)
    a2a: A2aConfig = msgspec.field(default_factory=A2aConfig)


DEFAULT_CONFIG_TOML = """\
# gateway.toml: every key with its default (docs/reference.md, "Configuration file").
# Environment variables GATEWAY_<SECTION>_<KEY> override this file, and the
# command-line flags --host and --port override both.

[server]
host = "127.0.0.1"
port = 8421                  # 0 picks a free port
public_url = ""              # e.g. "https://gw.example.com": ws_url then starts with wss://gw.example.com
max_body_bytes = 1048576     # largest HTTP request body
read_timeout_s = 10.0        # reading a request's header and body
body_timeout_s = 60.0        # a body over max_body_bytes read; 256 KiB of an answer taken
keepalive_timeout_s = 60.0   # an idle keep-alive connection is closed after this
shutdown_grace_s = 5.0       # on SIGTERM: how long to wait for turns to cancel and sockets to close
max_header_bytes = 16384     # largest HTTP request header
send_buffer_bytes = 0        # SO_SNDBUF of accepted sockets; 0 = the OS default
trusted_proxies = []         # IPs or CIDRs whose X-Forwarded-For/-Proto are believed (the proxy)
allowed_hosts = []           # Host names answered (else 421); empty: loopback + public_url's

[stream]
queue_max_events = 1000      # per-connection outbound bound; overflow closes with 1008
ping_interval_s = 30         # server ping period
ping_max_missed = 3          # unanswered pings before the connection is closed
replay_max_events = 10000    # longest replay a subscribe may ask for
tail_max_bytes = 1048576     # recent events a session keeps in memory, in bytes
snapshot_messages = 50       # messages in a snapshot
snapshot_max_bytes = 8388608 # a snapshot frame never exceeds this: older messages left out first
subscribe_timeout_s = 10     # a new connection must subscribe within this
attach_token_ttl_s = 60      # lifetime of an attach token
max_client_frame_bytes = 65536
close_grace_s = 5.0          # how long a close frame may take to reach a slow client
batch_window_ms = 2.0        # events faster than this: the longest a batch waits to grow; 0 = off
coalesce_ms = 0              # default delta rollup window of a subscription (0..250); 0 = off

[store]
backend = "sqlite"           # "sqlite" (the embedded default) | "redis" (several nodes)
path = "gateway.db"          # sqlite
url = "redis://127.0.0.1:6379/0"   # redis: every node of a deployment names the same one
retention_hours = 168        # older events: subscribe_error cursor_expired
flush_interval_ms = 0        # longest the writer gathers a batch; 0 = commit once one is pending
commit_timeout_s = 10.0      # a request waiting for a commit gives up with 503 store_unavailable
checkpoint_ms = 500          # a streaming message is stored this often: what a kill -9 can lose
lease_s = 10.0               # redis: a session's lease; a dead node's sessions are free after this

[model]
provider = "scripted"        # "scripted" | "anthropic" | "openai"
name = "scripted:echo"       # e.g. "anthropic:claude-sonnet-4-6"
base_url = ""                # provider endpoint override (a proxy, a local server)
max_tokens = 4096
thinking_budget_tokens = 0   # extended thinking budget; 0 = off
max_retries = 2              # retries of a failed model call
timeout_s = 600.0            # one model call
system = ""                  # the default agent's system prompt (never sent to a client)
system_file = ""             # ... or a file holding it, read at start-up and on SIGHUP
# temperature = 1.0          # unset: the provider's default
context_max_tokens = 150000  # compaction threshold (docs/protocol.md section 12)

[model.prices]               # USD per million tokens, keyed by model name; unlisted models cost 0
# For example:
# [model.prices."anthropic:claude-sonnet-4-6"]
# input_per_mtok = 3.0
# output_per_mtok = 15.0
# cache_read_per_mtok = 0.3    # optional, default 0
# cache_write_per_mtok = 3.75  # optional, default 0

[turns]
timeout_s = 600              # one whole turn
max_rounds = 25              # LLM calls per turn; then turn.completed stop_reason "max_rounds"
if_busy = "reject"           # a turn sent to a busy session: reject, queue, interrupt or steer
max_queued = 8               # queued turns per session; one more is 409 queue_full

[sessions]
idle_unload_s = 600          # a session unused this long leaves memory (loaded again when used)
workspace_root = "workspaces"  # every session's own directory lives here
allowed_workspaces = []      # absolute roots a client may name as workspace_path; empty: none
fork_copy_max_mb = 100       # a fork copies up to this much of its source's workspace; 0: no limit

[files]                      # docs/protocol.md §2 "Files"
max_bytes = 20971520         # one file (20 MiB); over it: 413 file_too_large
max_per_session = 100        # files one session holds; one more: 409 too_many_files
max_image_pixels = 40000000  # an image's width x height; over it: 422 invalid_file
[tools]
enabled = ["sleep", "read_file", "delegate"]   # "shell" is opt-in; mcp__<server>__<tool>, globs
require_approval = []                          # tool names (or globs) that wait for permission
approval_timeout_s = 300                       # an unanswered approval request fails after this
kill_grace_s = 5                               # SIGTERM, then SIGKILL after this
env = {}                                       # a tool process's variables beyond PATH, HOME, LANG
rlimit_cpu_s = 0                               # CPU seconds of a tool process; 0 = no limit
rlimit_memory_mb = 0                           # its address space; 0 = no limit
rlimit_file_mb = 0                             # the largest file it may write; 0 = no limit
process_slot_wait_s = 5                        # claude-code: a turn's wait for a slot; then 503
mcp_sampling = "ask"                           # an MCP server's sampling request: ask, allow, deny

[auth]
api_keys = []                # empty: no auth (loopback use); else Bearer required
api_keys_file = ""           # more keys, one a line (# comments); re-read on SIGHUP
allowed_origins = []         # origins besides the gateway's own (CORS answered); empty: none

[limits]                     # 0 = no limit
max_connections = 0          # open streams in total; over it: 503 over_capacity before the upgrade
max_connections_per_key = 0  # open streams per API key; over it: 503 over_capacity
max_sessions_per_key = 0     # sessions one API key may own; over it: 429 too_many_sessions
turns_per_minute_per_key = 0 # turns one API key may submit a minute; over it: 429 with Retry-After
max_tool_uses_per_turn = 64  # tools one turn runs; beyond: tool.failed "limit"
max_workers_per_turn = 8     # delegate workers one turn starts; beyond: tool.failed "limit"
max_delegate_depth = 2       # how deep delegation goes; beyond: tool.failed "limit"
max_session_mb = 256         # a session's stored data; past it: 409 session_too_large
max_file_mb_per_key = 0      # MiB of files one API key stores; over it: 429 quota_exceeded

[log]
format = "text"              # "text" | "json": one JSON object a line, with ts, level,
                             # event and, where they apply, session_id, turn_id, client
level = "info"               # "debug" | "info" | "warning" | "error"
queue_lines = 10000          # lines waiting for a slow stderr; past it dropped and counted

[telemetry]                  # traces (docs/operating.md "Traces"): pip install 'gateway[otel]'
traces = ""                  # "": as OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT say
                             # (nothing unless they ask) | "otlp": export | "none": never
endpoint = ""                # OTLP/HTTP traces URL; "": OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
                             # OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, else localhost:4318
service_name = ""            # "": OTEL_SERVICE_NAME, else "gateway"
sample_ratio = 1.0           # the share of turns traced (a worker's follows its parent's)
shutdown_timeout_s = 5.0     # an export's timeout, and how long stopping waits for the flush

# More agents (docs/reference.md, "Agents"; [model], [tools] and [turns] are the one
# named "default"); a key left out takes the value of [model], [tools] and [turns]:
# [agents]
# default = "support"                # the agent of a POST /sessions that names none
# [agents.support]
# model = "anthropic:claude-sonnet-4-6"
# system_file = "/etc/gateway/support.md"
# tools = ["read_file", "mcp__tickets__*"]
# require_approval = ["mcp__tickets__close"]
# max_rounds = 25
#
# MCP servers whose tools agents use (docs/reference.md, "MCP servers"):
# [mcp_servers.tickets]              # stdio: the gateway starts and owns the process
# command = ["/usr/local/bin/tickets-mcp", "--stdio"]
# env = {}
# cwd = ""                           # "" = the daemon's working directory
# scope = "node"                     # "node": one for every session | "session": one per session
# startup_timeout_s = 20
# tool_timeout_s = 300
# [mcp_servers.search]               # streamable HTTP
# url = "http://127.0.0.1:9000/mcp"
# headers = { Authorization = "Bearer ..." }
#
[a2a]                        # the A2A door's push notifications (docs/doors/a2a.md)
push_url_prefixes = []       # a push config's URL starts with one (https://HOST/...); empty: none
push_secret = ""             # whsec_...: signs each notification; required with prefixes
push_max_configs = 10        # push configs per context (session)
push_timeout_s = 10.0        # one attempt
push_max_attempts = 12       # then the notification is dropped and logged (webhook_dropped)
push_retry_first_s = 1.0     # the first retry's wait, doubling...
push_retry_max_s = 600.0     # ...up to this

# Webhooks (docs/reference.md, "Webhooks"): catalog events POSTed, signed, to a receiver:
# [webhooks.crm]
# url = "https://crm.example.com/hooks/gateway"
# events = ["turn.completed", "permission.requested"]
# secret = "whsec_..."               # Standard Webhooks secret (base64 after the prefix)
# timeout_s = 10                     # one attempt
# max_attempts = 12                  # then the delivery is dropped and logged (webhook_dropped)
# retry_first_s = 1                  # the first retry's wait, doubling...
# retry_max_s = 600                  # ...up to this
"""


# --- loading ---------------------------------------------------------------------

_TABLES_OF_TABLES = ("agents", "default_agent", "mcp_servers", "webhooks")

SCHEMA: dict[str, dict[str, Any]] = {
    section.name: {key.name: key.type for key in msgspec.structs.fields(section.type)}
    for section in msgspec.structs.fields(Config)
    if section.name not in _TABLES_OF_TABLES
}
"""Section -> key -> declared type: what the environment and the flags may set."""

_ENV_PREFIX = "GATEWAY_"
_ENV_KEYS: dict[str, tuple[str, str]] = {
    f"{_ENV_PREFIX}{section}_{key}".upper(): (section, key)
    for section, keys in SCHEMA.items()
    for key in keys
}


def load_config(path: str | None, env: Mapping[str, str], overrides: Mapping[str, Any]) -> Config:
    """Build the configuration from its layers (docs/reference.md "Configuration file").

    Args:
        path: the TOML file, or None for the embedded defaults.
        env: the process environment; every ``GATEWAY_*`` variable must be a config key.
        overrides: values from command-line flags, by dotted key (``"server.port"``).

    Returns:
        The validated, immutable configuration.

    Raises:
        ConfigError: one line naming the source, the key and the problem.
    """
    raw: dict[str, Any] = {}
    config = Config()
    if path is not None:
        raw = _read_toml(path)
        config = _validate(raw, _Source(path))
    for source, section, key, value in [*_env_entries(env), *_override_entries(overrides)]:
        raw.setdefault(section, {})[key] = value
        config = _validate(raw, source)
    if config.a2a.push_url_prefixes and not config.a2a.push_secret:  # whichever set it last
        problem = "a2a.push_secret: required with push_url_prefixes (whsec_ and base64)"
        raise ConfigError(f"config error: {problem}")
    keys = ("a2a.push_retry_first_s", "a2a.push_retry_max_s")  # as well
    _check_retry_bound(config.a2a.push_retry_first_s, config.a2a.push_retry_max_s, keys, None)
    if path is not None:
        _FILES[id(config)] = os.path.abspath(path)
        weakref.finalize(config, _FILES.pop, id(config), None)
    return config


_FILES: dict[int, str] = {}  # by id() of a loaded Config: the file it was read from


def config_file(config: Config) -> str:
    """The file ``config`` was read from by :func:`load_config` ("" for none).

    A claude-code agent's sandboxed ``Bash`` may not read it (docs/protocol.md §11).
    """
    return _FILES.get(id(config), "")


@dataclass(frozen=True)
class _Source:
    """Where a value came from; ``key`` is the one key the source's name already says."""

    name: str
    key: str | None = None

    def error(self, key: str | None, problem: str) -> ConfigError:
        where = self.name if key is None or key == self.key else f"{self.name}: {key}"
        return ConfigError(f"config error: {where}: {problem}")


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            text = file.read().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config error: no such config file: {path}") from None
    except OSError as exc:
        raise ConfigError(f"config error: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config error: {path}: not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)".
        raise ConfigError(f"config error: {path}: invalid TOML: {exc}") from None


def _env_entries(env: Mapping[str, str]) -> Iterator[tuple[_Source, str, str, Any]]:
    for var in sorted(name for name in env if name.startswith(_ENV_PREFIX)):
        if var not in _ENV_KEYS:
            raise _Source(f"environment {var}").error(None, "not a config key")
        section, key = _ENV_KEYS[var]
        source = _Source(f"environment {var}", key=f"{section}.{key}")
        yield source, section, key, _parse_env_value(env[var], SCHEMA[section][key])


def _parse_env_value(text: str, declared: Any) -> Any:
    """A string key takes the text as is; any other key reads it as a TOML value.

    Text that is not a TOML value stays a string, so that validation reports it
    against the key's type ("expected a number, got "soon"").
    """
    info = _unwrap(mi.type_info(declared))
    is_text = isinstance(info, mi.StrType) or (
        isinstance(info, mi.LiteralType) and all(isinstance(v, str) for v in info.values)
    )
    if is_text:
        return text
    try:
        parsed = tomllib.loads(f"value = {text}")
    except tomllib.TOMLDecodeError:
        return text
    return parsed["value"] if parsed.keys() == {"value"} else text


def _override_entries(overrides: Mapping[str, Any]) -> Iterator[tuple[_Source, str, str, Any]]:
    source = _Source("command line")
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if key not in SCHEMA.get(section, {}):
            raise source.error(None, f"unknown key {dotted}")
        yield source, section, key, value


# --- validation and its messages ---------------------------------------------------

_MESSAGE = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>.*)`)?$")
_KEY_MESSAGE = re.compile(r"^.* - at `key` in `\$(?P<path>.*)`$")
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `(?P<name>.*)`$")
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<name>.*)`$")
_PATH_STEP = re.compile(r"\.(?P<field>\w+)|\[(?P<index>\d+)\]|\[\.\.\.\]")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _validate(raw: dict[str, Any], source: _Source) -> Config:
    raw = _lift_default_agent(raw, source)
    _check_finite(raw, source, None)
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        if bad_key := _KEY_MESSAGE.match(str(exc)):  # a table's key, not its value
            table, value, declared = _locate(bad_key["path"], raw)
            key_type = typing.get_args(_strip_annotated(declared))[0]
            name = next(k for k in value if not _is_valid(k, key_type))
            expected = _describe(mi.type_info(key_type))
            raise source.error(table, f"{_show(name)} is not {expected}") from None
        match = _MESSAGE.match(str(exc))
        assert match is not None  # the pattern matches any string
        key, value, declared = _locate(match["path"] or "", raw)
        problem = match["problem"]
        if unknown := _UNKNOWN_FIELD.match(problem):
            name = _join(key, unknown["name"])
            if key is None and isinstance(value.get(unknown["name"]), dict):
                raise source.error(None, f"unknown section [{name}]") from None
            raise source.error(None, f"unknown key {name}") from None
        if missing := _MISSING_FIELD.match(problem):
            raise source.error(key, f"missing key {missing['name']}") from None
        expected = _describe(mi.type_info(declared))
        raise source.error(key, f"expected {expected}, got {_show(value)}") from None
    _check_trusted_proxies(config.server.trusted_proxies, source)
    _check_urls(config, source)
    _check_agents(config, source)
    _check_webhooks(config, source)
    _check_a2a_push(config, source)
    return config


def _check_finite(value: Any, source: _Source, key: str | None) -> None:
    """No key takes ``inf`` or ``nan``, which TOML spells (docs/reference.md "Configuration
    file"): a bound such as ``> 0`` lets ``inf`` pass, and ``nan`` would be shown as JSON's
    ``null``; found before any other check, named as the operator wrote it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise source.error(key, f"expected a finite number, got {value}")
    if isinstance(value, dict):
        for name, item in value.items():
            _check_finite(item, source, _join(key, _quote(str(name))))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_finite(item, source, f"{key}[{index}]")


def _lift_default_agent(raw: dict[str, Any], source: _Source) -> dict[str, Any]:
    """``[agents] default = "NAME"`` becomes ``default_agent``; a table there stays an agent.

    ``[agents.default]`` (a table) defines the agent named ``default`` (the
    ``[model]`` one, with its keys overridden); ``default = "NAME"`` (a string)
    names the agent of a ``POST /sessions`` that names none.
    """
    if "default_agent" in raw:
        raise source.error(None, "unknown key default_agent")
    agents = raw.get("agents")
    if not isinstance(agents, dict) or not isinstance(agents.get("default"), str):
        return raw
    agents = dict(agents)
    lifted = dict(raw, agents=agents, default_agent=agents.pop("default"))
    return lifted


_GLOB = re.compile(r"[*?\[]")


def _check_agents(config: Config, source: _Source) -> None:
    """What no single key can say: names that must exist, keys that exclude each other.

    docs/reference.md "Agents": an unknown tool, MCP server or agent, or both
    ``system`` and ``system_file``, is a config error. A tool pattern names a
    tool of the agent's runtime (a built-in tool; for ``claude-code`` one of
    Claude Code's, :mod:`gateway.protocol.claude_code_tools`, or a rule of
    one such as ``Bash(git:*)``), ``mcp__<server>__<tool>`` of a configured
    server, or is a glob; a tool of the other runtime is named as such. A
    ``claude-code`` agent's keys the CLI cannot honour are errors too
    (:func:`_claude_code_problem`).
    """
    known = ["default", *config.agents]
    if config.default_agent not in known:
        problem = f"unknown agent {_show(config.default_agent)}; agents are {', '.join(known)}"
        raise source.error("agents.default", problem)
    if config.model.system and config.model.system_file:
        raise source.error("model", "system and system_file are both set; keep one")
    for name, server in config.mcp_servers.items():
        if bool(server.command) == bool(server.url):
            problem = "set exactly one of command (stdio) and url (streamable HTTP)"
            raise source.error(f"mcp_servers.{name}", problem)
    lists = [("tools.enabled", config.tools.enabled, "native")]
    lists.append(("tools.require_approval", config.tools.require_approval, "native"))
    for name, agent in config.agents.items():
        where = f"agents.{name}"
        if agent.system is not None and agent.system_file is not None:
            raise source.error(where, "system and system_file are both set; keep one")
        if agent.delegate_agent is not None and agent.delegate_agent not in known:
            problem = f"unknown agent {_show(agent.delegate_agent)}; agents are {', '.join(known)}"
            raise source.error(f"{where}.delegate_agent", problem)
        lists.append((f"{where}.tools", agent.tools or (), agent.runtime))
        lists.append((f"{where}.require_approval", agent.require_approval or (), agent.runtime))
    for key, patterns, runtime in lists:
        for index, pattern in enumerate(patterns):
            if wrong := _tool_pattern_problem(pattern, config, runtime):
                raise source.error(f"{key}[{index}]", wrong)
    for name, agent in config.agents.items():
        if agent.runtime == "claude-code" and (wrong_key := _claude_code_problem(name, config)):
            raise source.error(*wrong_key)


CLAUDE_CODE_MIN_CONTEXT = 100_000
"""The smallest auto-compact window Claude Code takes (``CLAUDE_CODE_AUTO_COMPACT_WINDOW``)."""


def _claude_code_problem(name: str, config: Config) -> tuple[str, str] | None:
    """A ``claude-code`` agent's key the CLI cannot honour: the key and the problem.

    docs/protocol.md §11, "Options": Claude Code takes no temperature (its
    own, or the ``[model]`` one of a ``default`` agent that is Claude Code's);
    ``context_max_tokens`` is its auto-compact window, at least
    :data:`CLAUDE_CODE_MIN_CONTEXT`; ``require_approval`` needs ``tools``
    (without them Claude Code's default tools ask as ``permission_mode`` says).
    """
    agent, where = config.agents[name], f"agents.{name}"
    if agent.temperature is not None or (
        name == "default" and config.model.temperature is not None
    ):
        key = f"{where}.temperature" if agent.temperature is not None else "model.temperature"
        return key, "Claude Code takes no temperature (runtime claude-code); leave it out"
    context = agent.context_max_tokens
    if (context or config.model.context_max_tokens) < CLAUDE_CODE_MIN_CONTEXT:
        key = f"{where}.context_max_tokens" if context else "model.context_max_tokens"
        value = context or config.model.context_max_tokens
        return key, (
            f"Claude Code's auto-compact window is at least {CLAUDE_CODE_MIN_CONTEXT} tokens"
            f" (runtime claude-code), got {value}"
        )
    if agent.require_approval and agent.tools is None:
        return f"{where}.require_approval", (
            "needs tools on a claude-code agent (without tools, Claude Code's default tools"
            " ask as its permission_mode says)"
        )
    return None


def _tool_pattern_problem(pattern: str, config: Config, runtime: str) -> str | None:
    if pattern.startswith("mcp__"):
        server, sep, tool = pattern[5:].partition("__")
        if not sep or not server or not tool:
            return f"{_show(pattern)} is not mcp__<server>__<tool>"
        if not _GLOB.search(server) and server not in config.mcp_servers:
            servers = ", ".join(config.mcp_servers) or "none"
            return f"unknown MCP server {_show(server)} in {_show(pattern)}; servers: {servers}"
        return None
    cc = claude_code_tools
    name = cc.rule_tool(pattern)
    if runtime == "claude-code":
        if name in cc.TOOLS or (name == pattern and _GLOB.search(pattern)):
            return None
        if name in BUILTIN_TOOLS:
            return (
                f"{_show(name)} is a tool of the native runtime, not of claude-code;"
                f" Claude Code's tools are {', '.join(sorted(cc.TOOLS))}"
            )
        return (
            f"unknown Claude Code tool {_show(name)}; Claude Code {cc.CLI_VERSION}'s tools are"
            f" {', '.join(sorted(cc.TOOLS))}"
        )
    if name == pattern and (_GLOB.search(pattern) or pattern in BUILTIN_TOOLS):
        return None
    if name in cc.TOOLS:
        return (
            f"{_show(pattern)} is Claude Code's (runtime claude-code), not a tool of the native"
            f" runtime; tools are {', '.join(BUILTIN_TOOLS)} and mcp__<server>__<tool>"
        )
    return (
        f"unknown tool {_show(pattern)}; tools are {', '.join(BUILTIN_TOOLS)}"
        " and mcp__<server>__<tool>"
    )


def _check_webhooks(config: Config, source: _Source) -> None:
    """Each webhook's events are catalog events, its secret is base64 (docs/reference.md)."""
    for name, hook in config.webhooks.items():
        where = f"webhooks.{name}"
        if not hook.events:
            raise source.error(f"{where}.events", "name at least one catalog event type")
        for index, type_ in enumerate(hook.events):
            if type_ not in CATALOG_TYPES:
                problem = f"{_show(type_)} is not a catalog event type (docs/protocol.md §4)"
                raise source.error(f"{where}.events[{index}]", problem)
        try:
            body = hook.secret.removeprefix("whsec_")  # padding optional, as libraries take it
            key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        except binascii.Error:
            key = b""
        if not key:
            raise source.error(f"{where}.secret", "expected whsec_ and base64, got a bad base64")
        _check_url(f"{where}.url", hook.url, source)
        keys = (f"{where}.retry_first_s", f"{where}.retry_max_s")
        _check_retry_bound(hook.retry_first_s, hook.retry_max_s, keys, source)


def _check_urls(config: Config, source: _Source) -> None:
    """Every URL key a connection is made to (a webhook's: :func:`_check_webhooks`) has a
    port and a host it can use (:func:`sendable_problem`), refused naming its key rather
    than at the first request (docs/reference.md "Configuration file")."""
    urls = {
        "server.public_url": config.server.public_url,
        "model.base_url": config.model.base_url,
        "telemetry.endpoint": config.telemetry.endpoint,
        **{f"agents.{n}.base_url": a.base_url or "" for n, a in config.agents.items()},
        **{f"mcp_servers.{n}.url": m.url for n, m in config.mcp_servers.items()},
    }
    for key, url in urls.items():
        if url:
            _check_url(key, url, source)


def _check_url(key: str, url: str, source: _Source) -> None:
    """``url`` (key ``key``) has a host and a port a connection can use."""
    if bad := sendable_problem(url):
        problem = f"expected an http:// or https:// URL, got {_show(url)} ({bad})"
        raise source.error(key, problem)


def _check_retry_bound(
    first: float, most: float, keys: tuple[str, str], source: _Source | None
) -> None:
    """A retry's wait doubles from the first key's *up to* the second's (docs/reference.md
    "Webhooks"): the bound is at least the first wait, so waits never shrink. ``source``
    None: checked once every layer is read (either key may come from any)."""
    if most < first:
        problem = f"expected a number >= {keys[0].rpartition('.')[2]} ({first:g}), got {most:g}"
        if source is None:
            raise ConfigError(f"config error: {keys[1]}: {problem}")
        raise source.error(keys[1], problem)


def sendable_problem(url: str) -> str | None:
    """Why httpx cannot send to ``url``, which its key's pattern took (None: it can): its
    port or host is not valid, or it has no host (docs/reference.md "Webhooks"). Found
    here, not by the first delivery, which raised it and took the node down."""
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL as exc:
        return str(exc)
    if not host:
        return "no host"
    try:
        host.encode("idna")  # as the connection does: an empty or long label fails
    except UnicodeError:
        return "not a valid host name"
    return None


_PUSH_PREFIX = re.compile(r"^(https|http)://([^/@?#\\\s]+)/[^?#\\\s]*$")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def push_prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` is no ``[a2a] push_url_prefixes`` entry (None: it is one).

    A scheme, a host (no credentials) and a path that begins with ``/``, so a prefix
    never matches another host (``https://a.example`` would match ``https://a.example.evil``);
    ``http://`` for a loopback host only.
    """
    match = _PUSH_PREFIX.match(prefix)
    if match is None or not prefix.isascii() or sendable_problem(prefix):
        return f"expected https://HOST/ and an optional path, got {_show(prefix)}"
    host = (
        match[2].rsplit(":", 1)[0] if not match[2].startswith("[") else match[2].split("]")[0] + "]"
    )
    if match[1] == "http" and host not in LOOPBACK_HOSTS:
        return f"http:// is for a loopback host only (127.0.0.1, localhost, [::1]): {_show(prefix)}"
    return None


def _check_a2a_push(config: Config, source: _Source) -> None:
    """``[a2a] push_url_prefixes``: each a prefix (:func:`push_prefix_problem`); the secret's
    form (it is required with prefixes: :func:`load_config` checks it once every key is read)."""
    a2a = config.a2a
    for index, prefix in enumerate(a2a.push_url_prefixes):
        if bad := push_prefix_problem(prefix):
            raise source.error(f"a2a.push_url_prefixes[{index}]", bad)
    if a2a.push_secret:  # required with push_url_prefixes: load_config checks it at the end
        body = a2a.push_secret.removeprefix("whsec_")
        try:
            key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        except binascii.Error:
            key = b""
        if not a2a.push_secret.startswith("whsec_") or not key:
            raise source.error("a2a.push_secret", "expected whsec_ and base64")


def _check_trusted_proxies(entries: tuple[str, ...], source: _Source) -> None:
    """Each ``[server] trusted_proxies`` entry is an IP address or network, as the server parses it.

    gateway.http.server.TrustedProxies reads them with
    ``ipaddress.ip_network(strict=False)``: a host address is a /32 (or /128)
    network, and host bits of a network are ignored (``10.1.2.3/8`` is
    ``10.0.0.0/8``).
    """
    for index, entry in enumerate(entries):
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            problem = f"expected an IP address or network (CIDR), got {_show(entry)}"
            raise source.error(f"server.trusted_proxies[{index}]", problem) from None


def _locate(path: str, raw: Any) -> tuple[str | None, Any, Any]:
    """Follow msgspec's error path through the raw value and the declared types.

    Returns the dotted key (None for the top level), the offending value and its
    declared type. msgspec writes a dict key as ``[...]``; the entry at fault is
    found by validating each entry on its own.
    """
    key: str | None = None
    value: Any = raw
    declared: Any = Config
    for step in _PATH_STEP.finditer(path):
        declared = _strip_annotated(declared)
        if step["field"] is not None:
            field = step["field"]
            declared = {f.name: f.type for f in msgspec.structs.fields(declared)}[field]
            key, value = _join(key, field), value[field]
        elif step["index"] is not None:
            index = int(step["index"])
            declared = typing.get_args(declared)[0]
            key, value = f"{key}[{index}]", value[index]
        else:
            declared = typing.get_args(declared)[1]
            entry = next(k for k, v in value.items() if not _is_valid(v, declared))
            key, value = _join(key, _quote(entry)), value[entry]
    return key, value, declared


def _is_valid(value: Any, declared: Any) -> bool:
    try:
        msgspec.convert(value, declared)
    except msgspec.ValidationError:
        return False
    return True


def _strip_annotated(declared: Any) -> Any:
    return typing.get_args(declared)[0] if typing.get_origin(declared) is Annotated else declared


def _unwrap(info: mi.Type) -> mi.Type:
    return info.type if isinstance(info, mi.Metadata) else info


def _describe(info: mi.Type) -> str:
    """What a value of this declared type looks like, in an operator's words."""
    if isinstance(info, mi.Metadata):
        expected = (info.extra or {}).get("expected")
        return str(expected) if expected else _describe(info.type)
    if isinstance(info, mi.BoolType):
        return "true or false"
    if isinstance(info, mi.IntType):
        return "an integer" + _bounds(info)
    if isinstance(info, mi.FloatType):
        return "a number" + _bounds(info)
    if isinstance(info, mi.StrType):
        return "a non-empty string" if info.min_length else "a string"
    if isinstance(info, mi.LiteralType):
        choices = ", ".join(_show(v) for v in info.values)
        return choices if len(info.values) == 1 else f"one of {choices}"
    if isinstance(info, mi.VarTupleType | mi.ListType):
        return "a list"
    if isinstance(info, mi.DictType | mi.StructType):
        return "a table"
    if isinstance(info, mi.UnionType):
        kinds = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return " or ".join(_describe(t) for t in kinds) if kinds else "a valid value"
    return "a valid value"  # unreachable for the types declared above


def _bounds(info: mi.IntType | mi.FloatType) -> str:
    if info.ge is not None and info.le is not None:
        return f" in {info.ge}..{info.le}"
    if info.ge is not None:
        return f" >= {info.ge}"
    if info.gt is not None:
        return f" > {info.gt}"
    return ""


def _show(value: Any) -> str:
    """A value as the operator wrote it (JSON spelling is close enough to TOML)."""
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()  # a TOML date or time, written unquoted
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _join(key: str | None, name: str) -> str:
    return name if key is None else f"{key}.{name}"


def _quote(name: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise."""
    return name if _BARE_KEY.match(name) else _show(name)
