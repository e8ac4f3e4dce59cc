"""What the ``runtime = "claude-code"`` test modules share (tests/system/claude_code/,
tests/unit/runtimes/test_claude_code_mapping.py).

- :data:`CLAUDE_CODE_MARKS`: each system module's ``pytestmark`` (slow; skipped,
  saying why, without the claude-code extra; Trio's warnings for generators of
  the HTTP clients, and the SDK's ``CanUseToolShadowedWarning``, ignored).
- :func:`server`: the fake Anthropic API (:mod:`bench.fake_api`) as a fixture; a
  module imports it as ``server as server`` (the alias tells ruff the name is
  there for pytest).
- :func:`cc_config` / :func:`cc_toml`: a gateway whose default agent is a Claude
  Code one, its API and its proxy the fake server; :func:`gateway`: that config
  and its providers.
- :func:`run_turn`, :func:`decide`, :func:`only_model_calls`, :func:`alive`: a
  turn to its end, an answer through the permissions route, nothing left the
  machine, whether a pid runs.

It imports neither the model SDKs nor other test modules: the Claude Code
tests start no faster than the CLI does, but they need not wait for imports
they never use.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from bench.fake_api import FakeServer
from gateway.config import Config, load_config
from gateway.providers.factory import Providers, make_providers
from tests.conftest import Harness
from tests.debian import debian_binary

HAS_SDK = importlib.util.find_spec("claude_agent_sdk") is not None

CLAUDE_CODE_MARKS = [
    pytest.mark.slow,  # slow: Claude Code CLI processes
    pytest.mark.skipif(
        not HAS_SDK, reason="needs the claude-code extra: pip install 'gateway[claude-code]'"
    ),
    # Trio's ResourceWarning for async generators of these packages left to it.
    *[
        pytest.mark.filterwarnings(f"ignore:Async generator '{package}.:ResourceWarning")
        for package in ("anthropic", "httpx2", "httpcore2", "httpx", "httpcore")
    ],
    # Tools approved without asking are meant to bypass can_use_tool (the runtime's module).
    # Only with the SDK: pytest imports a filter's category before the skip above is
    # decided, and an absent one is an INTERNALERROR that stops the whole run.
    *(
        [pytest.mark.filterwarnings("ignore::claude_agent_sdk.CanUseToolShadowedWarning")]
        if HAS_SDK
        else []
    ),
]

PROMPT = "You work for the gateway's tests. The code word is MARIGOLD."


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeServer:
    """The fake model API, serving until the test ends; its replies are enqueued by the test."""
    fake = FakeServer()
    await nursery.start(fake.serve)
    return fake


def cc_config(tmp_path: Path, server: FakeServer, tail: str = "", **agent: str) -> Config:
    """The default agent is a Claude Code one; port 0, the store and workspaces in ``tmp_path``."""
    path = tmp_path / "gateway.toml"
    path.write_text(cc_toml(server, tail, **agent))
    flat = {
        "server.port": 0,
        "store.path": str(tmp_path / "gateway.db"),
        "sessions.workspace_root": str(tmp_path / "workspaces"),
    }
    return load_config(str(path), {}, flat)


def cc_toml(server: FakeServer, tail: str = "", **agent: str) -> str:
    """The config's text: a Claude Code default agent, its API and proxy the fake server.

    ``agent``: more keys of the agent (TOML values; ``""`` leaves the key out);
    ``tail``: more tables.
    """
    agent = {"tools": '["Bash"]', "require_approval": '["Bash"]', **agent}
    extra = "".join(f"{k} = {v}\n" for k, v in agent.items() if v)
    proxy = server.base_url  # anything not for the model API would be recorded there too
    text = f"""
[model]
provider = "anthropic"
name = "anthropic:claude-sonnet-4-6"
base_url = "{server.base_url}"
max_retries = 0

[tools]
approval_timeout_s = 30
kill_grace_s = 1

[agents.default]
runtime = "claude-code"
system = "{PROMPT}"
env = {{ HTTPS_PROXY = "{proxy}", HTTP_PROXY = "{proxy}", NO_PROXY = "127.0.0.1" }}
{extra}
{tail}"""
    return text


async def gateway(
    tmp_path: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    tail: str = "",
    **agent: str,
) -> tuple[Config, Providers]:
    """The config of :func:`cc_config` and its providers (the test closes them).

    Unless ``sandbox="false"``, Claude Code's sandbox needs Debian's ``bubblewrap``
    and ``socat`` (installed here, or the test is skipped saying why).
    """
    if agent.get("sandbox") != "false":
        debian_binary("bubblewrap", "bwrap")
        debian_binary("socat", "socat")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-fake")
    config = cc_config(tmp_path, server, tail, **agent)
    return config, make_providers(config, {"ANTHROPIC_API_KEY": "sk-fake"})


def only_model_calls(server: FakeServer) -> None:
    """Nothing left the machine: every request the CLI made was a model call, here."""
    assert server.requests
    assert {(r.method, r.path) for r in server.requests} == {("POST", "/v1/messages?beta=true")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def run_turn(gw: Harness, sid: str, content: str) -> list[Any]:
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, content)
        return await client.until_turn_ends()


async def decide(gw: Harness, sid: str, perm_id: str, decision: str) -> None:
    r = await gw.http.post(f"/sessions/{sid}/permissions/{perm_id}", json={"decision": decision})
    assert r.status_code == 202, r.text
