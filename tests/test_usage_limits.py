"""Usage limits: the ``usage_limit_reached`` row of the table, from the engine to the
driver, the snapshot, resume and the journal."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from driver_support import on_virtual_time

import statemachine as sm
from statemachine.core.engine import Engine
from statemachine.core.events import (
    CallModel,
    ContinueDecided,
    ModelResponded,
    Start,
    ToolDenied,
    ToolFinished,
)
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall, Usage, UserMessage
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.engine import UsageLimitExceededError, UsageLimits
from statemachine.errors import InvalidInputError, RunNotDoneError
from statemachine.hooks import RequireApproval
from statemachine.journal import Journal, JournalingEngine, replay
from statemachine.testing.models import ScriptedModel

S = TurnState
GREP = ToolDefinition(
    "grep",
    "Search.",
    {"type": "object", "properties": {"pattern": {"type": "string"}}},
)
HUNDRED = Usage(input=50, cache_read=10, output=40, total_tokens=100)


def _asks(turn: int, usage: Usage | None = HUNDRED) -> AssistantMessage:
    return AssistantMessage(
        [ToolCall(f"c{turn}", "grep", {"pattern": "x"})],
        stop_reason=StopReason.TOOL_USE,
        usage=usage,
    )


def _engine(limits: UsageLimits | None, **options: Any) -> Engine:
    return Engine(
        tools=[GREP], messages=[UserMessage("go")], usage_limits=limits, max_turns=5, **options
    )


def _turn(engine: Engine, turn: int, usage: Usage | None = HUNDRED) -> list[Any]:
    engine.handle(ModelResponded(_asks(turn, usage)))
    return list(engine.handle(ToolFinished(f"c{turn}", ToolOutput("found it"))))


# -- the limits themselves ---------------------------------------------------------------


@pytest.mark.parametrize("field", ["requests", "input_tokens", "output_tokens", "total_tokens"])
@pytest.mark.parametrize("value", [0, -3, True, 2.5, "10"])
def test_every_limit_is_a_positive_int_named_in_the_error(field: str, value: object) -> None:
    with pytest.raises(InvalidInputError, match=f"usage_limits.{field} must be a positive"):
        UsageLimits(**{field: value})  # type: ignore[arg-type]


def test_limits_round_trip_through_json() -> None:
    limits = UsageLimits(requests=3, total_tokens=500)
    assert limits.to_dict() == {"requests": 3, "totalTokens": 500}
    assert UsageLimits.from_dict(json.loads(json.dumps(limits.to_dict())), "p") == limits
    with pytest.raises(InvalidInputError, match="p: unknown key"):
        UsageLimits.from_dict({"tokens": 3}, "p")
    with pytest.raises(InvalidInputError, match=r"p\.requests must be a positive"):
        UsageLimits.from_dict({"requests": 0}, "p")


def test_input_tokens_count_cached_prompt_tokens_too() -> None:
    usage = Usage(input=5, cache_read=3, cache_write=2, output=1, total_tokens=11)
    assert UsageLimits(input_tokens=10).reached(usage, 1) == ("input_tokens", 10, 10)
    assert UsageLimits(input_tokens=11).reached(usage, 1) is None


def test_run_agent_refuses_bad_limits_before_any_model_call() -> None:
    model = ScriptedModel(AssistantMessage("hi"))
    for bad in ({"total_tokens": 10}, 10, "x"):
        with pytest.raises(InvalidInputError, match="usage_limits must be a UsageLimits"):
            sm.run_agent_sync(model=model, messages=[UserMessage("go")], usage_limits=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="usage_limits"):
        Engine(tools=[], messages=[UserMessage("go")], usage_limits={"requests": 1})  # type: ignore[arg-type]
    assert model.calls == 0


# -- the engine: the row and its place in rule 7 -----------------------------------------------


def test_the_limit_is_checked_before_the_call_that_would_exceed_it() -> None:
    engine = _engine(UsageLimits(total_tokens=200))
    engine.handle(Start())
    assert any(isinstance(a, CallModel) for a in _turn(engine, 1))  # 100 of 200: go on
    actions = _turn(engine, 2)  # 200 of 200: the next call would exceed it
    assert not any(isinstance(a, CallModel) for a in actions)
    assert engine.state is S.USAGE_LIMIT_EXCEEDED
    assert engine.turns == 2
    assert engine.usage.total_tokens == 200
    text = engine.explanation or ""
    assert "total_tokens=200" in text
    assert "200 used" in text
    assert "2 request(s), 120 input, 80 output, 200 total tokens" in text
    assert "Last operation: tool grep (call c2) returned: found it" in text
    assert engine.trace[-1].dest is S.USAGE_LIMIT_EXCEEDED


def test_a_response_without_usage_counts_as_zero_tokens() -> None:
    engine = _engine(UsageLimits(output_tokens=1))
    engine.handle(Start())
    for turn in (1, 2, 3):
        assert any(isinstance(a, CallModel) for a in _turn(engine, turn, usage=None))
    assert engine.state is S.AWAITING_MODEL
    assert engine.usage == Usage()


def test_the_requests_limit_counts_model_calls() -> None:
    engine = _engine(UsageLimits(requests=1))
    engine.handle(Start())
    _turn(engine, 1, usage=None)
    assert engine.state is S.USAGE_LIMIT_EXCEEDED
    assert "requests=1" in (engine.explanation or "")


def test_a_final_answer_past_the_limit_still_ends_done() -> None:
    # The limit forbids a further call; it never turns a finished run into a failure.
    engine = _engine(UsageLimits(total_tokens=10))
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("done", usage=HUNDRED)))
    assert engine.state is S.DONE


def test_the_turn_limit_wins_when_both_are_reached() -> None:
    engine = Engine(
        tools=[GREP],
        messages=[UserMessage("go")],
        max_turns=1,
        usage_limits=UsageLimits(total_tokens=100),
    )
    engine.handle(Start())
    _turn(engine, 1)
    assert engine.state is S.TURN_LIMIT_EXCEEDED


def test_a_stop_asked_by_should_continue_wins_over_the_usage_limit() -> None:
    engine = _engine(UsageLimits(total_tokens=100), check_continue=True)
    engine.handle(Start())
    _turn(engine, 1)
    assert engine.state is S.TURN_BOUNDARY
    engine.handle(ContinueDecided(True, "enough"))
    assert engine.state.value == "Done"
    assert "enough" in (engine.explanation or "")


def test_a_policy_denial_wins_over_the_usage_limit() -> None:
    engine = _engine(UsageLimits(total_tokens=100), check_permissions=True)
    engine.handle(Start())
    engine.handle(ModelResponded(_asks(1)))
    engine.handle(ToolDenied("c1", "not here"))
    assert engine.state is S.AWAITING_USER
    assert "denied by policy: not here" in (engine.explanation or "")


def test_usage_is_part_of_the_control_key_and_of_forks() -> None:
    one, two = _engine(UsageLimits(total_tokens=300)), _engine(UsageLimits(total_tokens=300))
    for engine in (one, two):
        engine.handle(Start())
    _turn(one, 1)
    _turn(two, 1, usage=None)
    assert one.state is two.state is S.AWAITING_MODEL
    assert one.control_key() != two.control_key()
    fork = one.fork()
    _turn(fork, 2)
    assert one.usage.total_tokens == 100
    assert fork.usage.total_tokens == 200


# -- snapshot and restore ----------------------------------------------------------------------


def test_usage_and_limits_survive_a_snapshot() -> None:
    engine = _engine(UsageLimits(requests=4, total_tokens=300))
    engine.handle(Start())
    _turn(engine, 1)
    engine.handle(ModelResponded(AssistantMessage("done", usage=HUNDRED)))
    data = json.loads(json.dumps(engine.snapshot()))
    assert data["usageLimits"] == {"requests": 4, "totalTokens": 300}
    assert data["usage"]["totalTokens"] == 200
    restored = Engine.restore(data)
    assert restored.usage == engine.usage
    assert restored.usage_limits == engine.usage_limits
    assert restored.control_key() == engine.control_key()


def test_a_snapshot_written_before_usage_was_counted_still_restores() -> None:
    engine = _engine(None)
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("done")))
    data = engine.snapshot()
    del data["usage"], data["usageLimits"]
    restored = Engine.restore(data)
    assert restored.usage == Usage()
    assert restored.usage_limits is None


def test_a_snapshot_with_bad_limits_is_refused_naming_the_field() -> None:
    engine = _engine(None)
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("done")))
    data = engine.snapshot()
    data["usageLimits"] = {"requests": 0}
    with pytest.raises(sm.errors.SnapshotError, match=r"snapshot\.usageLimits\.requests"):
        Engine.restore(data)


# -- the driver ------------------------------------------------------------------------------


def _grep_tool() -> sm.Tool:
    @sm.tool
    def grep(pattern: str = "") -> str:
        """Search."""
        return "found it"

    return grep


def test_run_agent_ends_usage_limit_exceeded_with_its_error_and_usage() -> None:
    model = ScriptedModel(_asks(1), _asks(2), AssistantMessage("never asked"))
    result = sm.run_agent_sync(
        model=model,
        messages=[UserMessage("go")],
        tools=[_grep_tool()],
        usage_limits=UsageLimits(total_tokens=150),
    )
    assert result.state is S.USAGE_LIMIT_EXCEEDED
    assert model.calls == 2
    assert result.usage.total_tokens == 200
    assert isinstance(result.error, UsageLimitExceededError)
    assert isinstance(result.error, RunNotDoneError)
    with pytest.raises(UsageLimitExceededError, match="total_tokens=150"):
        result.raise_for_state()
    assert result.messages[-1].role == "toolResult"  # every call answered (I1)


def test_a_resumed_run_goes_on_counting() -> None:
    async def main() -> tuple[sm.RunResult, sm.RunResult, ScriptedModel]:
        model = ScriptedModel(_asks(1), _asks(2), AssistantMessage("never asked"))
        tools = [_grep_tool()]
        first = await sm.run_agent(
            model=model,
            messages=[UserMessage("go")],
            tools=tools,
            before_tool_call=lambda call: RequireApproval("check"),
            usage_limits=UsageLimits(total_tokens=200),
        )
        assert first.state is S.AWAITING_USER
        assert first.snapshot is not None
        snapshot = json.loads(json.dumps(first.snapshot))
        second = await sm.resume_agent(
            snapshot,
            model=model,
            tools=tools,
            approvals={"c1": True},
            before_tool_call=lambda call: None,
        )
        return first, second, model

    first, second, model = on_virtual_time(main)
    assert first.usage.total_tokens == 100
    # 100 tokens before the suspension and 100 after: the limit of 200 is reached, so
    # the third response is never asked for (without the carried usage it would be).
    assert second.state is S.USAGE_LIMIT_EXCEEDED
    assert second.usage.total_tokens == 200
    assert "200 used" in second.explanation
    assert model.calls == 2


def test_resume_may_replace_the_limits() -> None:
    async def main() -> sm.RunResult:
        model = ScriptedModel(_asks(1), _asks(2), AssistantMessage("never asked"))
        tools = [_grep_tool()]
        first = await sm.run_agent(
            model=model,
            messages=[UserMessage("go")],
            tools=tools,
            before_tool_call=lambda call: RequireApproval("check"),
        )
        return await sm.resume_agent(
            first,
            model=model,
            tools=tools,
            approvals={"c1": True},
            before_tool_call=lambda call: None,
            usage_limits=UsageLimits(requests=1),
        )

    result = on_virtual_time(main)
    assert result.state is S.USAGE_LIMIT_EXCEEDED
    assert "requests=1" in result.explanation
    assert result.usage.total_tokens == 100


def test_resume_refuses_bad_limits_before_anything_runs() -> None:
    model = ScriptedModel(_asks(1))
    tools = [_grep_tool()]
    first = sm.run_agent_sync(
        model=model,
        messages=[UserMessage("go")],
        tools=tools,
        before_tool_call=lambda call: RequireApproval("check"),
    )
    with pytest.raises(InvalidInputError, match="usage_limits"):
        sm.resume_run(first, model=model, tools=tools, approvals={"c1": True}, usage_limits=5)  # type: ignore[arg-type]


# -- the journal --------------------------------------------------------------------------


def test_replay_gives_the_same_usage_limited_run() -> None:
    stream = io.StringIO()
    engine = JournalingEngine(
        journal=Journal(stream),
        tools=[GREP],
        messages=[UserMessage("go")],
        usage_limits=UsageLimits(total_tokens=150),
    )
    engine.handle(Start())
    _turn(engine, 1)
    _turn(engine, 2)
    assert engine.state is S.USAGE_LIMIT_EXCEEDED
    header = json.loads(stream.getvalue().splitlines()[0])
    assert header["options"]["usage_limits"] == {"totalTokens": 150}
    result = replay(stream.getvalue().splitlines(keepends=True))
    assert result.state is S.USAGE_LIMIT_EXCEEDED
    assert result.messages == tuple(engine.messages)
    assert result.trace == tuple(engine.trace)


def test_a_journal_header_with_bad_limits_is_refused_naming_the_field() -> None:
    from statemachine.journal._format import JournalHeader

    stream = io.StringIO()
    JournalingEngine(
        journal=Journal(stream),
        tools=[GREP],
        messages=[UserMessage("go")],
        usage_limits=UsageLimits(requests=2),
    )
    header = json.loads(stream.getvalue().splitlines()[0])
    assert JournalHeader.from_dict(header).engine().usage_limits == UsageLimits(requests=2)
    header["options"]["usage_limits"] = {"requests": 0}
    with pytest.raises(sm.errors.WireFormatError, match=r"usage_limits\.requests"):
        JournalHeader.from_dict(header)


# -- the tool-call limit (PydanticAI's tool_calls_limit) --------------------------------------


def _asks_twice(call_id: str) -> sm.AssistantMessage:
    return sm.AssistantMessage(
        [sm.ToolCall(f"{call_id}a", "echo_tool", {}), sm.ToolCall(f"{call_id}b", "echo_tool", {})],
        "toolUse",
    )


def test_a_tool_call_past_the_limit_is_not_run_and_the_run_ends_at_the_boundary() -> None:
    ran: list[str] = []

    @sm.tool
    def echo_tool() -> str:
        """Echo."""
        ran.append("echo")
        return "ok"

    model = ScriptedModel(_asks_twice("c1"), _asks_twice("c2"), "done")
    result = sm.Agent(model, tools=[echo_tool], usage_limits=sm.UsageLimits(tool_calls=3)).run_sync(
        "go"
    )
    assert ran == ["echo"] * 3
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert "tool_calls=3" in result.explanation
    last = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)][-1]
    assert last.is_error
    assert "tool_calls limit (3) is reached" in last.text
    assert model.calls == 2


def test_the_tool_call_limit_is_written_as_json_and_read_back() -> None:
    limits = sm.UsageLimits(tool_calls=2)
    assert limits.to_dict() == {"toolCalls": 2}
    assert sm.UsageLimits.from_dict({"toolCalls": 2}, "x") == limits
    with pytest.raises(sm.InvalidInputError, match="tool_calls"):
        sm.UsageLimits(tool_calls=0)


# -- a tool's own usage (RunContext.usage, add_usage) ---------------------------------------

SPENT = Usage(input=30, output=20, total_tokens=50)


def _spending_tool(seen: list[tuple[Usage, int]], *, sync: bool = False) -> sm.Tool:
    """``grep`` that calls a model of its own: it reads the run's usage, then adds what
    its call spent (one request, ``SPENT``)."""

    def spend(ctx: sm.RunContext[None]) -> str:
        seen.append((ctx.usage, ctx.requests))
        ctx.add_usage(SPENT, requests=1)
        seen.append((ctx.usage, ctx.requests))
        return "found it"

    if sync:

        @sm.tool(name="grep")
        def grep_sync(ctx: sm.RunContext[None], pattern: str = "") -> str:
            """Search."""
            return spend(ctx)

        return grep_sync

    @sm.tool(name="grep")
    async def grep(ctx: sm.RunContext[None], pattern: str = "") -> str:
        """Search."""
        return spend(ctx)

    return grep


@pytest.mark.parametrize("sync", [False, True])
def test_a_tool_reads_the_runs_usage_and_what_it_adds_joins_the_result(sync: bool) -> None:
    seen: list[tuple[Usage, int]] = []
    model = ScriptedModel(_asks(1), AssistantMessage("done", usage=HUNDRED))
    result = sm.run_agent_sync(model=model, messages="go", tools=[_spending_tool(seen, sync=sync)])
    assert result.ok
    assert seen == [(HUNDRED, 1), (HUNDRED + SPENT, 2)]
    assert result.usage == HUNDRED + SPENT + HUNDRED
    # the result the model read is the tool's own: the usage travels beside it
    assert result.messages[2].text == "found it"


def test_a_tools_added_requests_count_against_the_runs_limits() -> None:
    model = ScriptedModel(_asks(1), _asks(2), AssistantMessage("never asked"))
    result = sm.run_agent_sync(
        model=model,
        messages="go",
        tools=[_spending_tool([])],
        usage_limits=UsageLimits(requests=2),
    )
    assert result.state is S.USAGE_LIMIT_EXCEEDED
    assert model.calls == 1  # the tool's own call was the second request
    assert "requests=2" in result.explanation


def test_a_tools_added_usage_is_journaled_and_replays() -> None:
    import functools

    stream = io.StringIO()
    result = sm.run_agent_sync(
        model=ScriptedModel(_asks(1), AssistantMessage("done")),
        messages="go",
        tools=[_spending_tool([])],
        engine_factory=functools.partial(JournalingEngine, journal=Journal(stream)),
    )
    assert result.usage == HUNDRED + SPENT
    replayed = replay(stream.getvalue().splitlines(keepends=True))
    assert replayed.engine.usage == result.usage
    assert replayed.engine.requests == 3  # two model calls, and the tool's own


def test_add_usage_belongs_to_a_tools_call_and_checks_what_it_is_given() -> None:
    from statemachine.agent.context import Spent

    outside = sm.RunContext(None, "r1", 1, [])
    with pytest.raises(sm.UsageError, match="add_usage is for a tool's call"):
        outside.add_usage(SPENT)
    inside = sm.RunContext(None, "r1", 1, [], spent=Spent())
    with pytest.raises(InvalidInputError, match="usage must be a Usage"):
        inside.add_usage({"input": 3})  # type: ignore[arg-type]
    for requests in (-1, True, 1.5):
        with pytest.raises(InvalidInputError, match="requests must be an integer >= 0"):
            inside.add_usage(requests=requests)  # type: ignore[arg-type]
    inside.add_usage(requests=2)
    assert (inside.usage, inside.requests) == (Usage(), 2)
