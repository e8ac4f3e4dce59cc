"""Building the agents' providers (gateway.providers.factory): a Claude Code agent's on first use.

Claude Code makes its own model calls (docs/agents.md): its agent's provider
is not made at start-up, so a node of Claude Code agents does not import the
model SDK it would never call; it is made, once, if something calls it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_config
from gateway.providers.base import ModelRequest
from gateway.providers.factory import OnFirstUse, make_providers
from gateway.providers.scripted import ScriptedProvider

pytest.importorskip("claude_agent_sdk", reason="needs the claude-code extra")

TEXT = """
[model]
provider = "scripted"
name = "scripted:default"

[agents.coder]
runtime = "claude-code"
model = "scripted:default"
"""


async def test_a_claude_code_agents_provider_is_made_on_first_use(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(TEXT)
    providers = make_providers(load_config(path, {}, {}), {})
    native, coder = providers.for_agent("default"), providers.for_agent("coder")
    assert isinstance(native, ScriptedProvider)
    assert isinstance(coder, OnFirstUse) and coder._provider is None
    assert coder.name == "scripted"
    assert providers.all().count(coder) == 1
    # Called after all: made then, once.
    request = ModelRequest(model="scripted:default", messages=[], tools=[], max_tokens=100)
    first = coder.stream(request)
    made = coder._provider
    assert isinstance(made, ScriptedProvider) and made is not native
    second = coder.stream(request)
    assert coder._provider is made
    await first.aclose()
    await second.aclose()
    await providers.aclose()
