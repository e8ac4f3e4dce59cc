"""Which variables are secrets the daemon takes out of its environment (docs/protocol.md §15).

The scrub itself, ``/proc/<pid>/environ`` included, runs in a daemon process:
tests/integration/boundary/test_boundary_adversary.py.
"""

from __future__ import annotations

import pytest

from gateway.environment import is_secret


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ANTHROPIC_API_KEY", "sk-ant-x"),
        ("OPENAI_API_KEY", "sk-x"),
        ("GATEWAY_AUTH_API_KEYS", '["k"]'),
        ("GATEWAY_STORE_URL", "redis://localhost:6379"),  # any GATEWAY_*: the config's
        ("GITHUB_TOKEN", "ghp_x"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
        ("PGPASSWORD", "x"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer x"),
        ("REDIS_URL", "redis://user:pw@10.0.0.7:6379/0"),
        ("DATABASE_URL", "postgres://app:pw@db/app"),
        ("GITHUB_PAT", "github_pat_x"),  # found by an adversarial review: whole-word names
        ("SMTP_PASS", "x"),
        ("MYSQL_PWD", "x"),
        ("SENTRY_DSN", "https://key@o1.ingest.sentry.io/1"),
        ("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T/B/secret"),
    ],
)
def test_a_secret_is_taken_out(name: str, value: str) -> None:
    assert is_secret(name, value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PATH", "/usr/bin:/bin"),
        ("PWD", "/srv/gateway"),  # the shell's working directory
        ("OLDPWD", "/root"),
        ("PATHEXT", ".COM"),
        ("LANG", "C.UTF-8"),
        ("HOME", "/root"),
        ("PYTHONPATH", "/srv/gateway"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("REDIS_URL", "redis://10.0.0.7:6379/0"),  # no password in it
        ("HTTPS_PROXY", "http://user:pw@proxy:3128"),  # the clients made later read it
    ],
)
def test_the_rest_is_kept(name: str, value: str) -> None:
    assert not is_secret(name, value)
