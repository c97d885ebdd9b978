"""``Agent[Deps, Output]`` typed end to end: mypy (run on ``tests/`` with
``--strict``, so ``warn_unused_ignores``) checks the ``assert_type`` lines and that each
``# type: ignore[...]`` below marks an error it does report; pytest runs the same code,
so what mypy accepts also works."""

from __future__ import annotations

import dataclasses
from typing import Any, assert_type

import pytest

import statemachine as sm
from statemachine.testing import TestModel

pytestmark = pytest.mark.timeout(30)


@dataclasses.dataclass
class Shop:
    name: str


@dataclasses.dataclass
class Stock:
    title: str
    copies: int


def make_agent() -> sm.Agent[Shop, Stock]:
    agent = sm.Agent(TestModel(), deps_type=Shop, output_type=Stock)
    assert_type(agent, sm.Agent[Shop, Stock])

    @agent.tool
    def shop_name(ctx: sm.RunContext[Shop], shelf: int) -> str:
        """The shop's name."""
        assert_type(ctx.deps, Shop)
        return f"{ctx.deps.name}, shelf {shelf}"

    @agent.tool(retries=2)
    def restock(ctx: sm.RunContext[Shop], title: str) -> str:
        """Restock a title."""
        return title

    @agent.tool_plain
    def today() -> str:
        """Today's date."""
        return "2026-12-06"

    @agent.instructions_function
    def instructions(ctx: sm.RunContext[Shop]) -> str:
        return f"You work at {ctx.deps.name}."

    return agent


def test_a_typed_agents_runs_take_its_deps_and_give_its_output() -> None:
    agent = make_agent()
    result = agent.run_sync("stock?", deps=Shop("Chapter One"))
    assert_type(result, sm.RunResult[Stock])
    assert_type(result.output, Stock | None)
    assert result.output == Stock("a", 0)
    assert [t.name for t in agent.tools] == ["shop_name", "restock", "today"]
    assert agent.tools[1].retries == 2


def test_mypy_refuses_deps_of_another_type() -> None:
    agent = make_agent()
    with pytest.raises(sm.UsageError, match="deps"):
        agent.run_sync("stock?", deps=42)  # type: ignore[arg-type]


def test_mypy_refuses_a_tool_whose_context_is_of_another_deps_type() -> None:
    agent = make_agent()

    def wrong(ctx: sm.RunContext[int], shelf: int) -> str:
        """Reads an int."""
        return str(ctx.deps)

    agent.tool(wrong)  # type: ignore[arg-type]
    with pytest.raises(sm.UsageError, match="deps"):  # and at run time, before any call
        agent.run_sync("stock?", deps=Shop("x"))


def test_an_agent_without_types_is_an_agent_of_any() -> None:
    agent = sm.Agent(TestModel())
    assert_type(agent, sm.Agent[Any, Any])
    assert agent.run_sync("q", deps=object()).output == "success (no tool calls)"


def test_a_second_tool_of_one_name_is_refused_at_once() -> None:
    agent = make_agent()
    with pytest.raises(sm.InvalidInputError, match="today"):

        @agent.tool_plain
        def today() -> str:
            """Again."""
            return ""
