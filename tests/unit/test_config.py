"""Config loading (docs/reference.md "Configuration file"): defaults, layers, and one-line errors.

Every error test asserts the whole message: the line an operator reads must
name the source (file, environment variable or command line), the key and the
problem, and nothing else.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.config import (
    DEFAULT_CONFIG_TOML,
    SCHEMA,
    Config,
    Price,
    load_config,
)
from gateway.errors import ConfigError
from tests.paths import ROOT

Write = Callable[..., str]


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Write:
    """Write a config file in the working directory and return its relative name."""
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "gateway.toml") -> str:
        (tmp_path / name).write_text(text, encoding="utf-8")
        return name

    return write


def error(
    path: str | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, env or {}, overrides or {})
    message = str(info.value)
    assert "\n" not in message
    return message


# --- defaults ----------------------------------------------------------------------


def test_defaults_are_running_md_values() -> None:
    config = load_config(None, {}, {})
    assert config == Config()
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8421)
    assert config.server.public_url == ""
    assert config.server.max_body_bytes == 1_048_576
    assert config.stream.queue_max_events == 1000
    assert config.stream.ping_interval_s == 30.0
    assert config.stream.ping_max_missed == 3
    assert config.stream.replay_max_events == 10_000
    assert config.stream.snapshot_messages == 50
    assert config.stream.subscribe_timeout_s == 10.0
    assert config.stream.attach_token_ttl_s == 60.0
    assert config.stream.max_client_frame_bytes == 65_536
    assert (config.store.backend, config.store.path) == ("sqlite", "gateway.db")
    assert config.store.retention_hours == 168
    assert (config.model.provider, config.model.name) == ("scripted", "scripted:echo")
    assert (config.model.base_url, config.model.max_tokens) == ("", 4096)
    assert config.turns.timeout_s == 600.0
    assert config.tools.enabled == ("sleep", "read_file", "delegate")
    assert config.tools.require_approval == ()
    assert (config.tools.approval_timeout_s, config.tools.kill_grace_s) == (300.0, 5.0)
    assert (config.auth.api_keys, config.auth.allowed_origins) == ((), ())


def test_defaults_of_added_keys() -> None:
    config = Config()
    assert config.server.read_timeout_s == 10.0
    assert config.server.keepalive_timeout_s == 60.0
    assert config.server.shutdown_grace_s == 5.0
    assert config.server.max_header_bytes == 16_384
    assert config.server.send_buffer_bytes == 0
    assert config.stream.close_grace_s == 5.0
    assert config.store.flush_interval_ms == 0
    assert config.model.thinking_budget_tokens == 0
    assert config.model.max_retries == 2
    assert config.model.timeout_s == 600.0
    assert config.model.prices == {}


def test_default_config_toml_loads_to_the_defaults(write: Write) -> None:
    assert load_config(write(DEFAULT_CONFIG_TOML), {}, {}) == Config()


def test_default_config_toml_documents_every_key() -> None:
    """Every key is written out, but those unset by default (TOML has no null): commented."""
    document = tomllib.loads(DEFAULT_CONFIG_TOML)
    unset = {
        (section.name, key.name)
        for section in msgspec.structs.fields(Config)
        if section.name in SCHEMA
        for key in msgspec.structs.fields(section.type)
        if key.default is None
    }
    assert unset == {("model", "temperature")}
    assert "# temperature = " in DEFAULT_CONFIG_TOML
    assert {section: set(keys) for section, keys in document.items()} == {
        section: {key for key in keys if (section, key) not in unset}
        for section, keys in SCHEMA.items()
    }


def test_config_is_immutable() -> None:
    config = Config()
    with pytest.raises(AttributeError):
        config.server.port = 1  # type: ignore[misc]


# --- layers --------------------------------------------------------------------------


def test_file_overrides_defaults_key_by_key(write: Write) -> None:
    config = load_config(write('[server]\nport = 9000\n[tools]\nenabled = ["shell"]\n'), {}, {})
    assert config.server.port == 9000
    assert config.server.host == "127.0.0.1"
    assert config.tools.enabled == ("shell",)


def test_precedence_file_then_environment_then_flags(write: Write) -> None:
    path = write('[server]\nhost = "10.0.0.1"\nport = 1000\n')
    env = {"GATEWAY_SERVER_PORT": "2000"}
    assert load_config(path, {}, {}).server.port == 1000
    assert load_config(path, env, {}).server.port == 2000
    assert load_config(path, env, {"server.port": 3000}).server.port == 3000
    assert load_config(path, env, {"server.port": 3000}).server.host == "10.0.0.1"
    assert load_config(path, env, {"server.host": "::1"}).server.host == "::1"


def test_environment_values_are_parsed_by_the_key_type() -> None:
    env = {
        "GATEWAY_STREAM_QUEUE_MAX_EVENTS": "5000",
        "GATEWAY_STREAM_PING_INTERVAL_S": "2.5",
        "GATEWAY_TOOLS_ENABLED": '["sleep", "shell"]',
        "GATEWAY_MODEL_PROVIDER": "anthropic",
        "GATEWAY_SERVER_HOST": "true",  # a string key takes the raw text
        "GATEWAY_SERVER_PUBLIC_URL": "https://gw.example.com",
        "GATEWAY_AUTH_API_KEYS": '["k1", "k2"]',
    }
    config = load_config(None, env, {})
    assert config.stream.queue_max_events == 5000
    assert config.stream.ping_interval_s == 2.5
    assert config.tools.enabled == ("sleep", "shell")
    assert config.model.provider == "anthropic"
    assert config.server.host == "true"
    assert config.server.public_url == "https://gw.example.com"
    assert config.auth.api_keys == ("k1", "k2")


def test_environment_table_value() -> None:
    env = {"GATEWAY_MODEL_PRICES": "{ m = { input_per_mtok = 3, output_per_mtok = 15 } }"}
    assert load_config(None, env, {}).model.prices == {
        "m": Price(input_per_mtok=3.0, output_per_mtok=15.0)
    }


def test_environment_ignores_other_variables() -> None:
    assert load_config(None, {"PATH": "/bin", "GATEWAYX": "1"}, {}) == Config()


def test_prices_table(write: Write) -> None:
    path = write(
        '[model.prices."anthropic:claude-sonnet-4-6"]\n'
        "input_per_mtok = 3.0\noutput_per_mtok = 15.0\ncache_read_per_mtok = 0.3\n"
    )
    price = load_config(path, {}, {}).model.prices["anthropic:claude-sonnet-4-6"]
    assert price == Price(input_per_mtok=3.0, output_per_mtok=15.0, cache_read_per_mtok=0.3)
    assert price.cache_write_per_mtok == 0.0


# --- file errors ----------------------------------------------------------------------


def test_missing_file() -> None:
    assert error("/x/y.toml") == "config error: no such config file: /x/y.toml"


def test_bad_toml_syntax_names_file_and_line(write: Write) -> None:
    path = write("[server]\nport = \n")
    assert error(path) == (
        "config error: gateway.toml: invalid TOML: Invalid value (at line 2, column 8)"
    )


def test_unknown_key(write: Write) -> None:
    assert error(write('[server]\nhots = "x"\n')) == (
        "config error: gateway.toml: unknown key server.hots"
    )


def test_unknown_section(write: Write) -> None:
    assert error(write("[servr]\nport = 1\n")) == (
        "config error: gateway.toml: unknown section [servr]"
    )


def test_key_outside_any_section(write: Write) -> None:
    assert error(write("port = 1\n")) == "config error: gateway.toml: unknown key port"


def test_wrong_type(write: Write) -> None:
    assert error(write('[stream]\nqueue_max_events = "lots"\n')) == (
        'config error: gateway.toml: stream.queue_max_events: expected an integer >= 1, got "lots"'
    )


def test_section_of_the_wrong_type(write: Write) -> None:
    assert error(write("server = 5\n")) == (
        "config error: gateway.toml: server: expected a table, got 5"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nport = 70000", "server.port: expected an integer in 0..65535, got 70000"),
        ("[server]\nport = -1", "server.port: expected an integer in 0..65535, got -1"),
        (
            "[stream]\nping_max_missed = 0",
            "stream.ping_max_missed: expected an integer >= 1, got 0",
        ),
        ("[stream]\nping_interval_s = 0", "stream.ping_interval_s: expected a number > 0, got 0"),
        ("[tools]\nkill_grace_s = -1.5", "tools.kill_grace_s: expected a number >= 0, got -1.5"),
        ('[store]\npath = ""', 'store.path: expected a non-empty string, got ""'),
        (
            '[store]\nbackend = "postgres"',
            'store.backend: expected one of "redis", "sqlite", got "postgres"',
        ),
        (
            '[store]\nurl = "http://127.0.0.1:6379"',
            'store.url: expected a redis://, rediss:// or unix:// URL, got "http://127.0.0.1:6379"',
        ),
        (
            '[model]\nprovider = "gemini"',
            'model.provider: expected one of "anthropic", "openai", "scripted", got "gemini"',
        ),
        (
            '[model]\nbase_url = "gw.example.com"',
            'model.base_url: expected an http:// or https:// URL, or empty, got "gw.example.com"',
        ),
        ("[turns]\ntimeout_s = true", "turns.timeout_s: expected a number > 0, got true"),
        ('[auth]\napi_keys = "k"', 'auth.api_keys: expected a list, got "k"'),
        ("[server]\nhost = 1979-05-27", "server.host: expected a non-empty string, got 1979-05-27"),
    ],
)
def test_out_of_range_or_wrong_type(write: Write, text: str, message: str) -> None:
    assert error(write(text + "\n")) == f"config error: gateway.toml: {message}"


def test_unknown_tool_name_names_the_list_entry(write: Write) -> None:
    assert error(write('[tools]\nrequire_approval = ["sleep", "rm"]\n')) == (
        'config error: gateway.toml: tools.require_approval[1]: unknown tool "rm";'
        " tools are sleep, read_file, shell, delegate and mcp__<server>__<tool>"
    )


def test_price_errors_name_the_model(write: Write) -> None:
    ok = "[model.prices.a]\ninput_per_mtok = 1\noutput_per_mtok = 1\n"
    assert error(write(ok + '[model.prices."x:y"]\ninput_per_mtok = 1\n')) == (
        'config error: gateway.toml: model.prices."x:y": missing key output_per_mtok'
    )
    assert error(
        write(ok + '[model.prices."x:y"]\ninput_per_mtok = 1\noutput_per_mtok = -2\n')
    ) == (
        'config error: gateway.toml: model.prices."x:y".output_per_mtok:'
        " expected a number >= 0, got -2"
    )
    assert error(write(ok + "[model.prices.b]\ninput_per_mtok = 1\nouput_per_mtok = 1\n")) == (
        "config error: gateway.toml: unknown key model.prices.b.ouput_per_mtok"
    )


HOOK = """[webhooks.crm]
url = "https://crm.example.com/hooks"
events = ["turn.completed"]
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"""


def test_infinite_or_nan_numbers_are_refused_wherever_they_come_from(write: Write) -> None:
    """TOML spells inf and nan: no key takes one (a lease of inf crashed the node's start,
    a nan was shown as "null")."""
    assert error(write("[store]\nlease_s = inf\n")) == (
        "config error: gateway.toml: store.lease_s: expected a finite number, got inf"
    )
    assert error(write(HOOK + "timeout_s = nan\n")) == (
        "config error: gateway.toml: webhooks.crm.timeout_s: expected a finite number, got nan"
    )
    assert error(env={"GATEWAY_STORE_LEASE_S": "-inf"}) == (
        "config error: environment GATEWAY_STORE_LEASE_S: expected a finite number, got -inf"
    )
    assert error(overrides={"turns.timeout_s": float("inf")}) == (
        "config error: command line: turns.timeout_s: expected a finite number, got inf"
    )


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://crm.example.com:port/hooks", "Invalid port: 'port'"),
        ("https://[::1/hooks", "Invalid port: ':1'"),
        ("https://crm..example.com/hooks", "not a valid host name"),
        ("https:///hooks", "no host"),
    ],
)
def test_a_url_httpx_cannot_post_to_is_a_config_error(write: Write, url: str, why: str) -> None:
    """A webhook's URL, or an A2A push prefix, that passes the pattern but that httpx cannot
    send to (it raised from the first delivery, and the webhook loop took the node down)."""
    hook = HOOK.replace("https://crm.example.com/hooks", url)
    assert error(write(hook)) == (
        f"config error: gateway.toml: webhooks.crm.url: expected an http:// or https:// URL,"
        f' got "{url}" ({why})'
    )
    prefix = url.replace("/hooks", "/a2a/")
    text = f'[a2a]\npush_url_prefixes = ["{prefix}"]\npush_secret = "whsec_MfKQ9r8GKYqrTwjU"\n'
    assert error(write(text)).startswith(
        "config error: gateway.toml: a2a.push_url_prefixes[0]: expected https://HOST/"
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[server]\npublic_url = "https://gw.example.com:port"\n', "server.public_url"),
        ('[model]\nbase_url = "https:///v1"\n', "model.base_url"),
        ('[agents.helper]\nbase_url = "https://api..example.com"\n', "agents.helper.base_url"),
        ('[mcp_servers.search]\nurl = "https://[::1/mcp"\n', "mcp_servers.search.url"),
        ('[telemetry]\nendpoint = "http://otel:port/v1/traces"\n', "telemetry.endpoint"),
    ],
)
def test_every_url_key_is_one_httpx_can_send_to(write: Write, text: str, key: str) -> None:
    """docs/reference.md: every URL key, not only a webhook's, is checked for a port and a host
    a connection can use, and refused naming its key (not at the first request)."""
    said = error(write(text))
    assert said.startswith(f"config error: gateway.toml: {key}: expected an http:// or https://")


def test_a_retry_wait_that_starts_above_its_bound_is_a_config_error(write: Write) -> None:
    """``retry_first_s`` doubles *up to* ``retry_max_s``: a first wait above the bound would
    have waited it once, then the bound (waits that shrink)."""
    assert error(write(HOOK + "retry_first_s = 60\nretry_max_s = 10\n")) == (
        "config error: gateway.toml: webhooks.crm.retry_max_s:"
        " expected a number >= retry_first_s (60), got 10"
    )
    assert error(overrides={"a2a.push_retry_first_s": 700.0}) == (
        "config error: a2a.push_retry_max_s: expected a number >= push_retry_first_s (700), got 600"
    )
    both = {"a2a.push_retry_first_s": 700.0, "a2a.push_retry_max_s": 900.0}  # whichever first
    assert load_config(None, {}, both).a2a.push_retry_max_s == 900


# --- environment and flag errors -------------------------------------------------------


def test_environment_error_names_the_variable() -> None:
    assert error(env={"GATEWAY_STREAM_PING_INTERVAL_S": "soon"}) == (
        "config error: environment GATEWAY_STREAM_PING_INTERVAL_S:"
        ' expected a number > 0, got "soon"'
    )


def test_environment_list_error_names_the_entry() -> None:
    assert error(env={"GATEWAY_TOOLS_ENABLED": '["sleep", "shel"]'}) == (
        'config error: environment GATEWAY_TOOLS_ENABLED: tools.enabled[1]: unknown tool "shel";'
        " tools are sleep, read_file, shell, delegate and mcp__<server>__<tool>"
    )


def test_unknown_environment_variable() -> None:
    assert error(env={"GATEWAY_SERVER_HOTS": "x"}) == (
        "config error: environment GATEWAY_SERVER_HOTS: not a config key"
    )
    assert error(env={"GATEWAY_PORT": "1"}) == (
        "config error: environment GATEWAY_PORT: not a config key"
    )


def test_flag_errors() -> None:
    assert error(overrides={"server.port": 70000}) == (
        "config error: command line: server.port: expected an integer in 0..65535, got 70000"
    )
    assert error(overrides={"server.hots": "x"}) == (
        "config error: command line: unknown key server.hots"
    )


def test_the_layer_at_fault_is_named(write: Write) -> None:
    good_file = write("[server]\nport = 1000\n")
    bad_env = {"GATEWAY_SERVER_PORT": "99999"}
    assert error(good_file, bad_env) == (
        "config error: environment GATEWAY_SERVER_PORT: expected an integer in 0..65535, got 99999"
    )
    bad_file = write("[server]\nport = 99999\n", "bad.toml")
    assert error(bad_file, {"GATEWAY_SERVER_PORT": "1000"}, {"server.port": 2000}) == (
        "config error: bad.toml: server.port: expected an integer in 0..65535, got 99999"
    )
    assert error(good_file, {"GATEWAY_SERVER_PORT": "2000"}, {"server.port": -1}) == (
        "config error: command line: server.port: expected an integer in 0..65535, got -1"
    )


def test_the_documented_config_file_is_the_embedded_defaults() -> None:
    """docs/reference.md "Configuration file" is DEFAULT_CONFIG_TOML, to the letter."""
    reference = (ROOT / "docs" / "reference.md").read_text()
    section = reference[reference.index("## Configuration file") :]
    block = section[section.index("```toml\n") + len("```toml\n") :]
    assert block[: block.index("```")] == DEFAULT_CONFIG_TOML


def test_an_allowed_host_that_is_a_url_is_a_config_error() -> None:
    """``[server] allowed_hosts`` names hosts: a URL there never matches (docs/protocol.md §15)."""
    for good in ("gw.example.com", "localhost:8421", "127.0.0.1", "[::1]", "::1"):
        assert load_config(None, {}, {"server.allowed_hosts": [good]}).server.allowed_hosts
    for bad in ("https://gw.example.com", "gw.example.com/x", "", "a b"):
        with pytest.raises(ConfigError) as caught:
            load_config(None, {}, {"server.allowed_hosts": [bad]})
        assert "server.allowed_hosts[0]: expected a host name or IP address" in str(caught.value)
