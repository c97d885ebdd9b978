"""The executable specification: scenario files in ``specs/``, and the runner.

This module owns the scenario format (TOML, read with the standard library's
``tomllib``), the deterministic scripted model, tools and permission hook a scenario
describes, and the comparison of a run with what the scenario expects (the command
``python -m statemachine spec [PATHS]`` is ``statemachine/cli/spec.py``). ``specs/README.md`` documents the
format for the people who write scenarios; ``CATALOG`` names what a scenario may
claim to check (the checkpoint script, the acceptance lines, the invariants I1–I8),
and the runner reports which of them no scenario covers.

Scenarios run through the real loop (``AgentRun``, which ``run_agent`` runs; its
handle lets a scenario steer mid-run). Determinism without clocks: tools that
must finish in a given order wait for the calls they name (``after``), and an abort
is pressed and input queued at a named point (before the start, when the model is
called for the Nth time, when a tool starts, when the permission hook is asked about
a call), never after a delay. Only the grace period is real time, and a scenario sets it small.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog

from statemachine.agent.run import AgentRun, Deny, RequireApproval, RunResult, Stop
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.errors import InvalidInputError
from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    UserMessage,
    message_from_dict,
    message_to_dict,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput, ToolReturn

__all__ = [
    "CATALOG",
    "Scenario",
    "SpecError",
    "SpecOutcome",
    "compact",
    "coverage",
    "default_spec_dir",
    "discover",
    "load_scenario",
    "run_scenario",
]

CATALOG: Mapping[str, str] = {
    "checkpoint": "the checkpoint script runs: list the workspace files, then answer",
    "A1": "assistant 的 tool call 会被执行，即使 stopReason 不是 toolUse。"
    " (tool calls run even when the stop reason is not toolUse)",
    "A2": "tool result 会进入下一次模型请求。 (tool results reach the next model request)",
    "A3": "未知工具、参数校验失败和工具异常都形成错误 tool result，进程不崩溃。"
    " (unknown tool, invalid arguments and tool exceptions become error results)",
    "A4": "abort 后，每个已开始的 tool call 都有结果消息，会话状态可解释。"
    " (after abort every started call has a result and the state is explained)",
    "A5": "超过 turn 上限时有明确错误。 (the turn limit ends the run with a clear error)",
    "A6": "所有消息按发生顺序保留。 (every message is kept, in order)",
    "I1": "pairing: every tool call has exactly one result",
    "I2": "order: append-only history, results in tool-call order",
    "I3": "control: tool calls run whatever the stop reason; Done only without tool calls",
    "I4": "terminal: terminal states absorb everything and carry an explanation",
    "I5": "determinism: equal inputs give equal traces and histories",
    "I6": "abort: started calls finish their cleanup and have results; others say why",
    "I7": "limits: model calls never exceed max_turns; the limit is explained",
    "I8": "no crash, nothing lost: misbehaving tools, hooks and models end in results",
}
"""What a scenario's ``checks`` may name: the acceptance lines and the invariants."""

DEFAULT_GRACE_PERIOD = 0.05

MAX_SCENARIO_BYTES = 1024 * 1024
"""A scenario file larger than this is refused unread (the largest shipped is ~2 KB)."""

# The runner prints its own verdicts; the engine's events (warnings included: the
# scenarios provoke them on purpose) would bury them. A filtering logger, not a global
# structlog configuration, keeps only errors.
_QUIET = structlog.wrap_logger(
    None, wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR)
)


class SpecError(InvalidInputError):
    """A scenario file that is not a valid scenario; the message names file and key."""


# -- the compact transcript form ----------------------------------------------------------


def _args(arguments: Mapping[str, Any]) -> str:
    return json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True)


def compact(message: Message) -> str:
    """One message as one readable string (the form scenarios write transcripts in).

    ``user: TEXT``; ``assistant(STOP): TEXT | call ID NAME {ARGS} | error: MSG``;
    ``result ID NAME: TEXT`` or ``error ID NAME: TEXT`` for a tool result.
    """
    if isinstance(message, UserMessage):
        return "user: " + " | ".join(
            b.text if isinstance(b, TextContent) else "[image]" for b in message.content
        )
    if isinstance(message, AssistantMessage):
        parts = []
        for block in message.content:
            if isinstance(block, TextContent):
                parts.append(block.text)
            elif isinstance(block, ThinkingContent):
                parts.append(
                    "thinking: (redacted)" if block.redacted else f"thinking: {block.thinking}"
                )
            elif isinstance(block, ToolCall):
                unreadable = (
                    "" if block.parse_error is None else f" (unreadable: {block.parse_error})"
                )
                parts.append(f"call {block.id} {block.name} {_args(block.arguments)}{unreadable}")
        if message.error_message is not None:
            parts.append(f"error: {message.error_message}")
        return f"assistant({message.stop_reason.value}): " + " | ".join(parts)
    kind = "error" if message.is_error else "result"
    text = " | ".join(
        b.text if isinstance(b, TextContent) else "[image]"
        for b in message.content
        if isinstance(b, (TextContent, ImageContent))
    )
    return f"{kind} {message.tool_call_id} {message.tool_name}: {text}"


def _matches(expected: str, actual: str) -> bool:
    # "..." at the end of an expected line stands for any rest (long error texts).
    if expected.endswith("..."):
        return actual.startswith(expected[:-3])
    return expected == actual


def _lines_match(expected: Sequence[str], actual: Sequence[str]) -> bool:
    return len(expected) == len(actual) and all(
        _matches(e, a) for e, a in zip(expected, actual, strict=True)
    )


def _diff(label: str, expected: Sequence[str], actual: Sequence[str]) -> str:
    # One JSON string per line, so a message with newlines stays one diff line.
    shown = [a if not _matches(e, a) else e for e, a in zip(expected, actual, strict=False)]
    shown += list(actual[len(expected) :])
    lines = difflib.unified_diff(
        [json.dumps(e, ensure_ascii=False) for e in expected],
        [json.dumps(a, ensure_ascii=False) for a in shown],
        fromfile=f"expected {label}",
        tofile=f"actual {label}",
        lineterm="",
    )
    return "\n".join(lines)


# -- the scenario ---------------------------------------------------------------------------


@attrs.frozen
class ModelStep:
    """One scripted model call: a response, a raise, or a wait for the abort."""

    response: AssistantMessage | None
    raises: str | None
    hang: bool
    on_abort: str  # "return" | "raise" | "ignore"


@attrs.frozen
class CallBehaviour:
    """How the tool behaves for one call id."""

    returns: str | None = None
    raises: str | None = None
    is_error: bool = False
    bad_output: bool = False
    after: tuple[str, ...] = ()
    hang: bool = False
    on_abort: str = "finish"  # "finish" | "raise" | "ignore" | "stubborn"


@attrs.frozen
class Scenario:
    """A parsed scenario file."""

    path: Path
    name: str
    checks: tuple[str, ...]
    description: str
    messages: tuple[Message, ...]
    max_turns: int
    grace_period: float
    tools: tuple[ToolDefinition, ...]
    tool_defaults: Mapping[str, CallBehaviour]
    calls: Mapping[str, CallBehaviour]
    model: tuple[ModelStep, ...]
    abort: Mapping[str, Any]
    permissions: Mapping[str, Any] | None
    expect: Mapping[str, Any]
    inputs: tuple[Mapping[str, Any], ...] = ()
    should_continue: Mapping[str, Any] | None = None


_TOP = {"name", "checks", "description", "run", "tools", "calls", "model", "abort"}
_TOP |= {"permissions", "expect", "inputs", "continue"}
_RUN = {"max_turns", "grace_period", "messages"}
_TOOL = {"name", "description", "parameters", "returns", "raises", "is_error", "bad_output"}
_CALL = {"returns", "raises", "is_error", "bad_output", "after", "hang", "on_abort"}
_MODEL = {"text", "thinking", "stop_reason", "tool_calls", "error_message", "raises", "hang"}
_MODEL |= {"on_abort"}
_ABORT = {"before_start", "during_model_call", "when_tool_starts", "reason"}
_PERMISSIONS = {"deny", "advisory", "approve", "raise_for", "abort_at"}
_INPUT = {"kind", "text", "before_start", "during_model_call", "when_tool_starts"}
_CONTINUE = {"stop_at_turn", "reason"}
_EXPECT = {"state", "turns", "states", "transitions", "transcript", "messages"}
_EXPECT |= {"explanation_contains", "requests", "repeat", "finished"}


class _Reader:
    """Typed access to the parsed TOML, with errors that name the file and key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, problem: str) -> SpecError:
        return SpecError(f"{self.path}: {where}: {problem}")

    def table(self, data: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            raise self.fail(where, f"expected a table, got {type(data).__name__}")
        extra = sorted(set(data) - allowed)
        if extra:
            raise self.fail(
                where, f"unknown key(s) {', '.join(extra)} (known: {', '.join(sorted(allowed))})"
            )
        return data

    def get(self, data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str,
            default: Any = None) -> Any:  # fmt: skip
        if key not in data:
            return default
        value = data[key]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise self.fail(f"{where}.{key}", "expected a number, got a boolean")
        if not isinstance(value, kind):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise self.fail(f"{where}.{key}", f"expected {names}, got {type(value).__name__}")
        return value

    def strings(self, data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
        value = self.get(data, key, list, where, [])
        if not all(isinstance(v, str) for v in value):
            raise self.fail(f"{where}.{key}", "expected an array of strings")
        return tuple(value)


def _behaviour(reader: _Reader, data: Any, where: str, allowed: set[str]) -> CallBehaviour:
    table = reader.table(data, where, allowed)
    on_abort = reader.get(table, "on_abort", str, where, "finish")
    if on_abort not in ("finish", "raise", "ignore", "stubborn"):
        raise reader.fail(f"{where}.on_abort", f"{on_abort!r} is not finish/raise/ignore/stubborn")
    return CallBehaviour(
        returns=reader.get(table, "returns", str, where),
        raises=reader.get(table, "raises", str, where),
        is_error=reader.get(table, "is_error", bool, where, False),
        bad_output=reader.get(table, "bad_output", bool, where, False),
        after=reader.strings(table, "after", where),
        hang=reader.get(table, "hang", bool, where, False),
        on_abort=on_abort,
    )


def _model_step(reader: _Reader, data: Any, where: str) -> ModelStep:
    table = reader.table(data, where, _MODEL)
    on_abort = reader.get(table, "on_abort", str, where, "return")
    if on_abort not in ("return", "raise", "ignore"):
        raise reader.fail(f"{where}.on_abort", f"{on_abort!r} is not return/raise/ignore")
    hang = reader.get(table, "hang", bool, where, False)
    raises = reader.get(table, "raises", str, where)
    response = None
    if raises is None:
        content: list[Any] = []
        thinking = reader.get(table, "thinking", str, where)
        if thinking is not None:
            content.append(ThinkingContent(thinking))
        text = reader.get(table, "text", str, where)
        if text is not None:
            content.append(TextContent(text))
        for i, call in enumerate(reader.get(table, "tool_calls", list, where, [])):
            call_where = f"{where}.tool_calls[{i}]"
            call_table = reader.table(call, call_where, {"id", "name", "arguments", "parse_error"})
            content.append(
                ToolCall(
                    reader.get(call_table, "id", str, call_where, ""),
                    reader.get(call_table, "name", str, call_where, ""),
                    reader.get(call_table, "arguments", Mapping, call_where, {}),
                    parse_error=reader.get(call_table, "parse_error", str, call_where),
                )
            )
        stop = reader.get(table, "stop_reason", str, where)
        if stop is None:
            stop = "toolUse" if any(isinstance(b, ToolCall) for b in content) else "stop"
        try:
            stop_reason = StopReason(stop)
        except ValueError:
            valid = ", ".join(s.value for s in StopReason)
            raise reader.fail(f"{where}.stop_reason", f"{stop!r} is not one of {valid}") from None
        response = AssistantMessage(
            content,
            stop_reason=stop_reason,
            error_message=reader.get(table, "error_message", str, where),
        )
    return ModelStep(response, raises, hang, on_abort)


def _message(reader: _Reader, data: Any, where: str) -> Message:
    if isinstance(data, str):
        return UserMessage(data)
    try:
        return message_from_dict(data, path=where)
    except InvalidInputError as exc:
        raise reader.fail(where, str(exc)) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and check one scenario file; ``SpecError`` names what is wrong."""
    path = Path(path)
    reader = _Reader(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SCENARIO_BYTES + 1)
        if len(raw) > MAX_SCENARIO_BYTES:
            raise SpecError(f"{path}: larger than {MAX_SCENARIO_BYTES} bytes; not a scenario")
        data = tomllib.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    top = reader.table(data, "(top level)", _TOP)
    name = reader.get(top, "name", str, "(top level)")
    if not name:
        raise reader.fail("name", "every scenario needs a name")
    checks = reader.strings(top, "checks", "(top level)")
    unknown = [c for c in checks if c not in CATALOG]
    if unknown or not checks:
        raise reader.fail(
            "checks",
            f"name at least one of {', '.join(CATALOG)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else ""),
        )
    run = reader.table(top.get("run", {}), "run", _RUN)
    messages = tuple(
        _message(reader, m, f"run.messages[{i}]")
        for i, m in enumerate(reader.get(run, "messages", list, "run", []))
    )
    if not messages:
        raise reader.fail("run.messages", "give at least one message")
    tools: list[ToolDefinition] = []
    defaults: dict[str, CallBehaviour] = {}
    for i, raw in enumerate(reader.get(top, "tools", list, "(top level)", [])):
        where = f"tools[{i}]"
        table = reader.table(raw, where, _TOOL)
        try:
            definition = ToolDefinition(
                reader.get(table, "name", str, where, ""),
                reader.get(table, "description", str, where, ""),
                reader.get(table, "parameters", Mapping, where, {"type": "object"}),
            )
        except InvalidInputError as exc:
            raise reader.fail(where, str(exc)) from None
        tools.append(definition)
        defaults[definition.name] = _behaviour(
            reader, {k: v for k, v in table.items() if k in _CALL}, where, _CALL
        )
    calls = {
        str(call_id): _behaviour(reader, raw, f"calls.{call_id}", _CALL)
        for call_id, raw in reader.get(top, "calls", Mapping, "(top level)", {}).items()
    }
    model = tuple(
        _model_step(reader, raw, f"model[{i}]")
        for i, raw in enumerate(reader.get(top, "model", list, "(top level)", []))
    )
    abort = reader.table(top.get("abort", {}), "abort", _ABORT)
    permissions = None
    if "permissions" in top:
        permissions = reader.table(top["permissions"], "permissions", _PERMISSIONS)
    inputs = []
    for i, raw in enumerate(reader.get(top, "inputs", list, "(top level)", [])):
        where = f"inputs[{i}]"
        table = reader.table(raw, where, _INPUT)
        if reader.get(table, "kind", str, where, "steer") not in ("steer", "follow_up"):
            raise reader.fail(f"{where}.kind", "is 'steer' or 'follow_up'")
        if not isinstance(table.get("text"), str):
            raise reader.fail(f"{where}.text", "give the message text")
        inputs.append(table)
    should_continue = None
    if "continue" in top:
        should_continue = reader.table(top["continue"], "continue", _CONTINUE)
    expect = reader.table(top.get("expect", {}), "expect", _EXPECT)
    state = reader.get(expect, "state", str, "expect")
    if state is None or state not in TurnState.__members__:
        raise reader.fail("expect.state", f"name the final state, one of {', '.join(TurnState)}")
    return Scenario(
        path=path,
        name=name,
        checks=checks,
        description=reader.get(top, "description", str, "(top level)", ""),
        messages=messages,
        max_turns=reader.get(run, "max_turns", int, "run", 8),
        grace_period=float(
            reader.get(run, "grace_period", (int, float), "run", DEFAULT_GRACE_PERIOD)
        ),
        tools=tuple(tools),
        tool_defaults=defaults,
        calls=calls,
        model=model,
        abort=abort,
        permissions=permissions,
        expect=expect,
        inputs=tuple(inputs),
        should_continue=should_continue,
    )


# -- the scripted world ------------------------------------------------------------------------


class _World:
    """The model, tools and hook a scenario describes, for one run."""

    def __init__(self, scenario: Scenario, controller: AbortController) -> None:
        self.scenario = scenario
        self.controller = controller
        self.model_calls = 0
        self.requests: list[list[str]] = []
        self.finished: dict[str, asyncio.Event] = {}
        self.batch: list[ToolCall] = []  # the calls of the latest response
        self.started: set[int] = set()  # indices into batch whose tool has started
        self.finish_order: list[str] = []  # call ids, in the order their tools returned
        self.run: AgentRun | None = None

    def _done(self, call_id: str) -> asyncio.Event:
        return self.finished.setdefault(call_id, asyncio.Event())

    def _press_stop(self) -> None:
        self.controller.abort(self.scenario.abort.get("reason", "the user pressed stop"))

    async def _queue_inputs(self, point: str, value: object) -> None:
        """Queue the scenario's inputs that arrive at this point (steer or follow up).

        The driver posts queued input on the loop's next turn; yielding once lets it
        reach the engine before the answer of the call in progress, which is what
        "during the call" means in a scenario.
        """
        assert self.run is not None
        queued = False
        for item in self.scenario.inputs:
            if item.get(point) == value:
                queued = True
                if item.get("kind", "steer") == "follow_up":
                    self.run.follow_up(item["text"])
                else:
                    self.run.steer(item["text"])
        if queued:
            await asyncio.sleep(0)

    async def should_continue(self, messages: Sequence[Message], turn: int) -> Stop | None:
        rules = self.scenario.should_continue or {}
        if rules.get("stop_at_turn") == turn:
            return Stop(str(rules.get("reason", "should_continue said stop")))
        return None

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        self.model_calls += 1
        self.requests.append([compact(m) for m in messages])
        await self._queue_inputs("during_model_call", self.model_calls)
        if self.scenario.abort.get("during_model_call") == self.model_calls:
            self._press_stop()
        if self.model_calls > len(self.scenario.model):
            raise RuntimeError(
                f"the scenario scripts {len(self.scenario.model)} model response(s); "
                f"call {self.model_calls} has none"
            )
        step = self.scenario.model[self.model_calls - 1]
        if step.hang:
            await _until_aborted(signal)
            if step.on_abort == "raise":
                raise RuntimeError("the request was aborted")
            if step.on_abort == "ignore":
                await asyncio.Event().wait()
            return step.response or AssistantMessage((), stop_reason=StopReason.ABORTED)
        if step.raises is not None:
            raise RuntimeError(step.raises)
        assert step.response is not None
        self.batch = list(step.response.tool_calls)
        self.started = set()
        return step.response

    def tool(self, definition: ToolDefinition) -> Tool:
        async def execute(arguments: dict[str, Any], signal: AbortSignal) -> ToolReturn:
            call_id = self._which_call(definition.name, arguments)
            behaviour = self.scenario.calls.get(call_id) or self.scenario.tool_defaults.get(
                definition.name, CallBehaviour()
            )
            try:
                return await self._behave(definition, call_id, behaviour, signal)
            finally:
                self.finish_order.append(call_id)
                self._done(call_id).set()

        return Tool(definition, execute)

    def _which_call(self, name: str, arguments: dict[str, Any]) -> str:
        # ``execute`` is not told its call id. The driver starts calls in call order,
        # so the first call of the latest response with this tool and these arguments
        # that has not started yet is this one.
        for index, call in enumerate(self.batch):
            fits = call.name == name and call.arguments_dict() == arguments
            if fits and index not in self.started:
                self.started.add(index)
                return call.id
        return ""

    async def _behave(
        self, definition: ToolDefinition, call_id: str, b: CallBehaviour, signal: AbortSignal
    ) -> ToolReturn:
        if self.scenario.abort.get("when_tool_starts") == call_id:
            self._press_stop()
        await self._queue_inputs("when_tool_starts", call_id)
        for other in b.after:
            await self._done(other).wait()
        if b.hang:
            await _until_aborted(signal)
            if b.on_abort == "raise":
                raise RuntimeError("interrupted while cleaning up")
            if b.on_abort == "ignore":
                await asyncio.Event().wait()
            if b.on_abort == "stubborn":
                # Swallows the cancellation and finishes long after the run gave up on it.
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    await asyncio.sleep(self.scenario.grace_period * 6)
                return "a result too late to count"
        if b.raises is not None:
            raise RuntimeError(b.raises)
        if b.bad_output:
            return 42  # type: ignore[return-value]
        text = b.returns if b.returns is not None else f"{definition.name} ok"
        return ToolOutput(text, is_error=b.is_error)

    async def before_tool_call(self, call: ToolCall) -> Deny | RequireApproval | None:
        rules = self.scenario.permissions or {}
        if call.id == rules.get("abort_at"):
            self._press_stop()
            await asyncio.Event().wait()
        if call.id in rules.get("raise_for", ()):
            raise RuntimeError("the policy service is unreachable")
        if call.id in rules.get("deny", {}):
            return Deny(str(rules["deny"][call.id]))
        if call.id in rules.get("advisory", {}):
            return Deny(str(rules["advisory"][call.id]), advisory=True)
        if call.id in rules.get("approve", {}):
            return RequireApproval(str(rules["approve"][call.id]))
        return None


async def _until_aborted(signal: AbortSignal) -> None:
    while not signal.aborted:
        await asyncio.sleep(0.001)


# -- running and comparing ---------------------------------------------------------------------


@attrs.frozen
class SpecOutcome:
    """The verdict on one scenario: ``problems`` is empty when it passed."""

    scenario: Scenario
    problems: tuple[str, ...]
    result: RunResult | None

    @property
    def passed(self) -> bool:
        return not self.problems


def _state_trace(result: RunResult) -> list[str]:
    if not result.trace:
        return [TurnState.Ready.value]
    states = [result.trace[0].source.value]
    for record in result.trace:
        if record.dest.value != states[-1]:
            states.append(record.dest.value)
    return states


async def _run_once(scenario: Scenario) -> tuple[RunResult, _World]:
    controller = AbortController()
    world = _World(scenario, controller)
    if scenario.abort.get("before_start"):
        world._press_stop()
    tools = [world.tool(d) for d in scenario.tools]
    # AgentRun is what run_agent runs; its handle lets the scenario steer mid-run.
    run = AgentRun(
        model=world,
        messages=scenario.messages,
        tools=tools,
        max_turns=scenario.max_turns,
        signal=controller.signal,
        before_tool_call=world.before_tool_call if scenario.permissions is not None else None,
        should_continue=world.should_continue if scenario.should_continue is not None else None,
        grace_period=scenario.grace_period,
        run_id=scenario.path.stem,
        logger=_QUIET,
    )
    world.run = run
    await world._queue_inputs("before_start", True)
    result = await run.run()
    return result, world


def _compare(scenario: Scenario, result: RunResult, world: _World) -> list[str]:
    expect = scenario.expect
    problems: list[str] = []
    if result.state.value != expect["state"]:
        problems.append(
            f"final state: expected {expect['state']}, got {result.state.value} "
            f"({result.explanation})"
        )
    if "turns" in expect and result.turns != expect["turns"]:
        problems.append(f"turns: expected {expect['turns']}, got {result.turns}")
    states = _state_trace(result)
    if "states" in expect and list(expect["states"]) != states:
        problems.append(_diff("states", list(expect["states"]), states))
    if "transitions" in expect:
        actual = [f"{r.source.value} --{r.trigger.value}--> {r.dest.value}" for r in result.trace]
        if list(expect["transitions"]) != actual:
            problems.append(_diff("transitions", list(expect["transitions"]), actual))
    transcript = [compact(m) for m in result.messages]
    if "transcript" in expect and not _lines_match(expect["transcript"], transcript):
        problems.append(_diff("transcript", list(expect["transcript"]), transcript))
    if "messages" in expect:
        wire = [message_to_dict(m) for m in result.messages]
        if wire != list(expect["messages"]):
            problems.append(
                _diff(
                    "messages (wire)",
                    [json.dumps(m, ensure_ascii=False, sort_keys=True) for m in expect["messages"]],
                    [json.dumps(m, ensure_ascii=False, sort_keys=True) for m in wire],
                )
            )
    if "finished" in expect and list(expect["finished"]) != world.finish_order:
        problems.append(
            _diff("order the tools finished in", expect["finished"], world.finish_order)
        )
    for needle in expect.get("explanation_contains", ()):
        if needle not in result.explanation:
            problems.append(
                f"explanation: expected it to contain {needle!r}, got {result.explanation!r}"
            )
    for i, request in enumerate(expect.get("requests", ())):
        turn, tail = request.get("turn"), list(request.get("tail", ()))
        if not isinstance(turn, int) or not 1 <= turn <= len(world.requests):
            problems.append(f"requests[{i}]: there was no model call {turn!r}")
            continue
        actual = world.requests[turn - 1][-len(tail) :] if tail else []
        if not _lines_match(tail, actual):
            problems.append(_diff(f"request {turn} (last {len(tail)})", tail, actual))
    return problems


def run_scenario(scenario: Scenario) -> SpecOutcome:
    """Run one scenario through ``run_agent`` and compare it with what it expects.

    With ``expect.repeat = N`` the scenario runs N times and every run must give the
    same state trace, transition log and transcript (I5).
    """
    repeat = scenario.expect.get("repeat", 1)
    first: tuple[list[str], list[Any], list[str]] | None = None
    problems: list[str] = []
    result: RunResult | None = None
    for attempt in range(1, repeat + 1):
        try:
            result, world = asyncio.run(_run_once(scenario))
        except Exception as exc:  # noqa: BLE001 - a crash is a failed scenario, reported
            return SpecOutcome(scenario, (f"run_agent raised {type(exc).__name__}: {exc}",), None)
        seen = (
            _state_trace(result),
            list(result.trace),
            [compact(m) for m in result.messages],
        )
        if first is None:
            first = seen
            problems += _compare(scenario, result, world)
        elif seen != first:
            problems.append(
                f"run {attempt} of {repeat} differs from run 1 (I5):\n"
                + _diff("transcript (run 1)", first[2], seen[2])
            )
    return SpecOutcome(scenario, tuple(problems), result)


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """The scenario files under ``paths`` (files as given, directories searched)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(path.rglob("*.toml"))
        elif path.exists():
            found.append(path)
        else:
            raise SpecError(f"{path}: no such file or directory")
    return found


PACKAGED_SPEC_DIR = Path(__file__).resolve().parents[1] / "_specs"
"""Where an installed wheel keeps the scenarios (``specs/``, shipped as package data)."""

CHECKOUT_SPEC_DIR = Path(__file__).resolve().parents[2] / "specs"
"""Where a source checkout keeps them: the one source the wheel's copy is built from."""


def default_spec_dir() -> Path:
    """The scenarios that belong to this copy of the library.

    The packaged copy when the library is installed from a wheel, else ``specs/`` of the
    checkout the package is imported from. Never the current directory's ``specs/``: a
    directory of that name elsewhere is not ours, and a path argument runs it anyway.
    """
    return PACKAGED_SPEC_DIR if PACKAGED_SPEC_DIR.is_dir() else CHECKOUT_SPEC_DIR


def coverage(scenarios: Iterable[Scenario]) -> dict[str, list[str]]:
    """For every catalog entry, the scenarios that claim to check it."""
    out: dict[str, list[str]] = {key: [] for key in CATALOG}
    for scenario in scenarios:
        for key in scenario.checks:
            out[key].append(scenario.path.stem)
    return out
