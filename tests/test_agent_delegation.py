"""Agents run as tools of other agents: how deeply they nest, and whose usage and
limits their model calls count against."""

from __future__ import annotations

from typing import Any

import pytest

import statemachine as sm
from statemachine.agent.agent import DEFAULT_MAX_DEPTH
from statemachine.core.messages import Message
from statemachine.core.tools import ToolDefinition
from statemachine.messages import Usage
from statemachine.testing import FunctionModel, ScriptedModel

pytestmark = pytest.mark.timeout(30)

SPENT = Usage(input=10, output=5, total_tokens=15)


def _delegates_once(messages: list[Message], tools: list[ToolDefinition]) -> Any:
    """Ask the sub-agent once, then answer with what it said."""
    last = messages[-1]
    if isinstance(last, sm.ToolResultMessage):
        return sm.AssistantMessage(f"got: {last.text}", usage=SPENT)
    return sm.AssistantMessage(
        [sm.ToolCall("", "myself", {"prompt": "again"})], "toolUse", usage=SPENT
    )


def test_an_agent_that_is_its_own_sub_agent_nests_only_to_its_max_depth() -> None:
    model = FunctionModel(_delegates_once)
    agent = sm.Agent(model, name="myself")
    agent.tools = (agent.as_tool(max_depth=3),)
    result = agent.run_sync("go")
    assert result.state is sm.TurnState.DONE
    # the top run and three nested ones call the model twice each; the fourth is refused
    assert model.calls == 2 * 4
    innermost = [
        m for m in model.contexts[4] if isinstance(m, sm.ToolResultMessage)
    ]  # the call whose tool the depth refused
    assert innermost
    assert innermost[-1].is_error
    assert "DelegationDepthError" in innermost[-1].text
    assert "past max_depth=3" in innermost[-1].text


def test_the_default_depth_is_documented_and_bounds_a_self_delegating_agent() -> None:
    model = FunctionModel(_delegates_once)
    agent = sm.Agent(model, name="myself")
    agent.tools = (agent.as_tool(),)
    assert agent.run_sync("go").ok
    assert model.calls == 2 * (DEFAULT_MAX_DEPTH + 1)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_max_depth_must_be_a_positive_integer(bad: object) -> None:
    agent = sm.Agent(ScriptedModel(), name="a")
    with pytest.raises(sm.InvalidInputError, match="max_depth"):
        agent.as_tool(max_depth=bad)  # type: ignore[arg-type]


def _child(*script: Any) -> sm.Agent:
    return sm.Agent(ScriptedModel(*script), name="helper")


def _asks_helper(call_id: str = "p1") -> sm.AssistantMessage:
    return sm.AssistantMessage(
        [sm.ToolCall(call_id, "helper", {"prompt": "help"})], "toolUse", usage=SPENT
    )


def test_a_sub_agents_usage_joins_the_parents_result_usage() -> None:
    child = _child(
        sm.AssistantMessage([sm.ToolCall("c1", "nothing", {})], "toolUse", usage=SPENT),
        sm.AssistantMessage("helped", usage=SPENT),
    )

    @sm.tool
    def nothing() -> str:
        """Do nothing."""
        return "done"

    child.tools = (nothing,)
    parent = sm.Agent(
        ScriptedModel(_asks_helper(), sm.AssistantMessage("thanks", usage=SPENT)),
        tools=[child.as_tool()],
    )
    result = parent.run_sync("go")
    assert result.ok
    assert result.usage.input == 4 * SPENT.input  # two calls of each
    assert result.turns == 2  # the parent's own model calls
    assert result.stats is not None
    assert result.stats.usage.input == 4 * SPENT.input


def test_a_sub_agents_model_calls_count_against_the_parents_request_limit() -> None:
    child_model = ScriptedModel(*[_asks_helper(f"x{i}") for i in range(5)], "done")

    @sm.tool
    def helper(prompt: str) -> str:
        """Unused by the child but named like its calls."""
        return "fine"

    child = sm.Agent(child_model, name="helper", tools=[helper], max_turns=10)
    parent_model = ScriptedModel(_asks_helper(), "thanks")
    parent = sm.Agent(
        parent_model,
        tools=[child.as_tool()],
        usage_limits=sm.UsageLimits(requests=2),
    )
    result = parent.run_sync("go")
    # the parent's first call, then the child's one call left by the limit
    assert parent_model.calls + child_model.calls == 2
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert "requests" in result.explanation


def test_a_sub_agent_is_not_run_once_the_parents_limits_are_reached() -> None:
    child_model = ScriptedModel("never")
    child = sm.Agent(child_model, name="helper")
    parent = sm.Agent(
        ScriptedModel(_asks_helper()),
        tools=[child.as_tool()],
        usage_limits=sm.UsageLimits(requests=1),
    )
    result = parent.run_sync("go")
    assert child_model.calls == 0
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    [answer] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.is_error
    assert "usage limits are reached" in answer.text


def test_join_usage_false_keeps_a_sub_agents_usage_apart() -> None:
    child_model = ScriptedModel(sm.AssistantMessage("helped", usage=SPENT))
    child = sm.Agent(child_model, name="helper")
    parent = sm.Agent(
        ScriptedModel(_asks_helper(), sm.AssistantMessage("thanks", usage=SPENT)),
        tools=[child.as_tool(join_usage=False)],
        usage_limits=sm.UsageLimits(requests=2),
    )
    result = parent.run_sync("go")
    assert result.ok
    assert result.usage.input == 2 * SPENT.input
    assert result.stats is not None
    assert result.stats.usage.input == 3 * SPENT.input


def test_the_usage_a_tool_output_carries_crosses_the_wire() -> None:
    from statemachine.core.wire import tool_output_from_dict, tool_output_to_dict

    output = sm.ToolOutput("x", usage=SPENT, requests=3)
    assert tool_output_from_dict(tool_output_to_dict(output)) == output
    plain = sm.ToolOutput("x")
    assert tool_output_to_dict(plain) == {
        "content": [{"type": "text", "text": "x"}],
        "isError": False,
    }
    with pytest.raises(sm.InvalidInputError, match="requests"):
        sm.ToolOutput("x", requests=-1)


def test_the_requests_a_sub_agent_spent_survive_a_snapshot() -> None:
    from statemachine.engine import Engine, ModelResponded, Start, ToolFinished

    engine = Engine(
        tools=[ToolDefinition("helper", "", {"type": "object"})],
        messages=[sm.UserMessage("go")],
        max_turns=1,
    )
    engine.handle(Start())
    engine.handle(ModelResponded(_asks_helper()))
    engine.handle(ToolFinished("p1", sm.ToolOutput("ok", usage=SPENT, requests=3)))
    assert engine.state is sm.TurnState.TURN_LIMIT_EXCEEDED
    assert (engine.requests, engine.usage.input) == (4, 2 * SPENT.input)
    restored = Engine.restore(engine.snapshot())
    assert (restored.requests, restored.usage) == (4, engine.usage)
