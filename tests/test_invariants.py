"""history_violations: the I1/I2 checker over transcripts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm
from statemachine.core.invariants import Violation, history_violations


def user(text: str = "go") -> sm.UserMessage:
    return sm.UserMessage(text)


def asks(*ids: str, name: str = "t") -> sm.AssistantMessage:
    return sm.AssistantMessage(tuple(sm.ToolCall(i, name, {}) for i in ids))


def answer(call_id: str, name: str = "t") -> sm.ToolResultMessage:
    return sm.ToolResultMessage(call_id, name, "ok")


def test_a_valid_history_has_no_violation() -> None:
    history: list[sm.Message] = [
        user(),
        asks("a", "b"),
        answer("a"),
        answer("b"),
        user("more"),
        asks("c"),
        answer("c"),
        sm.AssistantMessage("done"),
    ]
    assert history_violations(history) == []


def test_an_empty_history_has_no_violation() -> None:
    assert history_violations([]) == []


def test_a_missing_result_is_reported_at_its_assistant_message() -> None:
    violations = history_violations([user(), asks("a", "b"), answer("a")])
    assert violations == [Violation("I1", 1, "tool call 'b' (t) has no result")]


def test_an_open_tail_is_allowed_only_when_asked_and_only_at_the_end() -> None:
    open_tail: list[sm.Message] = [user(), asks("a", "b"), answer("a")]
    assert history_violations(open_tail, allow_open_tail=True) == []
    earlier_open: list[sm.Message] = [user(), asks("a"), asks("b")]
    violations = history_violations(earlier_open, allow_open_tail=True)
    assert [(v.invariant, v.index) for v in violations] == [("I1", 1)]
    assert "before the next assistant message (message 2)" in violations[0].message


def test_a_result_without_a_call() -> None:
    violations = history_violations([user(), answer("ghost")])
    assert violations == [Violation("I1", 1, "result for tool call 'ghost' has no matching call")]


def test_a_second_result_for_one_call() -> None:
    violations = history_violations([user(), asks("a"), answer("a"), answer("a")])
    assert violations == [Violation("I1", 3, "a second result for tool call 'a'")]


def test_a_result_after_the_next_assistant_message() -> None:
    history: list[sm.Message] = [user(), asks("a"), sm.AssistantMessage("hm"), answer("a")]
    violations = history_violations(history)
    assert [(v.invariant, v.index) for v in violations] == [("I1", 1), ("I1", 3)]
    assert "comes after the next assistant message" in violations[1].message


def test_results_out_of_call_order_break_i2() -> None:
    violations = history_violations([user(), asks("a", "b"), answer("b"), answer("a")])
    assert [(v.invariant, v.index) for v in violations] == [("I2", 2)]
    assert "earlier call(s) 'a'" in violations[0].message


def test_a_result_naming_another_tool() -> None:
    violations = history_violations([user(), asks("a", name="read"), answer("a", "write")])
    assert violations == [
        Violation(
            "I1",
            2,
            "result for tool call 'a' names tool 'write', but the call was to 'read'",
        )
    ]


def test_empty_and_repeated_ids() -> None:
    history: list[sm.Message] = [
        user(),
        asks(""),
        answer(""),
        asks("x"),
        answer("x"),
        asks("x"),
        answer("x"),
    ]
    violations = history_violations(history)
    assert (violations[0].invariant, violations[0].index) == ("I1", 1)
    assert "empty id" in violations[0].message
    assert any(
        v.index == 5 and "repeats the id of a call in message 3" in v.message for v in violations
    )


def test_a_non_message_is_reported() -> None:
    history: list[object] = [user(), {"role": "user"}]
    violations = history_violations(history)  # type: ignore[arg-type]
    assert violations == [Violation("I8", 1, "not a message: dict")]


def test_violation_text_names_invariant_and_index() -> None:
    assert str(Violation("I2", 4, "out of order")) == "I2 at message 4: out of order"


# -- properties: well-formed histories pass, each kind of damage is caught --------------

batches = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=5)
with_results = batches.filter(any)
with_a_pair = batches.filter(lambda sizes: max(sizes) >= 2)


def _build(sizes: list[int]) -> list[sm.Message]:
    history: list[sm.Message] = [user()]
    n = 0
    for size in sizes:
        ids = [f"c{n + i}" for i in range(size)]
        n += size
        history.append(asks(*ids))
        history.extend(answer(i) for i in ids)
        if size == 0:
            history.append(user("next"))
    return history


@given(batches)
def test_histories_built_by_the_rules_pass(sizes: list[int]) -> None:
    assert history_violations(_build(sizes)) == []


@given(with_results, st.data())
def test_dropping_any_result_is_caught(sizes: list[int], data: st.DataObject) -> None:
    history = _build(sizes)
    results = [i for i, m in enumerate(history) if isinstance(m, sm.ToolResultMessage)]
    index = data.draw(st.sampled_from(results))
    dropped = history[:index] + history[index + 1 :]
    assert any(v.invariant == "I1" for v in history_violations(dropped))


@given(with_a_pair, st.data())
def test_swapping_two_results_of_a_batch_is_caught(sizes: list[int], data: st.DataObject) -> None:
    history = _build(sizes)
    pairs = [
        i
        for i in range(len(history) - 1)
        if isinstance(history[i], sm.ToolResultMessage)
        and isinstance(history[i + 1], sm.ToolResultMessage)
    ]
    i = data.draw(st.sampled_from(pairs))
    swapped = [*history[:i], history[i + 1], history[i], *history[i + 2 :]]
    assert [v.invariant for v in history_violations(swapped)] == ["I2"]


@given(with_results, st.data())
def test_duplicating_a_result_is_caught(sizes: list[int], data: st.DataObject) -> None:
    history = _build(sizes)
    results = [i for i, m in enumerate(history) if isinstance(m, sm.ToolResultMessage)]
    i = data.draw(st.sampled_from(results))
    duplicated = [*history[: i + 1], history[i], *history[i + 1 :]]
    violations = history_violations(duplicated)
    assert any("a second result" in v.message for v in violations)
