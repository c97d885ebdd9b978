"""What an engine makes and keeps as a run goes on: one batch refilled each turn
(never a new one), the zero usage shared until a response reports some, and a fork
whose batch stays its own when the engine it came from refills its batch, transition
records shared by the engines that take the same transitions, and the tools' tuple and
index shared by the engines that offer the same definitions: an engine waiting for its
model holds few objects of its own for the garbage collector to scan."""

from __future__ import annotations

import gc
import logging
import types
from collections import Counter
from typing import Any

import pytest
from engine_support import ECHO

from statemachine.core import batch as batch_module
from statemachine.core import state as state_module
from statemachine.core import trace as trace_module
from statemachine.core.engine import Engine
from statemachine.core.events import ModelResponded, Start, ToolFinished
from statemachine.core.messages import (
    AssistantMessage,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from statemachine.core.output import OutputSpec
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput

S = TurnState


def _engine() -> Engine:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], max_turns=10)
    engine.handle(Start())
    return engine


def _turn(engine: Engine, call_id: str, usage: Usage | None = None) -> None:
    call = ToolCall(call_id, "echo", {"text": call_id})
    engine.handle(ModelResponded(AssistantMessage((call,), usage=usage)))
    engine.handle(ToolFinished(call_id, ToolOutput(call_id)))


@pytest.mark.timeout(30)
def test_turns_refill_the_engines_one_batch_instead_of_making_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = _engine()
    made: list[Any] = []
    original = batch_module.Batch.__init__

    def counted(self: batch_module.Batch, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(batch_module.Batch, "__init__", counted)
    for turn in range(3):
        _turn(engine, f"c{turn}")
    assert made == []
    assert engine.state is S.AWAITING_MODEL
    assert engine.turns == 4
    results = [m.tool_call_id for m in engine.messages if isinstance(m, ToolResultMessage)]
    assert results == ["c0", "c1", "c2"]
    assert engine.pending_calls() == ()


@pytest.mark.timeout(30)
def test_a_fork_keeps_its_batch_when_the_original_goes_on() -> None:
    engine = _engine()
    engine.handle(ModelResponded(AssistantMessage((ToolCall("a", "echo", {"text": "a"}),))))
    fork = engine.fork()
    engine.handle(ToolFinished("a", ToolOutput("a")))  # the original refills its batch
    _turn(engine, "b")
    assert engine.pending_calls() == ()
    assert [c.id for c in fork.pending_calls()] == ["a"]
    fork.handle(ToolFinished("a", ToolOutput("fork")))
    assert fork.state is S.AWAITING_MODEL
    assert fork.messages[-1].content[0].text == "fork"  # type: ignore[union-attr]


@pytest.mark.timeout(30)
def test_engines_share_the_zero_usage_until_a_response_reports_some() -> None:
    first, second = _engine(), _engine()
    assert first.usage is second.usage
    assert first.usage == Usage()
    _turn(first, "a", usage=Usage(input=3, output=2, total_tokens=5))
    assert first.usage == Usage(input=3, output=2, total_tokens=5)
    assert second.usage == Usage()


@pytest.mark.timeout(30)
def test_engines_that_take_the_same_transitions_share_their_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace_module, "_SHARED", {})  # not full of other tests' records
    first, second = _engine(), _engine()
    for engine in (first, second):
        _turn(engine, "a")
        _turn(engine, "b")
    assert first.trace == second.trace
    assert len(first.trace) == 11
    assert all(a is b for a, b in zip(first.trace, second.trace, strict=True))


class _WarningsOnly:
    """A logger that keeps warnings and worse, and says so; records its binds."""

    def __init__(self, binds: list[dict[str, object]], warned: list[str]) -> None:
        self.binds, self.warned = binds, warned

    def is_enabled_for(self, level: int) -> bool:
        return level >= logging.WARNING

    def bind(self, **values: object) -> _WarningsOnly:
        self.binds.append(values)
        return self

    def warning(self, event: str, **fields: object) -> None:
        self.warned.append(event)


@pytest.mark.timeout(30)
def test_an_engine_keeps_no_bound_logger_it_will_not_log_with_and_binds_one_to_warn() -> None:
    binds: list[dict[str, object]] = []
    warned: list[str] = []
    engine = Engine(
        tools=[ECHO], messages=[UserMessage("go")], run_id="r1", logger=_WarningsOnly(binds, warned)
    )
    engine.handle(Start())
    _turn(engine, "a")
    assert vars(engine).get("_log") is None  # only asked whether it logs, then let go
    engine.handle(ModelResponded(AssistantMessage((ToolCall("", "echo", {"text": "x"}),))))
    assert warned == ["tool_call_id_normalised"]
    assert binds == [{"run_id": "r1"}, {"run_id": "r1"}]  # asked at construction, then to warn
    assert engine.pending_calls()[0].id == "call_t2_0"


# Where the walk stops: code and the modules it leads to are the program's, not a run's;
# through a function's globals the walk would reach the whole heap (whatever other
# tests left there, and this test's own frame holding both engines).
_CODE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.FrameType)


def _own_tracked(engine: Engine, other: Engine) -> Counter[str]:
    """The objects the collector tracks that ``engine`` holds and ``other`` does not
    (what every run holds of its own), by type."""

    def reachable(start: object) -> dict[int, object]:
        found: dict[int, object] = {}
        todo = [start]
        while todo:
            obj = todo.pop()
            if id(obj) in found or not gc.is_tracked(obj) or isinstance(obj, _CODE):
                continue
            found[id(obj)] = obj
            todo.extend(gc.get_referents(obj))
        return found

    gc.collect()  # the collector untracks the tuples and dicts that hold nothing it tracks
    shared = reachable(other)
    return Counter(type(o).__name__ for k, o in reachable(engine).items() if k not in shared)


@pytest.mark.timeout(30)
def test_an_engine_waiting_for_its_model_holds_only_its_record_history_and_log() -> None:
    first, second = _engine(), _engine()
    _turn(first, "a")
    _turn(second, "a")
    assert first.state is S.AWAITING_MODEL
    held = _own_tracked(first, second)
    messages = Counter(
        {"UserMessage": 1, "AssistantMessage": 1, "ToolCall": 1, "mappingproxy": 1}
        | {"ToolResultMessage": 1, "TextContent": 2, "tuple": 3}
    )
    # the engine, its record, the batch (empty), the trace and its list, the history,
    # the tool-call ids seen
    engine = Counter({"Engine": 1, "EngineState": 1, "Batch": 1, "Trace": 1, "list": 2, "set": 1})
    assert held == engine + messages


@pytest.mark.timeout(30)
def test_engines_offering_the_same_definitions_share_their_tuple_and_index() -> None:
    first, second = _engine(), _engine()
    assert first.tools is second.tools
    assert first._run.tools_by_name is second._run.tools_by_name
    same_name = ToolDefinition("echo", "Another echo.")
    other = Engine(tools=[same_name], messages=[UserMessage("go")])
    assert other.tools == (same_name,)
    assert other._run.tools_by_name == {"echo": same_name}
    assert first._run.tools_by_name == {"echo": ECHO}
    output = OutputSpec.of({"type": "object", "properties": {"n": {"type": "integer"}}})
    with_output = Engine(tools=[ECHO], messages=[UserMessage("go")], output=output)
    assert with_output.tools is first.tools
    assert set(with_output._run.tools_by_name) == {"echo", *(d.name for d in output.offered(()))}
    assert set(first._run.tools_by_name) == {"echo"}


@pytest.mark.timeout(30)
def test_the_shared_tool_sets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "_TOOLSETS", {})
    monkeypatch.setattr(state_module, "_TOOLSETS_MAX", 2)
    engines = [
        Engine(tools=[ToolDefinition(f"t{i}", "A tool.")], messages=[UserMessage("go")])
        for i in range(5)
    ]
    assert len(state_module._TOOLSETS) <= 2
    assert [e.tools[0].name for e in engines] == ["t0", "t1", "t2", "t3", "t4"]
