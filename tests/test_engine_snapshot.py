"""Snapshots that come from outside: checked against themselves, bounded, optionally
signed; resume asks the policy again and refuses missing tools.

The property tests draw snapshots from real runs (suspended for approvals, suspended
by a policy denial, and engines resting in every other state), damage them (typed
garbage anywhere, or edits that a person trying to run something would make) and
check that restore refuses with ``SnapshotError`` or the run that follows does
nothing it should not. Each property is also run against a restore whose checks are
switched off, to show that it catches what the checks are there for.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import statemachine as sm
import statemachine.engine
import statemachine.errors
from statemachine.agent import resume as _driver
from statemachine.core import engine as engine_module
from statemachine.core import snapshot as snapshot_module
from statemachine.core.engine import Engine
from statemachine.testing._reference import verify_transition

S = sm.TurnState
Snapshot = dict[str, Any]

# -- real runs to draw snapshots from ----------------------------------------------------------


def policy(call: sm.ToolCall) -> sm.Deny | sm.RequireApproval | None:
    """The runs' before_tool_call: ``rm`` needs a person, ``drop`` is denied."""
    name = call.arguments.get("name") if call.name == "act" else None
    if name == "rm":
        return sm.RequireApproval("deletes data")
    if name == "drop":
        return sm.Deny("drops the database")
    return None


class Recorder:
    """Tools and a model for one run, recording every call that ran and every model call."""

    def __init__(self, *responses: sm.AssistantMessage) -> None:
        self.ran: list[sm.ToolCall] = []
        self.responses = list(responses)
        self.model_calls = 0
        ran = self.ran

        @sm.tool
        def act(name: str) -> str:
            """Act on a name."""
            call = sm.current_tool_call()
            assert call is not None
            ran.append(call)
            return f"did {name}"

        @sm.tool(sequential=True)
        def barrier() -> str:
            """Runs alone."""
            call = sm.current_tool_call()
            assert call is not None
            ran.append(call)
            return "barrier passed"

        self.tools = [act, barrier]

    async def complete(
        self,
        messages: Sequence[sm.Message],
        tools: Sequence[sm.ToolDefinition],
        signal: sm.AbortSignal,
    ) -> sm.AssistantMessage:
        self.model_calls += 1
        return self.responses.pop(0) if self.responses else sm.AssistantMessage("done")


def _resume_is_refused(snap: dict[str, Any], error: type[Exception], match: str) -> None:
    """Resuming ``snap`` (approving 'b' under ``policy``) raises, and nothing ran."""
    recorder = Recorder()
    with pytest.raises(error, match=match):
        asyncio.run(
            sm.resume_agent(
                snap,
                model=recorder,
                tools=recorder.tools,
                approvals={"b": True},
                before_tool_call=policy,
            )
        )
    assert recorder.ran == []
    assert recorder.model_calls == 0


def act(call_id: str, name: str) -> sm.ToolCall:
    return sm.ToolCall(call_id, "act", {"name": name})


SUSPENDED_BATCHES: dict[str, tuple[sm.ToolCall, ...]] = {
    "approval": (act("a", "ls"), act("b", "rm"), act("c", "cat")),
    # d is denied by policy, its result held back behind b's
    "held-denial": (act("b", "rm"), act("d", "drop"), act("c", "cat")),
    # s and c are permitted but held back behind b by the barrier
    "held-barrier": (act("b", "rm"), sm.ToolCall("s", "barrier", {}), act("c", "cat")),
    "two-approvals": (act("b", "rm"), act("e", "rm"), act("c", "cat")),
    # AwaitingUser because of the denial, nothing pending
    "denial-only": (act("d", "drop"),),
}


def _json(data: object) -> Snapshot:
    loaded: Snapshot = json.loads(json.dumps(data))
    return loaded


@functools.cache
def suspended_snapshot(name: str) -> str:
    """The snapshot (as JSON text) of a real driver run suspended in AwaitingUser."""
    recorder = Recorder(sm.AssistantMessage(SUSPENDED_BATCHES[name], stop_reason="toolUse"))
    result = sm.run_agent_sync(
        model=recorder,
        tools=recorder.tools,
        messages=[sm.UserMessage("go")],
        before_tool_call=policy,
        run_id=name,
    )
    assert result.state is S.AWAITING_USER, result.explanation
    return json.dumps(result.snapshot)


ECHO = sm.ToolDefinition(
    "echo", "Echo", {"type": "object", "properties": {"text": {"type": "string"}}}
)


def _engine(**kwargs: Any) -> Engine:
    """An engine whose every transition is checked against the reference machine."""
    options: dict[str, Any] = {
        "tools": [ECHO],
        "messages": [sm.UserMessage("go")],
        "max_turns": 3,
        "transition_hook": verify_transition,
    }
    return Engine(**{**options, **kwargs})


def _ask(*ids: str) -> sm.engine.ModelResponded:
    calls = tuple(sm.ToolCall(i, "echo", {"text": i}) for i in ids)
    return sm.engine.ModelResponded(sm.AssistantMessage(calls, stop_reason="toolUse"))


def _resting_engines() -> Iterator[tuple[str, Engine]]:
    e = _engine()
    e.handle(sm.engine.InputQueued(sm.UserMessage("later"), sm.engine.InputKind.FOLLOW_UP))
    yield "ready-with-input", e
    e = _engine(check_permissions=True)
    e.handle(sm.engine.Start())
    e.handle(_ask("p", "q", "r"))
    e.handle(sm.engine.ToolPermitted("p"))
    e.handle(sm.engine.ApprovalRequired("q", "why"))
    yield "dispatching", e
    e = _engine(check_permissions=True)
    e.handle(sm.engine.Start())
    e.handle(_ask("p", "q"))
    e.handle(sm.engine.ApprovalRequired("p", "why"))
    e.handle(sm.engine.ApprovalRequired("q", "why"))
    e.handle(sm.engine.ApprovalDecided("p", True))
    yield "mid-approval", e  # p is ready, approved by a person, while q still waits
    e = _engine(check_continue=True)
    e.handle(sm.engine.Start())
    e.handle(_ask("p"))
    e.handle(sm.engine.ToolFinished("p", sm.ToolOutput("ok")))
    yield "turn-boundary", e
    e = _engine()
    e.handle(sm.engine.Start())
    e.handle(sm.engine.ModelResponded(sm.AssistantMessage("answer")))
    yield "done", e
    e = _engine()
    e.handle(sm.engine.Start())
    e.handle(_ask("p", "q"))
    e.handle(sm.engine.AbortRequested("stop"))
    e.handle(sm.engine.ToolCancelled("p", "stop"))
    e.handle(sm.engine.ToolFinished("q", sm.ToolOutput("late")))
    yield "aborted", e
    e = _engine()
    e.handle(sm.engine.Start())
    e.handle(sm.engine.ModelFailed("boom"))
    yield "failed", e
    e = _engine(max_turns=1)
    e.handle(sm.engine.Start())
    e.handle(_ask("p"))
    e.handle(sm.engine.ToolFinished("p", sm.ToolOutput("ok")))
    yield "turn-limit", e


@functools.cache
def resting_snapshots() -> dict[str, str]:
    return {name: json.dumps(e.snapshot()) for name, e in _resting_engines()}


def all_snapshots() -> dict[str, str]:
    return {**{n: suspended_snapshot(n) for n in SUSPENDED_BATCHES}, **resting_snapshots()}


def test_every_source_snapshot_restores_and_round_trips() -> None:
    for name, text in all_snapshots().items():
        data = json.loads(text)
        restored = Engine.restore(data)
        assert restored.snapshot() == data, name


# -- edits a person would make, each refused, naming the field --------------------------------


def _batch_index(snap: Snapshot, call_id: str) -> int:
    return next(i for i, s in enumerate(snap["batch"]) if s["call"]["id"] == call_id)


def _last_assistant(snap: Snapshot) -> dict[str, Any]:
    found: dict[str, Any] = next(m for m in reversed(snap["messages"]) if m["role"] == "assistant")
    return found


def _set_args_in_batch(snap: Snapshot) -> None:
    snap["batch"][_batch_index(snap, "b")]["call"]["arguments"] = {"name": "ls"}


def _set_name_in_batch(snap: Snapshot) -> None:
    snap["batch"][_batch_index(snap, "b")]["call"]["name"] = "barrier"


def _set_id_in_batch(snap: Snapshot) -> None:
    snap["batch"][_batch_index(snap, "b")]["call"]["id"] = "zz"


def _add_call_to_batch(snap: Snapshot) -> None:
    extra = copy.deepcopy(snap["batch"][_batch_index(snap, "b")])
    extra["call"]["id"] = "x"
    extra["call"]["arguments"] = {"name": "drop"}
    snap["batch"].append(extra)


def _json_true_for_one(snap: Snapshot) -> None:
    # 1 == True in Python: the check must compare JSON, not Python values.
    for item in (snap["batch"][0]["call"], _last_assistant(snap)["content"][0]):
        item["arguments"] = {"name": 1}
    snap["batch"][0]["call"]["arguments"] = {"name": True}


def _flushed_off(snap: Snapshot) -> None:
    snap["flushed"] += 1


def _turns_off(snap: Snapshot) -> None:
    snap["turns"] = 5


def _trace_off(snap: Snapshot) -> None:
    snap["trace"][-1][2] = "Done"


def _queue_assistant(snap: Snapshot) -> None:
    snap["steer"].append({"role": "assistant", "content": [], "stopReason": "stop"})


def _waiting_permission(snap: Snapshot) -> None:
    snap["batch"][_batch_index(snap, "b")]["status"] = "waiting-permission"


def _drop_held_result(snap: Snapshot) -> None:
    snap["batch"][_batch_index(snap, "c")]["result"] = None


TAMPERING: list[tuple[str, Callable[[Snapshot], None], str]] = [
    ("approval", _set_args_in_batch, r"snapshot\.batch\[1\]\.call: differs"),
    ("approval", _set_name_in_batch, r"snapshot\.batch\[1\]\.call: differs"),
    ("approval", _set_id_in_batch, r"snapshot\.batch\[1\]\.call: differs"),
    ("approval", _add_call_to_batch, r"snapshot\.batch: holds 4 call\(s\)"),
    ("approval", _json_true_for_one, r"snapshot\.batch\[0\]\.call: differs"),
    ("approval", _flushed_off, r"snapshot\.flushed"),
    ("approval", _turns_off, r"snapshot\.turns: 5, but the trace shows 1"),
    ("approval", _trace_off, r"snapshot\.trace\[\d+\]: .* is not a row"),
    ("approval", _queue_assistant, r"snapshot\.steer\[0\]: queued input must be a user"),
    ("approval", _waiting_permission, r"snapshot\.batch\[1\]\.status: 'waiting-permission'"),
    ("approval", _drop_held_result, r"snapshot\.batch\[2\]\.result: missing"),
    ("approval", lambda s: s.update(state="CollectingResults"), r"snapshot\.state"),
    ("approval", lambda s: s.update(denial={"callId": "q", "reason": "x"}), r"denial\.callId"),
    ("approval", lambda s: s.update(extra=1), r"snapshot: unknown key\(s\) 'extra'"),
    ("approval", lambda s: s.pop("batch"), r"snapshot\.batch: missing"),
    ("approval", lambda s: s.update(maxTurns="8"), r"snapshot\.maxTurns: expected an integer"),
    ("approval", lambda s: s.update(checkContinue=1), r"snapshot\.checkContinue: expected true"),
    ("approval", lambda s: s["batch"][0].update(status="running"), r"batch\[0\]\.status"),
    ("approval", lambda s: s.update(version=99), r"snapshot\.version: 99 is not 1"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("base", "damage", "field"), TAMPERING)
def test_a_tampered_snapshot_is_refused_naming_the_field(
    base: str, damage: Callable[[Snapshot], None], field: str
) -> None:
    snap = json.loads(suspended_snapshot(base))
    damage(snap)
    with pytest.raises(sm.errors.SnapshotError, match=field):
        Engine.restore(snap)


@pytest.mark.timeout(30)
def test_a_refused_snapshot_runs_nothing() -> None:
    snap = json.loads(suspended_snapshot("approval"))
    _set_args_in_batch(snap)
    _resume_is_refused(snap, sm.errors.SnapshotError, r"batch\[1\]\.call")


# -- malformed input: always SnapshotError, never a crash ----------------------------------------


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("snapshot", "field"),
    [
        (None, r"snapshot: expected a JSON object"),
        ([], r"snapshot: expected a JSON object"),
        ("{}", r"snapshot: expected a JSON object"),
        ({}, r"snapshot\.version: missing"),
        ({"version": 1, "tools": {1: 2}}, r"snapshot\.tools: object key 1"),
        ({"version": 1, "tools": {1, 2}}, r"snapshot\.tools: a set is not a JSON value"),
        ({"version": float("nan")}, r"snapshot\.version: nan is not a JSON number"),
        ({"version": 1, "trace": _nested(100_000)}, r"snapshot\.trace(\[0\])+: nested deeper"),
    ],
)
def test_malformed_snapshots_are_refused_naming_the_field(snapshot: Any, field: str) -> None:
    with pytest.raises(sm.errors.SnapshotError, match=field):
        Engine.restore(snapshot)


@pytest.mark.timeout(30)
def test_deep_arguments_and_cycles_are_refused_without_recursion() -> None:
    snap = json.loads(suspended_snapshot("approval"))
    snap["batch"][1]["call"]["arguments"] = {"name": _nested(10_000)}
    with pytest.raises(sm.errors.SnapshotError, match=r"snapshot\.batch\[1\]\.call\.arguments"):
        Engine.restore(snap)
    cycle: list[Any] = []
    cycle.append(cycle)
    snap = json.loads(suspended_snapshot("approval"))
    snap["steer"] = cycle
    with pytest.raises(sm.errors.SnapshotError, match="nested deeper than 64 levels"):
        Engine.restore(snap)


@pytest.mark.timeout(30)
def test_size_and_depth_limits_have_defaults_and_can_be_set() -> None:
    snap = json.loads(suspended_snapshot("approval"))
    assert engine_module.DEFAULT_MAX_SNAPSHOT_BYTES == 32 * 1024 * 1024
    assert engine_module.DEFAULT_MAX_SNAPSHOT_DEPTH == 64
    with pytest.raises(sm.errors.SnapshotError, match="larger than max_bytes=1000"):
        Engine.restore(snap, max_bytes=1000)
    with pytest.raises(sm.errors.SnapshotError, match="nested deeper than 3 levels"):
        Engine.restore(snap, max_depth=3)
    snap["messages"][0]["content"][0]["text"] = "x" * (engine_module.DEFAULT_MAX_SNAPSHOT_BYTES)
    with pytest.raises(sm.errors.SnapshotError, match="larger than max_bytes"):
        Engine.restore(snap)


# -- mutations: garbage anywhere, or edits with intent -----------------------------------------

GARBAGE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 10**20)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["ready", "done", "waiting-approval", "AwaitingUser", "b", "act"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


@st.composite
def garbage_edit(draw: st.DrawFn, snap: Snapshot) -> str:
    path = draw(st.sampled_from(list(_paths(snap))[1:]))
    parent, key = _at(snap, path[:-1]), path[-1]
    how = draw(st.sampled_from(["replace", "delete", "add-key"]))
    if how == "delete":
        del parent[key]
    elif how == "add-key" and isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=6))] = draw(GARBAGE)
    else:
        parent[key] = draw(GARBAGE)
    return f"{how} {path}"


INTENTS = [
    "args-in-batch",
    "args-in-both",
    "name-in-batch",
    "id-in-batch",
    "status",
    "status-and-barrier",
    "extra-call",
    "extra-call-in-both",
    "remove-call",
    "flushed",
    "denial-none",
]
STATUSES = ["ready", "waiting-approval", "waiting-permission", "done", "running"]


def _random_call(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(["ls", "rm", "drop", "cat"]))
    return {
        "type": "toolCall",
        "id": draw(st.sampled_from(["b", "c", "d", "x"])),
        "name": "act",
        "arguments": {"name": name},
    }


@st.composite
def intended_edit(draw: st.DrawFn, snap: Snapshot, intents: Sequence[str]) -> str:
    """An edit that tries to make something run: other arguments, another status, a
    call the model never made."""
    batch = snap["batch"]
    intent = draw(st.sampled_from(intents))
    if not batch:
        snap["flushed"] = draw(st.integers(0, 2))
        return "flushed on an empty batch"
    i = draw(st.integers(0, len(batch) - 1))
    slot = batch[i]
    calls = [b for b in _last_assistant(snap)["content"] if b["type"] == "toolCall"]
    if len(calls) != len(batch):  # an earlier edit added or removed a call
        calls += [copy.deepcopy(s["call"]) for s in batch[len(calls) :]]
    new_args = {"name": draw(st.sampled_from(["ls", "rm", "drop", 1, True]))}
    if intent == "args-in-batch":
        slot["call"]["arguments"] = new_args
    elif intent == "args-in-both":
        slot["call"]["arguments"] = new_args
        calls[i]["arguments"] = copy.deepcopy(new_args)
    elif intent == "name-in-batch":
        slot["call"]["name"] = draw(st.sampled_from(["barrier", "act", "missing"]))
    elif intent == "id-in-batch":
        slot["call"]["id"] = draw(st.sampled_from(["b", "c", "d", "x"]))
    elif intent in ("status", "status-and-barrier"):
        slot["status"] = draw(st.sampled_from(STATUSES))
        if draw(st.booleans()):
            slot["result"] = None
        if intent == "status-and-barrier":
            slot["sequential"] = True
            snap["denial"] = None
    elif intent in ("extra-call", "extra-call-in-both"):
        call = _random_call(draw)
        extra = {
            "call": call,
            "status": draw(st.sampled_from(STATUSES[:3])),
            "sequential": draw(st.booleans()),
            "resources": [],
            "note": "",
            "result": None,
        }
        at = draw(st.integers(0, len(batch)))
        batch.insert(at, extra)
        if intent == "extra-call-in-both":
            content = _last_assistant(snap)["content"]
            known = at < len(calls) and calls[at] in content
            where = content.index(calls[at]) if known else len(content)
            content.insert(where, copy.deepcopy(call))
    elif intent == "remove-call":
        del batch[i]
    elif intent == "flushed":
        snap["flushed"] = draw(st.integers(0, len(batch) + 1))
    else:
        snap["denial"] = None
    return f"{intent} at batch[{i}]"


@st.composite
def damaged(
    draw: st.DrawFn, names: Sequence[str], intents: Sequence[str] = ()
) -> tuple[str, Snapshot, list[str]]:
    """A snapshot from a real run with one to three edits; with ``intents``, only
    intended edits of those kinds."""
    name = draw(st.sampled_from(sorted(names)))
    snap: Snapshot = json.loads(all_snapshots()[name])
    done = []
    # Intended edits first: they read the snapshot's structure, which garbage may break.
    for _ in range(draw(st.integers(0 if not intents else 1, 3))):
        done.append(draw(intended_edit(snap, intents or INTENTS)))
    for _ in range(0 if intents else draw(st.integers(0 if done else 1, 2))):
        done.append(draw(garbage_edit(snap)))
    return name, snap, done


def _call_key(call: sm.ToolCall) -> str:
    return json.dumps([call.id, call.name, dict(call.arguments)], sort_keys=True)


def _history_calls(messages: Sequence[sm.Message]) -> set[str]:
    return {
        _call_key(c) for m in messages if isinstance(m, sm.AssistantMessage) for c in m.tool_calls
    }


# -- the engine alone: refuse, or start only calls the history shows ---------------------------


def restore_property(case: tuple[str, Snapshot, list[str]]) -> None:
    _, snap, _ = case
    refused: sm.errors.SnapshotError | None = None
    try:
        engine = Engine.restore(snap)
    except sm.errors.SnapshotError as exc:
        refused = exc
    if refused is not None:
        text = str(refused)
        assert text.startswith("snapshot"), f"the error names no field: {text}"
        assert "malformed (" not in text, f"a field escaped the typed readers: {text}"
        return
    history = _history_calls(engine.messages)
    started: list[sm.ToolCall] = []
    waiting = engine.pending_approvals() if engine.state is S.AWAITING_USER else ()
    for call, _ in waiting:
        actions = engine.handle(sm.engine.ApprovalDecided(call.id, True))
        started += [a.call for a in actions if isinstance(a, sm.engine.StartTool)]
    for call in started:
        assert _call_key(call) in history, f"started a call absent from the history: {call}"


@pytest.mark.timeout(120)
@given(case=damaged(list(SUSPENDED_BATCHES) + list(resting_snapshots())))
def test_a_damaged_snapshot_is_refused_or_starts_only_what_the_history_shows(
    case: tuple[str, Snapshot, list[str]],
) -> None:
    restore_property(case)


# -- the driver: resume runs nothing it should not ---------------------------------------------


def _approvals_in(snap: Any) -> dict[str, bool]:
    # What a person shown this (damaged) snapshot would approve: every waiting call.
    approvals: dict[str, bool] = {}
    batch = snap.get("batch") if isinstance(snap, dict) else None
    for item in batch if isinstance(batch, list) else []:
        call = item.get("call") if isinstance(item, dict) else None
        if (
            isinstance(call, dict)
            and isinstance(call.get("id"), str)
            and item.get("status") == "waiting-approval"
        ):
            approvals[call["id"]] = True
    return approvals


def resume_property(case: tuple[str, Snapshot, list[str]]) -> None:
    _, snap, _ = case
    recorder = Recorder()
    approvals = _approvals_in(snap)

    async def resume() -> sm.RunResult:
        return await asyncio.wait_for(
            sm.resume_agent(
                snap,
                model=recorder,
                tools=recorder.tools,
                approvals=approvals,
                before_tool_call=policy,
            ),
            10,
        )

    try:
        result = asyncio.run(resume())
    except (sm.UsageError, sm.errors.BadDataError):  # refused before anything ran
        assert recorder.ran == [], "a refused resume ran a tool"
        assert recorder.model_calls == 0, "a refused resume called the model"
        return
    history = _history_calls(result.messages)
    for call in recorder.ran:
        key = _call_key(call)
        assert key in history, f"ran a call absent from the history: {call}"
        verdict = policy(call)
        assert not isinstance(verdict, sm.Deny), f"ran a call the policy denies: {call}"
        if isinstance(verdict, sm.RequireApproval):
            assert approvals.get(call.id), f"ran a call without its approval: {call}"


@pytest.mark.timeout(240)
@settings(max_examples=40)
@given(case=damaged(list(SUSPENDED_BATCHES)))
def test_a_resumed_run_never_runs_a_call_it_should_not(
    case: tuple[str, Snapshot, list[str]],
) -> None:
    resume_property(case)


async def _ask_nobody(policy: object, recheck: object) -> None:
    return None


ONLY_FOUND_WITHOUT_CHECKS = settings(
    phases=[Phase.generate], database=None, derandomize=True, max_examples=300
)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("prop", "caught"),
    [
        (restore_property, "started a call absent from the history"),
        (resume_property, "ran a call absent from the history"),
    ],
)
def test_the_properties_catch_a_restore_without_its_self_check(
    monkeypatch: pytest.MonkeyPatch,
    prop: Callable[[tuple[str, Snapshot, list[str]]], None],
    caught: str,
) -> None:
    # The typed readers stay: what the property catches is what the self-check is for.
    monkeypatch.setattr(snapshot_module, "check_restored", lambda engine: None)
    cases = damaged(["approval", "held-barrier"], ["args-in-batch", "name-in-batch"])
    with pytest.raises(AssertionError, match=caught):
        ONLY_FOUND_WITHOUT_CHECKS(given(case=cases)(prop))()


@pytest.mark.timeout(240)
def test_the_resume_property_catches_a_resume_that_trusts_the_recorded_decisions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the self-check on, an edit that agrees with itself (a denied call marked
    # ready behind a barrier) runs the call unless the policy is asked again.
    monkeypatch.setattr(_driver, "_ask_policy_again", _ask_nobody)
    cases = damaged(["held-denial"], ["status-and-barrier"])
    with pytest.raises(AssertionError, match="ran a call the policy denies"):
        ONLY_FOUND_WITHOUT_CHECKS(given(case=cases)(resume_property))()


# -- the policy is asked again on resume --------------------------------------------------------


def _held_denial_marked_ready() -> Snapshot:
    # Consistent with itself: d is held back behind b by a barrier it never had.
    snap: Snapshot = json.loads(suspended_snapshot("held-denial"))
    i = _batch_index(snap, "d")
    snap["batch"][i].update(status="ready", result=None, sequential=True)
    snap["denial"] = None
    return snap


@pytest.mark.timeout(30)
def test_a_denied_call_edited_to_ready_is_denied_again_on_resume() -> None:
    snap = _held_denial_marked_ready()
    Engine.restore(snap)  # the snapshot alone cannot tell
    _resume_is_refused(
        snap, sm.errors.SnapshotError, r"call 'd' \(act\) is marked permitted .* denies"
    )


@pytest.mark.timeout(30)
def test_an_honest_resume_asks_the_policy_again_and_goes_on() -> None:
    asked: list[str] = []

    def asking(call: sm.ToolCall) -> sm.Deny | sm.RequireApproval | None:
        asked.append(call.id)
        return policy(call)

    recorder = Recorder()
    result = asyncio.run(
        sm.resume_agent(
            json.loads(suspended_snapshot("held-barrier")),
            model=recorder,
            tools=recorder.tools,
            approvals={"b": True},
            before_tool_call=asking,
        )
    )
    assert result.state is S.DONE
    assert asked == ["b", "s", "c"]
    assert [c.id for c in recorder.ran] == ["b", "s", "c"]


@pytest.mark.timeout(30)
def test_a_run_suspended_under_a_policy_is_not_resumed_without_one() -> None:
    recorder = Recorder()
    with pytest.raises(sm.UsageError, match="before_tool_call"):
        sm.resume_run(
            json.loads(suspended_snapshot("approval")),
            model=recorder,
            tools=recorder.tools,
            approvals={"b": True},
        )
    # A message runs nothing of the batch, so it needs no policy.
    run = sm.resume_run(
        json.loads(suspended_snapshot("approval")),
        model=recorder,
        tools=recorder.tools,
        message="never mind",
    )
    assert asyncio.run(run.run()).state is S.DONE
    assert recorder.ran == []


# -- missing tools fail at once -----------------------------------------------------------------


@pytest.mark.timeout(10)
def test_resume_without_the_tool_of_a_pending_call_fails_at_once() -> None:
    recorder = Recorder()
    act_only = [t for t in recorder.tools if t.name == "act"]
    with pytest.raises(sm.UsageError, match=r"tools lacks barrier, needed by .* s") as info:
        sm.resume_run(
            json.loads(suspended_snapshot("held-barrier")),
            model=recorder,
            tools=act_only,
            approvals={"b": True},
            before_tool_call=policy,
        )
    assert not isinstance(info.value, sm.InvalidInputError)
    with pytest.raises(sm.UsageError, match="tools lacks act"):
        asyncio.run(
            sm.resume_agent(
                json.loads(suspended_snapshot("approval")),
                model=recorder,
                tools=[],
                approvals={"b": True},
                before_tool_call=policy,
            )
        )
    assert recorder.ran == []
    assert recorder.model_calls == 0


@pytest.mark.timeout(10)
def test_resume_refuses_arguments_that_no_longer_fit_the_tool() -> None:
    @sm.tool(name="act")
    def strict(name: int) -> str:
        """Act on a number."""
        return str(name)

    with pytest.raises(sm.InvalidInputError, match="pending call 'b' do not fit"):
        sm.resume_run(
            json.loads(suspended_snapshot("approval")),
            model=Recorder(),
            tools=[strict],
            approvals={"b": True},
            before_tool_call=policy,
        )


# -- signatures ------------------------------------------------------------------------------------

KEY = b"k" * 32


@pytest.mark.timeout(30)
def test_a_signed_snapshot_restores_with_its_key() -> None:
    engine = Engine.restore(json.loads(suspended_snapshot("approval")))
    signed = _json(engine.snapshot(key=KEY))
    assert signed["signature"].startswith("hmac-sha256:")
    assert Engine.restore(signed, key=KEY).snapshot(key=KEY) == signed
    # str keys are their UTF-8 bytes; without a key the signature is not looked at
    assert Engine.restore(signed, key=KEY.decode()).state is S.AWAITING_USER
    assert Engine.restore(signed).state is S.AWAITING_USER
    assert Engine.sign_snapshot(engine.snapshot(), KEY) == signed


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("signature"), "missing, but a key was given"),
        (lambda s: s.update(signature="hmac-sha256:00"), "does not match"),
        (lambda s: s.update(signature=7), "expected a string"),
        (lambda s: s.update(signature="\udcff"), "does not match"),
        (lambda s: s.update(turns=2), "does not match"),
        (lambda s: s["batch"][1].update(status="ready"), "does not match"),
        (
            lambda s: s.update(signature=Engine.sign_snapshot(s, b"other")["signature"]),
            "does not match",
        ),
    ],
)
def test_a_wrong_or_missing_signature_is_refused(
    change: Callable[[Snapshot], None], message: str
) -> None:
    signed = Engine.sign_snapshot(json.loads(suspended_snapshot("approval")), KEY)
    change(signed)
    with pytest.raises(sm.errors.SnapshotSignatureError, match=f"snapshot.signature: {message}"):
        Engine.restore(signed, key=KEY)


@pytest.mark.timeout(30)
def test_the_signature_error_does_not_show_the_expected_signature() -> None:
    signed = Engine.sign_snapshot(json.loads(suspended_snapshot("approval")), KEY)
    good = signed["signature"]
    signed["turns"] = 2
    with pytest.raises(sm.errors.SnapshotSignatureError) as info:
        Engine.restore(signed, key=KEY)
    assert good[12:] not in str(info.value)
    expected = Engine.sign_snapshot(signed, KEY)["signature"]
    assert expected[12:] not in str(info.value)


@pytest.mark.timeout(30)
def test_resume_checks_the_signature_before_anything_runs() -> None:
    stored = Engine.sign_snapshot(json.loads(suspended_snapshot("approval")), KEY)
    recorder = Recorder()
    tampered = copy.deepcopy(stored)
    tampered["batch"][1]["note"] = "harmless"
    for bad in (tampered, json.loads(suspended_snapshot("approval"))):
        with pytest.raises(sm.errors.SnapshotSignatureError):
            sm.resume_run(
                bad,
                model=recorder,
                tools=recorder.tools,
                approvals={"b": True},
                before_tool_call=policy,
                key=KEY,
            )
    result = asyncio.run(
        sm.resume_agent(
            stored,
            model=recorder,
            tools=recorder.tools,
            approvals={"b": True},
            before_tool_call=policy,
            key=KEY,
        )
    )
    assert result.state is S.DONE
    assert [c.id for c in recorder.ran] == ["b"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("key", [b"", "", 7, "secret\ud800"])
def test_an_empty_or_odd_key_is_a_usage_error(key: Any) -> None:
    # A lone surrogate cannot be encoded: the same usage error as any unusable key,
    # and the key itself appears nowhere in the message.
    snap = json.loads(suspended_snapshot("approval"))
    with pytest.raises(sm.UsageError, match="non-empty bytes or a str") as raised:
        Engine.sign_snapshot(snap, key)
    assert "secret" not in str(raised.value)
    with pytest.raises(sm.UsageError, match="non-empty bytes or a str"):
        Engine.restore(Engine.sign_snapshot(snap, KEY), key=key)


@pytest.mark.timeout(30)
def test_a_refused_resume_stays_refused_when_run_again() -> None:
    recorder = Recorder()
    run = sm.resume_run(
        _held_denial_marked_ready(),
        model=recorder,
        tools=recorder.tools,
        approvals={"b": True},
        before_tool_call=policy,
    )
    for _ in range(2):
        with pytest.raises(sm.errors.SnapshotError, match="call 'd'"):
            asyncio.run(run.run())
    assert recorder.ran == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("schema", "field"),
    [
        ({"type": "object", "$schema": 5}, r"snapshot\.tools\[0\]\.parameters: not a usable"),
        ({"type": "object", "pattern": "("}, r"snapshot\.tools\[0\]: tool 'act': parameters"),
        ({"type": "object", "properties": 5}, r"snapshot\.tools\[0\]: tool 'act': parameters"),
    ],
)
def test_a_hostile_tool_schema_is_refused_naming_the_tool(schema: Any, field: str) -> None:
    snap = json.loads(suspended_snapshot("approval"))
    snap["tools"][0]["parameters"] = schema
    with pytest.raises(sm.errors.SnapshotError, match=field):
        Engine.restore(snap)


@pytest.mark.timeout(30)
def test_restore_does_not_match_arguments_against_the_snapshots_own_patterns() -> None:
    # A pattern that backtracks for ever on the call's argument: restore must not run
    # it (the caller's own tools are what resume matches the arguments against).
    snap = json.loads(suspended_snapshot("approval"))
    evil = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}}}
    snap["tools"][0]["parameters"] = evil
    slow = "a" * 64 + "!"
    snap["batch"][1]["call"]["arguments"] = {"name": slow}
    _last_assistant(snap)["content"][1]["arguments"] = {"name": slow}
    assert Engine.restore(snap).pending_approvals()[0][0].arguments["name"] == slow


@pytest.mark.timeout(30)
def test_a_huge_integer_is_refused_naming_the_field() -> None:
    snap = json.loads(suspended_snapshot("approval"))
    snap["turns"] = 10**2000
    with pytest.raises(
        sm.errors.SnapshotError, match=r"snapshot\.turns: an integer of over 1024 bits"
    ):
        Engine.restore(snap, key=KEY)


@pytest.mark.timeout(30)
def test_resume_takes_a_size_limit() -> None:
    recorder = Recorder()
    with pytest.raises(sm.errors.SnapshotError, match="larger than max_bytes=100"):
        sm.resume_run(
            json.loads(suspended_snapshot("approval")),
            model=recorder,
            tools=recorder.tools,
            approvals={"b": True},
            before_tool_call=policy,
            max_snapshot_bytes=100,
        )


@pytest.mark.timeout(10)
@pytest.mark.parametrize("limit", [0, -1, "big", True, 1.5])
def test_the_limits_themselves_are_checked(limit: Any) -> None:
    snap = json.loads(suspended_snapshot("approval"))
    with pytest.raises(sm.InvalidInputError, match="max_bytes must be a positive integer"):
        Engine.restore(snap, max_bytes=limit)
    with pytest.raises(sm.InvalidInputError, match="max_depth must be a positive integer"):
        Engine.restore(snap, max_depth=limit)


@pytest.mark.timeout(10)
def test_a_limit_of_one_is_a_limit_not_a_mistake() -> None:
    # The smallest allowed limit is a limit (the snapshot is refused as too large or
    # too deep), not a bad argument.
    snap = json.loads(suspended_snapshot("approval"))
    with pytest.raises(sm.errors.SnapshotError, match="larger than max_bytes=1"):
        Engine.restore(snap, max_bytes=1)
    with pytest.raises(sm.errors.SnapshotError, match="nested deeper than 1 level"):
        Engine.restore(snap, max_depth=1)
