"""Before a durable run ends it looks for messages without waiting (``_lane``): what the
looks take, and what its listener holds, is taken before the run ends, in the order it
was stored; a marker only for a backend that cannot look. First the lane's logic over
an in-memory backend (every case of a look, a message that would be lost without the
listener's check, a run taken back after a crash and its export), then the look on
DBOS, then a whole run whose listener is not woken in time (a notification poll of
five seconds): a steer stored just before the end still reaches the model, and the run
ends without waiting for the poll.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from dbos import DBOS

import statemachine as sm
from statemachine.core.tools import ToolDefinition
from statemachine.durable._dbos_control import TOPIC, Control, start_now
from statemachine.durable._lane import NOTHING, SYNC, ControlLane
from statemachine.durable.dbos import DBOSRunner
from statemachine.testing import FunctionModel

R = {"kind": "steer", "message": "r", "id": "r"}
M = {"kind": "follow_up", "message": "m", "id": "m"}
LATE = {"kind": "steer", "message": "late", "id": "late"}
POLL = 5.0  # DBOS's notification poll in the runs here: longer than a run takes


class _Lane(ControlLane):
    """The lane over an in-memory topic, as DBOS keeps it: a listener takes the oldest
    stored message when it starts and when the topic is polled (``poll``); a look takes
    the oldest one no listener took, and tells whether the listener holds a message.
    ``holds``: a message the listener takes just before the first look (it hands it
    over just after)."""

    def __init__(
        self,
        holds: Any = None,
        places: Sequence[Mapping[str, Any]] = (),
        answers: Sequence[tuple[Any, bool]] = (),
    ) -> None:
        super().__init__(places, 0)
        self.ops: list[str] = []  # the operations the run called, in order
        self.answers = list(answers)  # recorded looks: a run taken back after a crash
        self.topic: list[Any] = []
        self.listeners: list[asyncio.Future[Any]] = []
        self.places: list[tuple[int, Any]] = []
        self.sent: list[Any] = []
        self.looks = 0
        self.recorded: list[tuple[int, Mapping[str, Any]]] = []  # the places, and their ids
        self._holds, self._ops = holds, 0

    def poll(self) -> None:
        listener = self.listeners[-1] if self.listeners else None
        if listener is not None and not listener.done() and self.topic:
            listener.set_result(self.topic.pop(0))

    def pending(self) -> int:
        return sum(not f.done() for f in self.listeners)

    def _listen(self) -> asyncio.Future[Any]:
        self.ops.append("listen")
        self._ops += 2
        listener = asyncio.get_running_loop().create_future()
        self.listeners.append(listener)
        asyncio.get_running_loop().call_soon(self.poll)  # a recv looks when it starts
        return listener

    def _reserve(self) -> Any:
        self.ops.append("reserve")
        self._ops += 1
        return self._ops

    async def _record_place(self, place: Any, record: Mapping[str, Any]) -> None:
        self.places.append((record["at"], record["message"]))
        self.recorded.append((place, record))

    async def _publish(self, key: str, value: Any) -> None:
        self.ops.append(f"publish {value}")

    async def _send(self, marker: Mapping[str, Any]) -> None:
        self.sent.append(marker)
        self.topic.append(marker)
        asyncio.get_running_loop().call_soon(self.poll)

    def _next_operation(self) -> int:
        return self._ops

    async def _look(self, listening_since: int | None) -> tuple[Any, bool] | None:
        self.looks += 1
        self.ops.append("look")
        if self.answers:
            return self.answers.pop(0)
        listener = self.listeners[-1]
        if self._holds is not None:  # taken by the listener before the look's recv ran
            holds, self._holds = self._holds, None
            asyncio.get_running_loop().call_soon(listener.set_result, holds)
            return (self.topic.pop(0) if self.topic else None), True
        holds = listening_since is not None and listener.done()
        return (self.topic.pop(0) if self.topic else None), holds


class _Blind(_Lane):
    """A backend that cannot look: a marker is sent."""

    async def _look(self, listening_since: int | None) -> tuple[Any, bool] | None:
        return None


class _Deaf(_Lane):
    """Listens to nothing: the messages are the recorded ones (as an export)."""

    def start(self) -> None:
        pass


async def _started(lane: _Lane, *stored: Any) -> _Lane:
    """``lane`` listening, then ``stored`` stored: a poll would wake the listener."""
    lane.start()
    await asyncio.sleep(0)  # the listener's own first look
    lane.topic.extend(stored)
    return lane


def _texts(message: sm.Message) -> list[str]:
    return [b.text for b in getattr(message, "content", ()) if isinstance(b, sm.TextContent)]


@pytest.mark.timeout(10)
def test_nothing_stored_the_run_ends_at_once_without_a_marker() -> None:
    async def body() -> None:
        lane = await _started(_Lane())
        assert await lane.drain() == []
        assert lane.looks == 1
        assert lane.sent == []
        assert lane.places == []
        assert lane.synced()

    asyncio.run(body())


@pytest.mark.timeout(10)
def test_what_looks_take_is_taken_before_the_run_ends_without_a_poll() -> None:
    async def body() -> None:
        lane = await _started(_Lane(), M, LATE)
        assert await lane.drain() == [M, LATE]  # never polled: the looks took them
        assert lane.places == [(0, M), (0, LATE)]
        assert lane.looks == 3
        assert lane.sent == []
        assert lane.pending() == 1  # the listener kept listening: one at a time

    asyncio.run(body())


@pytest.mark.timeout(10)
def test_a_message_the_listener_holds_is_not_lost() -> None:
    """The look's recv found nothing, but only because the listener had just taken the
    message: without the listener's check the run would end without it."""

    async def body() -> None:
        lane = await _started(_Lane(holds=R))
        assert await lane.drain() == [R]
        assert lane.sent == []

    asyncio.run(body())


@pytest.mark.timeout(10)
def test_the_listeners_message_goes_before_the_looks_the_older_first() -> None:
    async def body() -> None:
        lane = await _started(_Lane(holds=R), M, LATE)
        assert await lane.drain() == [R, M, LATE]
        assert [m for _, m in lane.places] == [R, M, LATE]

    asyncio.run(body())


@pytest.mark.timeout(10)
def test_before_a_final_answer_a_looked_input_is_due_next_and_the_run_goes_on() -> None:
    async def body() -> None:
        lane = await _started(_Lane(), M)
        lane.handled = 7
        await lane.sync()
        assert lane.closed
        assert not lane.synced()  # the looked message first
        assert await lane.due() == M
        assert lane.places == [(7, M)]
        assert not lane.closed  # input came: the run goes on, open again
        assert lane.synced()

    asyncio.run(body())


async def _to_the_end(lane: _Lane, stored: Sequence[Any]) -> list[Any]:
    """A run's last turn over ``lane``: the model is called after 3 events (the run
    waits for it, taking what is due), ``stored`` is stored meanwhile, the final answer
    comes: the run syncs and takes what is due until synced; what it took."""
    lane.start()
    await asyncio.sleep(0)
    lane.handled = 3
    taken = [m for m in [await lane.due()] if m is not NOTHING]  # waiting for the model
    lane.topic.extend(stored)
    await lane.sync()  # the final answer came
    for _ in range(100):
        if lane.synced():
            return taken
        message = await lane.due()
        if message is NOTHING:
            await asyncio.sleep(0)  # the listener's message is on its way
        else:
            taken.append(message)
    raise AssertionError("the run did not take what it held")


@pytest.mark.timeout(10)
def test_a_run_taken_back_takes_what_its_end_took_at_its_end_with_the_same_operations() -> None:
    """After a crash the recorded places are taken again at the same point: a message
    the run took while ending is taken once it is ending again, not as soon as the run
    has been handed as many events (it then waits for the model), which would call the
    operations in another order (on DBOS, the run would no longer fit its records)."""

    async def body() -> None:
        first = _Lane(holds=R)
        looks: list[tuple[Any, bool]] = []
        look = first._look

        async def recording(listening_since: int | None) -> tuple[Any, bool] | None:
            found = await look(listening_since)
            assert found is not None
            looks.append(found)
            return found

        first._look = recording  # type: ignore[method-assign]
        assert await _to_the_end(first, [M]) == [R, M]
        assert [r["ending"] for _, r in first.recorded] == [True, True]
        again = _Lane(places=_by_id(first.recorded), answers=looks)
        assert await _to_the_end(again, []) == [R, M]
        assert again.ops == first.ops
        # An export runs the run's course again over its records, listening to nothing.
        export = _Deaf(places=_by_id(first.recorded), answers=looks)
        assert await _to_the_end(export, []) == [R, M]

    asyncio.run(body())


def _by_id(recorded: Sequence[tuple[int, Mapping[str, Any]]]) -> list[Mapping[str, Any]]:
    """The places as a backend lists them: by the ids drawn for them."""
    return [record for _, record in sorted(recorded, key=lambda r: r[0])]


async def _two_ends(lane: _Lane, answers: bool = False) -> list[Any]:
    """Two final answers: at the first a look finds a follow-up (the run goes on); at
    the second the listener holds ``R``, drawn its place when the run began, and the
    look finds ``M``. What the run took."""
    lane.start()
    await asyncio.sleep(0)
    lane.handled = 4
    taken: list[Any] = []
    for stored, at in (([LATE] if not answers else [], 4), ([M] if not answers else [], 6)):
        lane.handled = at
        lane.topic.extend(stored)
        await lane.sync()
        for _ in range(100):
            if lane.synced():
                break
            message = await lane.due()
            if message is NOTHING:
                await asyncio.sleep(0)
            else:
                taken.append(message)
    return taken


@pytest.mark.timeout(10)
def test_a_run_taken_back_takes_its_messages_in_the_order_it_took_them_not_their_ids() -> None:
    """The listener's place is drawn when it starts, a look's when it finds a message:
    a look's message can be taken first and have the larger id. Taken back in the
    order of the ids, the run would wait for the listener's message before the look's,
    and never take either."""

    async def body() -> None:
        first = _Lane()
        first._holds = None
        looks: list[tuple[Any, bool]] = []
        look = first._look

        async def recording(listening_since: int | None) -> tuple[Any, bool] | None:
            if len(looks) == 1:  # the second end: the listener has just taken R
                first._holds = R
            found = await look(listening_since)
            assert found is not None
            looks.append(found)
            return found

        first._look = recording  # type: ignore[method-assign]
        assert await _two_ends(first) == [LATE, R, M]
        ids = [place for place, _ in first.recorded]
        assert ids != sorted(ids)  # R's place was drawn first, taken second
        again = _Lane(places=_by_id(first.recorded), answers=looks)
        assert await _two_ends(again, answers=True) == [LATE, R, M]
        assert again.ops == first.ops

    asyncio.run(body())


@pytest.mark.timeout(10)
def test_after_a_looked_abort_the_listener_is_kept_and_its_message_waits_for_the_end() -> None:
    async def body() -> None:
        lane = await _started(_Lane(), {"kind": "abort", "reason": "stop"})
        await lane.sync()
        assert (await lane.due())["kind"] == "abort"
        assert lane.stopped
        assert lane.synced()
        lane.topic.append(LATE)
        lane.poll()  # the listener takes it; not taken after an abort
        assert await lane.due() is NOTHING
        assert lane.pending() == 0
        assert await lane.drain() == [LATE]  # queued input, not lost
        assert lane.pending() == 1
        assert len(lane.listeners) == 2  # one after the other, never two at once

    asyncio.run(body())


@pytest.mark.timeout(10)
def test_a_backend_that_cannot_look_sends_a_marker_and_takes_what_was_stored_before_it() -> None:
    async def body() -> None:
        lane = await _started(_Blind(), M)
        assert await lane.drain() == [M]
        assert [m["kind"] for m in lane.sent] == [SYNC]

    asyncio.run(body())


# -- a turn boundary: catching up, still open ------------------------------------------------

# A script of what happens around a run that is not ending: messages stored (each
# numbered), the listener woken by a poll, the run taking what is due while it waits
# for an operation, and an engine event handed over (which may end the turn).
_boundary_steps = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(1, 3)),
        st.just(("poll", 0)),
        st.just(("take", 0)),
        st.just(("event", 0)),
    ),
    max_size=25,
)


async def _hand_event(lane: _Lane, taken: list[Any]) -> None:
    """As the DBOS inbox does before it hands the engine an event that is no final
    answer: what is due first, and the event once ``catch_up`` says it may go."""
    for _ in range(1000):
        message = await lane.due()
        if message is not NOTHING:
            taken.append(message)
            lane.handled += 1  # the message's own event
        elif not lane.catching_up:
            if await lane.catch_up():
                lane.handled += 1
                return
        else:
            await asyncio.sleep(0)  # the listener's message is on its way
    raise AssertionError("the event was never handed over")


async def _take_due(lane: _Lane, taken: list[Any]) -> None:
    while (message := await lane.due()) is not NOTHING:
        taken.append(message)
        lane.handled += 1


async def _boundary_run(
    lane: _Lane, steps: Sequence[tuple[str, int]], replay: bool = False
) -> list[Any]:
    """``steps`` over ``lane``; checks, at each event, that once input came since the
    last one every message stored before it was taken first, in the order stored.
    ``replay``: nothing is stored (the run taken back takes its recorded places)."""
    stored: list[Any] = []
    taken: list[Any] = []
    lane.start()
    await asyncio.sleep(0)
    taken_by_last_event = 0
    for step, count in steps:
        if step == "store" and not replay:
            for _ in range(count):
                stored.append({"kind": "steer", "message": f"s{len(stored)}"})
                lane.topic.append(stored[-1])
        elif step == "poll" and not replay:
            lane.poll()
            await asyncio.sleep(0)
        elif step == "take":
            await _take_due(lane, taken)
        elif step == "event":
            await _hand_event(lane, taken)
            if not replay:
                assert taken == stored[: len(taken)]  # each once, in the order stored
                if len(taken) > taken_by_last_event:
                    assert taken == stored, "a message stored during the turn was left"
            taken_by_last_event = len(taken)
    return taken


class _Unseeing(_Lane):
    """A lane that never catches up: the event goes as soon as it comes."""

    async def catch_up(self) -> bool:
        return True


def _check_boundaries(lane_type: type[_Lane], steps: Sequence[tuple[str, int]]) -> None:
    async def body() -> None:
        first = lane_type()
        looks: list[tuple[Any, bool]] = []
        look = first._look

        async def recording(listening_since: int | None) -> tuple[Any, bool] | None:
            found = await look(listening_since)
            assert found is not None
            looks.append(found)
            return found

        first._look = recording  # type: ignore[method-assign]
        taken = await _boundary_run(first, steps)
        # Taken back after a crash: the same places, looks and operations.
        again = lane_type(places=_by_id(first.recorded), answers=looks)
        assert await _boundary_run(again, steps, replay=True) == taken
        assert again.ops == first.ops

    asyncio.run(body())


@pytest.mark.timeout(60)
@settings(max_examples=200, deadline=None, database=None)
@given(steps=_boundary_steps)
def test_every_message_stored_during_a_turn_is_taken_before_its_next_event(
    steps: list[tuple[str, int]],
) -> None:
    _check_boundaries(_Lane, steps)


@pytest.mark.timeout(60)
def test_the_boundary_property_catches_a_lane_that_does_not_catch_up() -> None:
    @settings(
        max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(steps=_boundary_steps)
    def check(steps: list[tuple[str, int]]) -> None:
        _check_boundaries(_Unseeing, steps)

    with pytest.raises(AssertionError, match="stored during the turn was left"):
        check()


@pytest.mark.timeout(10)
def test_a_run_that_took_a_message_under_an_older_version_does_not_catch_up() -> None:
    """Its records lack ``catches_up``: taken back, it must call the operations it
    called then, with no look before the event after the message."""

    async def body() -> tuple[list[str], list[str]]:
        ops = []
        for catches_up in (False, True):
            place = {"at": 0, "message": R, "ending": False, "n": 0}
            lane = _Lane(places=[{**place, "catches_up": True} if catches_up else place])
            lane.start()
            await asyncio.sleep(0)
            await _hand_event(lane, [])
            ops.append(lane.ops)
        return ops[0], ops[1]

    older, newer = asyncio.run(body())
    assert "look" not in older
    assert newer[-1] == "look"


# -- on DBOS --------------------------------------------------------------------------------------


def _runner(tmp_path: Path, model: FunctionModel, tools: Sequence[Any] = ()) -> DBOSRunner:
    return DBOSRunner(
        models={"m": model},
        tools=list(tools),
        database_url=f"sqlite:///{tmp_path}/runs.sqlite",
        notification_interval=POLL,  # the listener is not woken by a poll here
    )


async def _probe(send_first: bool, wait_listener: bool) -> dict[str, Any]:
    """A workflow with the lane's listener, then a look."""
    control = Control([])
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    if send_first:  # stored before the listener starts: its recv takes it at once
        await DBOS.send_async(workflow_id, R, TOPIC)
    control.start()
    if not send_first:  # stored once the listener waits: only a poll would wake it
        await _listener_waits(workflow_id, control._listening_since)
        await DBOS.send_async(workflow_id, M, TOPIC)
    recv = control._recv
    assert recv is not None
    if wait_listener:
        await asyncio.wait_for(asyncio.shield(recv), 10)
    found, holds = await control._look(control._listening_since)
    await control.close()
    return {"found": found, "holds": holds}


async def _listener_waits(workflow_id: str, listening_since: int) -> None:
    """Until the listener's recv waits: it records its deadline once it has looked for
    a stored message (else it could see the message stored next, and be woken)."""
    deadline = listening_since + 2  # its recv, then its deadline
    for _ in range(500):
        steps = await DBOS.list_workflow_steps_async(workflow_id, load_output=False)
        if any(s["function_id"] == deadline for s in steps):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the listener never started waiting")


@pytest.mark.timeout(60)
def test_on_dbos_a_look_takes_what_no_listener_took_and_sees_what_the_listener_holds(
    tmp_path: Path,
) -> None:
    probe = DBOS.workflow(name="tests.look_probe")(_probe)

    async def body() -> list[dict[str, Any]]:
        runner = _runner(tmp_path, FunctionModel(lambda m, t: sm.AssistantMessage("x")))
        runner.launch()
        try:
            found = []
            for i, args in enumerate([(False, False), (True, True)]):
                handle = await start_now(_start(probe, f"probe{i}", *args))
                found.append(await handle.get_result())
            return found
        finally:
            runner.destroy()

    stored_after, held = asyncio.run(body())
    assert stored_after == {"found": M, "holds": False}  # the listener never saw it
    assert held == {"found": None, "holds": True}  # the listener took it: the run must wait


async def _start(probe: Any, workflow_id: str, *args: Any) -> Any:
    from dbos import SetWorkflowID

    with SetWorkflowID(workflow_id):
        return await DBOS.start_workflow_async(probe, *args)


@pytest.mark.timeout(60)
def test_a_steer_stored_just_before_the_end_reaches_the_model_without_waiting_for_a_poll(
    tmp_path: Path,
) -> None:
    """The tool steers its own run: stored while the run is open (acknowledged), after
    the listener started, which no poll wakes in time. The look takes it
    before the final answer, so the model hears it, and nothing waits for the poll."""
    handles: dict[str, Any] = {}

    @sm.tool
    async def steer_me() -> str:
        """Steer the run."""
        await handles["run"].steer("heard me")
        return "sent"

    def model(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> Any:
        said = [t for m in messages if isinstance(m, sm.UserMessage) for t in _texts(m)]
        if not any(isinstance(m, sm.AssistantMessage) for m in messages):
            return sm.AssistantMessage([sm.ToolCall("c1", "steer_me", {})])
        return sm.AssistantMessage(f"said: {' / '.join(str(s) for s in said)}")

    async def body() -> tuple[sm.RunResult, float]:
        runner = _runner(tmp_path, FunctionModel(model), [steer_me])
        runner.launch()
        try:
            began = time.monotonic()
            handles["run"] = await runner.start("steered", model="m", messages="go")
            result = await handles["run"].result(timeout=30)
            return result, time.monotonic() - began
        finally:
            runner.destroy()

    result, took = asyncio.run(body())
    assert result.ok, result
    assert _texts(result.messages[-1]) == ["said: go / heard me"]  # before the final answer
    assert result.queued_input == ()
    assert took < POLL  # the poll was not waited for
