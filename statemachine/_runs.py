"""A finished run, saved and drawn: the run file format, and the pages ``trace`` writes.

A ``RunResult`` is saved as JSON (``run_result_to_dict``; read back with
``run_result_from_dict``), and ``load_run`` reads either such a file or a run journal,
which it replays and so verifies. ``sequence_diagram`` draws a run's messages, and
``run_section`` / ``run_page`` put that next to its path over the machine
(``statemachine._render``) as markdown. Nothing here writes a file.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import structlog

from statemachine._render import (
    chart_from_table,
    mermaid_ids,
    mermaid_text,
    overlay_from_trace,
    render,
)
from statemachine.agent.events import RunResult, run_error
from statemachine.core.engine import TransitionRecord
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import BASE_TABLE, Table, Trigger, TurnState
from statemachine.core.wire import (
    messages_from_dicts,
    messages_to_dicts,
)
from statemachine.errors import InvalidInputError, WireFormatError

__all__ = [
    "MAX_RUN_FILE_BYTES",
    "RUN_FILE_FORMAT",
    "load_run",
    "quiet_logger",
    "run_page",
    "run_result_from_dict",
    "run_result_from_journal",
    "run_result_to_dict",
    "run_section",
    "sequence_diagram",
]

RUN_FILE_FORMAT: Final = "agent-statemachine/run"
_RUN_FILE_VERSION: Final = 1
# _journal.FORMAT, spelled out so that reading a run file never imports the journal.
_JOURNAL_FORMAT: Final = "statemachine-journal"
MAX_RUN_FILE_BYTES: Final = 64 * 1024 * 1024
"""``load_run`` refuses a run file or journal larger than this, unread."""


# -- run files ------------------------------------------------------------------------------


def run_result_to_dict(result: RunResult) -> dict[str, Any]:
    """A ``RunResult`` as JSON-ready data: wire messages, the transition log, the end."""
    return {
        "format": RUN_FILE_FORMAT,
        "version": _RUN_FILE_VERSION,
        "runId": result.run_id,
        "state": result.state.value,
        "turns": result.turns,
        "explanation": result.explanation,
        "messages": messages_to_dicts(result.messages),
        "trace": [
            {
                "source": r.source.value,
                "trigger": r.trigger.value,
                "dest": r.dest.value,
                "turn": r.turn,
            }
            for r in result.trace
        ],
    }


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    if key not in data:
        raise WireFormatError(f"{path}: missing key {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise WireFormatError(f"{path}.{key}: expected {name}, got {type(value).__name__}")
    return value


def _enum(kind: type[TurnState] | type[Trigger], value: str, path: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise WireFormatError(
            f"{path}: {value!r} is not a {kind.__name__} of this version of the library"
        ) from None


def run_result_from_dict(data: Mapping[str, Any]) -> RunResult:
    """Parse ``run_result_to_dict``'s output; raise ``WireFormatError`` naming the bad path."""
    if not isinstance(data, Mapping):
        raise WireFormatError(f"run: expected an object, got {type(data).__name__}")
    if data.get("format") != RUN_FILE_FORMAT:
        raise WireFormatError(
            f"run.format: expected {RUN_FILE_FORMAT!r}, got {data.get('format')!r} "
            "(write run files with run_result_to_dict)"
        )
    if data.get("version") != _RUN_FILE_VERSION:
        raise WireFormatError(
            f"run.version: this library reads version {_RUN_FILE_VERSION}, "
            f"got {data.get('version')!r}"
        )
    state = _enum(TurnState, _field(data, "state", str, "run"), "run.state")
    explanation = _field(data, "explanation", str, "run")
    trace = []
    for i, item in enumerate(_field(data, "trace", list, "run")):
        path = f"run.trace[{i}]"
        if not isinstance(item, Mapping):
            raise WireFormatError(f"{path}: expected an object, got {type(item).__name__}")
        trace.append(
            TransitionRecord(
                _enum(TurnState, _field(item, "source", str, path), f"{path}.source"),
                _enum(Trigger, _field(item, "trigger", str, path), f"{path}.trigger"),
                _enum(TurnState, _field(item, "dest", str, path), f"{path}.dest"),
                _field(item, "turn", int, path),
            )
        )
    return RunResult(
        state=state,
        messages=tuple(messages_from_dicts(_field(data, "messages", list, "run"))),
        error=run_error(state, explanation),
        turns=_field(data, "turns", int, "run"),
        explanation=explanation,
        trace=tuple(trace),
        run_id=_field(data, "runId", str, "run"),
    )


def load_run(path: Path) -> RunResult:
    """Read a run file (``run_result_to_dict``) or a journal (replayed and verified).

    A file that cannot be read gives ``InvalidInputError``, one whose content is bad
    ``WireFormatError`` or ``JournalError``, each naming the problem, never a traceback.
    """
    return load_run_and_table(path)[0]


def load_run_and_table(path: Path) -> tuple[RunResult, Table]:
    """``load_run``, with the table the run went by: a journal's (its header declares
    the steps), else the library's (a run file does not record steps)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_RUN_FILE_BYTES + 1)
        if len(raw) > MAX_RUN_FILE_BYTES:
            raise WireFormatError(f"{path} is larger than {MAX_RUN_FILE_BYTES} bytes")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise WireFormatError(f"{path} is not UTF-8 text: {exc}") from exc
    first = text.split("\n", 1)[0]
    try:
        head = json.loads(first)
    except ValueError:
        head = None
    if isinstance(head, dict) and head.get("format") == _JOURNAL_FORMAT:
        # Lines end at "\n" only: str.splitlines also breaks at U+2028 and the other
        # separators, which JSON keeps unescaped inside strings.
        return _from_journal(io.StringIO(text))
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise WireFormatError(f"{path} is not JSON: {exc}") from exc
    return run_result_from_dict(data), BASE_TABLE


def run_result_from_journal(lines: Iterable[str]) -> RunResult:
    """The run a journal records, rebuilt by replaying it (which also verifies it)."""
    return _from_journal(lines)[0]


def _from_journal(lines: Iterable[str]) -> tuple[RunResult, Table]:
    from statemachine.journal import replay

    replayed = replay(lines, logger=quiet_logger())
    engine = replayed.engine
    explanation = engine.explanation or ""
    return RunResult(
        state=engine.state,
        messages=tuple(engine.messages),
        error=run_error(engine.state, explanation),
        turns=engine.turns,
        explanation=explanation,
        trace=tuple(engine.trace),
        run_id=replayed.header.run_id,
    ), engine.table


def quiet_logger() -> Any:
    # Warnings only, to standard error: a command's output is its diagrams. A local
    # logger, so structlog's global configuration stays the application's.
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


# -- sequence diagrams ------------------------------------------------------------------------


def _short(text: str, limit: int = 72) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arguments(arguments: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{k}={json.dumps(v, ensure_ascii=False, sort_keys=True, default=str)}"
        for k, v in arguments.items()
    )


def sequence_diagram(result: RunResult) -> str:
    """A mermaid ``sequenceDiagram`` of the run's history: user, model, one lane per tool.

    Error results and error or aborted responses are drawn with crossed arrows (``--x``)
    and marked ✗; the run's end state and explanation close the diagram.
    """
    tool_names: dict[str, None] = {}
    for message in result.messages:
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                tool_names.setdefault(call.name, None)
        elif isinstance(message, ToolResultMessage):
            tool_names.setdefault(message.tool_name, None)
    lanes = mermaid_ids([f"tool {name}" for name in tool_names])
    lane = {name: lanes[f"tool {name}"] for name in tool_names}
    out = ["sequenceDiagram", "  participant User as user", "  participant Model as model"]
    out += [f"  participant {lane[n]} as {mermaid_text(n)}" for n in tool_names]
    last_lane = lane[next(reversed(tool_names))] if tool_names else "Model"
    turn = 0
    for message in result.messages:
        if isinstance(message, UserMessage):
            text = " ".join(b.text for b in message.content if hasattr(b, "text"))
            out.append(f"  User->>Model: {mermaid_text(_short(text) or '(no text)')}")
        elif isinstance(message, AssistantMessage):
            turn += 1
            out.append(f"  Note over User,{last_lane}: turn {turn}")
            if message.stop_reason in (StopReason.ERROR, StopReason.ABORTED):
                what = "error" if message.stop_reason is StopReason.ERROR else "aborted"
                detail = message.error_message or message.text or what
                out.append(f"  Model--xUser: ✗ {what}: {mermaid_text(_short(detail))}")
            elif message.text:
                arrow = "->>" if message.tool_calls else "-->>"
                out.append(f"  Model{arrow}User: {mermaid_text(_short(message.text))}")
            for call in message.tool_calls:
                shown = _short(f"{call.name}({_arguments(call.arguments)})")
                target = lane[call.name]
                out.append(f"  Model->>{target}: {mermaid_text(shown)} [{mermaid_text(call.id)}]")
        else:
            text = _short(message.text or "(no text)")
            if message.is_error:
                out.append(f"  {lane[message.tool_name]}--xModel: ✗ {mermaid_text(text)}")
            else:
                out.append(f"  {lane[message.tool_name]}-->>Model: {mermaid_text(text)}")
    mark = "" if result.state is TurnState.DONE else "✗ " if result.state.is_terminal else "⏸ "
    end = f"{mark}{result.state.value}: {result.explanation or 'no explanation'}"
    out.append(f"  Note over User,{last_lane}: {mermaid_text(_short(end, 110))}")
    return "\n".join(out) + "\n"


def run_section(result: RunResult, title: str, intro: str, source: str, svg: str) -> list[str]:
    """Markdown for one run: where it came from, its path over the machine, its messages."""
    chart = chart_from_table()
    overlay = overlay_from_trace(chart, result.trace, result.state.value)
    mermaid = render("mermaid", chart, overlay)
    assert isinstance(mermaid, str)
    return [
        f"## {title}",
        "",
        intro,
        "",
        f"It ended **{result.state.value}** after {result.turns} model calls: {result.explanation}",
        "",
        "### The path it took through the machine",
        "",
        "States and steps the run visited are blue, with how often (×N); the state it "
        "ended in has a red border; grey was never visited.",
        "",
        "```mermaid",
        mermaid.rstrip("\n"),
        "```",
        "",
        f"The same overlay drawn by Graphviz ([`{svg}`]({svg})):",
        "",
        f"![the path of the run in {source}]({svg})",
        "",
        "### Its messages",
        "",
        "User, model and one lane per tool; error results and failed or aborted "
        "responses are crossed arrows marked ✗.",
        "",
        "```mermaid",
        sequence_diagram(result).rstrip("\n"),
        "```",
        "",
        f"Drawn with `python -m statemachine trace diagrams/{source} --format markdown`.",
        "",
    ]


def run_page(title: str, sections: Iterable[list[str]], generator: str) -> str:
    """A markdown page of run sections, marked as generated by the ``generator`` command."""
    lines = [f"# {title}", "", f"<!-- generated by `{generator}`; do not edit by hand -->", ""]
    for section in sections:
        lines += section
    return "\n".join(lines)
