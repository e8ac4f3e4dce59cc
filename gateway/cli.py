"""The command line: ``gateway serve [--config FILE] [--host H] [--port P]`` (docs/reference.md),
and the clients ``gateway attach`` and ``gateway chat`` (gateway.client.attach, .chat).

``main`` returns the exit status instead of exiting, so that tests can call it
and the console script (``sys.exit(main())``) and ``python -m gateway`` share it:

- 0: the daemon stopped (SIGTERM or SIGINT are handled by the server itself),
  or ``--version`` / ``--help`` were printed;
- 2: a usage error (argparse) or a bad configuration, reported as the one line
  of :class:`~gateway.errors.ConfigError` on stderr before anything starts;
- 1: any other start-up failure (the port is taken, the host is not this
  machine's, the store cannot be opened): one line naming it, no traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import version
from typing import Any

import trio

from gateway.config import Config, load_config
from gateway.errors import ConfigError

EXIT_USAGE = 2  # argparse's status for a usage error; docs/reference.md gives a bad config the same
EXIT_FAILURE = 1  # any other start-up failure


def main(argv: list[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments after the program name; None reads ``sys.argv``.

    Returns:
        The process exit status.
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code or 0)
    if args.command == "attach":
        from gateway.client.attach import run

        return run(args)
    if args.command == "chat":
        from gateway.client.chat import run as run_chat

        return run_chat(args)
    overrides: dict[str, Any] = {
        f"server.{flag}": value
        for flag, value in (("host", args.host), ("port", args.port))
        if value is not None
    }
    # Imported here so that a bad command line or config starts nothing at all.
    from gateway import environment, telemetry
    from gateway.app import serve
    from gateway.errors import ShutdownError, StartupError
    from gateway.providers.factory import make_providers

    env = environment.capture()  # what the daemon reads of it, kept: secrets go below
    try:
        config = load_config(args.config, env, overrides)
    except ConfigError as exc:  # no config, so no log format: the plain line
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    try:
        # A missing API key, an unusable model, an unreadable system_file: config errors.
        provider = make_providers(config, env)
        telemetry.settings(config.telemetry, env)  # traces without the otel extra
    except ConfigError as exc:
        _say(config, "config_invalid", str(exc))
        return EXIT_USAGE
    # Read: out of the environment, /proc/<pid>/environ's included (docs/protocol.md §15).
    environment.scrub()
    try:
        trio.run(serve, config, provider)
    except BaseException as exc:
        if (failure := StartupError.within(exc)) is not None:
            _say(config, "startup_failed", f"gateway: {failure.message}")
            return EXIT_FAILURE
        if (lost := ShutdownError.within(exc)) is not None:  # writes not made durable
            _say(config, "shutdown_failed", f"gateway: {lost.message}")
            return EXIT_FAILURE
        raise
    return 0


def _say(config: Config, name: str, line: str) -> None:
    """One line on stderr: JSON (event ``name``) under ``[log] format = "json"``, else plain."""
    if config.log.format == "json":
        from gateway.logs import json_line

        line = json_line(logging.ERROR, name, line)
    print(line, file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="A streaming gateway for LLM agent sessions."
    )
    parser.add_argument("--version", action="version", version=f"gateway {version('gateway')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the daemon in the foreground")
    serve.add_argument("--config", metavar="FILE", help="TOML config file (default: none)")
    serve.add_argument("--host", metavar="H", help="listen address (overrides server.host)")
    serve.add_argument(
        "--port", metavar="P", type=int, help="listen port, 0 for any (overrides server.port)"
    )
    attach = commands.add_parser(
        "attach", help="print a session's stream as JSON lines, resuming after a reconnect"
    )
    attach.add_argument("session_id")
    attach.add_argument("--url", default="http://127.0.0.1:8421", help="the gateway's base URL")
    attach.add_argument(
        "--filter", default="preset:chat", help="a preset, or a Filter as JSON (protocol §3)"
    )
    attach.add_argument("--since", help="resume after this event id")
    attach.add_argument("--snapshot", action="store_true", help="start with a snapshot")
    attach.add_argument(
        "--coalesce-ms", type=int, metavar="MS", help="roll deltas up in this window, 0..250"
    )
    attach.add_argument("--api-key", help="Bearer key, when the gateway has api_keys")
    chat = commands.add_parser("chat", help="chat with a session in the terminal")
    chat.add_argument("--url", default="http://127.0.0.1:8421", help="the gateway's base URL")
    chat.add_argument("--session", metavar="ID", help="the session (default: a new one)")
    chat.add_argument(
        "--view",
        choices=("full", "simple"),
        default="full",
        help="every block, or replace-then-append (docs/protocol.md §10)",
    )
    chat.add_argument(
        "--api-key", help="Bearer key, when the gateway has api_keys (or $GW_API_KEY)"
    )
    chat.add_argument("--agent", metavar="NAME", help="the agent of a new session (GET /agents)")
    return parser
