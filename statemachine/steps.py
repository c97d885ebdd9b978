"""Your own steps in the loop, as rows of the one transition table.

A ``Step`` runs at a named point of the loop (``"before_model"``: before each model
call; ``"after_final"``: after the model's final answer, before the run ends) and
answers with one of its named outcomes, each mapped to a destination: ``GoOn()``,
``Retry(budget=2)`` (back to the model with a message) or ``End(state,
explanation)`` (the run ends in a state of your naming). Give steps to ``run_agent``
or ``Agent`` (``steps=[...]``); their rows are generated into the run's table, which
the engine interprets, ``python -m statemachine check --agent module:attr`` explores
outcome by outcome, and ``diagram --agent`` and the docs extension ``statemachine.docs``
draw. A declaration that could leave a
tool call unanswered or put a message out of order is refused before anything runs
(``StepDeclarationError``). ``output_guardrail`` and ``input_guardrail`` are the
library's own steps, built the same way, and so is ``compaction``: past a token or
message budget, the model is sent a summary of the older history instead of all of it
(the history and the journal keep every message; ``views_sent`` reads back from a
journal what each model call was sent). ``Handoffs`` makes one agent of several that hand
the run to one another with a transfer tool, bounded by a ``handoff_limit`` step.

The rules (which points, which destinations, why) are written in
``statemachine.core.steps``; the guide is ``docs/guides/steps.md``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from statemachine._render import Chart, chart_from_table, render
from statemachine.agent.compaction import (
    DEFAULT_COMPACTION_TIMEOUT,
    DEFAULT_KEEP_LAST,
    DEFAULT_MAX_MESSAGES,
    DEFAULT_MAX_SUMMARY_CHARS,
    DEFAULT_MAX_TOKENS,
    CompactionView,
    ViewReader,
    compaction,
)
from statemachine.agent.handoff import DEFAULT_MAX_HANDOFFS, Handoffs, speaking_agent
from statemachine.agent.steps import (
    DEFAULT_STEP_TIMEOUT,
    Decision,
    Step,
    StepFunction,
    check_steps,
    input_guardrail,
    output_guardrail,
)
from statemachine.core.messages import Message
from statemachine.core.steps import (
    DEFAULT_RETRY_BUDGET,
    MAX_STEP_MESSAGE_CHARS,
    End,
    GoOn,
    Point,
    Retry,
    StepSpec,
    table_for,
)
from statemachine.core.table import (
    BASE_TABLE,
    STATE_DOCS,
    DeclaredState,
    OutcomeIs,
    Table,
    Transition,
    TurnState,
)
from statemachine.errors import InvalidInputError, StepDeclarationError
from statemachine.journal import replay

__all__ = [
    "BASE_TABLE",
    "DEFAULT_COMPACTION_TIMEOUT",
    "DEFAULT_KEEP_LAST",
    "DEFAULT_MAX_HANDOFFS",
    "DEFAULT_MAX_MESSAGES",
    "DEFAULT_MAX_SUMMARY_CHARS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_RETRY_BUDGET",
    "DEFAULT_STEP_TIMEOUT",
    "MAX_STEP_MESSAGE_CHARS",
    "CompactionView",
    "Decision",
    "DeclaredState",
    "End",
    "GoOn",
    "Handoffs",
    "OutcomeIs",
    "Point",
    "Retry",
    "Step",
    "StepDeclarationError",
    "StepFunction",
    "StepSpec",
    "Table",
    "Transition",
    "chart",
    "compaction",
    "diagram",
    "input_guardrail",
    "output_guardrail",
    "speaking_agent",
    "table_for",
    "table_of",
    "views_sent",
]


def table_of(target: Any) -> Table:
    """The transition table of ``target``: an ``Agent`` (its ``table``), a sequence of
    ``Step`` (checked), or a ``Table`` itself."""
    if isinstance(target, Table):
        return target
    table = getattr(target, "table", None)
    if isinstance(table, Table):
        return table
    if isinstance(target, Sequence) and not isinstance(target, (str, bytes)):
        return check_steps(target)
    raise InvalidInputError(
        f"expected an Agent, a sequence of Step or a Table, not {type(target).__name__}"
    )


def chart(target: Any) -> Chart:
    """The chart of ``target``'s table (``table_of``): the library's states and the
    declared ones alike, each declared end with a double border."""
    table = table_of(target)
    docs = {str(k): v for k, v in STATE_DOCS.items()} | {s.value: s.doc for s in table.declared}
    return chart_from_table(
        table.rows,
        terminal=[s.value for s in table.terminal],
        waiting=[TurnState.AWAITING_USER.value],
        docs=docs,
    )


def diagram(target: Any, fmt: str = "mermaid") -> str | bytes:
    """``target``'s table drawn in ``fmt`` (``mermaid``, ``dot``, ``svg``, ``png``), as
    ``python -m statemachine diagram --agent`` draws it."""
    return render(fmt, chart(target))


def views_sent(journal: str | os.PathLike[str] | Iterable[str]) -> list[list[Message]]:
    """What each model call of a journaled run was sent, read back from the journal
    alone: the history at the call, or its compacted view under the last ``compacted``
    decision of a ``compaction`` step (before a ``transform_context`` hook, whose
    rewriting the journal does not hold). ``JournalError``, naming the line, for a
    journal that does not replay or whose compaction would split a call from its
    result."""
    engine = replay(journal, engine_class=ViewReader).engine
    assert isinstance(engine, ViewReader)
    return engine.views
