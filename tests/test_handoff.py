"""Handoffs: a transfer tool's one result hands the run to another agent, whose model,
instructions and tools apply from the next call; the history and the journal show it;
a handoff loop ends in a named state; a route to an unknown agent is refused at once."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pytest

from statemachine import Agent, ToolCall, TurnState, run_agent_sync, tool
from statemachine.agent.compaction import compaction
from statemachine.agent.handoff import DEFAULT_MAX_HANDOFFS, Handoffs, speaking_agent
from statemachine.core.invariants import history_violations
from statemachine.core.messages import AssistantMessage, Message, ToolResultMessage
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError, StepEndedError
from statemachine.journal import Journal, JournalingEngine, replay
from statemachine.testing import FunctionModel, ScriptedModel

ran: list[str] = []


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    ran.append(f"lookup {order}")
    return f"order {order}: 240 EUR"


@tool
def refund(order: str) -> str:
    """Refund an order."""
    ran.append(f"refund {order}")
    return f"order {order} refunded"


def _results(messages: Sequence[Message]) -> list[ToolResultMessage]:
    return [m for m in messages if isinstance(m, ToolResultMessage)]


def _team(triage: object, billing: object, **options: object) -> Handoffs:
    return Handoffs(
        {
            "triage": Agent(triage, tools=[lookup], instructions="You triage."),  # type: ignore[arg-type]
            "billing": Agent(billing, tools=[refund], instructions="You refund."),  # type: ignore[arg-type]
        },
        routes={"triage": ["billing"]},
        start="triage",
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(30)
def test_after_a_handoff_the_other_agents_model_instructions_and_tools_apply() -> None:
    ran.clear()
    triage = ScriptedModel(ToolCall("t1", "transfer_to_billing", {}))
    billing = ScriptedModel(ToolCall("c1", "refund", {"order": "A17"}), "Refunded A17.")
    result = _team(triage, billing).agent.run_sync("Refund A17, it arrived broken.")

    assert result.state is TurnState.DONE
    assert (triage.calls, billing.calls) == (1, 2)
    assert [d.name for d in triage.requests[0].tools] == ["lookup", "transfer_to_billing"]
    assert triage.requests[0].instructions == "You triage."
    assert [d.name for d in billing.requests[0].tools] == ["refund"]
    assert billing.requests[0].instructions == "You refund."
    handoff, refunded = _results(result.messages)
    assert (handoff.tool_name, handoff.is_error) == ("transfer_to_billing", False)
    assert refunded.is_error is False
    assert ran == ["refund A17"]
    assert speaking_agent(result.messages, "triage") == "billing"
    assert history_violations(list(result.messages)) == []


@pytest.mark.timeout(30)
def test_a_handoff_is_in_the_journal_and_replays_exactly(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    triage = ScriptedModel(ToolCall("t1", "transfer_to_billing", {}))
    billing = ScriptedModel("Refunded.")
    team = _team(triage, billing)
    with Journal(path) as journal:
        result = run_agent_sync(
            model=team.agent.model,
            tools=team.agent.tools,
            steps=team.agent.options.steps,
            messages="Refund A17.",
            engine_factory=partial(JournalingEngine, journal=journal),
        )
    assert result.state is TurnState.DONE
    assert "transfer_to_billing" in path.read_text(encoding="utf-8")
    again = replay(path)
    assert again.ok
    assert tuple(again.messages) == result.messages
    assert speaking_agent(again.messages, "triage") == "billing"


def _always_transfer(target: str):  # type: ignore[no-untyped-def]
    def answer(messages: Sequence[Message], tools: Sequence[ToolDefinition]) -> AssistantMessage:
        call = ToolCall(f"h{len(messages)}", f"transfer_to_{target}", {})
        return AssistantMessage([call], "toolUse")

    return answer


@pytest.mark.timeout(30)
def test_a_handoff_loop_ends_in_its_named_state_with_every_call_answered() -> None:
    ping = FunctionModel(_always_transfer("pong"))
    pong = FunctionModel(_always_transfer("ping"))
    team = Handoffs(
        {"ping": Agent(ping), "pong": Agent(pong)},
        routes={"ping": ["pong"], "pong": ["ping"]},
        start="ping",
        max_handoffs=3,
        max_turns=50,
    )
    result = team.agent.run_sync("go")
    assert result.state.value == "HandoffLimitExceeded"
    assert isinstance(result.error, StepEndedError)
    assert "4 handoffs; at most 3" in (result.explanation or "")
    assert ping.calls + pong.calls == 4  # no model call after the fourth handoff
    assert history_violations(list(result.messages)) == []
    assert DEFAULT_MAX_HANDOFFS == 8


@pytest.mark.timeout(30)
def test_a_transfer_or_a_tool_the_speaking_agent_was_not_offered_is_an_error_result() -> None:
    ran.clear()
    triage = ScriptedModel(ToolCall("t1", "transfer_to_billing", {}))
    billing = ScriptedModel(
        [ToolCall("x1", "transfer_to_review", {}), ToolCall("x2", "lookup", {"order": "B"})],
        "Done.",
    )
    team = Handoffs(
        {
            "triage": Agent(triage, tools=[lookup]),
            "billing": Agent(billing, tools=[refund]),
            "review": Agent(ScriptedModel()),
        },
        routes={"triage": ["billing", "review"]},
        start="triage",
    )
    result = team.agent.run_sync("refund")
    assert result.state is TurnState.DONE
    _, denied, not_offered = _results(result.messages)
    assert denied.is_error
    assert "billing may not hand the run to review" in denied.content[0].text  # type: ignore[union-attr]
    assert not_offered.is_error
    assert "not offered to billing" in not_offered.content[0].text  # type: ignore[union-attr]
    assert ran == []  # lookup was not run
    assert speaking_agent(result.messages, "triage") == "billing"


@pytest.mark.timeout(10)
def test_a_team_naming_an_unknown_agent_is_refused_before_any_call() -> None:
    model = ScriptedModel("never")
    members = {"triage": Agent(model, tools=[lookup]), "billing": Agent(model)}
    with pytest.raises(InvalidInputError, match="'legal', which is not a member"):
        Handoffs(members, routes={"triage": ["legal"]}, start="triage")
    with pytest.raises(InvalidInputError, match="start 'sales' is not a member"):
        Handoffs(members, routes={}, start="sales")

    @tool
    def transfer_to_billing() -> str:
        """Not a real transfer."""
        return ""

    with pytest.raises(InvalidInputError, match="named like a transfer"):
        Handoffs({"a": Agent(model, tools=[transfer_to_billing])}, routes={}, start="a")
    with pytest.raises(InvalidInputError, match="max_handoffs"):
        Handoffs(members, routes={}, start="triage", max_handoffs=-1)
    assert model.calls == 0


@pytest.mark.timeout(30)
def test_a_team_takes_steps_of_its_own_and_compacts_without_losing_who_speaks() -> None:
    triage = ScriptedModel(ToolCall("t1", "transfer_to_billing", {}))
    billing = ScriptedModel(
        *[ToolCall(f"c{i}", "refund", {"order": str(i)}) for i in range(4)], "Refunded."
    )
    squeeze = compaction(
        lambda messages: "earlier: a handoff to billing", max_messages=4, keep_last=2
    )
    team = _team(triage, billing, steps=[squeeze])
    result = team.agent.run_sync("refund all")
    assert result.state is TurnState.DONE
    assert billing.calls == 5  # the transfer was summarised away; billing still speaks
    assert all(
        "transfer_to_billing" not in str(request.messages) for request in billing.requests[-2:]
    )
    assert [s.name for s in team.agent.options.steps] == ["handoff_limit", "compaction"]
