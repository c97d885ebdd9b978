"""What a durable run saves, as JSON (on any backend): step outputs, pending calls,
the result.

A backend would often pickle a step's output by default (DBOS does); our messages do
not pickle, and a record should be readable by any later version anyway, so every
saved value is the JSON of ``statemachine.core.wire``. A step's output is the list of the engine
events it reported; ``decode_step_events`` is the one function that reads it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from statemachine.agent.events import RunResult, RunStats, ToolQuestion, run_error
from statemachine.agent.output import Output, compile_output
from statemachine.core.engine import Engine
from statemachine.core.events import Event, InputQueued
from statemachine.core.messages import ToolCall, Usage
from statemachine.core.steps import table_from_data, table_to_data
from statemachine.core.table import BASE_TABLE, State, Table, Trigger, TurnState
from statemachine.core.trace import TransitionRecord
from statemachine.core.wire import (
    block_from_dict,
    block_to_dict,
    event_from_dict,
    event_to_dict,
    messages_from_dicts,
    messages_to_dicts,
    usage_from_dict,
    usage_to_dict,
)

__all__ = [
    "decode_step_events",
    "encode_step_events",
    "output_json",
    "question_from_dict",
    "question_to_dict",
    "result_from_dict",
    "result_to_dict",
]


def encode_step_events(events: Iterable[Event]) -> list[dict[str, Any]]:
    """A step's output: the JSON of the engine events it reported, in order."""
    return [event_to_dict(e) for e in events]


def decode_step_events(output: Any) -> list[Event]:
    """The engine events saved as the output of a model, tool, permission or
    should_continue step (``encode_step_events``), in order."""
    return [event_from_dict(d) for d in output]


def call_to_dict(call: ToolCall) -> dict[str, Any]:
    return block_to_dict(call)


def call_from_dict(d: Any) -> ToolCall:
    call = block_from_dict(d, ("toolCall",), "call")
    assert isinstance(call, ToolCall)
    return call


def _stats_to_dict(stats: RunStats) -> dict[str, Any]:
    return {
        "modelCalls": stats.model_calls,
        "toolCalls": {k: dict(v) for k, v in stats.tool_calls.items()},
        "usage": usage_to_dict(stats.usage),
        "turnSeconds": list(stats.turn_seconds),
        "toolSeconds": dict(stats.tool_seconds),
        "wallSeconds": stats.wall_seconds,
    }


def _stats_from_dict(d: Mapping[str, Any] | None) -> RunStats | None:
    if d is None:
        return None
    return RunStats(
        model_calls=d["modelCalls"],
        tool_calls={k: dict(v) for k, v in d["toolCalls"].items()},
        usage=usage_from_dict(d["usage"], "stats.usage") if d["usage"] else Usage(),
        turn_seconds=tuple(d["turnSeconds"]),
        tool_seconds=dict(d["toolSeconds"]),
        wall_seconds=d["wallSeconds"],
    )


def output_json(result: RunResult, engine: Engine, output_type: str | None) -> Any:
    """The structured output of a run that ended ``Done`` with one, as JSON (the
    validated arguments of its final-result call) with the name of its output type
    in the runner's registry: ``{"type": name, "value": ...}``; ``None`` otherwise."""
    output = Output.untyped(engine.output)
    if output is None or not result.ok:
        return None
    return {"type": output_type, "value": output.value(result.messages, engine.output_call)}


def result_to_dict(
    result: RunResult, stats: RunStats | None, output: Any = None, table: Table = BASE_TABLE
) -> dict[str, Any]:
    """The workflow's output: ``result`` with ``stats`` (the run's, all parts) and its
    structured output (``output_json``); with the declarations of the run's steps
    (``table``, its engine's), whose states its trace may name."""
    steps = {"steps": table_to_data(table)} if table.steps else {}
    return {
        **steps,
        "output": output,
        "state": result.state.value,
        "messages": messages_to_dicts(result.messages),
        "turns": result.turns,
        "explanation": result.explanation,
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in result.trace],
        "pending": [call_to_dict(c) for c in result.pending_approvals],
        "queued": [event_to_dict(e) for e in result.queued_input],
        "snapshot": None if result.snapshot is None else dict(result.snapshot),
        "stats": None if stats is None else _stats_to_dict(stats),
    }


def result_from_dict(
    run_id: str, d: Mapping[str, Any], output_types: Mapping[str, Any] | None = None
) -> RunResult:
    """The ``RunResult`` of a workflow's output (``result_to_dict``); its structured
    output converted to its type when ``output_types`` (a runner's registry) has it,
    else the validated JSON object."""
    table = table_from_data(d["steps"]) if d.get("steps") else BASE_TABLE
    # Every state of the run's table by name, made once: the trace names two a row.
    states = {s.value: s for s in table.states}
    state = _state(states, d["state"])
    output = d.get("output")
    value = None
    if isinstance(output, Mapping):
        value = output.get("value")
        known = (output_types or {}).get(str(output.get("type")))
        compiled = None if known is None else compile_output(known)
        if compiled is not None:
            value = compiled.from_json(value)
    queued = [event_from_dict(e) for e in d["queued"]]
    return RunResult(
        state=state,
        messages=tuple(messages_from_dicts(d["messages"])),
        error=run_error(state, d["explanation"]),
        turns=d["turns"],
        explanation=d["explanation"],
        trace=tuple(
            TransitionRecord(_state(states, s), Trigger(t), _state(states, e), n)
            for s, t, e, n in d["trace"]
        ),
        run_id=run_id,
        stats=_stats_from_dict(d.get("stats")),
        pending_approvals=tuple(call_from_dict(c) for c in d["pending"]),
        queued_input=tuple(e for e in queued if isinstance(e, InputQueued)),
        snapshot=d["snapshot"],
        output=value,
    )


def _state(states: Mapping[str, State], name: str) -> State:
    """The state named ``name`` among the run's ``states`` (the library's, or its
    steps'); ``ValueError`` for another."""
    return states.get(name) or TurnState(name)


def question_to_dict(question: ToolQuestion) -> dict[str, Any]:
    return {
        "id": question.id,
        "call_id": question.call_id,
        "tool_name": question.tool_name,
        "message": question.message,
        "schema": dict(question.schema),
        "url": question.url,
        "source": question.source,
    }


def question_from_dict(data: object) -> ToolQuestion | None:
    """The question published as ``data`` (read from a database or a workflow); ``None`` if it
    is not one."""
    if not isinstance(data, Mapping):
        return None
    texts = [data.get(k) for k in ("id", "call_id", "tool_name", "message", "source")]
    url, schema = data.get("url"), data.get("schema")
    if not all(isinstance(t, str) for t in texts) or not isinstance(schema, Mapping):
        return None
    if url is not None and not isinstance(url, str):
        return None
    question_id, call_id, tool_name, message, source = (str(t) for t in texts)
    return ToolQuestion(question_id, call_id, tool_name, message, schema, url, source)
