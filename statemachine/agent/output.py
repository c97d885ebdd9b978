"""A run's output type: turned into the output's JSON Schema once, before any model
call, and the validated value back into a value of that type.

``output_type`` may be a dataclass, an attrs class, a ``TypedDict``, a pydantic model
(when pydantic is installed; its own schema and validation) or a JSON Schema given as
a dict (the output is then the validated dict). The schema must describe an object.

How the model gives it (``output_mode``):

- ``"tool"``: as the arguments of the tool ``final_result`` (``statemachine.core.output``),
  which every model that calls tools can do;
- ``"native"``: as its final text, in the provider's own JSON-schema output mode (the
  schema reaches the client as ``CallOptions.output_schema``); the client must say it
  has one with ``native_output = True`` (OpenAI Chat Completions and Responses, Gemini;
  a fake model given ``native_output=True``), or the run is refused with a
  ``UsageError`` before any model call;
- ``"auto"`` (the default): native where the client has it, the tool otherwise.

Either way the engine validates the output and sends a failed attempt back to the
model within ``output_retries`` (rule 13 of ``core/table.py``). A resumed run keeps
the mode it was suspended in.

Several types (a union, a list of types) are offered in tool mode as one tool per
member, ``final_result_<Name>`` (PydanticAI's names), each with its member's schema
and converter; ``Output.legacy`` is the union as the one tool offered before, with
which a run suspended then resumes. In native mode a union stays one schema.

``end_strategy`` (``"early"`` by default, PydanticAI's documented default) decides the
fate of a response's other calls once its final result is accepted
(``core/output.py``). Output validators may be ``async``: a run with one awaits them
in its model call (``Output.judge``), on each output the response offers, up to the
first accepted, before the engine judges the response from those verdicts.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, Union

import attrs

from statemachine.agent.context import output_context, wants_context
from statemachine.agent.events import OutputT
from statemachine.agent.model import takes_options
from statemachine.agent.signature import Converter, compile_annotation
from statemachine.agent.tools import Tool, retries_of
from statemachine.core.limits import UsageLimits, check_usage_limits
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolResultMessage,
    thaw_json,
)
from statemachine.core.output import (
    DEFAULT_OUTPUT_RETRIES,
    OUTPUT_ACCEPTED,
    OUTPUT_TOOL,
    TEXT_OUTPUT,
    EndStrategy,
    OutputSpec,
    check_end_strategy,
    is_output_tool,
    parse_text_output,
)
from statemachine.core.tools import ToolDefinition, validate_arguments
from statemachine.errors import InvalidInputError, ModelRetry, UsageError

__all__ = [
    "OUTPUT_MODES",
    "Output",
    "OutputMode",
    "OutputType",
    "OutputValidator",
    "Validated",
    "budget_options",
    "check_output_validators",
    "compile_output",
    "native_output",
    "output_json",
    "run_output",
    "supports_native_output",
]

OutputMode: TypeAlias = Literal["tool", "native", "auto"]
"""How the model gives a run's output (module docstring)."""

OUTPUT_MODES: Final = ("tool", "native", "auto")

OutputType: TypeAlias = (
    type[OutputT] | Sequence[type[OutputT]] | types.UnionType | Mapping[str, Any] | None
)
"""What ``output_type`` may be: a type, several types (a list), a union (``Any`` to
mypy: annotate the agent, ``Agent[Deps, A | B]``, to type its output), a JSON Schema dict,
or ``None`` (the output is the final text)."""


@attrs.frozen
class Output:
    """The engine's ``OutputSpec`` and the converter of its validated JSON to the
    caller's type (``None``: the JSON as it is); ``members``: the converter of each
    final-result tool of a union offered a tool per member (``convert`` is then the
    union's as one tool, what a run suspended before that offered); ``validators``:
    run on each value the type accepted, in order."""

    spec: OutputSpec
    convert: Converter | None
    members: Mapping[str, Converter | None] = attrs.field(factory=dict)
    validators: tuple[OutputValidator, ...] = ()
    # The union as one tool, for a run suspended when a union was offered so.
    legacy: OutputSpec | None = attrs.field(default=None, eq=False, repr=False)
    # The values the type accepted (``OutputSpec.check``), by their tool and JSON: the
    # output is the value judged, not a second conversion (a validator runs once per
    # value).
    _accepted: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    # What ``judge`` found of the response being handled, by the same keys.
    _verdicts: dict[str, str | None] = attrs.field(factory=dict, eq=False, repr=False)

    @classmethod
    def untyped(cls, spec: OutputSpec | None) -> Output | None:
        """The output of a run resumed without its output type: the validated JSON
        object, unconverted (``None`` for a run without an output)."""
        return None if spec is None else cls(spec, None)

    @property
    def awaits(self) -> bool:
        """Whether a validator is async: the driver then judges each response with
        ``judge`` before the engine reads the verdicts (``check``)."""
        return any(inspect.iscoroutinefunction(fn) for fn in self.validators)

    def value(self, messages: tuple[Message, ...], call_id: str | None) -> Any:
        """The output (``call_id``: the engine's ``output_call``), converted."""
        if call_id is None:
            return None
        if call_id == TEXT_OUTPUT and self.spec.text:
            text = _final_text(messages)
            return self._accepted.get(_key(TEXT_OUTPUT, text), text)  # as validated
        tool, found = _output_value(messages, call_id)
        if found is None or not self._typed_at_all():
            return found
        key = _key(tool, found)
        return self._accepted[key] if key in self._accepted else self._converted(found, tool)

    def from_json(self, value: Any) -> Any:
        """``value``, the validated JSON of an output recorded without its tool (a
        durable run's), converted: by the first member whose tool's schema it matches
        and whose converter accepts it, else by the union's one-tool converter."""
        for definition in self.spec.tools if self.members else ():
            convert = self.members.get(definition.name)
            if validate_arguments(definition, value):
                continue
            try:
                return value if convert is None else convert(value)
            except Exception:  # noqa: BLE001 - not this member: try the next
                continue
        return value if self.convert is None else self.convert(value)

    def _typed_at_all(self) -> bool:
        return self.convert is not None or bool(self.members) or bool(self.validators)

    def _converted(self, value: Any, tool: str) -> Any:
        convert = self._converter(tool)
        result = value if convert is None else convert(value)
        for fn in self.validators:
            result = _validate(fn, result, tool)
        return result

    def _converter(self, tool: str) -> Converter | None:
        if tool == TEXT_OUTPUT and self.spec.text:
            return None  # the text of a union with str is the output as it is
        return self.members.get(tool, self.convert)

    def check(self, value: Any, tool: str) -> str | None:
        """``OutputSpec.check``: why the type refuses ``value`` given in ``tool`` (what
        its conversion or a validator raised, ``ModelRetry`` included), or ``None``.

        The engine asks twice of a text it refuses (``OutputSpec.accepts``, then
        ``missed``): the first verdict is kept for the second, and only for it, so a
        validator runs once per attempt, and again on the same text next attempt."""
        if not self._typed_at_all():
            return None
        key = _key(tool, value)
        if key in self._verdicts:
            return self._verdicts[key] if self.awaits else self._verdicts.pop(key)
        if self.awaits:  # judged by ``judge`` in a driver that awaits; none did here
            return "an async output validator can only judge the output in a run that awaits it"
        try:
            self._accepted[key] = self._converted(value, tool)
        except Exception as exc:  # noqa: BLE001 - a type that refuses: a failed attempt, never a crash
            problem = _problem(exc)
            if tool == TEXT_OUTPUT and self.spec.text:
                self._verdicts[key] = problem
            return problem
        return None

    async def judge(self, message: AssistantMessage) -> None:
        """Judge the outputs ``message`` offers, in order, up to the first accepted,
        awaiting async validators; ``check`` then answers the engine from the verdicts."""
        self._verdicts.clear()
        for tool, value in _candidates(self.spec, message):
            key = _key(tool, value)
            try:
                convert = self._converter(tool)
                result = value if convert is None else convert(value)
                for fn in self.validators:
                    result = _validate(fn, result, tool)
                    if inspect.isawaitable(result):
                        result = await result
            except Exception as exc:  # noqa: BLE001 - as in check
                self._verdicts[key] = _problem(exc)
                continue
            self._accepted[key] = result
            self._verdicts[key] = None
            return


def _validate(fn: OutputValidator, value: Any, tool: str) -> Any:
    if not wants_context(fn):
        return fn(value)
    context = output_context(None if tool == TEXT_OUTPUT else tool)
    return fn(context, value) if context is not None else fn(value)


def _problem(exc: Exception) -> str:
    """What a refusal says to the model: a retry request's message, or the error."""
    if isinstance(exc, ModelRetry):
        return _bounded(str(exc))
    return _bounded(f"{type(exc).__name__}: {exc}")


def _candidates(spec: OutputSpec, message: AssistantMessage) -> list[tuple[str, Any]]:
    """The outputs ``message`` offers that match their schema, in order, each with the
    tool that carried it (``TEXT_OUTPUT``: a native final text, or the text of a union
    with str)."""
    if message.stop_reason in (StopReason.ERROR, StopReason.ABORTED):
        return []
    if spec.text and not message.tool_calls:  # a final text of a union with str
        return [(TEXT_OUTPUT, message.text)]
    if spec.native:
        if message.tool_calls:
            return []
        try:
            value = parse_text_output(message.text)
        except ValueError:
            return []
        fits = isinstance(value, dict) and not validate_arguments(spec.definition, value)
        return [(TEXT_OUTPUT, value)] if fits else []
    tools = {d.name: d for d in spec.tools}
    return [
        (call.name, thaw_json(call.arguments))
        for call in message.tool_calls
        if call.name in tools
        and call.parse_error is None
        and not validate_arguments(tools[call.name], call.arguments)
    ]


_PROBLEM_CHARS: Final = 2_000
"""At most this much of what a type's validation said is sent back to the model."""


def _bounded(text: str) -> str:
    return text if len(text) <= _PROBLEM_CHARS else text[:_PROBLEM_CHARS] + "..."


def _key(tool: str, value: Any) -> str:
    return tool + ":" + json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _final_text(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            return message.text
    return ""


def run_output(output: Output | None, messages: tuple[Message, ...], call_id: str | None) -> Any:
    """``RunResult.output`` of a ``Done`` run: its output type's value, or the final
    text of a run whose output is plain text (no ``output_type``, or ``str``)."""
    return _final_text(messages) if output is None else output.value(messages, call_id)


def _output_value(messages: Sequence[Message], call_id: str) -> tuple[str, Any]:
    """The validated JSON object of the output with the tool that carried it: the
    accepted call's arguments, or the last final answer's text (``TEXT_OUTPUT``,
    native mode)."""
    for message in reversed(messages):
        if not isinstance(message, AssistantMessage):
            continue
        if call_id == TEXT_OUTPUT:
            return TEXT_OUTPUT, parse_text_output(message.text)
        for call in message.tool_calls:
            if call.id == call_id:
                return call.name, thaw_json(call.arguments)
    return call_id, None


def output_json(messages: Sequence[Message]) -> Any:
    """The validated JSON object a ``Done`` run with an output type gave, read from its
    messages: the arguments of the accepted ``final_result`` call, or else (native
    mode) the text of its last answer."""
    accepted = [
        m.tool_call_id
        for m in messages
        if isinstance(m, ToolResultMessage)
        and is_output_tool(m.tool_name)
        and not m.is_error
        and m.text == OUTPUT_ACCEPTED
    ]
    return _output_value(messages, accepted[-1] if accepted else TEXT_OUTPUT)[1]


def supports_native_output(model: object) -> bool:
    """True if ``model`` has a JSON-schema output mode: it takes ``options`` and says
    ``native_output = True``."""
    return takes_options(model) and getattr(model, "native_output", False) is True


def native_output(mode: object, model: object, output_type: object) -> bool:
    """Whether a run of ``model`` with ``output_type`` gives it natively (``mode``:
    ``output_mode``); ``InvalidInputError`` for an unknown mode, ``UsageError`` for
    ``"native"`` with a client that has no such mode."""
    if not isinstance(mode, str) or mode not in OUTPUT_MODES:
        raise InvalidInputError(f"output_mode must be 'tool', 'native' or 'auto', got {mode!r:.40}")
    if output_type is None or mode == "tool":
        return False
    supported = supports_native_output(model)
    if mode == "native" and not supported:
        raise UsageError(
            f"output_mode='native': the model client {type(model).__name__} has no "
            "JSON-schema output mode (it does not declare native_output = True and take "
            "options); use output_mode='tool' or 'auto'"
        )
    return supported


def compile_output(
    output_type: object,
    retries: int = DEFAULT_OUTPUT_RETRIES,
    mode: object = "tool",
    model: object = None,
    end_strategy: EndStrategy = "early",
) -> Output | None:
    """``output_type`` as an ``Output`` (``None`` for none, or plain text: ``str``;
    plain text with validators: an output judged by them, ``OutputSpec.plain_text``),
    given as ``mode`` (``output_mode``) says for ``model`` (module docstring), its
    other calls treated as ``end_strategy`` says; ``InvalidInputError`` naming
    ``output_type`` for a type that has no JSON Schema (``native_output`` for the
    mode's errors)."""
    validators: tuple[OutputValidator, ...] = ()
    if isinstance(output_type, Validated):
        validators = output_type.validators
        output_type = output_type.output_type
    native = native_output(mode, model, output_type)
    output = _compiled(output_type, retries, native)
    if output is None:
        if not validators:
            return None
        # plain text judged by its validators (PydanticAI's text output validators)
        output = Output(OutputSpec.plain_text(retries=retries), None)
    output = attrs.evolve(output, validators=validators)
    if output.convert is None and not output.members and not validators:
        spec = output.spec  # a JSON Schema: nothing to judge beyond it
    else:
        spec = attrs.evolve(output.spec, check=output.check)
    legacy = output.legacy and attrs.evolve(output.legacy, check=output.check)
    strategy = check_end_strategy(end_strategy)
    legacy = legacy and attrs.evolve(legacy, end_strategy=strategy)
    return attrs.evolve(output, spec=attrs.evolve(spec, end_strategy=strategy), legacy=legacy)


def _compiled(output_type: object, retries: int, native: bool) -> Output | None:
    """The output of a type (no validators, no end strategy): one tool, or one per
    member of a union in tool mode."""
    if output_type is None or output_type is str:
        return None
    if isinstance(output_type, Mapping):
        return Output(OutputSpec.of(output_type, retries=retries, native=native), None)
    members = _members(output_type)
    text = str in members and not native  # native: the text is the JSON of the output
    typed = [m for m in members if not (text and m is str)]
    if not typed:
        return None
    compiled = [(m, *compile_annotation(m, "output_type")) for m in typed]
    if len(typed) == 1 and _model_like(typed[0]):
        schema, convert = compiled[0][1], compiled[0][2]
    else:
        schema, convert = _wrapped(compiled)
    single = OutputSpec.of(schema, retries=retries, native=native, text=text)
    if len(typed) == 1 or native:
        return Output(single, convert)
    # A tool per member (PydanticAI's way): each member's schema as one tool would give it.
    tools = [
        _member_tool(m, member_schema, member_convert)
        for m, member_schema, member_convert in compiled
    ]
    names = _tool_names([m for m in typed])
    spec = OutputSpec.of_members(
        [(name, schema) for name, (schema, _) in zip(names, tools, strict=True)],
        retries=retries,
        text=text,
    )
    converters = {d.name: c for d, (_, c) in zip(spec.tools, tools, strict=True)}
    return Output(spec, convert, converters, legacy=single)


def _member_tool(
    member: Any, schema: dict[str, Any], convert: Converter | None
) -> tuple[dict[str, Any], Converter | None]:
    """A member's final-result tool: its schema and converter, wrapped in
    ``WRAPPER_KEY`` unless it is an object with named fields."""
    if _model_like(member):
        return schema, convert
    return _wrapped([(member, schema, convert)])


def _tool_names(members: Sequence[Any]) -> list[str]:
    """Each member's name in its tool's (``final_result_<name>``): its type's name, made
    of what a tool name may hold, numbered when two members share one."""
    names: list[str] = []
    for member in members:
        base = re.sub(r"[^A-Za-z0-9_]", "_", _type_name(typing.get_origin(member) or member))
        name, n = base[:40], 1
        while name in names:
            n += 1
            name = f"{base[:40]}_{n}"
        names.append(name)
    return names


OutputValidator: TypeAlias = Callable[..., Any]
"""``fn(output)`` or ``fn(ctx: RunContext, output)``, sync or ``async``: returns the
output (the same value, or a corrected one); raises ``ModelRetry`` to ask the model for
another."""


@attrs.frozen
class Validated:
    """An output type with validators run on each value the type accepted, in order
    (what ``Agent(output_validators=...)`` gives its runs as their ``output_type``)."""

    output_type: Any
    validators: tuple[OutputValidator, ...]


def check_output_validators(validators: Sequence[OutputValidator]) -> tuple[OutputValidator, ...]:
    """``validators`` checked: callables, sync or ``async`` (an async one is awaited by
    the driver on each response that offers an output, before the engine judges it)."""
    for fn in validators:
        if not callable(fn):
            raise InvalidInputError(f"an output validator must be a function, got {fn!r:.60}")
    return tuple(validators)


WRAPPER_KEY: Final = "response"
"""The one property of the object that carries an output that is not an object (as
PydanticAI wraps it): ``{"response": 3}`` for an ``int``."""


def _members(output_type: object) -> list[Any]:
    """The types a value of ``output_type`` may be: a list of output types, or a
    union's members (nested unions flattened), in order, each once."""
    if isinstance(output_type, (list, tuple)):
        if not output_type:
            raise InvalidInputError("output_type: an empty list of output types")
        found = [m for item in output_type for m in _members(item)]
    elif typing.get_origin(output_type) in (Union, types.UnionType):
        found = [m for item in typing.get_args(output_type) for m in _members(item)]
    else:
        found = [output_type]
    return list(dict.fromkeys(found))


def _model_like(annotation: object) -> bool:
    """Whether ``annotation`` is an object with named fields (its schema is given as
    it is; anything else is wrapped in ``WRAPPER_KEY``)."""
    return isinstance(annotation, type) and (
        dataclasses.is_dataclass(annotation)
        or attrs.has(annotation)
        or typing.is_typeddict(annotation)
        or callable(getattr(annotation, "model_json_schema", None))
    )


def _wrapped(
    compiled: list[tuple[Any, dict[str, Any], Converter | None]],
) -> tuple[dict[str, Any], Converter]:
    """The object schema ``{"response": <member, or anyOf the members>}`` and its
    converter: the first member whose schema the value matches and whose conversion
    accepts it (a union, as pydantic's tries its members)."""
    defs: dict[str, Any] = {}
    members = [(m, _hoisted(schema, defs), convert) for m, schema, convert in compiled]
    inner = members[0][1] if len(members) == 1 else {"anyOf": [s for _, s, _ in members]}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {WRAPPER_KEY: inner},
        "required": [WRAPPER_KEY],
        "additionalProperties": False,
    }
    if defs:
        schema["$defs"] = defs
    checks = [
        (_type_name(m), ToolDefinition(OUTPUT_TOOL, "", {**schema, "properties": {WRAPPER_KEY: s}}))
        for m, s, _ in members
    ]

    def convert(value: Mapping[str, Any]) -> Any:
        inner_value = value[WRAPPER_KEY]
        problems = []
        for (name, definition), (_, _, member_convert) in zip(checks, members, strict=True):
            if len(members) > 1 and validate_arguments(definition, value):
                problems.append(f"not a {name}")
                continue
            try:
                return inner_value if member_convert is None else member_convert(inner_value)
            except ModelRetry:
                raise
            except Exception as exc:  # this member refuses it: try the next
                if len(members) == 1:
                    raise
                problems.append(f"not a {name} ({type(exc).__name__}: {exc})")
        raise ValueError("the value is none of the output types: " + "; ".join(problems))

    return schema, convert


def _hoisted(schema: Any, defs: dict[str, Any]) -> Any:
    """``schema`` with every ``$defs`` moved into ``defs`` (their ``#/$defs/...``
    references then resolve from the wrapper, the document's root)."""
    if isinstance(schema, list):
        return [_hoisted(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$defs" and isinstance(value, dict):
            for name, definition in value.items():
                defs[name] = _hoisted(definition, defs)
        else:
            out[key] = _hoisted(value, defs)
    return out


def _type_name(annotation: object) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)


def budget_options(
    usage_limits: UsageLimits | None,
    output: Output | None,
    tools: Sequence[Tool],
    unknown_tool_retries: int | None = None,
) -> dict[str, Any]:
    """The engine options of a run's budget, given only when set (so that an
    ``engine_factory`` written before them still works for runs without them).

    ``unknown_tool_retries`` counts calls of a tool the run does not offer (rule 14);
    an ``Agent`` gives its ``output_retries``, as PydanticAI counts them against its
    agent's retries for output validation."""
    budgets = retries_of(tools)
    options: dict[str, Any] = {"tool_retries": budgets} if budgets else {}
    if unknown_tool_retries is not None:
        options["unknown_tool_retries"] = unknown_tool_retries
    if check_usage_limits(usage_limits) is not None:
        options["usage_limits"] = usage_limits
    if output is not None:
        options["output"] = output.spec
    return options
