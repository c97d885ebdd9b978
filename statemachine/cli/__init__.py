"""The command line: ``python -m statemachine COMMAND`` (or the ``statemachine`` script).

Each command lives in the module that owns its subject and exposes
``cli_COMMAND(argv: list[str]) -> int``; this file only dispatches, importing lazily so
that ``demo`` does not pay for the diagram or provider machinery. ``main`` returns the
exit code and never raises ``SystemExit`` itself; both entry points pass the code to
``sys.exit``, so they behave the same.
"""

from __future__ import annotations

import difflib
import importlib
import sys

from statemachine.cli.common import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, fail, program

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "statemachine.cli.demo",
        "the checkpoint script: list the workspace files (scripted model, no network)",
    ),
    "spec": (
        "statemachine.cli.spec",
        "run the executable specification (the shipped scenarios)",
    ),
    "check": ("statemachine.cli.check", "exhaustively check the engine within bounds"),
    "replay": ("statemachine.cli.replay", "replay and verify a run journal"),
    "view": ("statemachine.cli.view", "write a run journal as an HTML page you can step through"),
    "diagram": ("statemachine.cli.diagram", "draw the state machine"),
    "trace": ("statemachine.cli.trace", "draw the path a run took"),
    "run": ("statemachine.cli.run", "run a real agent against a provider"),
    "transcript": ("statemachine.cli.transcript", "check recorded conversation logs"),
    "durable": ("statemachine.cli.durable", "export, list durable runs; watch one survive kill -9"),
    "serve": (
        "statemachine.cli.serve",
        "serve an agent over HTTP (AG-UI) and watch its runs live in a browser",
    ),
    "mcp-example": (
        "statemachine.cli.mcp_example",
        "a small MCP server on stdio, to try MCP tools",
    ),
}

EXIT_CODES = (
    "exit status (every command): 0 ok, 1 the thing the command checks or runs failed,\n"
    "2 bad arguments or unreadable input, 130 interrupted (Ctrl-C). Expected errors are\n"
    "one line on stderr, prefixed by the command's name."
)


def usage() -> str:
    name = program()
    lines = [
        f"usage: {name} [--version] COMMAND [ARGS...]",
        f"       {name} help COMMAND   (or COMMAND --help)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join([*lines, "", EXIT_CODES])


EXTRAS: dict[str, str] = {
    "hypothesis": "test",
    "pytest": "test",
    "pygraphviz": "diagrams",
    "openai": "openai",
    "anthropic": "anthropic",
    "httpx2": "openai",
    "dbos": "dbos",
    "mcp": "mcp",
    "ag_ui": "live",
    "uvicorn": "live",
}
"""The extra that installs each optional package a command may import."""


def _dispatch(name: str, rest: list[str]) -> int:
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if not missing or missing == "statemachine":
            raise  # our own module missing is a broken install, not an expected error
        extra = EXTRAS.get(missing)
        hint = f": pip install 'agent-statemachine[{extra}]'" if extra else ""
        return fail(name, f"needs the Python package {missing!r}, which is not installed{hint}")
    try:
        code: int = getattr(module, f"cli_{name.replace('-', '_')}")(rest)
    except SystemExit as exc:  # a command that exits instead of returning: keep one contract
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return code


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code (130 after Ctrl-C, with one line, no traceback)."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print("statemachine: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(args: list[str]) -> int:
    if not args:
        print(usage(), file=sys.stderr)
        return EXIT_USAGE
    if args[0] in ("-h", "--help") or args == ["help"]:
        print(usage())
        return EXIT_OK
    if args[0] in ("--version", "-V"):
        from statemachine._version import DISTRIBUTION, __version__

        print(f"{DISTRIBUTION} {__version__}")
        return EXIT_OK
    if args[0] == "help":
        args = [*args[1:2], "--help"]
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return fail("statemachine", f"unknown command {name!r}{hint} (see --help)")
    return _dispatch(name, rest)
