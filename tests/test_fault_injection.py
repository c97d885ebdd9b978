"""Fault injection: every model call and tool call may misbehave, and abort may come
at any instant; the run still ends within its bound, with I1–I8 intact and its memory
bounded.

Hypothesis generates a ``Plan``: per model call and per tool call a fault (raise an
``Exception``, a ``BaseException`` of its own, ``GeneratorExit``,
``KeyboardInterrupt`` or ``SystemExit``; hang until cancelled; ignore the signal and
swallow every cancellation; block the event loop briefly; return several MB, or text
with lone surrogates), how long it takes, whether it honours the abort signal, the
turn limit, and when the caller aborts (through the signal or the run's handle). Runs
go on the idle-skipping event loop, so hangs, durations and grace periods cost no real
time; the clock is purely virtual, so the order of events does not depend on the
machine's speed (I5 is checked by running each plan twice).

The default profile runs a few dozen plans; ``HYPOTHESIS_PROFILE=thorough`` runs
10,000. The last tests break the driver on purpose and show that the properties find it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import os
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import pytest
import structlog
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

import statemachine as sm
import statemachine.engine
import statemachine.messages
from statemachine.agent.executor import AsyncioExecutor
from statemachine.agent.sync import close_loop
from statemachine.testing import (
    Execution as KitExecution,
)
from statemachine.testing import (
    FunctionModel,
    ModelTurn,
    RunRecord,
    Scenario,
    check_order,
    check_pairing,
    check_transcript,
)
from statemachine.testing.clock import IdleSkippingLoop
from statemachine.testing.scenario import DEFAULT_HISTORY

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
EXAMPLES = 10_000 if THOROUGH else 40

# Virtual seconds. Operations end on whole seconds and aborts come at k + 0.5, so the
# grace period's half and end (k + 0.7, k + 0.9) fall between them.
GRACE = 0.4
SLACK = 1e-6  # the clock is purely virtual here (VirtualLoop): no real time is counted
BLOCK = 0.002  # real seconds a "block" fault holds the event loop
HUGE = 4 * 1024 * 1024  # characters of a "huge" output
HANG = 10_000.0  # virtual seconds a hang lasts if nothing cancels it
FORCED_ABORT = 100.5  # when a plan with a hang and no abort of its own is aborted
MEMORY_BASE = 8 * 1024 * 1024  # bytes a run may use besides its huge outputs


class Fault(enum.StrEnum):
    OK = "ok"
    EXCEPTION = "exception"
    OWN_BASE = "own BaseException"
    GENERATOR_EXIT = "GeneratorExit"
    KEYBOARD_INTERRUPT = "KeyboardInterrupt"
    SYSTEM_EXIT = "SystemExit"
    HANG = "hang"  # until cancelled (or the signal, if it honours it)
    STUBBORN = "stubborn"  # ignores the signal, swallows every cancellation
    BLOCK = "block"  # holds the event loop for BLOCK seconds, then answers
    HUGE = "huge"
    SURROGATES = "surrogates"

    def __repr__(self) -> str:
        return f"Fault.{self.name}"


class OwnBase(BaseException):
    """A ``BaseException`` subclass of a tool's own."""


RAISES: dict[Fault, Callable[[str], BaseException]] = {
    Fault.EXCEPTION: lambda where: RuntimeError(f"failure in {where}"),
    Fault.OWN_BASE: lambda where: OwnBase(f"own in {where}"),
    Fault.GENERATOR_EXIT: lambda where: GeneratorExit(f"closed in {where}"),
    Fault.KEYBOARD_INTERRUPT: lambda where: KeyboardInterrupt(f"ctrl-c in {where}"),
    Fault.SYSTEM_EXIT: lambda where: SystemExit(f"exit in {where}"),
}
FATAL = (Fault.KEYBOARD_INTERRUPT, Fault.SYSTEM_EXIT)
ENDLESS = (Fault.HANG, Fault.STUBBORN)


@attrs.frozen
class Op:
    """One model call or tool call: its fault, its duration, whether it stops when
    its signal fires."""

    fault: Fault = Fault.OK
    seconds: int = 0
    honours: bool = False


@attrs.frozen
class Turn:
    model: Op
    calls: tuple[Op, ...]  # the tool calls the response asks for (none: it answers)


@attrs.frozen
class Plan:
    turns: tuple[Turn, ...]
    max_turns: int
    abort_at: float | None  # virtual seconds after the start; 0: before the start
    by_handle: bool  # abort through AgentRun.abort() rather than the signal

    def ops(self) -> Iterator[Op]:
        for turn in self.turns:
            yield turn.model
            yield from turn.calls

    def tool_op(self, key: str) -> Op:
        turn, call = key[1:].split("c")
        return self.turns[int(turn) - 1].calls[int(call)]

    @property
    def abort_time(self) -> float | None:
        """When the abort fires: a plan that may hang is always aborted at last."""
        if self.abort_at is None and any(op.fault in ENDLESS for op in self.ops()):
            return FORCED_ABORT
        return self.abort_at


faults = st.one_of(st.just(Fault.OK), st.sampled_from(Fault))
op_strategy = st.builds(
    Op, fault=faults, seconds=st.integers(min_value=0, max_value=3), honours=st.booleans()
)
turn_strategy = st.builds(
    Turn, model=op_strategy, calls=st.lists(op_strategy, max_size=3).map(tuple)
)
plans = st.builds(
    Plan,
    turns=st.lists(turn_strategy, min_size=1, max_size=3).map(tuple),
    max_turns=st.integers(min_value=1, max_value=4),
    # Between the whole seconds at which operations end: the order never depends
    # on how fast the machine computes.
    abort_at=st.one_of(
        st.none(), st.just(0.0), st.integers(min_value=0, max_value=14).map(lambda k: k + 0.5)
    ),
    by_handle=st.booleans(),
)


# -- the scripted model and tool ---------------------------------------------------------


@attrs.define
class Execution:
    key: str
    started_after_abort: bool
    finished: bool = False
    how: str = "running"  # returned, raised, stopped, cancelled
    output: str | None = None


@attrs.define
class Observer:
    plan: Plan
    model_calls: int = 0
    model_calls_after_abort: int = 0
    model_running: bool = False
    produced: list[sm.AssistantMessage] = attrs.Factory(list)
    executions: dict[str, Execution] = attrs.Factory(dict)
    fatal: list[BaseException] = attrs.Factory(list)  # KeyboardInterrupt/SystemExit raised
    abort_fired: bool = False
    abort_effective: bool = False  # the run had not ended when the abort fired
    fatal_before_abort: bool = False
    released: bool = False  # after the run: stubborn operations may end

    def raise_fault(self, fault: Fault, where: str) -> None:
        exc = RAISES[fault](where)
        if fault in FATAL:
            self.fatal.append(exc)
        raise exc

    async def pause(self, seconds: float, signal: sm.AbortSignal, honours: bool) -> bool:
        """Wait ``seconds``; True when cut short by the signal (if it honours it)."""
        if not honours:
            await asyncio.sleep(seconds)
            return False
        if signal.aborted:
            return True
        stop = asyncio.Event()
        unlink = signal.add_listener(lambda _: stop.set())
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except TimeoutError:
            return False
        finally:
            unlink()
        return True

    async def stubborn(self) -> None:
        while not self.released:
            try:
                await asyncio.sleep(HANG)
            except asyncio.CancelledError:
                continue
        raise asyncio.CancelledError  # the test's loop is closing around it

    async def misbehave(self, op: Op, signal: sm.AbortSignal, where: str) -> str | None:
        """Play ``op``'s fault; the text to answer, or None when stopped by the signal."""
        if await self.pause(op.seconds, signal, op.honours):
            return None
        fault = op.fault
        if fault in RAISES:
            self.raise_fault(fault, where)
        if fault is Fault.HANG:
            if await self.pause(HANG, signal, op.honours):
                return None
        elif fault is Fault.STUBBORN:
            await self.stubborn()
        elif fault is Fault.BLOCK:
            time.sleep(BLOCK)
        elif fault is Fault.HUGE:
            return f"{where}:" + "x" * HUGE
        elif fault is Fault.SURROGATES:
            return f"\ud800{where}\udfff\udc80"
        return f"output of {where}"


def Model(observer: Observer) -> FunctionModel:
    """The plan's model: a ``FunctionModel`` answering model call *n* with turn *n*."""

    async def answer(
        messages: Sequence[sm.Message],
        tools: Sequence[sm.ToolDefinition],
        signal: sm.AbortSignal,
    ) -> sm.AssistantMessage:
        obs = observer
        obs.model_calls += 1
        obs.model_calls_after_abort += obs.abort_fired
        n = obs.model_calls
        if n > len(obs.plan.turns):
            message = sm.AssistantMessage("The plan has ended.")
            obs.produced.append(message)
            return message
        turn = obs.plan.turns[n - 1]
        obs.model_running = True
        try:
            text = await obs.misbehave(turn.model, signal, f"model call {n}")
        finally:
            obs.model_running = False
        if text is None:
            message = sm.AssistantMessage("", stop_reason=sm.messages.StopReason.ABORTED)
        else:
            calls = [
                sm.ToolCall(f"call_{n}_{i}", "work", {"key": f"t{n}c{i}"})
                for i in range(len(turn.calls))
            ]
            stop = sm.messages.StopReason.TOOL_USE if calls else sm.messages.StopReason.STOP
            message = sm.AssistantMessage([sm.TextContent(text), *calls], stop_reason=stop)
        obs.produced.append(message)
        return message

    return FunctionModel(answer, with_signal=True)


# Built once: checking a schema costs more than a whole run.
WORK = sm.ToolDefinition(
    "work",
    "Do the planned work.",
    {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
        "additionalProperties": False,
    },
)


def make_tool(observer: Observer) -> sm.Tool:
    async def work(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
        obs = observer
        key = arguments["key"]
        ex = Execution(key, started_after_abort=obs.abort_fired)
        obs.executions[key] = ex
        try:
            text = await obs.misbehave(obs.plan.tool_op(key), signal, f"tool call {key}")
        except asyncio.CancelledError:
            ex.how = "cancelled"
            raise
        except BaseException:
            ex.how = "raised"
            raise
        finally:
            ex.finished = True
        if text is None:
            ex.how = "stopped"
            raise RuntimeError(f"tool call {key} stopped on the abort")
        ex.how, ex.output = "returned", text
        return text

    return sm.Tool(WORK, work)


# -- one run ------------------------------------------------------------------------------------


class VirtualLoop(IdleSkippingLoop):
    """The kit's idle-skipping loop with the real clock taken out: time moves only
    when the loop would wait. Operations that end at the same virtual instant then
    always come in the same order (on the kit's loop, real time spent computing
    decides), so a plan runs the same way twice (I5). Blocking the loop holds it for
    real but costs no virtual time; ``test_driver_faults`` times real blocking."""

    def time(self) -> float:
        return self._skipping.offset


@attrs.frozen
class Outcome:
    plan: Plan
    observer: Observer
    result: sm.RunResult | None
    raised: BaseException | None
    elapsed: float  # virtual seconds from the start to the return
    ended: bool
    running_at_return: tuple[str, ...]
    model_running_at_return: bool
    peak_bytes: int


QUIET = structlog.wrap_logger(
    structlog.ReturnLogger(),
    processors=[],
    wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
)


def bound(plan: Plan) -> float:
    """How long (virtual seconds) the run may take, at most."""
    blocks = sum(op.fault is Fault.BLOCK for op in plan.ops()) * BLOCK
    fatal = any(op.fault in FATAL for op in plan.ops())
    may_hang = any(op.fault in ENDLESS for op in plan.ops())
    work = math.inf if may_hang else sum(op.seconds for op in plan.ops()) + GRACE * fatal
    abort = plan.abort_time
    limit = min(work, math.inf if abort is None else abort + GRACE)
    return limit + blocks + SLACK


async def _play(plan: Plan, observer: Observer) -> Outcome:
    loop = asyncio.get_running_loop()
    controller = sm.AbortController()
    run = sm.AgentRun(
        model=Model(observer),
        messages=DEFAULT_HISTORY,
        tools=[make_tool(observer)],
        max_turns=plan.max_turns,
        signal=controller.signal,
        grace_period=GRACE,
        logger=QUIET,
    )

    def fire() -> None:
        observer.abort_fired = True
        observer.abort_effective = not run.engine.returns_to_caller
        observer.fatal_before_abort = bool(observer.fatal)
        if plan.by_handle:
            run.abort("the caller pressed stop")
        else:
            controller.abort("the caller pressed stop")

    abort_time = plan.abort_time
    timer = None
    if abort_time == 0.0:
        fire()
    elif abort_time is not None:
        timer = loop.call_later(abort_time, fire)

    async def guarded() -> BaseException | None:
        # Caught here: a task that raises KeyboardInterrupt or SystemExit stops the
        # whole event loop (asyncio's rule), and this runs the run in a task.
        try:
            await run.run()
        except (KeyboardInterrupt, SystemExit) as exc:
            return exc
        return None

    start = loop.time()
    task = asyncio.ensure_future(guarded())
    await asyncio.wait({task}, timeout=bound(plan) + 10 * GRACE)
    elapsed = loop.time() - start
    running = tuple(k for k, ex in observer.executions.items() if not ex.finished)
    model_running = observer.model_running
    if timer is not None:
        timer.cancel()
    raised: BaseException | None = None
    if task.done():
        raised = task.exception() or task.result()
    peak = tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else 0
    observer.released = True
    return Outcome(
        plan=plan,
        observer=observer,
        result=run.result if task.done() else None,
        raised=raised,
        elapsed=elapsed,
        ended=task.done(),
        running_at_return=running,
        model_running_at_return=model_running,
        peak_bytes=peak,
    )


def play(plan: Plan, *, trace_memory: bool = False) -> Outcome:
    """Run ``plan`` on a fresh idle-skipping loop, then close the loop without waiting
    for what the run abandoned (as ``run_agent_sync`` does)."""
    loop = VirtualLoop()
    if trace_memory:
        tracemalloc.start()
    try:
        return loop.run_until_complete(_play(plan, Observer(plan)))
    finally:
        if trace_memory:
            tracemalloc.stop()
        close_loop(loop, GRACE)


# -- the properties ---------------------------------------------------------------------------


def _as_record(outcome: Outcome) -> RunRecord:
    """The kit's view of this run, for its pairing (I1) and order (I2) properties."""
    plan, obs, result = outcome.plan, outcome.observer, outcome.result

    scenario = Scenario(turns=tuple(ModelTurn() for _ in plan.turns), max_turns=plan.max_turns)
    executions = tuple(
        KitExecution(
            key=ex.key,
            tool="work",
            order=i,
            abort_fired_before_start=ex.started_after_abort,
            finished=ex.finished,
            how=ex.how,
            output=ex.output,
        )
        for i, ex in enumerate(obs.executions.values())
    )
    return RunRecord(
        scenario=scenario,
        transcript=None if result is None else tuple(result.messages),
        result=result,
        error=None,
        timed_out=False,
        model_calls=obs.model_calls,
        produced=tuple(obs.produced),
        raised_at=(),
        executions=executions,
        running_at_return=outcome.running_at_return,
        abort_fired=obs.abort_fired,
        abort_fired_after_model_calls=0,
        model_calls_after_abort=obs.model_calls_after_abort,
    )


def expected_state(plan: Plan) -> sm.TurnState:
    """Where a run that is neither aborted nor interrupted ends."""
    for n, turn in enumerate(plan.turns, 1):
        if turn.model.fault in RAISES:
            return sm.TurnState.FAILED
        if not turn.calls:
            return sm.TurnState.DONE
        if n >= plan.max_turns:
            return sm.TurnState.TURN_LIMIT_EXCEEDED
    return sm.TurnState.DONE


def check_ending(outcome: Outcome) -> list[str]:
    """I8 and the bound: the run ends in time, and only a KeyboardInterrupt or a
    SystemExit raised under it escapes, the first one, after the run is closed."""
    obs = outcome.observer
    limit = bound(outcome.plan)
    if not outcome.ended:
        return [f"the run did not end within {limit:g} s (virtual): it hung"]
    out: list[str] = []
    if outcome.elapsed > limit:
        out.append(f"the run took {outcome.elapsed:.3f} s (virtual), over its bound {limit:g} s")
    if obs.fatal:
        if outcome.raised is not obs.fatal[0]:
            out.append(
                f"{obs.fatal[0]!r} was raised under the run, but it raised {outcome.raised!r}"
            )
    elif outcome.raised is not None:
        out.append(f"the run raised {outcome.raised!r}")
    if outcome.result is None:
        out.append("AgentRun.result is None after the run")
    return out


def check_history(outcome: Outcome) -> list[str]:
    """I1, I2 (the kit's properties and transcript checker), and the I3 and I4 parts
    that hold whatever the faults: a terminal state with a readable explanation, an
    error unless Done, Done only when the last answer asks for nothing."""
    result = outcome.result
    if result is None:
        return []
    record = _as_record(outcome)
    out = [*check_pairing(record), *check_order(record)]
    out += [str(v) for v in check_transcript(result.messages)]
    if result.state not in (
        sm.TurnState.DONE,
        sm.TurnState.FAILED,
        sm.TurnState.ABORTED,
        sm.TurnState.TURN_LIMIT_EXCEEDED,
    ):
        out.append(f"the run ended in {result.state}, which is not terminal")
    if not result.explanation.strip():
        out.append(f"the run ended {result.state} without an explanation")
    if (result.error is None) != (result.state is sm.TurnState.DONE):
        out.append(f"the run ended {result.state} with error={result.error!r}")
    last = next((m for m in reversed(result.messages) if isinstance(m, sm.AssistantMessage)), None)
    if result.state is sm.TurnState.DONE and last is not None and last.tool_calls:
        out.append("the run ended Done although the last answer asks for tools")
    answered = {m.tool_call_id for m in result.messages if isinstance(m, sm.ToolResultMessage)}
    for key in outcome.observer.executions:
        call_id = "call_" + key[1:].replace("c", "_")
        if call_id not in answered:
            out.append(f"tool call {key} ran but has no result")
    return out


def check_control(outcome: Outcome) -> list[str]:
    """I3/I4/I7: without an abort or an interrupt the run ends where the plan says, and
    never makes more than max_turns model calls."""
    obs, result, plan = outcome.observer, outcome.result, outcome.plan
    out: list[str] = []
    if obs.model_calls > plan.max_turns:
        out.append(f"{obs.model_calls} model calls with max_turns={plan.max_turns}")
    if result is None or obs.abort_effective or obs.fatal:
        return out
    expected = expected_state(plan)
    if result.state is not expected:
        out.append(f"the run ended {result.state}, but the plan leads to {expected}")
    if expected is sm.TurnState.TURN_LIMIT_EXCEEDED and (
        f"max_turns={plan.max_turns}" not in result.explanation
    ):
        out.append(f"the turn-limit explanation does not name the limit: {result.explanation!r}")
    return out


def check_abort(outcome: Outcome) -> list[str]:
    """I6: after the caller's abort no model call and no tool call starts, the run ends
    Aborted, and an operation still running when it returned is reported abandoned."""
    obs, result = outcome.observer, outcome.result
    out: list[str] = []
    if obs.model_calls_after_abort:
        out.append(f"{obs.model_calls_after_abort} model call(s) started after the abort")
    late = [k for k, ex in obs.executions.items() if ex.started_after_abort]
    if late:
        out.append(f"tool call(s) {', '.join(late)} started after the abort")
    if result is None:
        return out
    if (
        obs.abort_effective
        and not obs.fatal_before_abort
        and result.state is not sm.TurnState.ABORTED
    ):
        out.append(f"the run was aborted but ended {result.state}")
    results = {m.tool_call_id: m for m in result.messages if isinstance(m, sm.ToolResultMessage)}
    for key in outcome.running_at_return:
        answer = results.get("call_" + key[1:].replace("c", "_"))
        if answer is None or "abandoned" not in answer.text:
            out.append(f"tool call {key} was still running at the return, not reported abandoned")
        if "abandoned" not in result.explanation or "finished its cleanup" in result.explanation:
            out.append(f"the explanation does not say that {key} was abandoned")
    if outcome.model_running_at_return:
        last = result.messages[-1]
        if not isinstance(last, sm.AssistantMessage) or "abandoned" not in (
            last.error_message or ""
        ):
            out.append("the model call was still running at the return, not reported abandoned")
    return out


def check_memory(outcome: Outcome) -> list[str]:
    huge = sum(op.fault is Fault.HUGE for op in outcome.plan.ops())
    limit = MEMORY_BASE + 3 * huge * HUGE
    if outcome.peak_bytes > limit:
        return [f"the run's memory peaked at {outcome.peak_bytes} bytes, over {limit}"]
    return []


def check_determinism(first: Outcome, second: Outcome) -> list[str]:
    """I5: the same plan twice gives the same history, state, explanation and trace."""
    a, b = first.result, second.result
    if a is None or b is None:
        return []
    return [
        f"the two runs' {name} differ"
        for name in ("messages", "state", "explanation", "trace")
        if getattr(a, name) != getattr(b, name)
    ]


def violations(plan: Plan, *, twice: bool = True, trace_memory: bool = True) -> list[str]:
    first = play(plan, trace_memory=trace_memory)
    out = check_ending(first)
    out += check_history(first) + check_control(first) + check_abort(first)
    out += check_memory(first)
    if twice and first.ended:
        out += check_determinism(first, play(plan))
    return out


# -- the suite ------------------------------------------------------------------------------------


@pytest.mark.timeout(3600 if THOROUGH else 120)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(plans)
def test_every_faulty_run_ends_in_time_with_the_invariants_intact(plan: Plan) -> None:
    assert violations(plan) == []


@pytest.mark.timeout(60)
def test_a_plan_of_every_fault_at_once() -> None:
    calls = tuple(Op(fault) for fault in Fault if fault not in FATAL)
    plan = Plan(
        (Turn(Op(), calls), Turn(Op(Fault.HUGE), ())), max_turns=3, abort_at=None, by_handle=False
    )
    outcome = play(plan, trace_memory=True)
    assert check_ending(outcome) == []
    assert outcome.result is not None
    assert outcome.result.state is sm.TurnState.ABORTED  # the forced abort ends the hangs
    stubborn = [i for i, op in enumerate(calls) if op.fault is Fault.STUBBORN]
    assert outcome.running_at_return == tuple(f"t1c{i}" for i in stubborn)  # abandoned
    assert violations(plan) == []


# -- the properties catch a broken driver ----------------------------------------------------


@contextmanager
def broken(monkeypatch: pytest.MonkeyPatch, name: str, replacement: Any) -> Iterator[None]:
    with monkeypatch.context() as patch:
        patch.setattr(AsyncioExecutor, name, replacement)
        yield


def _search(problem: str) -> Plan:
    """A plan whose violations mention ``problem`` (not shrunk: kept quick)."""
    return find(
        plans,
        lambda plan: any(problem in v for v in violations(plan, twice=False, trace_memory=False)),
        settings=settings(
            max_examples=500,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            report_multiple_bugs=False,
        ),
    )


@pytest.mark.timeout(120)
def test_the_properties_catch_a_driver_that_forgets_a_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = AsyncioExecutor.report

    def forgetful(self: AsyncioExecutor, key: str, event: Any) -> None:
        if isinstance(event, sm.engine.ToolFinished) and key.endswith("_1"):
            return  # the second call of a batch never reports
        report(self, key, event)

    with broken(monkeypatch, "report", forgetful):
        plan = _search("did not end")
    assert any(len(turn.calls) >= 2 for turn in plan.turns)


@pytest.mark.timeout(120)
def test_the_properties_catch_a_driver_that_does_not_cancel_on_abort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def waits_for_ever(self: AsyncioExecutor, keys: list[str], reason: str) -> None:
        await asyncio.wait([self.tasks[k] for k in keys if k in self.tasks])

    with broken(monkeypatch, "cancel_after_grace", waits_for_ever):
        plan = _search("over its bound")
    # An operation that ignores the signal outlasted the grace period.
    assert plan.abort_time is not None
    assert any(not op.honours for op in plan.ops())


@pytest.mark.timeout(120)
def test_the_properties_catch_a_driver_that_rewrites_odd_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    execute = AsyncioExecutor.execute

    async def tidy(self: AsyncioExecutor, call: sm.ToolCall) -> Any:
        output = await execute(self, call)
        text = "".join(getattr(block, "text", "") for block in output.content)
        return sm.ToolOutput(text.encode("utf-8", "replace").decode("utf-8"), output.is_error)

    with broken(monkeypatch, "execute", tidy):
        plan = _search("a result that arrived must be kept as it is")
    assert any(op.fault is Fault.SURROGATES for op in plan.ops())
