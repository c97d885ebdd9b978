"""A run's options, declared once (``statemachine.agent.options``): every entry point
still takes them as typed keywords. mypy (run on ``tests/`` with ``--strict``, so
``warn_unused_ignores``) checks the ``assert_type`` lines and that each
``# type: ignore[...]`` below marks an error it does report; pytest runs the same calls
and sees each refused at run time too, naming the function or the argument."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, assert_type

import attrs
import pytest

import statemachine as sm
from statemachine.agent.options import DEFAULTS, AgentOptions, resolve
from statemachine.durable import DurableRunner
from statemachine.durable._registry import run_input
from statemachine.testing import ScriptedModel

pytestmark = pytest.mark.timeout(30)


@dataclasses.dataclass
class City:
    name: str


def test_a_misspelt_option_is_refused_by_mypy_and_at_run_time() -> None:
    model = ScriptedModel("hi")
    with pytest.raises(TypeError, match=r"run_agent_sync\(\) got an unexpected.*'max_turn'"):
        sm.run_agent_sync(model=model, messages="x", max_turn=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"AgentRun\(\) got an unexpected keyword.*'tool'"):
        sm.AgentRun(model=model, tool=[])  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"Agent\(\) got an unexpected keyword.*'hooks'"):
        sm.Agent(model, hooks=None)  # type: ignore[call-arg]


def test_a_per_run_option_is_not_an_agents() -> None:
    # deps and signal belong to one run (Agent.run takes them), run_id to a new run
    with pytest.raises(TypeError, match=r"Agent\(\) got an unexpected keyword.*'deps'"):
        sm.Agent(ScriptedModel(), deps=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"Agent\(\) got an unexpected keyword.*'run_id'"):
        sm.Agent(ScriptedModel(), run_id="r")  # type: ignore[call-arg]


def test_a_mistyped_option_is_refused_by_mypy_and_names_the_argument() -> None:
    model = ScriptedModel("hi")
    with pytest.raises(sm.InvalidInputError, match="max_turns must be a positive integer"):
        sm.run_agent_sync(model=model, messages="x", max_turns="3")  # type: ignore[arg-type]
    with pytest.raises(sm.InvalidInputError, match="grace_period must be a non-negative"):
        sm.Agent(model, grace_period="1")  # type: ignore[arg-type]
    with pytest.raises(sm.InvalidInputError, match="usage_limits must be a UsageLimits"):
        sm.AgentRun(model=model, usage_limits=3)  # type: ignore[arg-type]
    with pytest.raises(sm.InvalidInputError, match="tools must be a sequence of Tool"):
        sm.Agent(model, tools="search")  # type: ignore[arg-type]
    with pytest.raises(sm.InvalidInputError, match="signal must be an AbortSignal"):
        sm.run_agent_sync(model=model, messages="x", signal=True)  # type: ignore[arg-type]


def test_the_output_type_still_types_the_result() -> None:
    model = ScriptedModel('{"name": "Oslo"}')
    typed = sm.run_agent_sync(model=model, messages="x", output_type=City)
    assert_type(typed, sm.RunResult[City])
    plain = sm.run_agent_sync(model=ScriptedModel("hi"), messages="x")
    assert_type(plain, sm.RunResult[Any])
    assert_type(sm.Agent(ScriptedModel(), output_type=City), sm.Agent[Any, City])
    run = sm.AgentRun(model=ScriptedModel(), messages="x", output_type=City)
    assert_type(run, sm.AgentRun[City])


def test_the_defaults_are_written_once_and_every_run_reads_them() -> None:
    run = sm.AgentRun(model=ScriptedModel("hi"), messages="x")
    assert run.options is DEFAULTS  # no options given: the one shared record
    assert (DEFAULTS.max_turns, DEFAULTS.grace_period, DEFAULTS.output_mode) == (8, 1.0, "auto")
    agent = sm.Agent(ScriptedModel("hi"), max_turns=3)
    assert agent.options == attrs.evolve(DEFAULTS, max_turns=3)


def test_a_keyword_beside_a_record_replaces_that_field_only() -> None:
    base = resolve("Agent", {"max_turns": 3, "instructions": "x"}, AgentOptions)
    run = sm.AgentRun(model=ScriptedModel("hi"), messages="x", options=base, max_turns=5)
    assert (run.options.max_turns, run.options.instructions) == (5, "x")
    assert base.max_turns == 3  # the record is frozen: the agent's is unchanged


def test_resume_keeps_the_mode_of_the_run_it_resumes() -> None:
    @sm.tool
    def act() -> str:
        """Act."""
        return "ok"

    def ask(call: sm.ToolCall) -> sm.RequireApproval:
        return sm.RequireApproval()

    model = ScriptedModel(sm.ToolCall("c1", "act", {}), "done")
    waiting = sm.run_agent_sync(model=model, messages="x", tools=[act], before_tool_call=ask)
    assert waiting.state is sm.TurnState.AWAITING_USER
    with pytest.raises(sm.InvalidInputError, match="output_mode: a resumed run keeps"):
        sm.resume_run(waiting, model=model, message="go on", output_mode="tool")
    kept = sm.resume_run(waiting, model=model, message="go on", max_turns=None)  # type: ignore[arg-type]
    assert kept.engine.max_turns == 8  # None keeps the suspended run's limit
    with pytest.raises(TypeError, match=r"resume_run\(\) got an unexpected keyword.*'run_id'"):
        sm.resume_run(waiting, model=model, message="go on", run_id="r")  # type: ignore[call-arg]
    resumed = sm.resume_agent_sync(
        waiting,
        model=model,
        tools=[act],
        before_tool_call=ask,
        approvals={"c1": True},
        max_turns=4,
    )
    assert resumed.state is sm.TurnState.DONE


async def _durable_start_is_typed(runner: DurableRunner) -> None:
    """Checked by mypy, never run: a durable run's options are typed keywords too."""
    await runner.start("r", model="m", messages="x", max_turn=3)  # type: ignore[call-arg]
    await runner.enqueue("r", queue="q", model="m", messages="x", max_turns="8")  # type: ignore[arg-type]


def test_a_durable_runs_options_are_checked_before_anything_is_stored() -> None:
    runner = SimpleNamespace(models={"m": None}, tools={"t": None}, manifest={}, output_types={})
    with pytest.raises(TypeError, match=r"start\(\) got an unexpected keyword.*'max_turn'"):
        run_input(runner, "start", "r", {"model": "m", "messages": "x", "max_turn": 3})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(TypeError, match=r"enqueue\(\) missing .* 'messages'"):
        run_input(runner, "enqueue", "r", {"model": "m"})  # type: ignore[typeddict-item]
    with pytest.raises(sm.InvalidInputError, match="unknown tools"):
        run_input(runner, "start", "r", {"model": "m", "messages": "x", "tools": ["u"]})
    spec, extras = run_input(runner, "start", "r", {"model": "m", "messages": "x"})
    assert (spec["model"], spec["tools"], spec["max_turns"], extras) == ("m", ["t"], 8, {})


def test_an_agents_per_run_keywords_are_typed_and_checked() -> None:
    agent = sm.Agent(ScriptedModel("hi", "hi"), deps_type=City)
    result = agent.run_sync("x", deps=City("Oslo"), message_history=[])
    assert result.final_text == "hi"
    with pytest.raises(TypeError, match=r"run\(\) got an unexpected keyword.*'dep'"):
        agent.run_sync("x", dep=City("Oslo"))  # type: ignore[call-arg]
    with pytest.raises(sm.UsageError, match="deps: Agent takes RunContext\\[City\\]"):
        agent.run_sync("x", deps="Oslo")  # type: ignore[arg-type]
