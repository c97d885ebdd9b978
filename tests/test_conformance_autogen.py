"""autogen-agentchat as a peer of the conformance kit: each finding the kit reports
(examples/conformance/REPORT.md), on the smallest scenario that shows it, and the hang
reproduced against autogen's own ``AssistantAgent`` without the kit. autogen-agentchat
0.7.5 is installed beside the package without its resolution (autogen-core pins
protobuf 5): see examples/conformance/autogen-requirements.txt."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from statemachine.messages import StopReason
from statemachine.testing import (
    AbortAt,
    AbortKind,
    ModelTurn,
    OnAbort,
    Scenario,
    ScriptedCall,
    check_record,
    run_conformance,
    run_scenario,
)
from statemachine.testing.clock import IdleSkippingLoop
from statemachine.testing.strategies import PRIOR_EXCHANGE

if os.environ.get("CI") == "true":
    import autogen_agentchat  # noqa: F401 - run.sh installs it for the tests: fail here, never skip
else:
    pytest.importorskip("autogen_agentchat", reason="autogen-agentchat is not installed")
sys.path.insert(0, str(Path(__file__).parents[1] / "examples" / "conformance"))
LOOP = importlib.import_module("python_peers").autogen_loop()


def _call(tool: str = "alpha", call_id: str | None = None) -> ScriptedCall:
    return ScriptedCall(tool=tool, call_id=call_id)


def _tool_turn(*calls: ScriptedCall, on_abort: OnAbort = OnAbort.HONOUR) -> ModelTurn:
    return ModelTurn(calls=calls, stop_reason=StopReason.TOOL_USE, on_abort=on_abort)


@pytest.mark.timeout(60)
def test_a_plain_tool_turn_passes() -> None:
    record = run_scenario(LOOP, Scenario(turns=(_tool_turn(_call()),)))
    assert check_record(record) == {}
    assert record.transcript is not None
    assert [m.role for m in record.transcript] == ["user", "assistant", "toolResult", "assistant"]


@pytest.mark.timeout(60)
def test_an_abort_during_a_model_call_that_ignores_it_runs_no_call() -> None:
    # The adapter's model client links the request to the token autogen hands it, as
    # autogen's own clients do: a model that would answer after the abort is cancelled,
    # and none of its calls runs (a client that kept the token unused would let them).
    scenario = Scenario(
        turns=(_tool_turn(_call(), on_abort=OnAbort.IGNORE),),
        abort=AbortAt(AbortKind.MODEL_CALL, 1),
    )
    record = run_scenario(LOOP, scenario)
    assert record.abort_fired
    assert record.executions == ()
    assert check_record(record) == {}


# -- the findings ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_cancelling_during_a_tool_call_never_returns() -> None:
    scenario = Scenario(turns=(_tool_turn(_call()),), abort=AbortAt(AbortKind.TOOL_START, 1, 0))
    record = run_scenario(LOOP, scenario, timeout=30.0)
    assert record.timed_out
    assert check_record(record)["I8"] == [
        "the loop did not return within 30 s (a model or tool misbehaved and the loop hung)"
    ]


@pytest.mark.timeout(60)
def test_a_model_exception_escapes_the_run() -> None:
    record = run_scenario(LOOP, Scenario(turns=(ModelTurn(raises=True),)))
    assert check_record(record)["I8"] == [
        "the loop did not return a history: RuntimeError: scripted model failure on call 1"
    ]


@pytest.mark.timeout(60)
def test_an_empty_call_id_is_passed_on() -> None:
    record = run_scenario(LOOP, Scenario(turns=(_tool_turn(_call(call_id="")),)))
    assert check_record(record)["I1"] == ["I1 at message 1: tool call alpha has an empty id"]


@pytest.mark.timeout(60)
def test_a_call_id_from_an_earlier_turn_is_passed_on() -> None:
    scenario = Scenario(turns=(_tool_turn(_call(call_id="prev_1")),), history=PRIOR_EXCHANGE)
    record = run_scenario(LOOP, scenario)
    assert check_record(record)["I1"] == [
        "I1 at message 5: tool call id 'prev_1' repeats the id of a call in message 1"
    ]


@pytest.mark.timeout(120)
def test_the_search_finds_the_escaping_exception_and_the_hang() -> None:
    report = run_conformance(
        LOOP, max_examples=100, seed=20261202, properties=["I8"], per_property=True
    )
    assert [f.problems for f in report.failures] == [
        ("the loop did not return a history: RuntimeError: scripted model failure on call 1",),
        ("the loop did not return within 10 s (a model or tool misbehaved and the loop hung)",),
    ]


# -- the hang, against autogen's own AssistantAgent ----------------------------------------


async def _assistant_cancelled_during(phase: str) -> tuple[bool, list[str]]:
    """An ``AssistantAgent`` whose model asks for one tool call; its run's token is
    cancelled while the model call (``phase="model"``) or the tool call
    (``phase="tool"``) is under way. Whether the run ended within an hour (of the
    idle-skipping clock: a wait nothing else can end costs no real time), and what the
    tool saw."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core import CancellationToken, FunctionCall
    from autogen_core.models import (
        ChatCompletionClient,
        CreateResult,
        LLMMessage,
        ModelFamily,
        ModelInfo,
        RequestUsage,
    )

    usage = RequestUsage(prompt_tokens=0, completion_tokens=0)
    token = CancellationToken()
    seen: list[str] = []
    started = asyncio.Event()

    class OneCall(ChatCompletionClient):
        """A model that asks for ``lookup`` once; it links its request to the token,
        as autogen's own clients do."""

        async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
            request: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            kwargs["cancellation_token"].link_future(request)
            if phase == "model":
                started.set()
                await request  # until cancelled
            call = FunctionCall(id="call_1", name="lookup", arguments='{"key": "a"}')
            return CreateResult(
                finish_reason="function_calls", content=[call], usage=usage, cached=False
            )

        def create_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def close(self) -> None:
            return None

        def actual_usage(self) -> RequestUsage:
            return usage

        def total_usage(self) -> RequestUsage:
            return usage

        def count_tokens(self, messages: Sequence[LLMMessage], **_: Any) -> int:
            return 0

        def remaining_tokens(self, messages: Sequence[LLMMessage], **_: Any) -> int:
            return 1_000

        @property
        def capabilities(self) -> Any:
            return self.model_info

        @property
        def model_info(self) -> ModelInfo:
            return ModelInfo(
                vision=False,
                function_calling=True,
                json_output=False,
                family=ModelFamily.UNKNOWN,
                structured_output=False,
            )

    async def lookup(key: str) -> str:
        """Looks a key up, slowly."""
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("tool cancelled")
            raise
        return "found"

    agent = AssistantAgent("assistant", model_client=OneCall(), tools=[lookup])
    run = asyncio.ensure_future(agent.run(task="look a up", cancellation_token=token))
    await started.wait()
    token.cancel()
    done, _ = await asyncio.wait({run}, timeout=3600)
    if not done:
        run.cancel()  # ends the test's own wait; autogen never would
        await asyncio.gather(run, return_exceptions=True)
        return False, seen
    seen.append("run cancelled" if run.cancelled() else f"run ended: {run.exception()!r}")
    return True, seen


def _on_idle_skipping_loop(phase: str) -> tuple[bool, list[str]]:
    with asyncio.Runner(loop_factory=IdleSkippingLoop) as runner:
        return runner.run(_assistant_cancelled_during(phase))


@pytest.mark.timeout(60)
def test_assistant_agent_cancelled_during_a_tool_call_never_ends() -> None:
    # The workbench links the tool's task to the token: the cancel reaches the tool, the
    # asyncio.gather over the calls raises CancelledError, and the marker that ends the
    # agent's wait on its event queue is put only after gather succeeds
    # (AssistantAgent._process_model_result, autogen-agentchat 0.7.5): the run waits on
    # the queue for ever.
    ended, seen = _on_idle_skipping_loop("tool")
    assert seen == ["tool cancelled"]
    assert not ended
    # The same cancel during the model call ends the run at once.
    ended, seen = _on_idle_skipping_loop("model")
    assert ended
    assert seen == ["run cancelled"]


@pytest.mark.timeout(60)
def test_a_call_id_from_an_earlier_turn_is_only_a_warning_with_id_reuse_warning() -> None:
    # autogen's providers (OpenAI) accept an id repeated from an earlier turn: judged
    # as the transcript checker judges their logs, it is reported, not failed.
    scenario = Scenario(turns=(_tool_turn(_call(call_id="prev_1")),), history=PRIOR_EXCHANGE)
    report = run_conformance(
        LOOP, scenarios=st.just(scenario), properties=["I1"], id_reuse="warning"
    )
    assert report.passed
    assert [runs for _, runs in report.warnings] == [1]
