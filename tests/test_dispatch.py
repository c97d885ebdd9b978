"""The compiled dispatch (statemachine.core.dispatch): the table's rows compiled to
Python, obeyed as the table says, and compiled again whenever the engine's tables are
replaced or written; guards and entry effects called by name, so a subclass or a
patched class is obeyed without a rebuild."""

from __future__ import annotations

from typing import Any

import pytest

import statemachine as sm
import statemachine.core.engine as engine_module
from statemachine.core import dispatch
from statemachine.core.dispatch import TableData
from statemachine.core.engine import Engine
from statemachine.core.errors import ProtocolError
from statemachine.core.events import ModelResponded, Start, ToolFinished
from statemachine.core.table import Trigger, TurnState

S = TurnState
T = Trigger
KEY = (S.AwaitingModel, T.model_responded)
ECHO = sm.ToolDefinition("echo", "Echo.", {"type": "object"})


class _Quiet:
    def bind(self, **_: Any) -> _Quiet:
        return self

    def debug(self, *_: Any, **__: Any) -> None: ...

    def info(self, *_: Any, **__: Any) -> None: ...

    def warning(self, *_: Any, **__: Any) -> None: ...


def _engine(cls: type[Engine] = Engine) -> Engine:
    e = cls(tools=[ECHO], messages=[sm.UserMessage("go")], logger=_Quiet())
    e.handle(Start())
    return e


def _call(call_id: str = "c1") -> ModelResponded:
    return ModelResponded(sm.AssistantMessage((sm.ToolCall(call_id, "echo", {}),)))


@pytest.fixture(autouse=True)
def _no_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    # These tests break the table on purpose; the reference machine would object.
    monkeypatch.setattr(Engine, "transition_hook", None)


def test_the_engines_tables_forget_their_compiled_dispatch_on_every_write() -> None:
    # Each write is done to a plain dict as well: it must also take effect.
    table, plain = TableData({1: 2}), {1: 2}
    writes: list[tuple[str, tuple[object, ...]]] = [
        ("__setitem__", (3, 4)),
        ("__delitem__", (3,)),
        ("update", ({5: 6},)),
        ("setdefault", (7, 8)),
        ("pop", (7,)),
        ("popitem", ()),
        ("__ior__", ({9: 10},)),
        ("clear", ()),
    ]
    for name, args in writes:
        engine_module._dispatch()
        assert dispatch.latest is not None
        getattr(table, name)(*args)
        getattr(plain, name)(*args)
        assert dispatch.latest is None, name
        assert table == plain, name
    engine_module._dispatch()


def test_a_row_edited_in_place_is_obeyed_and_its_restoration_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as patch:
        patch.setitem(engine_module._ROWS, KEY, ((None, S.Done),))  # calls never run
        e = _engine()
        e.handle(_call())
        assert e.state is S.Done
    e = _engine()
    e.handle(_call())
    assert e.state is S.CollectingResults


def test_replaced_tables_are_obeyed(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = dict(engine_module._ROWS)
    rows[KEY] = ((None, S.Done),)
    monkeypatch.setattr(engine_module, "_ROWS", rows)  # a plain dict, by identity
    e = _engine()
    e.handle(_call())
    assert e.state is S.Done
    internal = dict(engine_module._INTERNAL_FROM)
    internal[S.DispatchingTools] = ()  # dispatched never fires
    monkeypatch.setattr(engine_module, "_ROWS", engine_module._ROWS.__class__(rows))
    monkeypatch.setattr(engine_module, "_INTERNAL_FROM", internal)
    monkeypatch.setitem(engine_module._ROWS, KEY, ((None, S.DispatchingTools),))
    e = _engine()
    e.handle(_call())
    assert e.state is S.DispatchingTools


def test_a_patched_guard_and_a_subclass_guard_are_obeyed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NeverCalls(Engine):
        def _guard_has_tool_calls(self) -> bool:
            return False

    e = _engine(NeverCalls)
    e.handle(_call())
    assert e.state is S.Done  # the subclass's guard decided
    e = _engine()
    e.handle(_call())
    assert e.state is S.CollectingResults  # and only for the subclass
    monkeypatch.setattr(Engine, "_guard_has_tool_calls", lambda self: False)
    e = _engine()
    e.handle(_call())
    assert e.state is S.Done


def test_a_guard_named_by_no_identifier_is_still_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engine_module._ROWS, KEY, (("not a name", S.Done), (None, S.Failed)))
    monkeypatch.setattr(Engine, "not a name", lambda self: True, raising=False)
    e = _engine()
    e.handle(_call())
    assert e.state is S.Done


def test_no_row_that_applies_is_refused_after_the_hook_hears_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    heard: list[Any] = []
    monkeypatch.setattr(Engine, "transition_hook", lambda *args: heard.append(args[1:]))
    monkeypatch.setitem(engine_module._ROWS, KEY, (("_guard_reports_error", S.Failed),))
    e = _engine()
    with pytest.raises(ProtocolError, match="no row of the table applies"):
        e.handle(_call())
    assert heard[-1] == (S.AwaitingModel, T.model_responded, None)
    assert e.state is S.AwaitingModel


def test_the_hook_sees_every_transition_the_trace_records(monkeypatch: pytest.MonkeyPatch) -> None:
    heard: list[Any] = []
    monkeypatch.setattr(Engine, "transition_hook", lambda *args: heard.append(args[1:]))
    e = _engine()
    e.handle(_call())
    e.handle(ToolFinished("c1", sm.ToolOutput("ok")))
    assert heard == [(r.source, r.trigger, r.dest) for r in e.trace]
    assert len(heard) == 6


def test_the_compiled_source_is_kept_for_reading() -> None:
    source = engine_module._dispatch().source
    assert "def step_AwaitingModel_model_responded(self):" in source
    assert "self._guard_has_tool_calls()" in source


def test_internal_triggers_replaced_alone_are_obeyed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The rows stay the same dict and the dispatch compiled from them is current; only
    # the internal triggers are replaced (by identity, not written): compiled again.
    e = _engine()
    e.handle(_call())
    assert e.state is S.CollectingResults  # dispatched fired
    internal = dict(engine_module._INTERNAL_FROM)
    internal[S.DispatchingTools] = ()  # dispatched never fires
    monkeypatch.setattr(engine_module, "_INTERNAL_FROM", internal)
    e = _engine()
    e.handle(_call())
    assert e.state is S.DispatchingTools


def test_rows_replaced_while_the_dispatch_is_current_are_obeyed_on_the_next_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The dispatch compiled from the old rows is current; the very next event, in a
    # fresh engine, must already take the replaced rows' transition.
    _engine()
    rows = dict(engine_module._ROWS)
    rows[(S.Ready, T.start)] = ((None, S.Done),)
    monkeypatch.setattr(engine_module, "_ROWS", rows)
    e = Engine(tools=[ECHO], messages=[sm.UserMessage("go")], logger=_Quiet())
    e.handle(Start())
    assert e.state is S.Done
