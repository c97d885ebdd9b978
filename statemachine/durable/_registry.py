"""What a worker's code is, for durable runs on any backend: the registry's manifest,
the application version made from it, and what changed between two manifests.

A durable run records the manifest of the registry it was started with (its models,
its tools with a digest of each one's code and schema, and its hooks with a digest of
each one's code). A worker that takes the run compares it with its own:

- **blocking** changes (a model or tool the run names is gone, a tool is scheduled
  differently or takes other parameters, a ``before_tool_call`` or
  ``should_continue`` hook was added or removed, the transition table changed, a
  declared step was removed, added or reordered or its point or outcomes changed) would
  hand the engine other events than the recorded ones, or none: the run is held,
  never replayed on them (a recorded call is checked against its tool's parameters
  again on replay, so a call the old ones took could be refused by the new);
- **notes** (a tool's, hook's or step's code or description changed, the run's
  instructions changed) do not change the run's course: the run goes on, outputs
  recorded before come from the old code and calls from then on from the new; each
  such change is recorded with the run. A held run gets no notes: they are written when a worker
  whose code fits it takes it.

``application_version`` is the package version, a digest of the transition table and
a digest of the manifest: it changes when the registry does.

Patches are the other way to change code under one application version: a tool or
hook asks ``patched("name")`` and branches on it. A run started before the worker had
the patch answers ``False`` for all its life (it keeps the old code), a run started
since answers ``True``; the backend records which (``check_patches`` checks a
worker's list, ``patches_applied`` sets what a run's tools and hooks see).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import types
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statemachine._version import __version__
from statemachine.agent.model_call import check_instructions
from statemachine.agent.options import DEFAULT_MAX_TURNS, refuse_unknown
from statemachine.agent.output import compile_output
from statemachine.agent.steps import Step, check_steps
from statemachine.agent.tools import Tool
from statemachine.core.limits import UsageLimits, check_usage_limits
from statemachine.core.messages import thaw_json
from statemachine.core.steps import table_from_data, table_to_data
from statemachine.core.table import TRANSITIONS, Table
from statemachine.durable._inputs import run_spec
from statemachine.errors import InvalidInputError, UsageError

if TYPE_CHECKING:
    from statemachine.durable import DurableRunOptions

__all__ = [
    "HOOKS",
    "application_version",
    "check_patches",
    "code_digest",
    "declared_steps",
    "differences",
    "manifest",
    "patched",
    "patches_applied",
    "replay_options",
    "run_extras",
    "run_input",
    "run_options",
    "table_change",
    "table_digest",
    "unknown_extras",
    "with_extras",
    "worker_manifest",
]

HOOKS = ("before_tool_call", "after_tool_call", "should_continue")
_STEP_HOOKS = ("before_tool_call", "should_continue")  # each asked in a step of its own
_DEPTH = 4  # how deep a digest follows functions held in closures


def table_digest() -> str:
    """A digest of the transition table's rows: changes whenever the table does."""
    # Names, not reprs: a guard's repr carries its memory address.
    rows = "\n".join(
        f"{t.source.value}|{t.trigger.value}|{t.dest.value}|"
        f"{getattr(t.guard, '__name__', t.guard)}|{t.label}"
        for t in TRANSITIONS
    )
    return hashlib.sha256(rows.encode()).hexdigest()[:12]


def _code(code: types.CodeType, depth: int, out: Any) -> None:
    out.update(code.co_code)
    out.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code(const, depth, out)
        else:
            out.update(repr(const).encode())


def _callable(fn: Any, depth: int, out: Any) -> None:
    if depth > _DEPTH:
        return
    fn = getattr(fn, "__func__", fn)  # a bound method: its function
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        _code(code, depth, out)
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                held = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(held) and not isinstance(held, type):
                _callable(held, depth + 1, out)
        return
    func = getattr(fn, "func", None)  # functools.partial
    if func is not None and callable(func):
        _callable(func, depth + 1, out)
        out.update(repr((getattr(fn, "args", ()), getattr(fn, "keywords", {}))).encode())
        return
    # A callable object: its class's name and the code of its class's __call__.
    out.update(f"{type(fn).__module__}.{type(fn).__qualname__}".encode())
    code = getattr(vars(type(fn)).get("__call__"), "__code__", None)
    if isinstance(code, types.CodeType):
        _code(code, depth, out)


def code_digest(fn: Callable[..., Any]) -> str:
    """A digest of ``fn``'s code (and of the functions its closure holds): the same in
    every process running the same code with the same Python."""
    out = hashlib.sha256()
    _callable(fn, 0, out)
    return out.hexdigest()[:12]


def _tool_digest(tool: Tool) -> str:
    schema = json.dumps(
        [tool.definition.description, tool.definition.parameters], sort_keys=True, default=str
    )
    return f"{code_digest(tool.execute)}.{hashlib.sha256(schema.encode()).hexdigest()[:8]}"


def _parameters(tool: Tool) -> str:
    """A digest of the JSON Schema a tool's calls are checked against."""
    schema = json.dumps(tool.definition.parameters, sort_keys=True, default=str)
    return hashlib.sha256(schema.encode()).hexdigest()[:12]


def _scheduling(tool: Tool) -> str:
    """How the engine schedules the tool's calls (it decides when each starts)."""
    resources = tool.resources
    return f"{tool.sequential}:{'' if resources is None else code_digest(resources)}"


def _declaration(table: Table) -> dict[str, str]:
    """A digest of each step's declaration (its point, outcomes and their destinations,
    ``on_error``), by name: what its rows in the table are made of."""
    return {
        entry["name"]: hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:12]
        for entry in table_to_data(table)
    }


def manifest(
    models: Sequence[str],
    tools: Sequence[Tool],
    hooks: Mapping[str, Any],
    steps: Sequence[Step] = (),
    table: Table | None = None,
) -> dict[str, Any]:
    """The registry as a run records it (JSON): model names, tools and hooks by name
    with a digest of each (a hook not set: ``None``); with ``steps`` (whose checked
    ``table`` it is), the steps in their order, each with a digest of its declaration
    and of its function's code. No ``steps`` key without steps, so a registry without
    them keeps its version."""
    registry: dict[str, Any] = {
        "models": sorted(models),
        "tools": {t.name: _tool_digest(t) for t in tools},
        "scheduling": {t.name: _scheduling(t) for t in tools},
        "parameters": {t.name: _parameters(t) for t in tools},
        "hooks": {
            name: None if hooks.get(name) is None else code_digest(hooks[name]) for name in HOOKS
        },
    }
    if steps and table is not None:
        declared = _declaration(table)
        registry["steps"] = [[s.name, declared[s.name], code_digest(s.function)] for s in steps]
    return registry


def application_version(registry: Mapping[str, Any] | None = None) -> str:
    """Package version + table digest (+ a digest of ``registry``, a ``manifest``)."""
    version = f"{__version__}+table.{table_digest()}"
    if registry is None:
        return version
    text = json.dumps(registry, sort_keys=True)
    return f"{version}.code.{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def table_change(spec: Mapping[str, Any]) -> list[str]:
    """The blocking change of a run ``spec`` recorded on another transition table
    (none for a run that recorded no table)."""
    table = spec.get("table")
    if table is None or table == table_digest():
        return []
    return [f"the transition table changed (the run's {table}, this worker's {table_digest()})"]


def differences(
    recorded: Mapping[str, Any],
    mine: Mapping[str, Any],
    model: str,
    tools: Sequence[str],
    instructions: str | None = None,
) -> tuple[list[str], list[str]]:
    """What changed from the manifest a run ``recorded`` (using ``model``, ``tools``
    and the ``instructions`` of that name) to this worker's (``mine``): the blocking
    changes and the notes (module docstring), each a sentence naming the model, tool,
    hook or instructions."""
    blocking: list[str] = []
    notes: list[str] = []
    if model not in mine["models"]:
        blocking.append(f"model {model!r} is not in this worker's registry")
    for name in tools:
        theirs, ours = recorded.get("tools", {}).get(name), mine["tools"].get(name)
        if ours is None:
            blocking.append(f"tool {name!r} is not in this worker's registry (removed or renamed)")
            continue
        scheduled = recorded.get("scheduling", {}).get(name)
        parameters = recorded.get("parameters", {}).get(name)
        if scheduled is not None and scheduled != mine["scheduling"].get(name):
            blocking.append(
                f"tool {name!r} is scheduled differently (sequential or resources changed): "
                "the run's recorded steps were started in another order"
            )
        elif parameters is not None and parameters != mine["parameters"].get(name):
            blocking.append(
                f"tool {name!r} takes other parameters than when the run started: the "
                "calls the run recorded were checked against the old ones"
            )
        elif theirs is not None and theirs != ours:
            notes.append(
                f"tool {name!r} changed since the run started: outputs recorded before "
                "come from its old code, calls from now on run the new"
            )
    for name in HOOKS:
        if name not in recorded.get("hooks", {}):
            continue
        theirs, ours = recorded["hooks"][name], mine["hooks"].get(name)
        if (theirs is None) != (ours is None):
            change = "removed" if ours is None else "added"
            if name in _STEP_HOOKS:
                asked = "ask" if ours is None else "do not ask"
                blocking.append(f"hook {name!r} was {change}: the run's recorded steps {asked} it")
            else:
                notes.append(f"hook {name!r} was {change} since the run started")
        elif theirs != ours:
            notes.append(f"hook {name!r} changed since the run started")
    _step_differences(recorded.get("steps", []), mine.get("steps", []), blocking, notes)
    if instructions is not None:
        theirs = recorded.get("instructions", {}).get(instructions)
        ours = mine.get("instructions", {}).get(instructions)
        if theirs is not None and ours is not None and theirs != ours:
            notes.append(
                f"instructions {instructions!r} changed since the run started: model calls "
                "recorded before were sent the old ones, calls from now on are sent the new"
            )
    return blocking, notes


def _step_differences(
    recorded: Sequence[Sequence[str]],
    mine: Sequence[Sequence[str]],
    blocking: list[str],
    notes: list[str],
) -> None:
    """The changes of the declared steps (``manifest``): a step removed, added or
    reordered, or declared otherwise, changes the table the run's recorded decisions
    were made on (blocking); a step's code changed only what it decides from now on."""
    theirs = {entry[0]: entry for entry in recorded}
    ours = {entry[0]: entry for entry in mine}
    for name, entry in theirs.items():
        if name not in ours:
            blocking.append(
                f"step {name!r} is not in this worker's steps (removed or renamed): the "
                "run's table has its rows"
            )
        elif entry[1] != ours[name][1]:
            blocking.append(
                f"step {name!r} is declared otherwise than when the run started (its point, "
                "outcomes or their destinations changed): the run's table has its old rows"
            )
        elif entry[2] != ours[name][2]:
            notes.append(
                f"step {name!r} changed since the run started: decisions recorded before "
                "come from its old code, steps from now on run the new"
            )
    for name in ours:
        if name not in theirs:
            blocking.append(f"step {name!r} was added: the run's table has no rows for it")
    kept = [n for n in theirs if n in ours]
    if kept != [n for n in ours if n in theirs]:
        blocking.append(f"the steps were reordered: the run's table runs them as {kept}")


def declared_steps(table: Table) -> dict[str, Any]:
    """What a run's input records of its steps (JSON, ``table_to_data``): an export
    rebuilds the run's table from it; empty for a run without steps."""
    return {"steps": table_to_data(table)} if table.steps else {}


# -- patches ------------------------------------------------------------------------------

MAX_PATCHES = 100  # patches a worker may carry at once (deprecate, then drop, old ones)

_patches: contextvars.ContextVar[tuple[frozenset[str], frozenset[str]] | None]
_patches = contextvars.ContextVar("statemachine_durable_patches", default=None)


def check_patches(patches: object, deprecated: object) -> tuple[tuple[str, ...], frozenset[str]]:
    """A worker's patches, in the order they were introduced, and which of them are
    deprecated; ``InvalidInputError`` naming what is wrong."""
    if isinstance(patches, str) or not isinstance(patches, Sequence):
        raise InvalidInputError("patches must be a sequence of names, oldest first")
    if isinstance(deprecated, str) or not isinstance(deprecated, Collection):
        raise InvalidInputError("deprecated_patches must be a collection of names")
    names = tuple(patches)
    if len(names) > MAX_PATCHES:
        raise InvalidInputError(f"at most {MAX_PATCHES} patches, got {len(names)}")
    for name in names:
        if not isinstance(name, str) or not name or len(name) > 200 or "\x00" in name:
            raise InvalidInputError(
                f"a patch name is a non-empty str of at most 200 chars: {name!r}"
            )
    if len(set(names)) != len(names):
        raise InvalidInputError(f"patch names must be unique, got {list(names)}")
    unknown = sorted(str(n) for n in deprecated if n not in names)
    if unknown:
        raise InvalidInputError(
            f"deprecated patches {unknown} are not in patches: a deprecated patch keeps "
            "its place in the list until no run took it"
        )
    return names, frozenset(str(n) for n in deprecated)


@contextlib.contextmanager
def patches_applied(known: Collection[str], applied: Collection[str]) -> Iterator[None]:
    """Within: ``patched(name)`` answers for a run that took the patches ``applied``,
    on a worker that has the patches ``known``."""
    token = _patches.set((frozenset(known), frozenset(applied)))
    try:
        yield
    finally:
        _patches.reset(token)


def patched(name: str) -> bool:
    """Whether the durable run calling this (from a tool or a hook) runs the code of
    the patch ``name``: ``False`` for a run started before its worker had the patch
    (it keeps the old code for all its life), ``True`` for a run started since.
    Outside a durable run: ``True`` (the code of today). ``UsageError`` for a name
    the worker was not given (``DBOSRunner(patches=...)``)."""
    scope = _patches.get()
    if scope is None:
        return True
    known, applied = scope
    if name not in known:
        raise UsageError(
            f"patch {name!r} is not one of this worker's patches {sorted(known)}: "
            "name it in DBOSRunner(patches=[...])"
        )
    return name in applied


# -- instructions, output types and usage limits of a run ------------------------------------

_LIMITS = ("requests", "input_tokens", "output_tokens", "total_tokens")


def with_extras(
    registry: dict[str, Any], instructions: Mapping[str, Any], output_types: Mapping[str, Any]
) -> dict[str, Any]:
    """``registry`` (a ``manifest``) with the worker's instructions and output types,
    each by name with a digest (a string's text, a function's code, a type's JSON
    Schema); unchanged when there are none, so a registry without them keeps its
    version. ``InvalidInputError`` for an entry that is neither."""
    if instructions:
        for value in instructions.values():
            check_instructions(value)
        registry["instructions"] = {
            name: hashlib.sha256(value.encode()).hexdigest()[:12]
            if isinstance(value, str)
            else code_digest(value)
            for name, value in instructions.items()
        }
    if output_types:
        registry["output_types"] = {}
        for name, output_type in output_types.items():
            output = compile_output(output_type)
            if output is None:
                raise InvalidInputError(f"output type {name!r} is None")
            # The union as one tool: the digest a registry had before a tool per member.
            spec = output.legacy or output.spec
            schema = json.dumps(spec.definition.parameters, sort_keys=True, default=str)
            registry["output_types"][name] = hashlib.sha256(schema.encode()).hexdigest()[:12]
    return registry


def run_extras(
    registry: Mapping[str, Any],
    output_types: Mapping[str, Any],
    instructions: str | None,
    output_type: str | None,
    usage_limits: UsageLimits | None,
) -> dict[str, Any]:
    """What a run's input records of them (JSON): the names of its instructions and
    output type in the registry (``InvalidInputError`` for a name it lacks), the
    output type's JSON Schema (an export rebuilds the run with it) and its usage
    limits; empty when the run has none."""
    extras: dict[str, Any] = {}
    if output_type is not None and output_type in output_types:
        compiled = compile_output(output_types[output_type])
        if compiled is not None:
            spec = compiled.legacy or compiled.spec  # one schema, as an export reads it
            extras["output_schema"] = thaw_json(spec.definition.parameters)
    for key, name in (("instructions", instructions), ("output_types", output_type)):
        if name is None:
            continue
        known = registry.get(key, {})
        if name not in known:
            what = "output type" if key == "output_types" else key
            raise InvalidInputError(f"unknown {what} {name!r}; known: {sorted(known)}")
        extras[key] = name
    limits = check_usage_limits(usage_limits)
    if limits is not None:
        extras["usage_limits"] = {f: getattr(limits, f) for f in _LIMITS}
    return extras


def run_input(
    runner: Any, where: str, run_id: str, options: DurableRunOptions
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run's input for the ``runner``'s method ``where`` (``start``, ``enqueue``): its
    ``options`` checked against the runner's registry (its ``models``, ``tools``,
    ``manifest`` and ``output_types``), as ``run_spec`` and ``run_extras`` record them."""
    from statemachine.durable import DurableRunOptions  # the public module imports this one

    refuse_unknown(where, options, DurableRunOptions)
    for key in ("model", "messages"):
        if key not in options:
            raise TypeError(f"{where}() missing 1 required keyword-only argument: {key!r}")
    extras = run_extras(
        runner.manifest,
        runner.output_types,
        options.get("instructions"),
        options.get("output_type"),
        options.get("usage_limits"),
    )
    spec = run_spec(
        run_id,
        options["model"],
        options["messages"],
        options.get("tools"),
        options.get("max_turns", DEFAULT_MAX_TURNS),
        models=runner.models,
        registry_tools=runner.tools,
    )
    return spec, extras


def worker_manifest(
    models: Sequence[str],
    tools: Sequence[Tool],
    hooks: Mapping[str, Any],
    steps: Sequence[Step],
    instructions: Mapping[str, Any],
    output_types: Mapping[str, Any],
) -> tuple[Table, dict[str, Any]]:
    """A worker's registry as its runs record it: the table of its ``steps`` (checked,
    ``InvalidInputError`` first) and its ``manifest`` ``with_extras``."""
    table = check_steps(steps)
    registry = manifest(models, tools, hooks, steps, table)
    return table, with_extras(registry, instructions, output_types)


def unknown_extras(
    spec: Mapping[str, Any], instructions: Mapping[str, Any], output_types: Mapping[str, Any]
) -> list[str]:
    """The blocking changes for a run ``spec`` on a worker with these registries: its
    instructions or output type gone."""
    blocking = []
    if spec.get("instructions") is not None and spec["instructions"] not in instructions:
        blocking.append(f"instructions {spec['instructions']!r} are not in this worker's registry")
    if spec.get("output_types") is not None and spec["output_types"] not in output_types:
        blocking.append(f"output type {spec['output_types']!r} is not in this worker's registry")
    return blocking


def run_options(
    spec: Mapping[str, Any], instructions: Mapping[str, Any], output_types: Mapping[str, Any]
) -> dict[str, Any]:
    """The run's keyword arguments (``AgentRun``) for what ``run_extras`` recorded."""
    options: dict[str, Any] = {}
    if spec.get("instructions") is not None:
        options["instructions"] = instructions[spec["instructions"]]
    if spec.get("output_types") is not None:
        options["output_type"] = output_types[spec["output_types"]]
    if spec.get("usage_limits") is not None:
        options["usage_limits"] = UsageLimits(**spec["usage_limits"])
    return options


async def _never_decides(*args: Any) -> str:
    raise AssertionError("an export answers the steps from their recorded decisions")


def replay_options(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The options that shape a run's course, for rebuilding it without the registry
    (an export): its output type's JSON Schema, its usage limits and its steps (their
    declarations, each answered by its recorded decisions; ``StepDeclarationError``
    for recorded declarations that do not make a table)."""
    options: dict[str, Any] = {}
    if spec.get("steps"):
        table = table_from_data(spec["steps"])
        options["steps"] = [
            Step(s.name, s.point, dict(s.outcomes), _never_decides, on_error=s.on_error)
            for s in table.steps
        ]
    if spec.get("output_schema") is not None:
        options["output_type"] = spec["output_schema"]
    if spec.get("usage_limits") is not None:
        options["usage_limits"] = UsageLimits(**spec["usage_limits"])
    return options
