"""The transition table compiled to Python, once, for the engine's dispatch.

``Engine`` applies the table's own rule: in a state, on a trigger, the first row whose
guard holds is taken; after an input, internal triggers fire while their guards hold.
Applied by a generic loop, that rule costs more than the work it dispatches (a row
lookup, guards and entry effects found by name, one call per transition). So the
engine's digest of the table (``_ROWS`` and ``_INTERNAL_FROM`` in ``core/engine.py``,
themselves derived from ``core/table.py``) is written out here as Python source, as
attrs writes an ``__init__``, and compiled:

* one *step* per (state, input trigger): the rows in table order as ``if`` tests, each
  taking its transition (the transition hook, the state, the record, the debug log,
  the destination's entry effect);
* one *settle* per state: its internal triggers in order, each fired when its guard
  holds, then the settle of the state reached (so the chain of internal transitions
  after an input runs without a loop around it), counting the firings against the cap.

Guards and entry effects are called by method name (``self._guard_has_tool_calls()``):
a subclass's or a patched class's method is the one called, with nothing to rebuild.
Only the rows are compiled in, so the compiled dispatch is keyed by the identity of
the two dicts it was built from (a test may replace them) and forgotten when either
is written (``TableData``, the type of both, forgets it on every write). The
transition hook is read on every step: a hook sees every transition on this one path.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from statemachine.core.errors import ProtocolError
from statemachine.core.table import Trigger, TurnState
from statemachine.core.trace import TURN, transition_code

__all__ = ["Compiled", "TableData", "compile_table", "forget", "latest"]

Rows = tuple[tuple[str | None, TurnState], ...]
Step = Callable[[Any], None]
Settle = Callable[[Any, int], None]


class TableData(dict[Any, Any]):
    """A dict whose every write forgets the compiled dispatch (see the module docstring).

    Reads are the dict's own; only the writes are wrapped, and nothing writes the
    engine's tables except a test or a tool that means to change what the engine does.
    """

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        forget()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        forget()

    def __ior__(self, other: Any) -> TableData:  # type: ignore[misc]
        super().__ior__(other)
        forget()
        return self

    def clear(self) -> None:
        super().clear()
        forget()

    def pop(self, *args: Any) -> Any:
        forget()
        return super().pop(*args)

    def popitem(self) -> Any:
        forget()
        return super().popitem()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        forget()
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        forget()


class Compiled:
    """The dispatch compiled from one pair of tables (``rows``, ``internal``)."""

    __slots__ = ("internal", "rows", "settle", "source", "steps")

    def __init__(
        self,
        rows: Mapping[tuple[TurnState, Trigger], Rows],
        internal: Mapping[TurnState, tuple[tuple[Trigger, str], ...]],
        cap: int,
    ) -> None:
        self.rows = rows
        self.internal = internal
        self.source = _source(rows, internal)
        namespace = _namespace(cap)
        exec(compile(self.source, "<statemachine dispatch>", "exec"), namespace)
        self.steps: dict[tuple[TurnState, Trigger], Step] = {
            key: namespace[_step_name(*key)] for key in rows
        }
        self.settle: dict[TurnState, Settle] = namespace["SETTLE"]


latest: Compiled | None = None
"""The dispatch compiled last (``None`` once a table it was built from was written).
A variable, not a function: the engine reads it on every event."""


def forget() -> None:
    global latest
    latest = None


def compile_table(
    rows: Mapping[tuple[TurnState, Trigger], Rows],
    internal: Mapping[TurnState, tuple[tuple[Trigger, str], ...]],
    cap: int,
) -> Compiled:
    """The dispatch for these tables (``cap``: internal firings allowed per input),
    compiled now and kept until they change."""
    global latest
    latest = Compiled(rows, internal, cap)
    return latest


# -- writing the source ---------------------------------------------------------------


def _namespace(cap: int) -> dict[str, Any]:
    names: dict[str, Any] = {f"S_{s.name}": s for s in TurnState}
    names.update({f"T_{t.name}": t for t in Trigger})
    names.update(CAP=cap, TURN=TURN, no_row=_no_row, logged=_logged)
    return names


# What every transition does besides the row's own choice, called by the steps.


def _logged(engine: Any, source: TurnState, trigger: Trigger, dest: TurnState) -> None:
    engine._log.debug(
        "transition",
        turn=engine.turns,
        from_state=source.value,
        to_state=dest.value,
        trigger=trigger.value,
    )


def _no_row(engine: Any, hook: Any, source: TurnState, trigger: Trigger) -> NoReturn:
    if hook is not None:
        hook(engine, source, trigger, None)
    # Unreachable when the table is complete (the checker proves it); kept so that a
    # broken table fails loudly instead of silently stalling.
    raise ProtocolError(f"no row of the table applies to {trigger.value!r} in {source}")


def _step_name(state: TurnState, trigger: Trigger) -> str:
    return f"step_{state.name}_{trigger.name}"


def _call(method: str, argument: str = "") -> str:
    """``self.<method>(argument)``, through ``getattr`` for a name that is no identifier."""
    if method.isidentifier() and not keyword.iskeyword(method):
        return f"self.{method}({argument})"
    return f"getattr(self, {method!r})({argument})"


def _take(source: TurnState, trigger: Trigger, dest: TurnState, then: str) -> list[str]:
    """The lines that take one row's transition (as ``Engine`` always has)."""
    s, t, d = f"S_{source.name}", f"T_{trigger.name}", f"S_{dest.name}"
    lines = [
        "if hook is not None:",
        f"    hook(self, {s}, {t}, {d})",
        f"self._state = {d}",
        # the record, stored compactly (core/trace.py)
        f"self.trace._codes.append(self.turns * TURN + {transition_code(source, trigger, dest)})",
        "if self._debug:",
        f"    logged(self, {s}, {t}, {d})",
    ]
    if dest is not source:
        lines.append(_call(f"_enter_{dest.value}", s))
    lines.append(then)
    return lines


def _rows_body(
    source: TurnState, trigger: Trigger, rows: Rows, holds: str | None, then: str
) -> list[str]:
    """The table's rule for one (state, trigger): the first row whose guard holds."""
    lines: list[str] = []
    for guard, dest in rows:
        take = _take(source, trigger, dest, then)
        if guard is None or guard == holds:
            return lines + take  # rows after an unconditional one are never reached
        lines.append(f"if {_call(guard)}:")
        lines.extend("    " + line for line in take)
    lines.append(f"no_row(self, hook, S_{source.name}, T_{trigger.name})")
    return lines


def _indent(lines: Iterable[str], by: str = "    ") -> list[str]:
    return [by + line for line in lines]


def _source(
    rows: Mapping[tuple[TurnState, Trigger], Rows],
    internal: Mapping[TurnState, tuple[tuple[Trigger, str], ...]],
) -> str:
    out: list[str] = []
    for (state, trigger), group in rows.items():
        out.append(f"def {_step_name(state, trigger)}(self):")
        out.append("    hook = self.__class__.transition_hook")
        out.extend(_indent(_rows_body(state, trigger, group, None, "return")))
    settle: list[str] = []
    for state, firing in internal.items():
        name = f"settle_{state.name}"
        settle.append(f"S_{state.name}: {name}")
        out.append(f"def {name}(self, fired):")
        for trigger, guard in firing:
            then = "return SETTLE[self._state](self, fired + 1)"
            body = _rows_body(state, trigger, rows.get((state, trigger), ()), guard, then)
            out.append(f"    if {_call(guard)}:")
            out.append("        if fired == CAP:")
            out.append(f"            self._runaway(T_{trigger.name}, fired)")
            out.append("        hook = self.__class__.transition_hook")
            out.extend(_indent(body, "        "))
        out.append("    return None")
    out.append("SETTLE = {" + ", ".join(settle) + "}")
    return "\n".join(out) + "\n"
