"""What an engine makes and keeps as a run goes on: one batch refilled each turn
(never a new one), the zero usage shared until a response reports some, and a fork
whose batch stays its own when the engine it came from refills its batch, and
transition records shared by the engines that take the same transitions."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from engine_support import ECHO

from statemachine.core import batch as batch_module
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
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolOutput

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
