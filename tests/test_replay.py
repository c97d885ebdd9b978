"""Replay's own machinery (``statemachine/journal/_replay.py``): the garbage collector
paused while the lines are replayed, and left as it was found."""

from __future__ import annotations

import gc
import io
import logging
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import structlog

from statemachine.core.engine import Engine
from statemachine.core.events import Event, ModelResponded, Start, ToolFinished
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolOutput
from statemachine.journal import Journal, JournalError, JournalingEngine, replay
from statemachine.journal._replay import collector_paused
from statemachine.testing.checker import FIRST_MESSAGE, TOOL


def _quiet() -> Any:
    return structlog.wrap_logger(
        None, wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL)
    )


_CALL = ToolCall("a", "echo", {"text": "1"})
_EVENTS: tuple[Event, ...] = (
    Start(),
    ModelResponded(AssistantMessage((_CALL,), stop_reason=StopReason.TOOL_USE)),
    ToolFinished("a", ToolOutput("1")),
    ModelResponded(AssistantMessage("done")),
)


def _lines() -> list[str]:
    stream = io.StringIO()
    engine = JournalingEngine(
        journal=Journal(stream), tools=[TOOL], messages=[FIRST_MESSAGE], logger=_quiet()
    )
    for event in _EVENTS:
        engine.handle(event)
    return stream.getvalue().splitlines(keepends=True)


class _Watching(Engine):
    """Notes whether the collector ran while each event was handled."""

    seen: ClassVar[list[bool]] = []

    def handle(self, event: Event) -> Any:
        _Watching.seen.append(gc.isenabled())
        return super().handle(event)


@pytest.fixture
def collector() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    _Watching.seen = []
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.usefixtures("collector")
def test_the_collector_is_paused_during_replay_and_running_after() -> None:
    result = replay(_lines(), engine_class=_Watching, logger=_quiet())
    assert result.ok
    assert result.state is TurnState.Done
    assert _Watching.seen == [False] * len(_EVENTS)
    assert gc.isenabled()


@pytest.mark.usefixtures("collector")
def test_the_collector_runs_again_when_replay_fails() -> None:
    lines = _lines()
    lines[3] = lines[3].replace('"after":"AwaitingModel"', '"after":"Done"')
    with pytest.raises(JournalError, match="replay diverged"):
        replay(lines, engine_class=_Watching, logger=_quiet())
    assert gc.isenabled()
    partial = replay(lines, strict=False, engine_class=_Watching, logger=_quiet())
    assert partial.error is not None
    assert gc.isenabled()


@pytest.mark.usefixtures("collector")
def test_the_collector_runs_again_when_the_source_raises() -> None:
    def source() -> Iterator[str]:
        yield from _lines()[:2]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay(source(), logger=_quiet())
    assert gc.isenabled()


@pytest.mark.usefixtures("collector")
def test_a_collector_paused_by_the_caller_stays_paused() -> None:
    gc.disable()
    assert replay(_lines(), engine_class=_Watching, logger=_quiet()).ok
    assert not gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
