"""What a run costs the process beyond its history: signatures read once, not per run
or per call, and a run that returned freed by reference counting alone (no reference
cycle left for the garbage collector)."""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm
from statemachine.agent.executor import IN_PROCESS, AsyncioExecutor, Operation
from statemachine.agent.model import CallOptions, takes_options
from statemachine.agent.run import use_backend
from statemachine.core.engine import Engine
from statemachine.testing import FunctionModel, ScriptedModel

_LIBRARY = str(Path(sm.__file__).parent)


@sm.tool
async def echo(text: str) -> str:
    """Say it back."""
    return text


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cycle collector off: what is freed then is freed by reference counting."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def signatures_read(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every object whose signature is read from now on."""
    read: list[object] = []
    real = inspect.signature

    def counting(obj: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        read.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting)
    return read


def _two_turns(messages: Sequence[sm.Message], tools: object) -> sm.AssistantMessage:
    if len(messages) == 1:
        return sm.AssistantMessage((sm.ToolCall("c1", "echo", {"text": "hi"}),))
    return sm.AssistantMessage("done")


def _run(**options: Any) -> sm.AgentRun:
    return sm.AgentRun(tools=[echo], messages="go", max_turns=4, **options)


def test_a_client_class_has_its_signature_read_once(signatures_read: list[object]) -> None:
    class WithOptions:
        async def complete(
            self, messages: object, tools: object, signal: object, *, options: CallOptions
        ) -> sm.AssistantMessage:
            return sm.AssistantMessage("x")

    class Plain:
        async def complete(self, messages: object, tools: object, signal: object) -> object:
            return sm.AssistantMessage("x")

    answers = [takes_options(c) for c in (WithOptions(), WithOptions(), Plain(), Plain())]
    assert answers == [True, True, False, False]
    assert len(signatures_read) == 2  # one per class, not one per client


def test_the_signature_cache_does_not_keep_a_client_class_alive() -> None:
    class Client:
        async def complete(self, messages: object, tools: object, signal: object) -> object:
            return sm.AssistantMessage("x")

    assert takes_options(Client()) is False
    gone = weakref.ref(Client)
    del Client
    gc.collect()  # a class is in cycles of its own (its __dict__, its methods)
    assert gone() is None


def test_a_callable_set_on_the_client_itself_is_read_as_it_is() -> None:
    class Client:
        pass

    with_options = Client()
    with_options.complete = lambda messages, tools, signal, options=None: None  # type: ignore[attr-defined]
    without = Client()
    without.complete = lambda messages, tools, signal: None  # type: ignore[attr-defined]
    assert (takes_options(with_options), takes_options(without), takes_options(object())) == (
        True,
        False,
        False,
    )


def _answering_with_options() -> Any:
    """A new closure at each call, as a model function made per run is."""

    def with_options(messages: object, tools: object, *, options: CallOptions) -> str:
        return options.instructions or ""

    return with_options


@pytest.mark.timeout(30)
def test_a_fake_model_reads_its_functions_signatures_once(
    signatures_read: list[object],
) -> None:
    function = FunctionModel(_answering_with_options())
    scripted = ScriptedModel(_answering_with_options(), "plain", _answering_with_options())
    FunctionModel(_answering_with_options())
    assert len(signatures_read) <= 1  # one def: its closures share their parameters
    made = len(signatures_read)
    signal = sm.AbortController().signal

    async def calls() -> list[str]:
        given = CallOptions(instructions="be brief")
        answers = [await function.complete([], [], signal, options=given) for _ in range(3)]
        answers += [await scripted.complete([], [], signal, options=given) for _ in range(3)]
        return [a.text for a in answers]

    assert asyncio.run(calls()) == ["be brief"] * 3 + ["be brief", "plain", "be brief"]
    assert len(signatures_read) == made  # none at a call


def test_a_wrapped_model_function_is_read_through_its_wrapper() -> None:
    answer = _answering_with_options()

    @functools.wraps(answer)
    def logged(*args: Any, **kwargs: Any) -> Any:
        return answer(*args, **kwargs)

    def plain(messages: object, tools: object) -> str:
        return "plain"

    signal = sm.AbortController().signal
    given = CallOptions(instructions="wrapped")

    async def calls() -> list[str]:
        models = [FunctionModel(logged), FunctionModel(plain)]
        return [(await m.complete([], [], signal, options=given)).text for m in models]

    assert asyncio.run(calls()) == ["wrapped", "plain"]


@pytest.mark.timeout(30)
def test_a_run_that_returned_is_freed_by_reference_counting(collector_off: None) -> None:
    engines: list[weakref.ref[Engine]] = []

    async def main() -> None:
        run = _run(model=FunctionModel(_two_turns, record=False))
        engines.append(weakref.ref(run.engine))
        result = await run.run()
        assert (result.state, result.turns) == (sm.TurnState.DONE, 2)

    asyncio.run(main())
    assert engines[0]() is None


@pytest.mark.timeout(30)
def test_a_run_with_instructions_from_a_function_is_freed_likewise(collector_off: None) -> None:
    seen: list[int] = []

    def instructions(context: sm.RunContext[Any]) -> str:
        seen.append(context.turn)
        return f"turn {context.turn}"

    engines: list[weakref.ref[Engine]] = []

    async def main() -> None:
        model = FunctionModel(_two_turns, record=True)
        run = _run(model=model, instructions=instructions)
        engines.append(weakref.ref(run.engine))
        result = await run.run()
        assert result.state is sm.TurnState.DONE
        assert [r.instructions for r in model.requests] == ["turn 1", "turn 2"]

    asyncio.run(main())
    assert seen == [1, 2]
    assert engines[0]() is None


def _provider_down(messages: object, tools: object) -> str:
    raise RuntimeError("provider down")


@pytest.mark.timeout(30)
def test_a_failed_run_is_freed_once_its_result_is_dropped(collector_off: None) -> None:
    engines: list[weakref.ref[Engine]] = []
    causes: list[BaseException | None] = []

    async def main() -> None:
        run = _run(model=FunctionModel(_provider_down))
        engines.append(weakref.ref(run.engine))
        result = await run.run()
        assert result.state is sm.TurnState.FAILED
        assert result.error is not None
        causes.append(result.error.__cause__)  # the client's exception, traceback and all

    asyncio.run(main())
    assert isinstance(causes[0], RuntimeError)
    assert causes[0].__traceback__ is not None
    assert engines[0]() is not None  # its traceback's frames still hold the run
    causes.clear()
    assert engines[0]() is None


@pytest.mark.timeout(30)
def test_a_finished_run_leaves_no_cyclic_garbage() -> None:
    async def one() -> None:
        result = await _run(model=FunctionModel(_two_turns, record=False)).run()
        assert result.state is sm.TurnState.DONE

    async def main() -> list[object]:
        await one()  # what the first run makes once (caches) is not counted
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            await one()
            gc.collect()
            return list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    garbage = asyncio.run(main())
    assert [type(o).__name__ for o in garbage] == []


@pytest.mark.timeout(30)
def test_a_running_run_holds_no_reference_cycle_between_its_loop_and_its_executor() -> None:
    # The executor reports to the loop; the loop is handed the executor, never keeps it.
    seen: list[tuple[bool, bool]] = []

    class Looking:
        def start(self, driver: AsyncioExecutor, op: Operation) -> None:
            loop = driver.loop
            seen.append((loop in gc.get_referents(driver), driver in gc.get_referents(loop)))
            IN_PROCESS.start(driver, op)

        def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
            IN_PROCESS.cancel(driver, keys, reason)

        def reported(self, key: str) -> None:
            IN_PROCESS.reported(key)

        async def ask(self, driver: AsyncioExecutor, *args: Any) -> None:
            return None

    run = _run(model=FunctionModel(_two_turns, record=False))
    use_backend(run, inbox=asyncio.Queue(), backend=Looking())
    assert asyncio.run(run.run()).state is sm.TurnState.DONE
    assert seen == [(True, False)] * 3  # two model calls and a tool call


class _Waiting:
    """A client that waits in each call until released."""

    def __init__(self) -> None:
        self.inside = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(
        self, messages: object, tools: object, signal: object
    ) -> sm.AssistantMessage:
        self.inside.set()
        await self.release.wait()
        return sm.AssistantMessage("done")


@pytest.mark.timeout(30)
def test_a_run_waiting_for_its_model_holds_only_the_drivers_own_coroutines() -> None:
    def library_coroutines() -> dict[int, str]:
        return {
            id(o): o.cr_code.co_qualname
            for o in gc.get_objects()
            if inspect.iscoroutine(o) and o.cr_code.co_filename.startswith(_LIBRARY)
        }

    async def main() -> list[str]:
        model = _Waiting()
        gc.collect()
        before = library_coroutines()  # left by other tests, if any
        run = asyncio.ensure_future(sm.run_agent(model=model, tools=[echo], messages="go"))
        await model.inside.wait()
        waiting = sorted(name for key, name in library_coroutines().items() if key not in before)
        model.release.set()
        assert (await run).state is sm.TurnState.DONE
        return waiting

    # No wrapper of the model call (instructions, options) waits in a coroutine of its own.
    assert asyncio.run(main()) == [
        "ActionLoop.drive",
        "AgentRun.run",
        "AsyncioExecutor.call_model",
        "RunInbox.get",
        "run_agent",
    ]


def _entry_locals(name: str) -> set[str]:
    """The local names held by the waiting coroutine of the library's entry ``name``."""
    found = [
        o
        for o in gc.get_objects()
        if inspect.iscoroutine(o)
        and o.cr_code.co_qualname == name
        and o.cr_code.co_filename.startswith(_LIBRARY)
        and o.cr_frame is not None
    ]
    assert len(found) == 1
    frame = found[0].cr_frame
    assert frame is not None
    return set(frame.f_locals)


@pytest.mark.timeout(30)
def test_a_waiting_run_holds_no_dict_of_the_keywords_it_was_given() -> None:
    # The options are resolved into the run's record: the entry's own frame, which
    # waits as long as the run does, keeps neither the keywords nor what it resumed.
    async def deny(call: sm.ToolCall) -> sm.Deny:
        return sm.Deny("not now")

    async def main() -> tuple[set[str], set[str]]:
        asks = sm.AssistantMessage((sm.ToolCall("c1", "echo", {"text": "x"}),))
        suspended = await sm.run_agent(
            model=ScriptedModel(asks), messages="go", tools=[echo], before_tool_call=deny
        )
        assert suspended.state is sm.TurnState.AWAITING_USER
        model = _Waiting()
        started = asyncio.ensure_future(sm.run_agent(model=model, tools=[echo], messages="go"))
        await model.inside.wait()
        held_new = _entry_locals("run_agent")
        model.release.set()
        assert (await started).state is sm.TurnState.DONE
        model = _Waiting()
        resumed = asyncio.ensure_future(
            sm.resume_agent(
                suspended, model=model, tools=[echo], message="again", before_tool_call=deny
            )
        )
        await model.inside.wait()
        held_resumed = _entry_locals("resume_agent")
        model.release.set()
        assert (await resumed).state is sm.TurnState.DONE
        return held_new, held_resumed

    held_new, held_resumed = asyncio.run(main())
    assert "options" not in held_new
    assert not {"options", "state"} & held_resumed


@pytest.mark.timeout(30)
def test_a_run_that_logs_nothing_binds_no_logger_of_its_own() -> None:
    binds: list[dict[str, object]] = []

    class Recording:
        def bind(self, **values: object) -> Recording:
            binds.append(values)
            return self

        def __getattr__(self, level: str) -> Any:
            return lambda *args, **kwargs: None

    result = sm.run_agent_sync(
        model=FunctionModel(_two_turns), tools=[echo], messages="go", logger=Recording()
    )
    assert result.state is sm.TurnState.DONE
    assert binds == [{"run_id": result.run_id}]  # the engine's, for its transition log


def _answering_with_what_it_is_given() -> Any:
    def answer(messages: object, tools: object, **extra: object) -> str:
        options = extra.get("options")
        return options.instructions or "" if isinstance(options, CallOptions) else "none given"

    return answer


def test_a_model_function_that_gives_its_own_signature_is_read_as_it_says() -> None:
    def declared(messages: object, tools: object, *, options: CallOptions) -> None: ...

    plain = _answering_with_what_it_is_given()
    said = _answering_with_what_it_is_given()  # the same def, but it says it takes options
    said.__signature__ = inspect.signature(declared)
    signal = sm.AbortController().signal
    given = CallOptions(instructions="sent")

    async def calls() -> list[str]:
        models = [FunctionModel(plain), FunctionModel(said), FunctionModel(plain)]
        return [(await m.complete([], [], signal, options=given)).text for m in models]

    assert asyncio.run(calls()) == ["none given", "sent", "none given"]


class _WaitingTogether:
    """A client in whose first call ``runs`` runs wait until released."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.arrived = 0
        self.all_in = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(
        self, messages: object, tools: object, signal: object
    ) -> sm.AssistantMessage:
        self.arrived += 1
        if self.arrived == self.runs:
            self.all_in.set()
        await self.release.wait()
        return sm.AssistantMessage("done")


def _held_per_run(kind: type, runs: int = 50) -> float:
    """How many objects of type ``kind`` each of ``runs`` runs holds while all of them
    wait in their first model call (no hooks, no abort)."""

    async def main() -> float:
        model = _WaitingTogether(runs)
        gc.collect()
        before = sum(1 for o in gc.get_objects() if type(o) is kind)
        tasks = [
            asyncio.ensure_future(sm.run_agent(model=model, tools=[echo], messages="go"))
            for _ in range(runs)
        ]
        await model.all_in.wait()
        gc.collect()
        held = (sum(1 for o in gc.get_objects() if type(o) is kind) - before) / runs
        model.release.set()
        for result in await asyncio.gather(*tasks):
            assert result.state is sm.TurnState.DONE
        return held

    return asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_waiting_run_without_hooks_or_abort_makes_no_set_for_them() -> None:
    # The calls reported so far, and the engine's ids: the sets for hook calls and for
    # calls abandoned after an abort are made only when there are some.
    assert _held_per_run(set) <= 2


@pytest.mark.timeout(60)
def test_a_waiting_run_makes_no_list_or_dict_for_what_it_was_never_given() -> None:
    # No abort listener, every tool's calls free to run beside the others: no list,
    # dict or scheduling is made for them (the lists left are the history, the trace,
    # the batch, the input queues, the inbox and the like: 10 lists and 4 dicts before).
    # No deque either: each holds a block of 64 slots from the start.
    assert _held_per_run(list) <= 9.5
    assert _held_per_run(dict) <= 3.5
    assert _held_per_run(deque) <= 0.5


@pytest.mark.timeout(30)
def test_a_run_waiting_for_its_model_holds_no_event_it_has_handled(collector_off: None) -> None:
    results: list[weakref.ref[sm.ToolOutput]] = []

    @sm.tool
    async def look(text: str) -> sm.ToolOutput:
        """Look it up."""
        output = sm.ToolOutput(text)
        results.append(weakref.ref(output))  # what the tool's ToolFinished carries
        return output

    async def main() -> list[bool]:
        second = _Waiting()
        calls = 0

        async def answer(messages: object, tools: object) -> sm.AssistantMessage:
            nonlocal calls
            calls += 1
            if calls == 1:
                return sm.AssistantMessage((sm.ToolCall("c1", "look", {"text": "hi"}),))
            return await second.complete(messages, tools, None)

        run = asyncio.ensure_future(
            sm.run_agent(model=FunctionModel(answer), tools=[look], messages="go")
        )
        await second.inside.wait()
        alive = [ref() is not None for ref in results]
        second.release.set()
        assert (await run).state is sm.TurnState.DONE
        return alive

    assert asyncio.run(main()) == [False]  # its result is in the history, as a message
