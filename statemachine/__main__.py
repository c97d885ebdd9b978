"""``python -m statemachine COMMAND``: the command-line entry point.

Each command lives in the module that owns its subject and exposes
``cli(argv: list[str]) -> int``; this file only dispatches, importing lazily so that
``demo`` does not pay for the diagram or provider machinery.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("statemachine._demo", "run the demo agent (embedded scripted model) on a directory"),
    "spec": ("statemachine._spec", "run the executable specification in specs/"),
    "check": ("statemachine._checker", "exhaustively check the engine within bounds"),
    "replay": ("statemachine._journal", "replay and verify a run journal"),
    "diagram": ("statemachine._diagrams", "render the state machine"),
    "trace": ("statemachine._diagrams", "draw the path a run took"),
    "run": ("statemachine.providers._cli", "run a real agent against a provider"),
    "transcript": ("statemachine._transcript_cli", "check recorded conversation logs"),
}


def usage() -> str:
    lines = [
        "usage: python -m statemachine [--version] COMMAND [ARGS...]",
        "",
        "commands:",
    ]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] in ("--version", "-V"):
        from ._version import DISTRIBUTION, __version__

        print(f"{DISTRIBUTION} {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    code: int = getattr(module, f"cli_{name}")(rest)
    return code


if __name__ == "__main__":
    sys.exit(main())
