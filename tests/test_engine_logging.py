"""The engine's logging: the transition log goes to every logger that keeps debug
events (or cannot say), never to one that says it drops them, and so does the end
of a run at info; a replaced call id is logged with why. The library never configures
logging (see ``test_engine.py``)."""

from __future__ import annotations

import logging

import pytest
from engine_support import ECHO
from structlog.testing import capture_logs

from statemachine.core.engine import Engine
from statemachine.core.events import (
    ModelResponded,
    Start,
)
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    UserMessage,
)
from statemachine.core.table import TurnState

S = TurnState


class _UnaskableLogger:
    """A logger whose level cannot be asked: it must be given every event."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def bind(self, **_: object) -> _UnaskableLogger:
        return self

    def is_enabled_for(self, level: int) -> bool:
        raise RuntimeError("no level here")

    def debug(self, event: str, **_: object) -> None:
        self.events.append(event)

    info = warning = debug


@pytest.mark.timeout(30)
def test_a_logger_that_cannot_be_asked_its_level_gets_the_transitions() -> None:
    logger = _UnaskableLogger()
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], logger=logger)
    engine.handle(Start())
    assert "transition" in logger.events


class _PlainLogger:
    """A logger that cannot be asked its level at all: it gets every event."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def bind(self, **_: object) -> _PlainLogger:
        return self

    def debug(self, event: str, **_: object) -> None:
        self.events.append(event)

    info = warning = debug


@pytest.mark.timeout(30)
def test_a_logger_without_a_level_check_gets_the_transitions() -> None:
    logger = _PlainLogger()
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], logger=logger)
    engine.handle(Start())
    assert "transition" in logger.events


class _DroppingLogger:
    """A logger that says once and for all that it drops debug; it records what it gets."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def bind(self, **_: object) -> _DroppingLogger:
        return self

    def debug(self, event: str, **_: object) -> None:
        self.events.append(event)

    info = warning = debug


class _StructlogStyle(_DroppingLogger):
    def is_enabled_for(self, level: int) -> bool:
        return level > logging.DEBUG


class _StdlibStyle(_DroppingLogger):
    def isEnabledFor(self, level: int) -> bool:  # the stdlib spelling
        return level > logging.DEBUG


@pytest.mark.timeout(30)
@pytest.mark.parametrize("logger_class", [_StructlogStyle, _StdlibStyle])
def test_a_logger_that_drops_debug_is_not_given_the_transitions(
    logger_class: type[_DroppingLogger],
) -> None:
    logger = logger_class()
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], logger=logger)
    engine.handle(Start())
    assert engine.trace
    assert "transition" not in logger.events


@pytest.mark.timeout(30)
def test_a_replaced_call_id_is_logged_with_why_it_was_replaced() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    calls = [ToolCall("", "echo", {"text": "a"}), ToolCall("c1", "echo", {"text": "b"})]
    calls.append(ToolCall("c1", "echo", {"text": "c"}))
    with capture_logs() as logs:
        engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    replaced = [e for e in logs if e["event"] == "tool_call_id_normalised"]
    assert [(e["original"], e["reason"]) for e in replaced] == [("", "empty"), ("c1", "repeated")]


class _WarningsOnly(_DroppingLogger):
    def is_enabled_for(self, level: int) -> bool:
        return level >= logging.WARNING


def _finished(logger: object) -> Engine:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], logger=logger)
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("done")))
    assert engine.state is S.DONE
    return engine


@pytest.mark.timeout(30)
def test_the_end_of_a_run_is_logged_only_to_a_logger_that_keeps_info() -> None:
    quiet, listening, unaskable = _WarningsOnly(), _StructlogStyle(), _UnaskableLogger()
    _finished(quiet)
    _finished(listening)
    _finished(unaskable)
    assert "run_ended" not in quiet.events
    assert listening.events.count("run_ended") == 1
    assert unaskable.events.count("run_ended") == 1
