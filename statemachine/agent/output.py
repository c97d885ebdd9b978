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

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

import attrs

from statemachine.agent.model import takes_options
from statemachine.agent.signature import Converter, compile_annotation
from statemachine.core.messages import AssistantMessage, Message, ToolResultMessage, thaw_json
from statemachine.core.output import (
    DEFAULT_OUTPUT_RETRIES,
    OUTPUT_ACCEPTED,
    OUTPUT_TOOL,
    TEXT_OUTPUT,
    OutputSpec,
    parse_text_output,
)
from statemachine.errors import InvalidInputError, UsageError

__all__ = [
    "OUTPUT_MODES",
    "Output",
    "OutputMode",
    "compile_output",
    "native_output",
    "output_json",
    "supports_native_output",
]

OutputMode: TypeAlias = Literal["tool", "native", "auto"]
"""How the model gives a run's output (module docstring)."""

OUTPUT_MODES: Final = ("tool", "native", "auto")


@attrs.frozen
class Output:
    """The engine's ``OutputSpec`` and the converter to the caller's type."""

    spec: OutputSpec
    convert: Converter | None

    @classmethod
    def untyped(cls, spec: OutputSpec | None) -> Output | None:
        """The output of a run resumed without its output type: the validated JSON
        object, unconverted (``None`` for a run without an output)."""
        return None if spec is None else cls(spec, None)

    def value(self, messages: tuple[Message, ...], call_id: str | None) -> Any:
        """The output (``call_id``: the engine's ``output_call``), converted."""
        if call_id is None:
            return None
        found = _output_value(messages, call_id)
        return found if self.convert is None or found is None else self.convert(found)


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
    """``output_type`` as an ``Output`` (``None`` for none), given as ``mode``
    (``output_mode``) says for ``model``; ``InvalidInputError`` naming ``output_type``
    for a type that cannot be a JSON Schema of an object (``native_output`` for the
    mode's errors)."""
    native = native_output(mode, model, output_type)
    if output_type is None:
        return None
    if isinstance(output_type, Mapping):
        return Output(OutputSpec.of(output_type, retries=retries, native=native), None)
    if not isinstance(output_type, type):
        raise InvalidInputError(
            f"output_type must be a class or a JSON Schema dict, got {type(output_type).__name__}"
        )
    schema, convert = compile_annotation(output_type, "output_type")
    return Output(OutputSpec.of(schema, retries=retries, native=native), convert)
