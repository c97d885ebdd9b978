"""The executable specification: scenario files in ``specs/``, read into scenarios.

A spec file (TOML, read with the standard library's ``tomllib``) is a serialisation of
a ``statemachine.testing.Scenario`` (the model's responses, the tools and how each
call behaves, the abort instant, the hooks) plus what its run must show
(``Expectations``: the final state, the transcript, the state trace...). ``load_scenario``
reads one into a ``Spec``; ``run_scenario`` runs its scenario through the kit's one
runner (``runner.run_scenario`` with ``agent_loop``, that is the real loop) and
compares the ``RunRecord`` with the expectations. ``specs/README.md`` documents the
format for the people who write scenarios; ``CATALOG`` names what a scenario may claim
to check (the checkpoint script, the acceptance lines, the invariants I1–I8), and
``coverage`` says which of them no scenario covers. The command is
``python -m statemachine spec [PATHS]`` (``statemachine/cli/spec.py``).

Determinism without clocks: tools that must finish in a given order wait for the calls
they name (``after``), and an abort is pressed and input queued at a named point
(before the start, when the model is called for the Nth time, when a tool starts,
when the permission hook is asked about a call), never after a delay. Only the grace
period is a time, and it runs on the kit's idle-skipping event loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from statemachine.agent.events import (
    RunResult,
)
from statemachine.core.messages import (
    StopReason,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition
from statemachine.core.wire import (
    message_to_dict,
)
from statemachine.errors import InvalidInputError
from statemachine.testing import _spec_reader
from statemachine.testing._compact import compact, diff, lines_match
from statemachine.testing._spec_reader import (
    MAX_SCENARIO_BYTES,
    Reader,
    SpecError,
    default_spec_dir,
    discover,
    message,
    read,
)
from statemachine.testing._spec_steps import StepScript, read_steps
from statemachine.testing.runner import agent_loop
from statemachine.testing.runner import run_scenario as run_record
from statemachine.testing.scenario import (
    AbortAt,
    AbortKind,
    Hooks,
    Input,
    ModelTurn,
    OnAbort,
    Outcome,
    RunRecord,
    Scenario,
    ScriptedCall,
    ToolBehaviour,
    call_key,
)

__all__ = [
    "CATALOG",
    "MAX_SCENARIO_BYTES",
    "Expectations",
    "Spec",
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

HANG_LIMIT = 60.0
"""How long a call that ignores the abort waits to be cancelled: far past any grace
period a spec sets, and free on the idle-skipping loop."""


@attrs.frozen
class Expectations:
    """What the run of a spec must show; an absent field is not checked."""

    state: str
    turns: int | None = None
    states: tuple[str, ...] | None = None  # the state trace, repeats collapsed
    transitions: tuple[str, ...] | None = None  # "Source --trigger--> Dest"
    transcript: tuple[str, ...] | None = None  # compact form
    messages: tuple[Any, ...] | None = None  # wire form
    explanation_contains: tuple[str, ...] = ()
    requests: tuple[Mapping[str, Any], ...] = ()  # {turn, tail}: what the model saw
    finished: tuple[str, ...] | None = None  # call ids, in the order their tools ended
    repeat: int = 1  # runs that must all be identical (I5)


@attrs.frozen
class Spec:
    """A parsed spec file: its scenario, its expectations, and what it claims to check."""

    path: Path
    name: str
    checks: tuple[str, ...]
    description: str
    scenario: Scenario
    expect: Expectations
    grace_period: float
    ids: Mapping[str, str]  # call key -> the call id the file gave it
    run_options: Mapping[str, Any] = attrs.field(factory=dict)  # usage_limits, output_type...
    steps: tuple[StepScript, ...] = ()  # declared steps, their answers scripted


_TOP = {"name", "checks", "description", "run", "tools", "calls", "model", "abort"}
_TOP |= {"permissions", "expect", "inputs", "continue", "steps"}
_RUN = {"max_turns", "grace_period", "messages", "usage_limits", "output_schema"}
_RUN |= {"output_retries"}
_TOOL = {"name", "description", "parameters", "returns", "raises", "is_error", "bad_output"}
_CALL = {"returns", "raises", "is_error", "bad_output", "after", "hang", "on_abort"}
_MODEL = {"text", "thinking", "stop_reason", "tool_calls", "error_message", "raises", "hang"}
_MODEL |= {"on_abort", "usage"}
_TOOL_CALL = {"id", "name", "arguments", "parse_error"}
_ABORT = {"before_start", "during_model_call", "when_tool_starts", "reason"}
_PERMISSIONS = {"deny", "advisory", "approve", "raise_for", "abort_at"}
_INPUT = {"kind", "text", "before_start", "during_model_call", "when_tool_starts"}
_CONTINUE = {"stop_at_turn", "reason"}
_EXPECT = {"state", "turns", "states", "transitions", "transcript", "messages"}
_EXPECT |= {"explanation_contains", "requests", "repeat", "finished"}

_TOOL_ON_ABORT = {
    "finish": OnAbort.FINISH,
    "raise": OnAbort.RAISE,
    "ignore": OnAbort.HANG,
    "stubborn": OnAbort.STUBBORN,
}
_MODEL_ON_ABORT = {"return": OnAbort.HONOUR, "raise": OnAbort.RAISE, "ignore": OnAbort.HANG}


class _Loader:
    """One spec file being read into a scenario.

    The file names tool calls by the ids the model gives them; the scenario by their
    keys (``call_key``: turn and position). ``keys`` maps an id to the key of the first
    call that has it, so ``after``, ``when_tool_starts`` and typed input can name calls.
    """

    def __init__(self, reader: Reader, top: Mapping[str, Any]) -> None:
        self.r = reader
        self.top = top
        self.steps = [
            reader.table(raw, f"model[{i}]", _MODEL)
            for i, raw in enumerate(reader.get(top, "model", list, "(top level)", []))
        ]
        self.calls: list[list[Mapping[str, Any]]] = []
        self.keys: dict[str, str] = {}
        self.positions: dict[str, tuple[int, int]] = {}
        self.ids: dict[str, str] = {}
        for t, step in enumerate(self.steps, 1):
            where = f"model[{t - 1}]"
            raw_calls = reader.get(step, "tool_calls", list, where, [])
            tables = [
                reader.table(c, f"{where}.tool_calls[{i}]", _TOOL_CALL)
                for i, c in enumerate(raw_calls)
            ]
            self.calls.append(tables)
            for c, table in enumerate(tables):
                call_id = reader.get(table, "id", str, f"{where}.tool_calls[{c}]", "")
                self.keys.setdefault(call_id, call_key(t, c))
                self.positions.setdefault(call_id, (t, c))
                self.ids[call_key(t, c)] = call_id

    def key(self, call_id: str, where: str) -> str:
        if call_id not in self.keys:
            raise self.r.fail(where, f"no model response calls {call_id!r}")
        return self.keys[call_id]

    def behaviour(self, data: Any, where: str, allowed: set[str], grace: float) -> ToolBehaviour:
        r = self.r
        table = r.table(data, where, allowed)
        on_abort = r.get(table, "on_abort", str, where, "finish")
        if on_abort not in _TOOL_ON_ABORT:
            raise r.fail(f"{where}.on_abort", f"{on_abort!r} is not finish/raise/ignore/stubborn")
        hang = r.get(table, "hang", bool, where, False)
        raises = r.get(table, "raises", str, where)
        after = tuple(self.key(i, f"{where}.after") for i in r.strings(table, "after", where))
        return ToolBehaviour(
            outcome=Outcome.RAISE if raises is not None else Outcome.RETURN,
            error=raises or "",
            returns=r.get(table, "returns", str, where),
            is_error=r.get(table, "is_error", bool, where, False),
            bad_output=r.get(table, "bad_output", bool, where, False),
            after=after,
            until_abort=hang,
            on_abort=_TOOL_ON_ABORT[on_abort] if hang else OnAbort.FINISH,
            late_by=grace * 6,
        )

    def tools(self, grace: float) -> tuple[tuple[ToolDefinition, ...], dict[str, ToolBehaviour]]:
        """The tools the file declares, with each one's default behaviour."""
        r = self.r
        definitions: list[ToolDefinition] = []
        defaults: dict[str, ToolBehaviour] = {}
        for i, raw in enumerate(r.get(self.top, "tools", list, "(top level)", [])):
            where = f"tools[{i}]"
            table = r.table(raw, where, _TOOL)
            try:
                definition = ToolDefinition(
                    r.get(table, "name", str, where, ""),
                    r.get(table, "description", str, where, ""),
                    r.get(table, "parameters", Mapping, where, {"type": "object"}),
                )
            except InvalidInputError as exc:
                raise r.fail(where, str(exc)) from None
            definitions.append(definition)
            behaviour = {k: v for k, v in table.items() if k in _CALL}
            defaults[definition.name] = self.behaviour(behaviour, where, _CALL, grace)
        return tuple(definitions), defaults

    def turns(
        self, grace: float, abort: AbortAt, defaults: Mapping[str, ToolBehaviour]
    ) -> tuple[ModelTurn, ...]:
        """The model's responses, each call with the behaviour the file gives it (its
        own, else its tool's)."""
        by_id = {
            str(call_id): self.behaviour(raw, f"calls.{call_id}", _CALL, grace)
            for call_id, raw in self.r.get(self.top, "calls", Mapping, "(top level)", {}).items()
        }
        turns = []
        for t, step in enumerate(self.steps, 1):
            calls = []
            for c, table in enumerate(self.calls[t - 1]):
                where = f"model[{t - 1}].tool_calls[{c}]"
                call_id = self.r.get(table, "id", str, where, "")
                name = self.r.get(table, "name", str, where, "")
                behaviour = (
                    by_id.get(call_id)
                    or defaults.get(name)
                    or ToolBehaviour(on_abort=OnAbort.FINISH)
                )
                if behaviour.returns is None:
                    behaviour = attrs.evolve(behaviour, returns=f"{name} ok")
                calls.append(
                    ScriptedCall(
                        tool=name,
                        call_id=call_id,
                        behaviour=behaviour,
                        arguments=self.r.get(table, "arguments", Mapping, where, {}),
                        parse_error=self.r.get(table, "parse_error", str, where),
                    )
                )
            turns.append(self.turn(step, t, calls, abort))
        return tuple(turns)

    def turn(
        self, step: Mapping[str, Any], number: int, calls: list[ScriptedCall], abort: AbortAt
    ) -> ModelTurn:
        r, where = self.r, f"model[{number - 1}]"
        on_abort = r.get(step, "on_abort", str, where, "return")
        if on_abort not in _MODEL_ON_ABORT:
            raise r.fail(f"{where}.on_abort", f"{on_abort!r} is not return/raise/ignore")
        hang = r.get(step, "hang", bool, where, False)
        if hang and not (abort.kind is AbortKind.MODEL_CALL and abort.turn == number):
            raise r.fail(f"{where}.hang", f"needs [abort] during_model_call = {number}")
        stop = r.get(step, "stop_reason", str, where)
        if stop is None:
            stop = "toolUse" if calls else "stop"
        try:
            stop_reason = StopReason(stop)
        except ValueError:
            valid = ", ".join(s.value for s in StopReason)
            raise r.fail(f"{where}.stop_reason", f"{stop!r} is not one of {valid}") from None
        raises = r.get(step, "raises", str, where)
        return ModelTurn(
            text=r.get(step, "text", str, where, ""),
            thinking=r.get(step, "thinking", str, where, ""),
            calls=calls,
            stop_reason=stop_reason,
            error_message=r.get(step, "error_message", str, where),
            raises=raises is not None,
            error=raises or "",
            on_abort=_MODEL_ON_ABORT[on_abort] if hang else OnAbort.IGNORE,
            usage=_spec_reader.usage(r, step, where),
        )

    def abort(self) -> AbortAt:
        """The one abort instant: ``[abort]``, or the permission hook's ``abort_at``."""
        r = self.r
        table = r.table(self.top.get("abort", {}), "abort", _ABORT)
        permissions = r.table(self.top.get("permissions", {}), "permissions", _PERMISSIONS)
        reason = r.get(table, "reason", str, "abort", "the user pressed stop")
        instants: list[AbortAt] = []
        if r.get(table, "before_start", bool, "abort", False):
            instants.append(AbortAt(AbortKind.BEFORE_START, reason=reason))
        if "during_model_call" in table:
            turn = r.get(table, "during_model_call", int, "abort")
            instants.append(AbortAt(AbortKind.MODEL_CALL, turn, reason=reason))
        for kind, raw in (
            (AbortKind.TOOL_START, r.get(table, "when_tool_starts", str, "abort")),
            (AbortKind.PERMISSION, r.get(permissions, "abort_at", str, "permissions")),
        ):
            if raw is not None:
                where = "abort.when_tool_starts" if kind is AbortKind.TOOL_START else "abort_at"
                self.key(raw, where)  # a call some response makes
                turn, call = self.positions[raw]
                instants.append(AbortAt(kind, turn, call, reason=reason))
        if len(instants) > 1:
            raise r.fail("abort", "give at most one instant to press stop at")
        return instants[0] if instants else AbortAt()

    def hooks(self) -> Hooks | None:
        """The permission hook, the stop rule and the typed input, when there are any."""
        r, top = self.r, self.top
        if not {"permissions", "continue", "inputs"} & set(top):
            return None
        rules = r.table(top.get("permissions", {}), "permissions", _PERMISSIONS)
        stop = r.table(top.get("continue", {}), "continue", _CONTINUE)

        def texts(key: str) -> dict[str, str]:
            given = r.get(rules, key, Mapping, "permissions", {})
            return {str(k): str(v) for k, v in given.items()}

        return Hooks(
            deny=texts("deny"),
            advisory=texts("advisory"),
            approve=texts("approve"),
            raise_for=r.strings(rules, "raise_for", "permissions"),
            permissions="permissions" in top,
            stop_at_turn=r.get(stop, "stop_at_turn", int, "continue"),
            stop_reason=r.get(stop, "reason", str, "continue", "should_continue said stop"),
            inputs=tuple(
                self.typed(raw, f"inputs[{i}]")
                for i, raw in enumerate(r.get(top, "inputs", list, "(top level)", []))
            ),
        )

    def typed(self, raw: Any, where: str) -> Input:
        r = self.r
        table = r.table(raw, where, _INPUT)
        kind = r.get(table, "kind", str, where, "steer")
        if kind not in ("steer", "follow_up"):
            raise r.fail(f"{where}.kind", "is 'steer' or 'follow_up'")
        if not isinstance(table.get("text"), str):
            raise r.fail(f"{where}.text", "give the message text")
        tool = r.get(table, "when_tool_starts", str, where)
        return Input(
            table["text"],
            kind,
            before_start=r.get(table, "before_start", bool, where, False),
            model_call=r.get(table, "during_model_call", int, where, 0),
            tool_start=self.key(tool, f"{where}.when_tool_starts") if tool is not None else "",
        )

    def expectations(self, ends: Iterable[str] = ()) -> Expectations:
        r = self.r
        expect = r.table(self.top.get("expect", {}), "expect", _EXPECT)
        state = r.get(expect, "state", str, "expect")
        states = [*(s.value for s in TurnState), *sorted(ends)]  # the steps' ends too
        if state is None or state not in states:
            raise r.fail("expect.state", f"name the final state, one of {', '.join(states)}")

        def lines(key: str) -> tuple[Any, ...] | None:
            return tuple(r.get(expect, key, list, "expect")) if key in expect else None

        return Expectations(
            state=state,
            turns=r.get(expect, "turns", int, "expect"),
            states=lines("states"),
            transitions=lines("transitions"),
            transcript=lines("transcript"),
            messages=lines("messages"),
            explanation_contains=r.strings(expect, "explanation_contains", "expect"),
            requests=tuple(r.get(expect, "requests", list, "expect", [])),
            finished=lines("finished"),
            repeat=r.get(expect, "repeat", int, "expect", 1),
        )


def load_scenario(path: str | Path) -> Spec:
    """Read and check one spec file; ``SpecError`` names what is wrong."""
    path = Path(path)
    reader = Reader(path)
    top = reader.table(read(path), "(top level)", _TOP)
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
        message(reader, m, f"run.messages[{i}]")
        for i, m in enumerate(reader.get(run, "messages", list, "run", []))
    )
    if not messages:
        raise reader.fail("run.messages", "give at least one message")
    grace = float(reader.get(run, "grace_period", (int, float), "run", DEFAULT_GRACE_PERIOD))
    loader = _Loader(reader, top)
    abort = loader.abort()
    tools, defaults = loader.tools(grace)
    scenario = Scenario(
        turns=loader.turns(grace, abort, defaults),
        abort=abort,
        max_turns=reader.get(run, "max_turns", int, "run", 8),
        history=messages,
        tools=tools,
        hooks=loader.hooks(),
        script_must_last=True,
    )
    description = reader.get(top, "description", str, "(top level)", "")
    steps = read_steps(reader, top)
    expect = loader.expectations(set().union(*(script.ends for script in steps)))
    options = _spec_reader.run_options(reader, run)
    return Spec(
        path, name, checks, description, scenario, expect, grace, loader.ids, options, steps
    )


# -- running and comparing ---------------------------------------------------------------------


@attrs.frozen
class SpecOutcome:
    """The verdict on one spec: ``problems`` is empty when it passed."""

    scenario: Spec
    problems: tuple[str, ...]
    result: RunResult | None

    @property
    def passed(self) -> bool:
        return not self.problems


def _state_trace(result: RunResult) -> list[str]:
    if not result.trace:
        return [TurnState.READY.value]
    states = [result.trace[0].source.value]
    for record in result.trace:
        if record.dest.value != states[-1]:
            states.append(record.dest.value)
    return states


def _run_once(spec: Spec) -> RunRecord:
    options = dict(spec.run_options)
    if spec.steps:
        options["steps"] = [script.step() for script in spec.steps]  # fresh scripts each run
    loop = agent_loop(grace_period=spec.grace_period, run_id=spec.path.stem, **options)
    return run_record(loop, spec.scenario, timeout=HANG_LIMIT * 2, hang_limit=HANG_LIMIT)


def _result_problems(expect: Expectations, result: RunResult) -> list[str]:
    """The final state, turns, state trace, transitions and explanation."""
    problems: list[str] = []
    if result.state.value != expect.state:
        problems.append(
            f"final state: expected {expect.state}, got {result.state.value} ({result.explanation})"
        )
    if expect.turns is not None and result.turns != expect.turns:
        problems.append(f"turns: expected {expect.turns}, got {result.turns}")
    states = _state_trace(result)
    if expect.states is not None and list(expect.states) != states:
        problems.append(diff("states", list(expect.states), states))
    if expect.transitions is not None:
        actual = [f"{r.source.value} --{r.trigger.value}--> {r.dest.value}" for r in result.trace]
        if list(expect.transitions) != actual:
            problems.append(diff("transitions", list(expect.transitions), actual))
    problems += [
        f"explanation: expected it to contain {needle!r}, got {result.explanation!r}"
        for needle in expect.explanation_contains
        if needle not in result.explanation
    ]
    return problems


def _history_problems(expect: Expectations, result: RunResult) -> list[str]:
    """The transcript (compact form) and the messages (wire form)."""
    problems: list[str] = []
    transcript = [compact(m) for m in result.messages]
    if expect.transcript is not None and not lines_match(expect.transcript, transcript):
        problems.append(diff("transcript", list(expect.transcript), transcript))
    if expect.messages is not None:
        wire = [message_to_dict(m) for m in result.messages]
        if wire != list(expect.messages):
            problems.append(
                diff(
                    "messages (wire)",
                    [json.dumps(m, ensure_ascii=False, sort_keys=True) for m in expect.messages],
                    [json.dumps(m, ensure_ascii=False, sort_keys=True) for m in wire],
                )
            )
    return problems


def _world_problems(spec: Spec, record: RunRecord) -> list[str]:
    """What the scripted world saw: the order the tools ended in, the model's requests."""
    expect, problems = spec.expect, []
    finished = [spec.ids.get(key, key) for key in record.finish_order]
    if expect.finished is not None and list(expect.finished) != finished:
        problems.append(diff("order the tools finished in", list(expect.finished), finished))
    requests = [[compact(m) for m in sent] for sent in record.requests]
    for i, request in enumerate(expect.requests):
        turn, tail = request.get("turn"), list(request.get("tail", ()))
        if not isinstance(turn, int) or not 1 <= turn <= len(requests):
            problems.append(f"requests[{i}]: there was no model call {turn!r}")
            continue
        actual = requests[turn - 1][-len(tail) :] if tail else []
        if not lines_match(tail, actual):
            problems.append(diff(f"request {turn} (last {len(tail)})", tail, actual))
    return problems


def run_scenario(spec: Spec) -> SpecOutcome:
    """Run one spec's scenario through the real loop and compare it with what it expects.

    With ``expect.repeat = N`` the scenario runs N times and every run must give the
    same state trace, transition log and transcript (I5).
    """
    first: tuple[list[str], list[Any], list[str]] | None = None
    problems: list[str] = []
    result: RunResult | None = None
    for attempt in range(1, spec.expect.repeat + 1):
        record = _run_once(spec)
        result = record.result
        if result is None:
            return SpecOutcome(spec, (f"run_agent raised {record.error}",), None)
        seen = (_state_trace(result), list(result.trace), [compact(m) for m in result.messages])
        if first is None:
            first = seen
            problems += _result_problems(spec.expect, result)
            problems += _history_problems(spec.expect, result)
            problems += _world_problems(spec, record)
        elif seen != first:
            problems.append(
                f"run {attempt} of {spec.expect.repeat} differs from run 1 (I5):\n"
                + diff("transcript (run 1)", first[2], seen[2])
            )
    return SpecOutcome(spec, tuple(problems), result)


def coverage(scenarios: Iterable[Spec]) -> dict[str, list[str]]:
    """For every catalog entry, the scenarios that claim to check it."""
    out: dict[str, list[str]] = {key: [] for key in CATALOG}
    for scenario in scenarios:
        for key in scenario.checks:
            out[key].append(scenario.path.stem)
    return out
