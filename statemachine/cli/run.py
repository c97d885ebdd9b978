"""``python -m statemachine run``: a real agent, a real provider, the workspace tools.

    python -m statemachine run --provider openai|anthropic --model NAME "prompt"
        [--base-url URL] [--dir DIR] [--max-turns N] [--system TEXT] [--verbose]

The transcript is printed as it happens: the assistant's text as it streams (the
provider's ``on_text``), then, from the run's event stream (``AgentRun.events()``),
each tool call when its response enters the history and each tool result as it does,
then the final state and its explanation. The key comes from ``OPENAI_API_KEY`` or
``ANTHROPIC_API_KEY`` (an OpenAI-compatible local server given by ``--base-url``
needs none). It is never printed: everything this command writes, transcript and
logs alike, passes through redaction, and logs are rendered by the command's own
structlog logger (the library never configures structlog globally).

Exit status: 0 when the run ends ``Done``, 1 for any other end, 2 for bad usage or an
unusable workspace directory.
Ctrl-C aborts the run through its signal, so tools clean up and the transcript
stays valid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal as _signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import structlog

from statemachine.agent.events import (
    MessageAdded,
    RunEvent,
    RunResult,
)
from statemachine.agent.model import ModelClient
from statemachine.agent.run import (
    AgentRun,
)
from statemachine.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    CommandParser,
    describe_run_event,
    fail,
    load_attribute,
    parse,
    run_shown,
)
from statemachine.core.abort import AbortController
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    thaw_json,
)
from statemachine.core.table import TurnState
from statemachine.errors import InvalidInputError
from statemachine.providers.redaction import RedactSecrets, redact

__all__ = ["cli_run"]

_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
_RESULT_LINES = 12  # a transcript shows the head of a long tool result, not all of it


class _Transcript:
    """Prints messages once each, in history order, with every secret redacted."""

    def __init__(self, out: TextIO, secrets: Sequence[str]) -> None:
        self.out = out
        self.secrets = tuple(secrets)
        self.streaming = False  # an assistant line is open
        self.streamed = False  # text streamed since the last assistant message shown

    def write(self, text: str) -> None:
        self.out.write(redact(text, self.secrets))
        self.out.flush()

    def line(self, text: str = "") -> None:
        self.write(text + "\n")

    def stream_text(self, text: str) -> None:
        if not self.streaming:
            self.write("assistant: ")
            self.streaming = True
        self.streamed = True
        self.write(text)

    def end_stream(self) -> None:
        if self.streaming:
            self.line()
            self.streaming = False

    def event(self, event: RunEvent) -> None:
        if isinstance(event, MessageAdded):
            self.show(event.message)
        else:
            self.end_stream()  # e.g. a model call that ended without a message

    def show(self, message: Message) -> None:
        if isinstance(message, UserMessage):
            text = "\n".join(getattr(b, "text", "[image]") for b in message.content)
            self.line(f"user: {text}")
        elif isinstance(message, ToolResultMessage):
            lines = message.text.splitlines() or [""]
            more = len(lines) - _RESULT_LINES
            label = "error" if message.is_error else "result"
            self.line(f"  {label} ({message.tool_name}): {lines[0]}")
            for extra in lines[1:_RESULT_LINES]:
                self.line(f"    {extra}")
            if more > 0:
                self.line(f"    ... ({more} more lines)")
        else:
            self.show_assistant(message)

    def show_assistant(self, message: AssistantMessage) -> None:
        if not self.streamed and message.text:
            self.stream_text(message.text)  # a message whose text was not streamed
        self.streamed = False
        self.end_stream()
        for block in message.content:
            if isinstance(block, ToolCall):
                arguments = json.dumps(thaw_json(block.arguments), ensure_ascii=False)
                self.line(f"  -> {block.name} {arguments}")
        if message.stop_reason not in (StopReason.STOP, StopReason.TOOL_USE):
            why = f": {message.error_message}" if message.error_message else ""
            self.line(f"  [stop reason {message.stop_reason.value}{why}]")


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        "run",
        description="Run a real agent with the workspace tools (list_files, read_file) "
        "and your own (--tool MODULE:NAME) against a model provider, printing the "
        "transcript as it streams. The API key "
        "comes from OPENAI_API_KEY or ANTHROPIC_API_KEY (a local OpenAI-compatible server "
        "given by --base-url needs none) and is never printed. Ctrl-C aborts the run; "
        "tools clean up and the transcript stays valid.",
        failed="the run did not end Done (model failure, turn limit, abort)",
    )
    parser.add_argument("prompt", help="what to ask the agent")
    parser.add_argument("--provider", required=True, choices=sorted(_KEY_ENV))
    parser.add_argument("--model", required=True, help="model name, e.g. gpt-4o-mini")
    parser.add_argument(
        "--base-url",
        help="API base URL; for a local OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1",
    )
    parser.add_argument("--dir", default=".", help="workspace directory (default: .)")
    parser.add_argument(
        "--max-turns", type=int, default=8, metavar="N", help="model calls allowed (default: 8)"
    )
    parser.add_argument("--system", help="system prompt")
    parser.add_argument(
        "--tool",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="add your tools: NAME in MODULE (imported from the current directory or the "
        "environment) is a Tool, a function (made a tool with statemachine.tool) or a "
        "list of them; repeat for more",
    )
    parser.add_argument(
        "--no-workspace-tools",
        action="store_true",
        help="do not give the model list_files and read_file",
    )
    parser.add_argument("--events", action="store_true", help="print each run event on stderr")
    parser.add_argument("--verbose", action="store_true", help="log each transition")
    return parser


def load_tools(spec: str) -> list[Any]:
    """The tools ``MODULE:NAME`` names; ``InvalidInputError`` saying what is wrong."""
    from statemachine.agent.tools import Tool, tool

    found = load_attribute("--tool", spec, "mytools:search")
    items = list(found) if isinstance(found, (list, tuple)) else [found]
    tools = []
    for item in items:
        if isinstance(item, Tool):
            tools.append(item)
        elif callable(item):
            tools.append(tool(item))
        else:
            raise InvalidInputError(
                f"--tool {spec!r}: {type(item).__name__} is not a Tool, a function or a list "
                "of them"
            )
    return tools


def _logger(secrets: Sequence[str], verbose: bool) -> Any:
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        processors=[
            RedactSecrets(secrets),
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.DEBUG if verbose else logging.WARNING
        ),
    )


def _model(args: argparse.Namespace, key: str | None, transcript: _Transcript, log: Any) -> Any:
    common: dict[str, Any] = {
        "api_key": key,
        "base_url": args.base_url,
        "system": args.system,
        "on_text": transcript.stream_text,
        "logger": log,
    }
    if args.provider == "openai":
        from statemachine.providers.openai_chat import OpenAIChatModel

        return OpenAIChatModel(args.model, **common)
    from statemachine.providers.anthropic_messages import AnthropicModel

    return AnthropicModel(args.model, **common)


async def _run(
    model: ModelClient,
    tools: Any,
    prompt: str,
    max_turns: int,
    log: Any,
    transcript: _Transcript,
    events: bool = False,
) -> RunResult:
    controller = AbortController()
    messages = [UserMessage(prompt)]
    run = AgentRun(
        model=model,
        tools=tools,
        messages=messages,
        max_turns=max_turns,
        signal=controller.signal,
        logger=log,
    )
    loop = asyncio.get_running_loop()
    installed = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        # Only possible in the main thread of a Unix process; elsewhere Ctrl-C
        # simply interrupts as usual.
        loop.add_signal_handler(_signal.SIGINT, controller.abort, "interrupted (Ctrl-C)")
        installed = True
    try:
        on_event = transcript.event
        if events:

            def on_event(event: RunEvent) -> None:
                transcript.event(event)
                if not isinstance(event, MessageAdded):
                    line = redact(describe_run_event(event), transcript.secrets)
                    print(f"  event: {line}", file=sys.stderr, flush=True)

        result = await run_shown(run, messages, transcript.show, on_event)
    finally:
        if installed:
            loop.remove_signal_handler(_signal.SIGINT)
    transcript.end_stream()
    return result


def cli_run(argv: list[str]) -> int:
    """``python -m statemachine run ...``; see the module docstring."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    env = _KEY_ENV[args.provider]
    key = os.environ.get(env) or None
    if key is None and not (args.provider == "openai" and args.base_url):
        return fail("run", f"set {env} to your API key")
    if args.max_turns < 1:
        return fail("run", "--max-turns must be at least 1")
    secrets = [key] if key else []
    transcript = _Transcript(sys.stdout, secrets)
    log = _logger(secrets, args.verbose)
    try:
        from statemachine.workspace import workspace_tools

        tools = [] if args.no_workspace_tools else list(workspace_tools(Path(args.dir)))
        for spec in args.tool:
            tools += load_tools(spec)
        names = [t.name for t in tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidInputError(f"two tools are named {', '.join(twice)}: rename one")
        model = _model(args, key, transcript, log)
    except (InvalidInputError, ImportError) as exc:
        return fail("run", redact(str(exc), secrets))
    shown = Path(args.dir).resolve()
    transcript.line(f"statemachine run: {args.provider} model {args.model} on {shown}")
    transcript.line(f"  tools: {', '.join(t.name for t in tools) or 'none'}")
    transcript.line()
    result = asyncio.run(
        _run(model, tools, args.prompt, args.max_turns, log, transcript, args.events)
    )
    transcript.line()
    transcript.line(f"final state: {result.state.value} after {result.turns} model call(s)")
    transcript.line(f"explanation: {result.explanation}")
    return EXIT_OK if result.state is TurnState.DONE else EXIT_FAILED
