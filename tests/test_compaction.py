"""Compaction as a before_model step: what the model is sent once the context passes its
budget, the pairs it never splits, its failures as a named outcome, and the journal
that shows each view sent and replays exactly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from statemachine import AbortController, ToolCall, TurnState, run_agent, run_agent_sync, tool
from statemachine.agent.compaction import (
    SUMMARY_PREFIX,
    CompactionView,
    compaction,
    reported_tokens,
    safe_cut,
    splits_pair,
)
from statemachine.core.events import StepDecided
from statemachine.core.invariants import history_violations
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from statemachine.errors import (
    CompactionError,
    InvalidInputError,
    JournalError,
    StepEndedError,
)
from statemachine.journal import Journal, JournalingEngine, replay
from statemachine.steps import diagram, views_sent
from statemachine.testing import FunctionModel, ScriptedModel


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def _calls(n: int) -> list[ToolCall | str]:
    """A model that looks up ``n`` orders, one per turn, then answers."""
    script: list[ToolCall | str] = [
        ToolCall(f"c{i}", "lookup", {"order": str(i)}) for i in range(n)
    ]
    return [*script, "All orders shipped."]


def _summarise(messages: Sequence[Message]) -> str:
    return f"{len(messages)} earlier messages about orders"


def _text(message: Message) -> str:
    return "".join(getattr(block, "text", "") for block in message.content)


def _is_part(part: list[Message], whole: list[Message]) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole)))


def _assistant(*call_ids: str) -> AssistantMessage:
    return AssistantMessage([ToolCall(i, "lookup", {"order": i}) for i in call_ids])


def _result(call_id: str) -> ToolResultMessage:
    return ToolResultMessage(call_id, "lookup", "shipped")


# -- a run compacted -----------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_long_run_is_compacted_and_the_model_sent_the_summary_and_the_recent_messages() -> None:
    model = ScriptedModel(*_calls(6))
    step = compaction(_summarise, max_messages=6, keep_last=2)
    result = run_agent_sync(model=model, messages="ship", tools=[lookup], steps=[step])

    assert result.state is TurnState.DONE
    # The history is whole: every message of every turn, append-only.
    assert len(result.messages) == 1 + 6 * 2 + 1
    assert history_violations(list(result.messages)) == []
    sent = [list(request.messages) for request in model.requests]
    assert all(len(view) <= 6 for view in sent)
    assert sent[0] == [UserMessage("ship")]  # within budget: the whole history
    compacted = [view for view in sent if view[0] != UserMessage("ship")]
    assert compacted, "the run never passed its budget"
    for view in compacted:
        first = view[0]
        assert isinstance(first, UserMessage)
        assert _text(first).startswith(SUMMARY_PREFIX)
        assert history_violations(list(view[1:])) == []
        # The rest of the view is a part of the history, as it was.
        assert _is_part(view[1:], list(result.messages))
    # A later summary summarises the earlier one with what it cut: never two summaries.
    assert all(sum(m.role == "user" for m in view) == 1 for view in compacted)
    assert [r.dest.value for r in result.trace].count("Compaction") == len(sent)


@pytest.mark.timeout(30)
def test_a_summarising_model_is_sent_the_messages_cut_away_and_the_prompt_without_tools() -> None:
    summariser = ScriptedModel("The user asked about orders 0 to 3; all shipped.")
    model = ScriptedModel(*_calls(5))
    step = compaction(summariser, max_messages=8, keep_last=2)
    result = run_agent_sync(model=model, messages="ship", tools=[lookup], steps=[step])

    assert result.state is TurnState.DONE
    assert summariser.calls == 1
    asked = summariser.requests[0]
    assert list(asked.tools) == []
    assert asked.messages[0] == UserMessage("ship")
    last = asked.messages[-1]
    assert isinstance(last, UserMessage)
    assert "at most 8000 characters" in _text(last)
    summary = UserMessage(SUMMARY_PREFIX + "The user asked about orders 0 to 3; all shipped.")
    assert summary in model.requests[-1].messages


@pytest.mark.timeout(30)
def test_the_token_budget_reads_the_usage_the_last_response_reported() -> None:
    history: list[Message] = [
        UserMessage("ship"),
        AssistantMessage("ok", usage=Usage(input=900, output=100)),
        UserMessage("x" * 400),
    ]
    assert reported_tokens(history) == 1000 + 100
    assert reported_tokens([UserMessage("y" * 40)]) == 10  # no usage yet: four chars a token

    model = ScriptedModel(
        AssistantMessage(
            [ToolCall("c1", "lookup", {"order": "1"})], "toolUse", usage=Usage(input=5_000)
        ),
        AssistantMessage(
            [ToolCall("c2", "lookup", {"order": "2"})], "toolUse", usage=Usage(input=10)
        ),
        AssistantMessage("done", usage=Usage(input=10)),
    )
    counted: list[int] = []

    def count(messages: Sequence[Message]) -> int:
        counted.append(reported_tokens(messages))
        return counted[-1]

    step = compaction(_summarise, max_tokens=1_000, keep_last=1, count_tokens=count)
    result = run_agent_sync(model=model, messages="ship", tools=[lookup], steps=[step])
    assert result.state is TurnState.DONE
    assert counted[0] < 1_000 < counted[1]  # the second call passed the budget: compacted
    assert _text(model.requests[1].messages[0]).startswith(SUMMARY_PREFIX)


# -- failures are a named outcome ----------------------------------------------------------


def _raises(messages: Sequence[Message]) -> str:
    raise RuntimeError("summariser down")


async def _hangs(messages: Sequence[Message]) -> str:
    await asyncio.sleep(60)
    return "never"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("summarize", "timeout", "said"),
    [
        (_raises, 30.0, "RuntimeError"),
        (_hangs, 0.2, "timeout"),
        (lambda messages: "s" * 9_000, 30.0, "at most 8000"),
        (lambda messages: "  ", 30.0, "no summary"),
        (ScriptedModel(AssistantMessage([], "error", "boom")), 30.0, "model call failed"),
    ],
    ids=["raises", "hangs", "too_long", "empty", "model_error"],
)
def test_a_compaction_that_fails_ends_the_run_in_its_named_state(
    summarize: Callable[..., object], timeout: float, said: str
) -> None:
    model = ScriptedModel(*_calls(4))
    step = compaction(summarize, max_messages=3, keep_last=1, timeout=timeout)
    result = run_agent_sync(model=model, messages="ship", tools=[lookup], steps=[step])

    assert result.state.value == "CompactionFailed"
    assert isinstance(result.error, StepEndedError)
    assert said in (result.explanation or "")
    assert history_violations(list(result.messages)) == []  # every call answered
    assert model.calls == 2  # no model call after the failure


@pytest.mark.timeout(10)
def test_compaction_refuses_bad_budgets_before_anything_runs() -> None:
    with pytest.raises(InvalidInputError, match="max_messages"):
        compaction(_summarise, max_messages=1)
    with pytest.raises(InvalidInputError, match="keep_last"):
        compaction(_summarise, max_messages=10)  # keeps 20: never short enough
    with pytest.raises(InvalidInputError, match="max_summary_chars"):
        compaction(_summarise, max_summary_chars=40_000)
    with pytest.raises(InvalidInputError, match="summarize"):
        compaction("not a summariser")  # type: ignore[arg-type]


@pytest.mark.timeout(10)
def test_a_compaction_step_is_drawn_with_its_outcomes_and_its_failed_state() -> None:
    drawn = str(diagram([compaction(_summarise)]))
    assert "Compaction" in drawn
    assert "CompactionFailed" in drawn
    for outcome in ("kept", "compacted", "reused", "failed"):
        assert f"outcome={outcome}" in drawn


# -- a call and its result are never split -------------------------------------------------


@pytest.mark.timeout(10)
def test_a_cut_inside_a_call_and_its_results_moves_back_before_the_call() -> None:
    history: list[Message] = [
        UserMessage("ship"),
        _assistant("a", "b"),
        _result("a"),
        _result("b"),
        AssistantMessage("done"),
        UserMessage("more"),
    ]
    assert splits_pair(history, 2)
    assert splits_pair(history, 3)
    assert safe_cut(history, 3) == 1  # between the results: back before the call
    assert safe_cut(history, 4) == 4  # after both results: as asked
    with pytest.raises(CompactionError, match="split a tool call from its result"):
        CompactionView(3, "s").apply(history)
    with pytest.raises(CompactionError, match="history has 6"):
        CompactionView(9, "s").apply(history)
    assert CompactionView(4, "s").apply(history)[1:] == history[4:]


@pytest.mark.timeout(10)
def test_a_cut_never_drops_a_call_whose_result_has_not_come() -> None:
    history: list[Message] = [UserMessage("ship"), _assistant("a")]  # a is pending
    assert safe_cut(history, 2) == 1
    with pytest.raises(CompactionError):
        CompactionView(2, "s").apply(history)


@pytest.mark.timeout(30)
def test_a_run_whose_budget_would_cut_between_a_call_and_its_results_keeps_the_pair() -> None:
    both = [ToolCall("a", "lookup", {"order": "1"}), ToolCall("b", "lookup", {"order": "2"})]
    model = ScriptedModel(both, ToolCall("c", "lookup", {"order": "3"}), "done")
    # keep_last=1 asks to cut just before the last result: the cut moves before the call.
    step = compaction(_summarise, max_messages=3, keep_last=1)
    result = run_agent_sync(model=model, messages="ship", tools=[lookup], steps=[step])
    assert result.state is TurnState.DONE
    second = list(model.requests[1].messages)
    assert _text(second[0]).startswith(SUMMARY_PREFIX)
    assert second[1:] == list(result.messages[1:4])  # the call and both its results
    for request in model.requests:
        assert history_violations(list(request.messages[1:])) == []


# -- any history, any budget: the view never splits a pair ---------------------------------


@st.composite
def _histories(draw: st.DrawFn) -> list[Message]:
    """Histories that keep I1 and I2, possibly ending with calls still pending."""
    history: list[Message] = [UserMessage("start")]
    n = 0
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["calls", "text", "user"]))
        if kind == "calls":
            ids = [f"c{n + i}" for i in range(draw(st.integers(1, 3)))]
            n += len(ids)
            history.append(_assistant(*ids))
            history.extend(_result(i) for i in ids)
        elif kind == "text":
            history.append(AssistantMessage("text"))
        else:
            history.append(UserMessage("more"))
    if draw(st.booleans()):
        history.append(_assistant(f"c{n}"))  # a pending call at the end
    return history


Cutter = Callable[[Sequence[Message], int], int]


def _view_splits(cutter: Cutter, history: list[Message], want: int) -> bool:
    """True if the view a compaction with ``cutter`` would send splits a call from its
    result, or drops a call whose result has not come (a pending one)."""
    cut = cutter(history, want)
    if cut == 0:
        return False
    dropped, kept = history[:cut], history[cut:]
    calls = {c.id for m in dropped if isinstance(m, AssistantMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in dropped if isinstance(m, ToolResultMessage)}
    view = [UserMessage(SUMMARY_PREFIX + "s"), *kept]
    return calls != answered or bool(history_violations(view, allow_open_tail=True))


def _naive_cut(history: Sequence[Message], want: int) -> int:
    """A broken compactor's cut: exactly where the budget asks."""
    return max(0, min(want, len(history)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=_histories(), want=st.integers(0, 40))
def test_the_compacted_view_never_splits_a_call_from_its_result(
    history: list[Message], want: int
) -> None:
    assert not _view_splits(safe_cut, history, want)
    cut = safe_cut(history, want)
    if cut:
        CompactionView(cut, "s").apply(history)  # accepted as it is


@pytest.mark.timeout(60)
def test_the_property_catches_a_compactor_that_cuts_where_the_budget_asks() -> None:
    found = find(
        st.tuples(_histories(), st.integers(0, 40)),
        lambda case: _view_splits(_naive_cut, *case),
        settings=settings(max_examples=500, deadline=None, database=None),
    )
    history, want = found
    assert _view_splits(_naive_cut, history, want)
    assert not _view_splits(safe_cut, history, want)


# -- journaled and replayed ----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_replay_of_a_compacted_run_is_exact_and_its_journal_shows_each_view_sent(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    model = ScriptedModel(*_calls(6))
    step = compaction(_summarise, max_messages=6, keep_last=2)
    with Journal(path) as journal:
        result = run_agent_sync(
            model=model,
            messages="ship",
            tools=[lookup],
            steps=[step],
            engine_factory=partial(JournalingEngine, journal=journal),
        )
    assert result.state is TurnState.DONE
    again = replay(path)
    assert again.ok
    assert again.state is TurnState.DONE
    assert tuple(again.messages) == result.messages  # every original message
    sent = [list(request.messages) for request in model.requests]
    assert views_sent(path) == sent
    outcomes = [s.event.outcome for s in again.steps if isinstance(s.event, StepDecided)]
    assert {"kept", "compacted", "reused"} <= set(outcomes)
    assert any(view[0] != UserMessage("ship") for view in sent)  # it did compact


@pytest.mark.timeout(30)
def test_a_journal_whose_compaction_splits_a_pair_is_refused_when_read_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    with Journal(path) as journal:
        run_agent_sync(
            model=ScriptedModel(*_calls(4)),
            messages="ship",
            tools=[lookup],
            steps=[compaction(_summarise, max_messages=4, keep_last=1)],
            engine_factory=partial(JournalingEngine, journal=journal),
        )
    text = path.read_text(encoding="utf-8")
    assert '"outcome":"compacted","message":"3\\n' in text
    # Cut at 2 instead: between the first call and its result.
    path.write_text(text.replace('"message":"3\\n', '"message":"2\\n', 1), encoding="utf-8")
    with pytest.raises(JournalError, match=r"line 10: .*split a tool call from its result"):
        views_sent(path)
    for bad in ("", "three\nsummary", "3\n", "summary only"):
        with pytest.raises(CompactionError, match="not '<cut>"):
            CompactionView.from_message(bad)


def _compacted_view(history: list[Message], max_messages: int, keep_last: int) -> list[Message]:
    """The view the compaction step itself decides on ``history`` (no earlier view),
    built from its decision without ``apply``'s check, so a bad cut shows in it."""
    step = compaction(_summarise, max_messages=max_messages, keep_last=keep_last)
    decide: Any = step.function  # the compactor: an async function of the history
    decision = asyncio.run(decide(history))
    if decision.outcome != "compacted":
        return history
    view = CompactionView.from_message(decision.message)
    return [UserMessage(SUMMARY_PREFIX + view.summary), *history[view.cut :]]


def _splits(history: list[Message], view: list[Message]) -> bool:
    kept = view[1:] if view is not history else view
    dropped = history[: len(history) - len(kept)]
    calls = {c.id for m in dropped if isinstance(m, AssistantMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in dropped if isinstance(m, ToolResultMessage)}
    return calls != answered or bool(history_violations(kept, allow_open_tail=True))


_budgets = st.integers(2, 12).flatmap(
    lambda most: st.tuples(st.just(most), st.integers(0, most - 1))
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=_histories(), budget=_budgets)
def test_the_compaction_steps_own_decision_never_splits_a_call_from_its_result(
    history: list[Message], budget: tuple[int, int]
) -> None:
    assert not _splits(history, _compacted_view(history, *budget))


@pytest.mark.timeout(60)
def test_that_property_catches_a_compaction_step_with_a_naive_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import statemachine.agent.compaction as module

    monkeypatch.setattr(module, "safe_cut", _naive_cut)
    history, budget = find(
        st.tuples(_histories(), _budgets),
        lambda case: _splits(case[0], _compacted_view(case[0], *case[1])),
        settings=settings(max_examples=500, deadline=None, database=None),
    )
    monkeypatch.undo()
    assert not _splits(history, _compacted_view(history, *budget))


@pytest.mark.timeout(30)
def test_abort_while_a_summarising_model_runs_ends_the_run_and_cancels_the_summary() -> None:
    asyncio.run(_abort_while_summarising())


async def _abort_while_summarising() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow(messages: Sequence[Message], tools: object) -> AssistantMessage:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return AssistantMessage("never")

    controller = AbortController()

    async def abort_when_started() -> None:
        await started.wait()
        controller.abort("the user left")

    aborter = asyncio.create_task(abort_when_started())
    model = ScriptedModel(*_calls(4))
    result = await run_agent(
        model=model,
        messages="ship",
        tools=[lookup],
        steps=[compaction(FunctionModel(slow), max_messages=3, keep_last=1)],
        signal=controller.signal,
    )
    await aborter
    assert result.state is TurnState.ABORTED
    assert "Compaction" in (result.explanation or "")
    assert history_violations(list(result.messages)) == []
    await asyncio.wait_for(cancelled.wait(), 5)
    assert model.calls == 2
