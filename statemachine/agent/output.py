"""A run's output type: turned into the final-result tool's JSON Schema once, before
any model call, and the validated arguments back into a value of that type.

``output_type`` may be a dataclass, an attrs class, a ``TypedDict``, a pydantic model
(when pydantic is installed; its own schema and validation) or a JSON Schema given as
a dict (the output is then the validated dict). The schema must describe an object:
it is the parameters of the tool ``final_result`` (``statemachine.core.output``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from statemachine.agent.signature import Converter, compile_annotation
from statemachine.core.messages import AssistantMessage, Message, thaw_json
from statemachine.core.output import DEFAULT_OUTPUT_RETRIES, OutputSpec
from statemachine.errors import InvalidInputError

__all__ = ["Output", "compile_output"]


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
        """The output: the arguments of the accepted call ``call_id``, converted."""
        if call_id is None:
            return None
        for message in reversed(messages):
            if isinstance(message, AssistantMessage):
                for call in message.tool_calls:
                    if call.id == call_id:
                        arguments = thaw_json(call.arguments)
                        return arguments if self.convert is None else self.convert(arguments)
        return None


def compile_output(output_type: object, retries: int = DEFAULT_OUTPUT_RETRIES) -> Output | None:
    """``output_type`` as an ``Output`` (``None`` for none); ``InvalidInputError``
    naming ``output_type`` for a type that cannot be a JSON Schema of an object."""
    if output_type is None:
        return None
    if isinstance(output_type, Mapping):
        return Output(OutputSpec.of(output_type, retries=retries), None)
    if not isinstance(output_type, type):
        raise InvalidInputError(
            f"output_type must be a class or a JSON Schema dict, got {type(output_type).__name__}"
        )
    schema, convert = compile_annotation(output_type, "output_type")
    return Output(OutputSpec.of(schema, retries=retries), convert)
