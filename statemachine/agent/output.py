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
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, Union

import attrs

from statemachine.agent.context import current_run_context, wants_context
from statemachine.agent.events import OutputT
from statemachine.agent.model import takes_options
from statemachine.agent.signature import Converter, compile_annotation
from statemachine.agent.tools import Tool, retries_of
from statemachine.core.limits import UsageLimits, check_usage_limits
from statemachine.core.messages import AssistantMessage, Message, ToolResultMessage, thaw_json
from statemachine.core.output import (
    DEFAULT_OUTPUT_RETRIES,
    OUTPUT_ACCEPTED,
    OUTPUT_TOOL,
    TEXT_OUTPUT,
    OutputSpec,
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
    caller's type (``None``: the JSON as it is)."""

    spec: OutputSpec
    convert: Converter | None
    # The values the type accepted (``OutputSpec.check``), by their JSON: the output is
    # the value judged, not a second conversion (a validator runs once per value).
    _accepted: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @classmethod
    def untyped(cls, spec: OutputSpec | None) -> Output | None:
        """The output of a run resumed without its output type: the validated JSON
        object, unconverted (``None`` for a run without an output)."""
        return None if spec is None else cls(spec, None)

    def value(self, messages: tuple[Message, ...], call_id: str | None) -> Any:
        """The output (``call_id``: the engine's ``output_call``), converted."""
        if call_id is None:
            return None
        if call_id == TEXT_OUTPUT and self.spec.text:
            return _final_text(messages)
        found = _output_value(messages, call_id)
        if self.convert is None or found is None:
            return found
        key = _key(found)
        return self._accepted[key] if key in self._accepted else self.convert(found)

    def check(self, value: Any) -> str | None:
        """``OutputSpec.check``: why the type refuses ``value`` (what its conversion
        raised, validators and ``ModelRetry`` included), or ``None``."""
        if self.convert is None:
            return None
        try:
            converted = self.convert(value)
        except ModelRetry as exc:
            return _bounded(str(exc))
        except Exception as exc:  # noqa: BLE001 - a type that refuses: a failed attempt, never a crash
            return _bounded(f"{type(exc).__name__}: {exc}")
        self._accepted[_key(value)] = converted
        return None


_PROBLEM_CHARS: Final = 2_000
"""At most this much of what a type's validation said is sent back to the model."""


def _bounded(text: str) -> str:
    return text if len(text) <= _PROBLEM_CHARS else text[:_PROBLEM_CHARS] + "..."


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _final_text(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            return message.text
    return ""


def run_output(output: Output | None, messages: tuple[Message, ...], call_id: str | None) -> Any:
    """``RunResult.output`` of a ``Done`` run: its output type's value, or the final
    text of a run whose output is plain text (no ``output_type``, or ``str``)."""
    return _final_text(messages) if output is None else output.value(messages, call_id)


def _output_value(messages: Sequence[Message], call_id: str) -> Any:
    """The validated JSON object of the output: the accepted call's arguments, or the
    last final answer's text (``TEXT_OUTPUT``, native mode)."""
    for message in reversed(messages):
        if not isinstance(message, AssistantMessage):
            continue
        if call_id == TEXT_OUTPUT:
            return parse_text_output(message.text)
        for call in message.tool_calls:
            if call.id == call_id:
                return thaw_json(call.arguments)
    return None


def output_json(messages: Sequence[Message]) -> Any:
    """The validated JSON object a ``Done`` run with an output type gave, read from its
    messages: the arguments of the accepted ``final_result`` call, or else (native
    mode) the text of its last answer."""
    accepted = [
        m.tool_call_id
        for m in messages
        if isinstance(m, ToolResultMessage)
        and m.tool_name == OUTPUT_TOOL
        and not m.is_error
        and m.text == OUTPUT_ACCEPTED
    ]
    return _output_value(messages, accepted[-1] if accepted else TEXT_OUTPUT)


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
) -> Output | None:
    """``output_type`` as an ``Output`` (``None`` for none, or plain text: ``str``),
    given as ``mode`` (``output_mode``) says for ``model`` (module docstring);
    ``InvalidInputError`` naming ``output_type`` for a type that has no JSON Schema
    (``native_output`` for the mode's errors)."""
    if isinstance(output_type, Validated):
        return _validated(output_type, retries, mode, model)
    native = native_output(mode, model, output_type)
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
    wrapped = len(typed) > 1 or not _model_like(typed[0])
    if not wrapped:
        schema, convert = compiled[0][1], compiled[0][2]
    else:
        schema, convert = _wrapped(compiled)
    output = Output(OutputSpec.of(schema, retries=retries, native=native, text=text), convert)
    return attrs.evolve(output, spec=attrs.evolve(output.spec, check=output.check))


OutputValidator: TypeAlias = Callable[..., Any]
"""``fn(output)`` or ``fn(ctx: RunContext, output)``, sync: returns the output (the same
value, or a corrected one); raises ``ModelRetry`` to ask the model for another."""


@attrs.frozen
class Validated:
    """An output type with validators run on each value the type accepted, in order
    (what ``Agent(output_validators=...)`` gives its runs as their ``output_type``)."""

    output_type: Any
    validators: tuple[OutputValidator, ...]


def check_output_validators(validators: Sequence[OutputValidator]) -> tuple[OutputValidator, ...]:
    """``validators`` checked: sync callables (they run in the engine's judgement of
    the output, which does not wait)."""
    for fn in validators:
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise InvalidInputError(f"an output validator must be a sync function, got {fn!r:.60}")
    return tuple(validators)


def _validated(validated: Validated, retries: int, mode: object, model: object) -> Output | None:
    output = compile_output(validated.output_type, retries, mode, model)
    if output is None or not validated.validators:
        if validated.validators:
            raise InvalidInputError("output validators need an output_type other than str")
        return output
    convert, validators = output.convert, validated.validators

    def convert_and_validate(value: Any) -> Any:
        result = value if convert is None else convert(value)
        for fn in validators:
            context = current_run_context() if wants_context(fn) else None
            result = fn(context, result) if context is not None else fn(result)
        return result

    checked = Output(output.spec, convert_and_validate)
    return attrs.evolve(checked, spec=attrs.evolve(checked.spec, check=checked.check))


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
    usage_limits: UsageLimits | None, output: Output | None, tools: Sequence[Tool]
) -> dict[str, Any]:
    """The engine options of a run's budget, given only when set (so that an
    ``engine_factory`` written before them still works for runs without them)."""
    budgets = retries_of(tools)
    options: dict[str, Any] = {"tool_retries": budgets} if budgets else {}
    if check_usage_limits(usage_limits) is not None:
        options["usage_limits"] = usage_limits
    if output is not None:
        options["output"] = output.spec
    return options
