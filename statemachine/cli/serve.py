"""``statemachine serve MODULE:AGENT``: an agent served over HTTP, its runs watched live.

The server is ``statemachine.live``'s: an AG-UI ``RunAgentInput`` posted to ``/`` starts
a run and is answered with its AG-UI events; the page at ``/`` shows a run as it runs,
on the state diagram. ``--demo`` serves the demo's agent (a scripted model and the
workspace tools on DIR; no network, no account).

Shut by default: it listens on 127.0.0.1; another ``--host`` only with a token of your
own in ``STATEMACHINE_LIVE_TOKEN`` (read from the environment, never from the command
line, where other users of the machine could read it). Without one, a token is made
and the address to open, token included, is printed once on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from statemachine.cli.common import EXIT_OK, EXIT_USAGE, CommandParser, fail, load_attribute, parse
from statemachine.errors import InvalidInputError

__all__ = ["TOKEN_VARIABLE", "cli_serve"]

TOKEN_VARIABLE = "STATEMACHINE_LIVE_TOKEN"


def _defaults() -> dict[str, Any]:
    """The server's defaults, for the help (placeholders when the [live] extra is
    missing: the help still shows, and running says which extra to install)."""
    try:
        import statemachine.live as live
    except ModuleNotFoundError:
        unknown = "the [live] extra's default"
        return dict.fromkeys(("host", "port", "runs", "watchers", "body"), unknown)
    return {
        "host": live.DEFAULT_HOST,
        "port": live.DEFAULT_PORT,
        "runs": live.DEFAULT_MAX_RUNS,
        "watchers": live.DEFAULT_MAX_WATCHERS,
        "body": f"{live.DEFAULT_MAX_BODY_BYTES:,} bytes",
    }


def _parser() -> CommandParser:
    default = _defaults()
    parser = CommandParser(
        "serve",
        description="Serve an agent over HTTP and watch its runs live: POST an AG-UI "
        "RunAgentInput to / to start a run (the answer is its AG-UI events as "
        "server-sent events), GET /runs/ID/events to watch one, or open / in a browser "
        "for the page that shows a run on the state diagram as it runs. Every request "
        f"needs the access token ({TOKEN_VARIABLE}, or the one printed at start).",
        failed=None,
        epilog=f"It listens on {default['host']} unless --host says otherwise, and refuses "
        f"an address other machines reach unless {TOKEN_VARIABLE} holds a token you "
        "chose. Requests from another origin are refused. Needs the [live] extra.",
    )
    parser.add_argument(
        "agent", nargs="?", help="the Agent to serve, as MODULE:NAME (e.g. myapp.agents:support)"
    )
    parser.add_argument(
        "--demo",
        metavar="DIR",
        nargs="?",
        const=".",
        help="serve the demo's agent on the files of DIR (default: here) instead",
    )
    parser.add_argument("--host", help=f"default: {default['host']}")
    parser.add_argument("--port", type=int, help=f"default: {default['port']}")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name clients use to reach the server, besides the loopback names and "
        "--host (repeat it); any other Host header is refused",
    )
    parser.add_argument(
        "--max-runs", type=int, help=f"runs held at once (default: {default['runs']})"
    )
    parser.add_argument(
        "--max-watchers",
        type=int,
        help=f"event streams open at once (default: {default['watchers']})",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, help=f"the largest request body (default: {default['body']})"
    )
    return parser


def _agent(args: argparse.Namespace) -> Any:
    if (args.agent is None) == (args.demo is None):
        raise InvalidInputError("name an agent (MODULE:NAME) or give --demo, one of them")
    if args.demo is not None:
        from pathlib import Path

        from statemachine.agent.agent import Agent
        from statemachine.cli.demo import demo_model
        from statemachine.workspace import workspace_tools

        root = Path(args.demo)
        if not root.is_dir():
            raise InvalidInputError(f"--demo {args.demo}: not a directory")
        return Agent(demo_model(), name="demo", tools=workspace_tools(root))
    from statemachine.agent.agent import Agent

    found = load_attribute("agent", args.agent, "myapp.agents:support")
    if not isinstance(found, Agent):
        raise InvalidInputError(f"{args.agent} is a {type(found).__name__}, not an Agent")
    return found


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def cli_serve(argv: list[str]) -> int:
    """``statemachine serve MODULE:AGENT [--host H] [--port P]``: serve until Ctrl-C."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        import statemachine.live as live
    except ModuleNotFoundError as exc:
        return fail(
            "serve",
            f"needs the Python package {exc.name!r}, which is not installed: "
            "pip install 'agent-statemachine[live]'",
        )

    host = _given(args.host, live.DEFAULT_HOST)
    port = _given(args.port, live.DEFAULT_PORT)
    try:
        agent = _agent(args)
        app = live.LiveApp(
            agent,
            token=os.environ.get(TOKEN_VARIABLE) or None,
            max_runs=_given(args.max_runs, live.DEFAULT_MAX_RUNS),
            max_watchers=_given(args.max_watchers, live.DEFAULT_MAX_WATCHERS),
            max_body_bytes=_given(args.max_body_bytes, live.DEFAULT_MAX_BODY_BYTES),
            hosts=tuple(args.allow_host),
        )

        def ready(address: str) -> None:
            token = f"<{TOKEN_VARIABLE}>" if app.token_given else app.token
            print(f"serve: open {address}/?token={token}", file=sys.stderr, flush=True)

        live.serve(app, host, port, on_ready=ready)
    except InvalidInputError as exc:
        return fail("serve", str(exc), EXIT_USAGE)
    except OSError as exc:
        return fail("serve", f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    return EXIT_OK
