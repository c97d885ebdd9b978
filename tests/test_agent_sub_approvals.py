"""A sub-agent that stops for approval (``Agent.as_tool(approve=...)``): each call the
child waits on is put to the hook, named as the child's, and the child is resumed
inside the parent's call; without a hook, or when the hook asks for a person, the
parent's call ends with an error result naming the waiting calls."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.testing import ScriptedModel

pytestmark = pytest.mark.timeout(30)


@attrs.frozen
class Library:
    books: tuple[str, ...]


@sm.tool
def count_books(ctx: sm.RunContext[Library]) -> int:
    """How many books the library has."""
    return len(ctx.deps.books)


def _child(*script: Any) -> sm.Agent[Any]:
    return sm.Agent(
        ScriptedModel(*script),
        name="librarian",
        tools=[count_books],
        before_tool_call=lambda call: sm.RequireApproval("a person checks every count"),
    )


def _parent(child: sm.Agent[Any], approve: Any, *, parent_says: str = "Done.") -> sm.RunResult[Any]:
    parent = sm.Agent(
        ScriptedModel(sm.ToolCall("p1", "librarian", {"prompt": "count"}), parent_says),
        tools=[child.as_tool(approve=approve)],
    )
    return parent.run_sync("How many?", deps=Library(("a", "b")))


def _answer(result: sm.RunResult[Any]) -> sm.ToolResultMessage:
    [answer] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    return answer


def test_an_approving_hook_resumes_the_child_inside_the_parents_call() -> None:
    seen: list[sm.ToolCall] = []

    def policy(call: sm.ToolCall) -> None:
        seen.append(call)

    child = _child(sm.ToolCall("c1", "count_books", {}), "The library has 2 books.")
    result = _parent(child, policy)
    assert result.state is sm.TurnState.DONE
    answer = _answer(result)
    assert (answer.text, answer.is_error) == ("The library has 2 books.", False)
    assert [(c.id, c.name) for c in seen] == [("c1", "librarian.count_books")]
    assert result.stats is not None
    assert result.stats.model_calls == 4  # the parent's 2 and the child's 2, across its resume
    assert result.stats.tool_calls["count_books"] == {"ok": 1}


def test_a_denying_hook_denies_the_childs_call_and_the_child_goes_on() -> None:
    child_model = ScriptedModel(sm.ToolCall("c1", "count_books", {}), "I may not count.")
    child = sm.Agent(
        child_model,
        name="librarian",
        tools=[count_books],
        before_tool_call=lambda call: sm.RequireApproval("check"),
    )
    result = _parent(child, lambda call: sm.Deny("not today", advisory=True))
    assert _answer(result).text == "I may not count."
    denied = child_model.requests[1].messages[-1]
    assert isinstance(denied, sm.ToolResultMessage)
    assert denied.is_error
    assert "not today" in denied.text


def test_a_child_that_stops_twice_is_decided_twice() -> None:
    seen: list[str] = []
    child = _child(
        sm.ToolCall("c1", "count_books", {}),
        sm.ToolCall("c2", "count_books", {}),
        "Counted twice: 2.",
    )
    result = _parent(child, lambda call: seen.append(call.id))
    assert _answer(result).text == "Counted twice: 2."
    assert seen == ["c1", "c2"]


def test_a_hook_that_asks_for_a_person_ends_the_call_naming_the_waiting_calls() -> None:
    child = _child(sm.ToolCall("c1", "count_books", {}), "never")
    result = _parent(child, lambda call: sm.RequireApproval("a person, please"))
    answer = _answer(result)
    assert answer.is_error
    assert "approval for count_books (c1)" in answer.text
    assert "give as_tool an approve hook" in answer.text


def test_an_async_hook_taking_the_parents_context_decides_too() -> None:
    async def policy(ctx: sm.RunContext[Library], call: sm.ToolCall) -> None:
        assert ctx.deps == Library(("a", "b"))
        assert ctx.tool_call is not None
        assert ctx.tool_call.name == "librarian"  # the parent's call of the sub-agent

    child = _child(sm.ToolCall("c1", "count_books", {}), "2 books.")
    assert _answer(_parent(child, policy)).text == "2 books."


def test_a_hook_that_answers_something_else_fails_the_parents_call() -> None:
    child = _child(sm.ToolCall("c1", "count_books", {}), "never")
    answer = _answer(_parent(child, lambda call: "yes"))
    assert answer.is_error
    assert "as_tool's approve returned str" in answer.text
