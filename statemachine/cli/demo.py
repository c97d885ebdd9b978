"""``python -m statemachine demo [DIR]``: the checkpoint script, narrated live.

This module owns the demo: a scripted model and a narrator that prints the
loop as it runs. The checkpoint script is the loop's smallest whole run (user:
"列出工作区文件", list the files in the workspace; the assistant calls ``list_files {}``;
the result goes back to the model; the model answers), made one turn richer so that
the loop is visible: after the listing, the model reads the README (or the first text
file) before it answers.

The model is a ``statemachine.testing.FunctionModel`` around ``_respond``. It decides
each step from the history it is given and nothing else, and its final answer is
composed from the tool results in that history (the file names it was shown, the first
line it was read), so the demo shows data flowing through ``run_agent``, never canned
text. The tools are the real ``statemachine.workspace`` tools, confined to DIR.

What is printed, as it happens (the initial history, then the run's own event stream,
``AgentRun.events()``, in order):

- each message: the user's prompt, each assistant message (text and tool calls with
  their arguments), each tool result (abbreviated) (``MessageAdded``);
- each state transition (``from -> to``, with its trigger and turn) (``StateChanged``);
- any warning the run logs, through a logger built here with ``structlog.wrap_logger``
  and a processor of ours (structlog is never configured globally), which also keeps
  the engine's debug log out of the output;
- the final state and its explanation.

Exit status: 0 when the run ends ``Done``, 1 for any other end, 2 for bad arguments
(a DIR that does not exist, for one).
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import MutableMapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

import structlog

from statemachine.agent.events import (
    MessageAdded,
    RunEvent,
    RunResult,
    StateChanged,
)
from statemachine.agent.run import (
    AgentRun,
)
from statemachine.cli.common import EXIT_FAILED, EXIT_OK, CommandParser, fail, parse, run_shown
from statemachine.core.engine import TransitionRecord
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError, UsageError
from statemachine.testing.models import FunctionModel
from statemachine.workspace import workspace_tools

__all__ = ["PROMPT", "cli_demo", "demo_model", "run_demo"]

PROMPT = "List the files in the workspace. (列出工作区文件)"
"""The user message of the checkpoint script, in English and in the original Chinese."""

# How much of the listing the answer names before it says "and N more".
_NAMED_FILES = 8
# Extensions the model prefers when there is no README to read.
_TEXT_SUFFIXES = frozenset(
    {".md", ".rst", ".txt", ".py", ".ts", ".js", ".json", ".toml", ".yaml", ".yml"}
    | {".cfg", ".ini", ".sh", ".c", ".h", ".rs", ".go", ".java"}
)


# -- the scripted model ------------------------------------------------------------------


def _listed_files(listing: str) -> tuple[list[str], bool]:
    """The file paths in a ``list_files`` result, and whether the listing was cut.

    Lines in brackets are the tool's notes and lines ending in ``/`` are empty
    directories; neither is a file.
    """
    lines = listing.splitlines()
    files = [line for line in lines if line and not line.startswith("[") and line[-1] != "/"]
    cut = any(line.startswith("[Listing stopped") for line in lines)
    return files, cut


def _pick_file(files: Sequence[str]) -> str:
    """The README nearest the root, else the first text-looking file, else the first."""
    readmes = [f for f in files if PurePosixPath(f).name.lower().startswith("readme")]
    if readmes:
        return min(readmes, key=lambda f: (f.count("/"), f))
    for f in files:
        if PurePosixPath(f).suffix.lower() in _TEXT_SUFFIXES:
            return f
    return files[0]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= 80 else line[:77] + "..."
    return ""


def _names(files: Sequence[str]) -> str:
    if len(files) == 1:
        return files[0]
    return ", ".join(files[:-1]) + " and " + files[-1]


def _respond(messages: Sequence[Message], tools: Sequence[ToolDefinition]) -> AssistantMessage:
    """The demo model's next answer: list the files, read the README, answer from both.

    Each answer is a function of the history alone (the messages after the last user
    message), so the same workspace gives the same run.
    """
    available = {t.name for t in tools}
    start = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=-1)
    turn = list(messages[start + 1 :])
    calls = {c.id: c for m in turn if isinstance(m, AssistantMessage) for c in m.tool_calls}
    results = {m.tool_name: m for m in turn if isinstance(m, ToolResultMessage)}
    next_id = sum(len(m.tool_calls) for m in messages if isinstance(m, AssistantMessage)) + 1

    listing = results.get("list_files")
    if listing is None:
        if "list_files" not in available:
            return AssistantMessage("I cannot list the workspace: I have no list_files tool.")
        return _call(f"call_{next_id}", "list_files", {})
    if listing.is_error:
        return AssistantMessage(f"I could not list the workspace: {listing.text}")
    files, cut = _listed_files(listing.text)
    read = results.get("read_file")
    if read is None and files and "read_file" in available:
        return _call(f"call_{next_id}", "read_file", {"path": _pick_file(files)})
    read_call = calls.get(read.tool_call_id) if read is not None else None
    read_path = str(read_call.arguments.get("path", "")) if read_call is not None else ""
    return AssistantMessage(_answer(files, cut, read, read_path))


def demo_model() -> FunctionModel:
    """The demo's model: a ``FunctionModel`` that lists, reads and answers (no network)."""
    return FunctionModel(_respond)


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> AssistantMessage:
    return AssistantMessage((ToolCall(call_id, name, arguments),), stop_reason=StopReason.TOOL_USE)


def _answer(files: list[str], cut: bool, read: ToolResultMessage | None, read_path: str) -> str:
    if not files:
        return "The workspace holds no files."
    count = f"at least {len(files)}" if cut else str(len(files))
    noun = "file" if len(files) == 1 and not cut else "files"
    if len(files) <= _NAMED_FILES:
        parts = [f"The workspace contains {count} {noun}: {_names(files)}."]
    else:
        shown = ", ".join(files[:_NAMED_FILES])
        parts = [
            f"The workspace contains {count} {noun}, among them {shown} "
            f"and {len(files) - _NAMED_FILES} more."
        ]
    if read is not None and read.is_error:
        parts.append(f"I could not read {read_path}: {read.text}")
    elif read is not None:
        first = _first_line(read.text)
        if first:
            parts.append(f'{read_path} begins with: "{first}".')
        else:
            parts.append(f"{read_path} holds no text.")
    return " ".join(parts)


# -- narration ---------------------------------------------------------------------------


def _abbreviate(text: str, width: int = 90, lines: int = 3) -> str:
    """The first few non-blank lines of ``text`` on one line, and its length."""
    all_lines = text.splitlines()
    shown = " | ".join([line.strip() for line in all_lines if line.strip()][:lines])
    if len(shown) > width:
        shown = shown[: width - 3] + "..."
    if len(all_lines) > lines:
        shown += f"  ({len(all_lines)} lines)"
    return shown


_INDENT = " " * 12


def _wrap(text: str) -> list[str]:
    """Text as lines of at most 88 columns (after the 12-column role label)."""
    out: list[str] = []
    for paragraph in text.splitlines() or [""]:
        out.extend(textwrap.wrap(paragraph, 88) or [""])
    return out


class Narrator:
    """Prints messages and transitions, in the order the run's event stream gives them.

    The initial history is printed first (``message``); then each ``MessageAdded`` and
    ``StateChanged`` of ``AgentRun.events()`` as it arrives (``event``).
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def line(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def message(self, message: Message) -> None:
        if isinstance(message, UserMessage):
            text = "".join(b.text for b in message.content if isinstance(b, TextContent))
            self.line(f"user        {text}")
        elif isinstance(message, AssistantMessage):
            parts: list[str] = []
            for block in message.content:
                if isinstance(block, TextContent):
                    parts.extend(_wrap(block.text))
                elif isinstance(block, ThinkingContent):
                    shown = "(redacted)" if block.redacted else _abbreviate(block.thinking)
                    parts.append(f"(thinking) {shown}")
                elif isinstance(block, ToolCall):
                    arguments = json.dumps(block.arguments_dict(), ensure_ascii=False)
                    parts.append(f"toolCall {block.name} {arguments}  (id {block.id})")
            if message.error_message:
                parts.append(f"error: {message.error_message}")
            body = f"\n{_INDENT}".join(parts) or "(no content)"
            self.line(f"assistant   {body}  [stopReason: {message.stop_reason.value}]")
        else:
            flag = " (isError)" if message.is_error else ""
            self.line(f"toolResult  {message.tool_name}{flag}: {_abbreviate(message.text)}")

    def transition(self, record: TransitionRecord) -> None:
        arrow = f"{record.source.value} -> {record.dest.value}"
        self.line(f"    {arrow:<42} ({record.trigger.value}, turn {record.turn})")

    def event(self, event: RunEvent) -> None:
        if isinstance(event, MessageAdded):
            self.message(event.message)
        elif isinstance(event, StateChanged):
            self.transition(event.record)

    def on_log(self, _: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        """The structlog processor: print warnings and errors, drop everything."""
        if method in ("warning", "error", "critical"):
            details = ", ".join(
                f"{k}={v}" for k, v in sorted(event.items()) if k not in ("event", "run_id")
            )
            self.line(f"    ! {event.get('event')}: {details}")
        raise structlog.DropEvent

    def logger(self) -> Any:
        """A structlog logger that reports to this narrator only."""
        return structlog.wrap_logger(
            structlog.ReturnLogger(),
            processors=[self.on_log],
            # Explicit, so that an application's global configuration (a level
            # filter, say) cannot hide the warnings the demo shows.
            wrapper_class=structlog.BoundLogger,
            context_class=dict,
            cache_logger_on_first_use=False,
        )

    async def narrate(self, run: AgentRun, history: Sequence[Message]) -> RunResult:
        """Run ``run`` (whose initial history is ``history``), printing it as it goes."""
        return await run_shown(run, history, self.message, self.event)


# -- the command -------------------------------------------------------------------------


def run_demo(root: Path, out: TextIO, *, max_turns: int = 8) -> RunResult:
    """Run the script on ``root``, narrating to ``out``; return how the run ended.

    Raises ``InvalidInputError`` if ``root`` is not an existing directory, and
    ``UsageError`` if called from a running event loop.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise UsageError("run_demo() cannot be called from a running event loop")
    tools = workspace_tools(root)
    narrator = Narrator(out)
    shown_root = root.resolve()
    narrator.line(f"statemachine demo: the checkpoint script on {shown_root}")
    narrator.line("  model: the embedded scripted model (deterministic, no network)")
    narrator.line(f"  tools: {', '.join(t.name for t in tools)} (confined to that directory)")
    narrator.line()
    messages: list[Message] = [UserMessage(PROMPT)]
    run = AgentRun(
        model=demo_model(),
        tools=tools,
        messages=messages,
        max_turns=max_turns,
        logger=narrator.logger(),
        run_id="demo",
    )
    result = asyncio.run(narrator.narrate(run, messages))
    narrator.line()
    narrator.line(f"final state: {result.state.value} after {result.turns} model calls")
    narrator.line(f"explanation: {result.explanation}")
    return result


def cli_demo(argv: list[str]) -> int:
    """``python -m statemachine demo [DIR] [--max-turns N]``."""
    parser = CommandParser(
        "demo",
        description="Run the checkpoint script (list the workspace files, read the README, "
        "answer) on DIR with the embedded scripted model (deterministic, no network) and "
        "the real workspace tools, printing each message and state transition as it happens.",
        failed="the run did not end Done (e.g. the turn limit)",
    )
    parser.add_argument(
        "dir", nargs="?", default=".", metavar="DIR", help="workspace directory (default: .)"
    )
    parser.add_argument(
        "--max-turns", type=int, default=8, metavar="N", help="model calls allowed (default: 8)"
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    root = Path(args.dir)
    if not root.exists():
        return fail("demo", f"directory {args.dir!r} does not exist")
    if not root.is_dir():
        return fail("demo", f"{args.dir!r} is not a directory")
    try:
        result = run_demo(root, sys.stdout, max_turns=args.max_turns)
    except InvalidInputError as exc:
        return fail("demo", str(exc))
    return EXIT_OK if result.state is TurnState.DONE else EXIT_FAILED
