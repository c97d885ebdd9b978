"""The end strategy of a run with an output type: what becomes of the other calls of a
response whose final result is accepted (``OutputSpec.end_strategy``, rule 13 of
``core/table.py``). ``"early"`` answers them as not run; ``"exhaustive"`` runs them.

The property test drives the engine through random batches (final-result calls valid
and not, ordinary calls known and not, with and without a permission hook) under both
strategies, and checks I1 and the strategy's promise on the history; it is shown able
to fail on an engine that leaves the other calls of an early end unanswered.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statemachine as sm
from statemachine.core.engine import Engine
from statemachine.core.events import (
    Action,
    CheckContinue,
    CheckPermission,
    ContinueDecided,
    Event,
    ModelResponded,
    Start,
    StartTool,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.invariants import history_violations
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.output import NOT_RUN_EARLY, EndStrategy, OutputSpec
from statemachine.core.table import State, Transition, TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.errors import InvalidInputError
from statemachine.journal import Journal, JournalingEngine, replay
from statemachine.testing import ScriptedModel

S = TurnState
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
LOOKUP = ToolDefinition("lookup", "Look up.", {"type": "object", "properties": {}})


def _engine(strategy: EndStrategy, **options: Any) -> Engine:
    spec = attrs.evolve(OutputSpec.of(SCHEMA), end_strategy=strategy)
    return Engine(tools=[LOOKUP], messages=[UserMessage("go")], output=spec, **options)


def _results(engine: Engine) -> dict[str, ToolResultMessage]:
    return {m.tool_call_id: m for m in engine.messages if isinstance(m, ToolResultMessage)}


BATCH = AssistantMessage(
    [
        ToolCall("c1", "lookup", {}),
        ToolCall("f1", "final_result", {"answer": "42"}),
        ToolCall("c2", "lookup", {}),
    ],
    stop_reason=StopReason.TOOL_USE,
)


def test_early_answers_the_other_calls_as_not_run_and_ends_done() -> None:
    engine = _engine("early")
    engine.handle(Start())
    actions = engine.handle(ModelResponded(BATCH))
    assert not any(isinstance(a, StartTool) for a in actions)  # nothing ran
    assert engine.state is S.DONE
    assert engine.output_call == "f1"
    results = _results(engine)
    assert [m.tool_call_id for m in engine.messages if isinstance(m, ToolResultMessage)] == [
        "c1",
        "f1",
        "c2",
    ]  # call order (I2)
    assert (results["c1"].text, results["c1"].is_error) == (NOT_RUN_EARLY, True)
    assert (results["c2"].text, results["c2"].is_error) == (NOT_RUN_EARLY, True)
    assert not results["f1"].is_error


def test_exhaustive_runs_the_other_calls_before_the_run_ends() -> None:
    engine = _engine("exhaustive")
    engine.handle(Start())
    actions = engine.handle(ModelResponded(BATCH))
    assert [a.call.id for a in actions if isinstance(a, StartTool)] == ["c1", "c2"]
    engine.handle(ToolFinished("c1", ToolOutput("found")))
    engine.handle(ToolFinished("c2", ToolOutput("found")))
    assert engine.state is S.DONE
    assert _results(engine)["c2"].text == "found"


def test_early_runs_everything_when_the_final_result_is_invalid() -> None:
    engine = _engine("early")
    engine.handle(Start())
    bad = AssistantMessage(
        [ToolCall("c1", "lookup", {}), ToolCall("f1", "final_result", {"answer": 42})],
        stop_reason=StopReason.TOOL_USE,
    )
    actions = engine.handle(ModelResponded(bad))
    assert [a.call.id for a in actions if isinstance(a, StartTool)] == ["c1"]
    engine.handle(ToolFinished("c1", ToolOutput("found")))
    assert _results(engine)["f1"].is_error
    assert engine.state is S.AWAITING_MODEL


def test_early_asks_no_permission_for_calls_it_does_not_run() -> None:
    engine = _engine("early", check_permissions=True)
    engine.handle(Start())
    actions = engine.handle(ModelResponded(BATCH))
    assert not any(isinstance(a, CheckPermission) for a in actions)
    assert engine.state is S.DONE


def test_the_engine_default_is_exhaustive_and_an_unknown_strategy_is_refused() -> None:
    assert OutputSpec.of(SCHEMA).end_strategy == "exhaustive"
    with pytest.raises(InvalidInputError, match="end_strategy"):
        attrs.evolve(OutputSpec.of(SCHEMA), end_strategy="eventually")  # type: ignore[arg-type]


def test_the_strategy_survives_the_wire_and_is_absent_for_exhaustive() -> None:
    spec = attrs.evolve(OutputSpec.of(SCHEMA), end_strategy="early")
    assert spec.to_dict()["endStrategy"] == "early"
    assert OutputSpec.from_dict(spec.to_dict(), "output") == spec
    assert "endStrategy" not in OutputSpec.of(SCHEMA).to_dict()  # as written before
    with pytest.raises(InvalidInputError, match="endStrategy"):
        OutputSpec.from_dict({**spec.to_dict(), "endStrategy": "soon"}, "output")


# -- the property ------------------------------------------------------------------------------

CALLS = st.sampled_from(["ok", "unknown", "final_ok", "final_bad"])


def _call(index: int, kind: str) -> ToolCall:
    call_id = f"c{index}"
    if kind == "ok":
        return ToolCall(call_id, "lookup", {})
    if kind == "unknown":
        return ToolCall(call_id, "nowhere", {})
    return ToolCall(call_id, "final_result", {"answer": "42" if kind == "final_ok" else 42})


def _drive(engine: Engine, responses: list[list[str]]) -> None:
    """Run ``engine`` on the scripted responses, answering every action, until it
    returns or waits for an event nobody sends (a broken engine may)."""
    pending: list[Action] = list(engine.handle(Start()))
    script = iter(responses)
    while not engine.state.is_terminal:
        event: Event | None = None
        for action in pending:
            if isinstance(action, StartTool):
                event = ToolFinished(action.call.id, ToolOutput("found"))
            elif isinstance(action, CheckPermission):
                event = ToolPermitted(action.call.id)
            elif isinstance(action, CheckContinue):
                event = ContinueDecided(False)
            if event is not None:
                pending.remove(action)
                break
        if event is None and engine.state is S.AWAITING_MODEL:
            kinds = next(script, [])
            calls = [_call(i, k) for i, k in enumerate(kinds, start=10 * engine.turns)]
            event = ModelResponded(
                AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)
                if calls
                else AssistantMessage("done")
            )
        if event is None:
            return  # stuck: the history shows what is missing
        pending.extend(engine.handle(event))


def _findings(engine: Engine) -> list[str]:
    """I1 and I2 on the history, and the strategy's promise: under ``early`` a batch
    whose final result was accepted ran nothing else; under ``exhaustive`` every valid
    call of it ran."""
    found = [str(v) for v in history_violations(engine.messages)]
    if engine.output_call is None or engine.output is None:
        return found
    results = _results(engine)
    [batch] = [
        m
        for m in engine.messages
        if isinstance(m, AssistantMessage) and engine.output_call in {c.id for c in m.tool_calls}
    ]
    for call in batch.tool_calls:
        result = results.get(call.id)
        if result is None or engine.output.owns(call.name):
            continue  # I1 reports a missing result; the final-result calls are judged
        ran = result.text == "found"
        if engine.output.end_strategy == "early" and ran:
            found.append(f"{call.id} ran after an early end")
        if engine.output.end_strategy == "exhaustive" and call.name == "lookup" and not ran:
            found.append(f"{call.id} did not run under the exhaustive strategy")
    if engine.state is not S.DONE:
        found.append(f"an accepted final result ended {engine.state}")
    return found


RESPONSES = st.lists(st.lists(CALLS, min_size=0, max_size=4), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["early", "exhaustive"]),
    st.booleans(),
    RESPONSES,
)
def test_every_call_has_one_result_and_the_strategy_holds(
    strategy: EndStrategy, permissions: bool, responses: list[list[str]]
) -> None:
    engine = _engine(strategy, check_permissions=permissions, check_continue=True, max_turns=3)
    _drive(engine, responses)
    assert _findings(engine) == []


class LeavesOthersUnanswered(Engine):
    """Broken on purpose: an early end that drops the other calls from the batch
    instead of answering them (the run ends, their calls never get a result), the bug
    I1 exists to catch."""

    def _enter_DispatchingTools(self, row: Transition) -> None:
        output, batch = self.output, self._run.batch
        assert output is not None
        for slot in batch.slots:
            if output.owns(slot.call.name):
                self._resolve_output(slot, self._refusal(slot.call))
        if self.output_call is None:
            super()._enter_DispatchingTools(row)
            return
        kept = tuple(slot for slot in batch.slots if slot.result is not None)
        batch.slots = kept
        batch.by_id = {slot.call.id: slot for slot in kept}
        self._flush()

    _ENTRIES: ClassVar[Mapping[State, Callable[[Engine, Transition], None]]] = {
        **Engine._ENTRIES,
        TurnState.DISPATCHING_TOOLS: _enter_DispatchingTools,  # type: ignore[dict-item]
    }


def test_the_property_catches_an_early_end_that_leaves_a_call_unanswered() -> None:
    spec = attrs.evolve(OutputSpec.of(SCHEMA), end_strategy="early")
    broken = LeavesOthersUnanswered(tools=[LOOKUP], messages=[UserMessage("go")], output=spec)
    _drive(broken, [["ok", "final_ok"]])
    assert any("I1" in f for f in _findings(broken))
    real = _engine("early")
    _drive(real, [["ok", "final_ok"]])
    assert _findings(real) == []  # the same script passes on the real engine


# -- the Agent -------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_an_agent_ends_early_by_default_and_runs_the_others_when_exhaustive() -> None:
    ran: list[str] = []

    @sm.tool
    def notify(who: str) -> str:
        """Tell someone."""
        ran.append(who)
        return "told"

    def both() -> AssistantMessage:
        return AssistantMessage(
            [
                ToolCall("c1", "final_result", {"answer": "42"}),
                ToolCall("c2", "notify", {"who": "ada"}),
            ],
            stop_reason=StopReason.TOOL_USE,
        )

    early = sm.Agent(ScriptedModel(both()), tools=[notify], output_type=SCHEMA).run_sync("q")
    assert early.ok
    assert early.output == {"answer": "42"}
    assert ran == []
    [_, not_run] = [m for m in early.messages if isinstance(m, ToolResultMessage)]
    assert (not_run.text, not_run.is_error) == (NOT_RUN_EARLY, True)
    exhaustive = sm.Agent(
        ScriptedModel(both()), tools=[notify], output_type=SCHEMA, end_strategy="exhaustive"
    ).run_sync("q")
    assert exhaustive.output == {"answer": "42"}
    assert ran == ["ada"]
    with pytest.raises(InvalidInputError, match="end_strategy"):
        sm.Agent(ScriptedModel(), output_type=SCHEMA, end_strategy="late")  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_a_resumed_run_keeps_its_end_strategy() -> None:
    @sm.tool
    def notify(who: str) -> str:
        """Tell someone."""
        return "told"

    model = ScriptedModel(
        AssistantMessage([ToolCall("c1", "notify", {"who": "a"})], stop_reason=StopReason.TOOL_USE),
        BATCH_FOR_AGENT,
    )
    first = sm.Agent(
        model,
        tools=[notify],
        output_type=SCHEMA,
        before_tool_call=lambda call: sm.RequireApproval("check"),
    ).run_sync("q")
    assert first.state is S.AWAITING_USER
    assert first.snapshot is not None
    assert first.snapshot["output"]["endStrategy"] == "early"
    # resumed by an agent that would run everything: the run stays early
    agent = sm.Agent(
        model,
        tools=[notify],
        output_type=SCHEMA,
        end_strategy="exhaustive",
        before_tool_call=lambda c: None,
    )
    resumed = agent.resume_sync(first, approvals={"c1": True})
    assert resumed.ok
    texts = [m.text for m in resumed.messages if isinstance(m, ToolResultMessage)]
    assert texts == ["told", NOT_RUN_EARLY, "Final result accepted."]


BATCH_FOR_AGENT = AssistantMessage(
    [ToolCall("c2", "notify", {"who": "b"}), ToolCall("f1", "final_result", {"answer": "1"})],
    stop_reason=StopReason.TOOL_USE,
)


# -- the wire: snapshots and journals ------------------------------------------------------------


def _member_spec(strategy: EndStrategy) -> OutputSpec:
    spec = OutputSpec.of_members(
        [("Answer", SCHEMA), ("Refusal", {"type": "object", "properties": {"why": {}}})]
    )
    return attrs.evolve(spec, end_strategy=strategy)


MEMBERS_BATCH = AssistantMessage(
    [
        ToolCall("c1", "lookup", {}),
        ToolCall("f1", "final_result_Refusal", {"why": "no"}),
        ToolCall("f2", "final_result_Answer", {"answer": "42"}),
    ],
    stop_reason=StopReason.TOOL_USE,
)


def test_a_replayed_journal_ends_early_as_the_run_did() -> None:
    stream = io.StringIO()
    engine = JournalingEngine(
        journal=Journal(stream),
        tools=[LOOKUP],
        messages=[UserMessage("go")],
        output=_member_spec("early"),
    )
    engine.handle(Start())
    engine.handle(ModelResponded(MEMBERS_BATCH))
    assert engine.state is S.DONE
    assert engine.output_call == "f1"  # the first valid call, whichever member's tool
    result = replay(stream.getvalue().splitlines(keepends=True))
    assert result.state is S.DONE
    assert result.messages == tuple(engine.messages)
    assert [m.text for m in result.messages if isinstance(m, ToolResultMessage)] == [
        NOT_RUN_EARLY,
        "Final result accepted.",
        "Not used: a final result was already accepted.",
    ]


def test_a_snapshot_with_a_tool_per_member_restores_and_refuses_a_stranger() -> None:
    engine = Engine(
        tools=[LOOKUP],
        messages=[UserMessage("go")],
        output=_member_spec("exhaustive"),
        check_permissions=True,
    )
    engine.handle(Start())
    engine.handle(ModelResponded(MEMBERS_BATCH))  # c1 waits for its permission
    data = json.loads(json.dumps(engine.snapshot()))
    assert [t["name"] for t in data["output"]["tools"]] == [
        "final_result_Answer",
        "final_result_Refusal",
    ]
    restored = Engine.restore(data)
    assert restored.control_key() == engine.control_key()
    restored.handle(ToolPermitted("c1"))
    restored.handle(ToolFinished("c1", ToolOutput("found")))
    assert restored.state is S.DONE
    assert restored.output_call == "f1"
    with pytest.raises(InvalidInputError, match="final_result_Answer"):
        Engine(
            tools=[ToolDefinition("final_result_Answer", "Mine.", {"type": "object"})],
            messages=[UserMessage("go")],
            output=_member_spec("early"),
        )
