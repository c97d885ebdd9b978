"""Resuming a run suspended in ``AwaitingUser``: ``resume_run`` and ``resume_agent``.

A suspended run is a snapshot (``RunResult.snapshot``): it is checked against itself
and, with a key, against its signature before anything runs; then the person's
decisions (approvals, or a new message) are the first events of the resumed run.

Before anything runs, the snapshot is checked against itself
(``Engine.restore``: its pending calls must be exactly the unanswered calls of its
last assistant message) and, with ``key``, against its signature
(``SnapshotSignatureError`` if it is missing or wrong); ``max_snapshot_bytes``
bounds its size (default 32 MiB of JSON text). ``tools`` must hold the
tool of every call that may run (else ``UsageError`` naming the missing ones), and
the calls' arguments must fit those tools' schemas. When calls may run (resuming
with ``approvals``), ``before_tool_call`` is asked again about each of them as the
run starts, because the snapshot's record of what it allowed could have been
edited: if it now denies a call, or requires approval for a call the snapshot
marks as permitted, ``run()`` raises ``SnapshotError`` and nothing runs. A run
suspended under a ``before_tool_call`` hook must be resumed with one.

``RunResult.stats`` of a resumed run count the whole run: the stats of the part before
the suspension (taken from the ``RunResult`` resumed, or given as ``stats=`` with a
snapshot alone) plus this part's. ``instructions``, ``model_settings`` and ``deps``
are ``run_agent``'s: code, which does not travel in a snapshot, so they are given again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Unpack

import attrs

from statemachine.agent.calls import call_hook, describe
from statemachine.agent.events import OutputT, RunResult
from statemachine.agent.hooks import (
    BeforeToolCall,
    Deny,
    RequireApproval,
)
from statemachine.agent.model import ModelClient
from statemachine.agent.options import DEFAULTS, Options, ResumeOptions, RunOptions, resolve
from statemachine.agent.output import compile_output
from statemachine.agent.run import AgentRun, check_first, continue_run
from statemachine.agent.steps import check_steps
from statemachine.agent.sync import refuse_running_loop, run_sync
from statemachine.agent.tools import Tool, scheduling_of
from statemachine.core.engine import DEFAULT_MAX_SNAPSHOT_BYTES, Engine
from statemachine.core.events import ApprovalDecided, Event, InputQueued
from statemachine.core.messages import ToolCall, UserMessage
from statemachine.core.output import OutputSpec
from statemachine.core.table import TurnState
from statemachine.core.tools import validate_arguments
from statemachine.errors import (
    InvalidInputError,
    OutputTypeChangedError,
    SnapshotError,
    UsageError,
)

__all__ = ["resume_agent", "resume_agent_sync", "resume_run"]


def resume_run(
    state: RunResult | Mapping[str, Any],
    *,
    model: ModelClient | str,
    options: Options = DEFAULTS,
    **keywords: Unpack[ResumeOptions[OutputT]],
) -> AgentRun[OutputT]:
    """An ``AgentRun`` that continues a run suspended in ``AwaitingUser``. ``state`` is
    the ``RunResult`` or its ``snapshot``; give ``approvals`` (call id -> True, False or
    ``Deny(reason)``) for every pending call, or a new ``message`` (pending calls are then
    "not approved"). ``max_turns`` may raise the limit; ``usage_limits``, ``output_type``,
    ``output_retries`` replace the run's (give the type again for a typed output); the
    run's ``steps`` are given again; its ``output_mode`` is the suspended run's. The
    options are ``ResumeOptions`` (``options``: a resolved record they replace fields
    of, as ``AgentRun``'s). The rest: the module docstring."""
    given = keywords  # what is left once what resuming alone takes is taken out
    approvals = given.pop("approvals", None)
    message = given.pop("message", None)
    key = given.pop("key", None)
    max_snapshot_bytes = given.pop("max_snapshot_bytes", DEFAULT_MAX_SNAPSHOT_BYTES)
    stats = given.pop("stats", None)
    if "max_turns" in given and given["max_turns"] is None:
        del given["max_turns"]  # None: the suspended run keeps its limit
    if "output_mode" in given:
        raise InvalidInputError("output_mode: a resumed run keeps the mode of the run it resumes")
    opts = resolve("resume_run", given, RunOptions, options)
    max_turns = opts.max_turns if "max_turns" in given else None
    engine = _restore(state, opts, key, max_snapshot_bytes, max_turns)
    engine.output = _output_spec(engine, opts.output_type, opts.output_retries)
    events = _resume_events(engine, approvals, message)
    policy = opts.before_tool_call
    recheck = [] if message is not None else _may_run(engine, events, opts.tools, policy)
    run = continue_run(
        engine,
        events,
        model=model,
        options=opts,
        previous_stats=stats or (state.stats if isinstance(state, RunResult) else None),
    )
    if policy is not None and recheck:
        # Before anything runs, the policy is asked again about the calls that may run.
        check_first(run, partial(_ask_policy_again, policy, tuple(recheck)))
    return run


def _output_spec(engine: Engine, output_type: object, output_retries: int) -> OutputSpec | None:
    """The output of the resumed run: the snapshot's, or ``output_type``'s (given in
    the snapshot's mode, tool or native, with its tools and end strategy: a union
    offered as one tool before it was offered a tool per member stays one)."""
    output = compile_output(output_type, output_retries)
    if output is None:
        return engine.output
    shown = engine.output
    if shown is None:
        return output.spec
    for spec in (output.spec, output.legacy):
        if spec is not None and _tools_of(spec) == _tools_of(shown):
            return attrs.evolve(spec, native=shown.native, end_strategy=shown.end_strategy)
    # The model answered (or will answer) the schema it was shown: judging it by
    # another, or converting its output to another type, would be wrong either way.
    raise OutputTypeChangedError(
        "output_type: its JSON Schema is not the one the suspended run showed the "
        "model; resume with the output type the run was started with, or without "
        "output_type for the validated JSON"
    )


def _tools_of(spec: OutputSpec) -> list[tuple[str, Any]]:
    return [(d.name, d.schema_dict()) for d in spec.tools]


def _may_run(
    engine: Engine,
    events: Sequence[Event],
    tools: Sequence[Tool],
    before_tool_call: BeforeToolCall | None,
) -> list[tuple[ToolCall, bool]]:
    """The calls of the restored batch that may run once the decisions ``events`` are
    handled, each with whether it waited for a person; refused at once if ``tools``
    cannot run them or the hook they were suspended under is missing."""
    approved = {e.call_id for e in events if isinstance(e, ApprovalDecided) and e.approved}
    waiting = {call.id for call, _ in engine.pending_approvals()}
    may_run = [c for c in engine.pending_calls() if c.id in approved or c.id not in waiting]
    _check_tools_for(may_run, tools)
    if before_tool_call is None and engine.check_permissions:
        raise UsageError(
            "this run was suspended under a before_tool_call hook: resume it with the hook, "
            "which is asked again about the calls that may run"
        )
    return [(c, c.id in waiting) for c in may_run]


def _restore(
    state: RunResult | Mapping[str, Any],
    options: Options,
    key: bytes | str | None,
    max_snapshot_bytes: int,
    max_turns: int | None,
) -> Engine:
    """The engine of the suspended run, checked (``resume_run``)."""
    snapshot = state.snapshot if isinstance(state, RunResult) else state
    if snapshot is None:
        raise UsageError("only a run that stopped in AwaitingUser can be resumed")
    engine = Engine.restore(
        snapshot,
        scheduling=scheduling_of(options.tools),
        logger=options.logger,
        key=key,
        max_bytes=max_snapshot_bytes,
        table=check_steps(options.steps),  # a snapshot with steps needs their table, and only it
    )
    if engine.state is not TurnState.AWAITING_USER:
        raise UsageError(f"only a run in AwaitingUser can be resumed, not {engine.state}")
    if max_turns is not None:
        engine.max_turns = max_turns
    if options.usage_limits is not None:
        engine.usage_limits = options.usage_limits
    return engine


def _resume_events(
    engine: Engine,
    approvals: Mapping[str, bool | Deny] | None,
    message: str | UserMessage | None,
) -> list[Event]:
    events: list[Event] = []
    pending = [call.id for call, _ in engine.pending_approvals()]
    for call_id, decision in (approvals or {}).items():
        if call_id not in pending:
            raise InvalidInputError(f"call {call_id!r} is not waiting for approval")
        if isinstance(decision, Deny):
            events.append(ApprovalDecided(call_id, False, decision.reason))
        elif isinstance(decision, bool):
            events.append(ApprovalDecided(call_id, decision))
        else:
            raise InvalidInputError("an approval is True, False, or a Deny(reason)")
    if message is not None:
        events.append(InputQueued(UserMessage(message) if isinstance(message, str) else message))
    elif len(events) != len(pending) or not pending:
        missing = sorted(set(pending) - {e.call_id for e in events if hasattr(e, "call_id")})
        raise InvalidInputError(
            "resume needs a decision for every pending call "
            f"(missing: {', '.join(missing) or 'none are pending'}) or a new message"
        )
    return events


def _check_tools_for(calls: Sequence[ToolCall], tools: Sequence[Tool]) -> None:
    """Refuse at once what would otherwise fail inside a tool's task."""
    by_name = {t.name: t for t in tools}
    missing = sorted({c.name for c in calls} - by_name.keys())
    if missing:
        ids = ", ".join(c.id for c in calls if c.name not in by_name)
        raise UsageError(
            f"tools lacks {', '.join(missing)}, needed by the pending call(s) {ids}: "
            "resume with the tools of the suspended run"
        )
    for call in calls:
        if validate_arguments(by_name[call.name].definition, call.arguments):
            raise InvalidInputError(
                f"the arguments of pending call {call.id!r} do not fit the schema of tool "
                f"{call.name!r} as given now"
            )


async def _ask_policy_again(
    policy: BeforeToolCall, recheck: Sequence[tuple[ToolCall, bool]]
) -> None:
    """Ask the policy about every call of a restored batch that may still run.

    A call may go on only if the policy allows it now: permitted, or, for a call that
    waits for a person, also "requires approval" (the person decides). Anything else
    refuses the resume before anything runs; like the run's own dispatch, a hook that
    raises counts as a denial.
    """
    for call, awaits_person in recheck:
        decision: object
        try:
            decision = await call_hook(policy, call)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook fails closed
            decision = Deny(f"the before_tool_call hook raised {describe(exc)}")
        if decision is None or (awaits_person and isinstance(decision, RequireApproval)):
            continue
        if isinstance(decision, Deny):
            answer = f"denies it ({decision.reason})"
        elif isinstance(decision, RequireApproval):
            answer = "requires a person's approval for it"
        else:
            answer = f"returns a {type(decision).__name__}"
        marked = "waits for approval" if awaits_person else "is marked permitted"
        raise SnapshotError(
            f"snapshot.batch: call {call.id!r} ({call.name}) {marked} in the snapshot, but "
            f"the before_tool_call hook, asked again on resume, {answer}; nothing was run "
            "(resume with a message instead, or find out who changed the snapshot)"
        )


async def resume_agent(
    state: RunResult | Mapping[str, Any],
    *,
    model: ModelClient | str,
    **options: Unpack[ResumeOptions[OutputT]],
) -> RunResult[OutputT]:
    """Continue a run suspended in ``AwaitingUser`` (see ``resume_run``, which also
    says what is checked before anything runs; the options are ``ResumeOptions``)."""
    run = resume_run(state, model=model, **options)
    del options, state  # resolved into the run: not held while it waits
    return await run.run()


def resume_agent_sync(
    state: RunResult | Mapping[str, Any],
    *,
    model: ModelClient | str,
    **options: Unpack[ResumeOptions[OutputT]],
) -> RunResult[OutputT]:
    """``resume_agent`` for code without an event loop (see ``run_agent_sync``)."""
    refuse_running_loop("resume_agent_sync")
    run = resume_run(state, model=model, **options)
    return run_sync(run.run(), run.options.grace_period)
