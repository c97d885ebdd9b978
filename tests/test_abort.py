"""AbortController and AbortSignal: a one-way, thread-safe latch with listeners."""

from __future__ import annotations

import threading

import pytest
from structlog.testing import capture_logs

import statemachine as sm


def test_a_new_signal_is_not_aborted() -> None:
    controller = sm.AbortController()
    assert controller.signal.aborted is False
    assert controller.signal.reason is None
    controller.signal.throw_if_aborted()  # does not raise


def test_abort_without_a_reason_gives_a_default_text() -> None:
    controller = sm.AbortController()
    controller.abort()
    assert controller.signal.aborted is True
    assert controller.signal.reason == "aborted by the caller"


def test_the_first_reason_is_kept() -> None:
    controller = sm.AbortController()
    controller.abort("user pressed stop")
    controller.abort("second")
    assert controller.signal.reason == "user pressed stop"


def test_the_controller_always_hands_out_the_same_signal() -> None:
    controller = sm.AbortController()
    assert controller.signal is controller.signal


def test_throw_if_aborted_raises_aborted_error_with_the_reason() -> None:
    controller = sm.AbortController()
    controller.abort("stop now")
    with pytest.raises(sm.AbortedError, match="Operation aborted: stop now"):
        controller.signal.throw_if_aborted()


def test_listeners_hear_the_reason_exactly_once() -> None:
    controller = sm.AbortController()
    heard: list[object] = []
    controller.signal.add_listener(heard.append)
    controller.abort("r1")
    controller.abort("r2")
    assert heard == ["r1"]


def test_a_listener_added_after_abort_is_called_at_once() -> None:
    controller = sm.AbortController()
    controller.abort("late")
    heard: list[object] = []
    remove = controller.signal.add_listener(heard.append)
    assert heard == ["late"]
    remove()  # a no-op, and safe


def test_a_removed_listener_is_not_called_and_removal_is_idempotent() -> None:
    controller = sm.AbortController()
    heard: list[object] = []
    kept: list[object] = []
    remove = controller.signal.add_listener(heard.append)
    controller.signal.add_listener(kept.append)
    remove()
    remove()
    controller.abort("x")
    assert heard == []
    assert kept == ["x"]


def test_a_listener_that_raises_does_not_silence_the_others() -> None:
    controller = sm.AbortController()
    heard: list[object] = []

    def broken(reason: object) -> None:
        raise RuntimeError("listener bug")

    controller.signal.add_listener(broken)
    controller.signal.add_listener(heard.append)
    with capture_logs() as logs:
        controller.abort("go")
    assert heard == ["go"]
    assert controller.signal.aborted
    assert [e["event"] for e in logs] == ["abort_listener_failed"]


def test_abort_from_another_thread_runs_listeners_in_that_thread() -> None:
    controller = sm.AbortController()
    threads: list[str] = []
    controller.signal.add_listener(lambda _: threads.append(threading.current_thread().name))
    worker = threading.Thread(target=controller.abort, args=("from ui",), name="ui-thread")
    worker.start()
    worker.join()
    assert controller.signal.aborted
    assert controller.signal.reason == "from ui"
    assert threads == ["ui-thread"]


def test_concurrent_aborts_fire_listeners_once() -> None:
    controller = sm.AbortController()
    heard: list[object] = []
    controller.signal.add_listener(heard.append)
    barrier = threading.Barrier(8)

    def hit(i: int) -> None:
        barrier.wait()
        controller.abort(f"thread {i}")

    workers = [threading.Thread(target=hit, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(heard) == 1
    assert heard[0] == controller.signal.reason


def test_repr_shows_state_and_reason() -> None:
    controller = sm.AbortController()
    assert repr(controller.signal) == "AbortSignal(aborted=False, reason=None)"
    controller.abort("why")
    assert repr(controller.signal) == "AbortSignal(aborted=True, reason='why')"
