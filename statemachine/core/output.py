"""Structured output: the final-result tool a run offers the model, and its retry budget.

A run with an ``OutputSpec`` offers the model one more tool, ``final_result`` by
default, whose parameters are the output's JSON Schema. The engine answers a call of
it itself (it never reaches the driver): arguments that validate are the run's output
(the call gets the result "Final result accepted.", so I1 holds) and the run ends
``Done`` at the turn boundary; arguments that do not validate go back to the model as
an error result naming the problems, and a final text answer goes back as a user
message asking for the tool. Each such attempt spends one of ``retries``; one more
failure than that ends the run ``OutputInvalid`` (rules 7 and 13 of ``core/table.py``).

Where a provider has a native JSON-schema output mode (OpenAI's ``response_format``
with ``json_schema``, for instance), the final text could carry the output instead of
a tool call; the engine's rows would stay the same, with the text validated in place
of the call's arguments. Only the tool is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError

__all__ = [
    "DEFAULT_OUTPUT_RETRIES",
    "OUTPUT_ACCEPTED",
    "OUTPUT_TOOL",
    "OutputSpec",
]

OUTPUT_TOOL: Final = "final_result"
"""The name of the tool that carries the final result."""

DEFAULT_OUTPUT_RETRIES: Final = 2
"""How many failed attempts at the final result a run allows before ``OutputInvalid``."""

OUTPUT_ACCEPTED: Final = "Final result accepted."
"""The result of the final-result call whose arguments became the output."""

_DESCRIPTION: Final = (
    "Give the final result of the task. Call this exactly once, when the task is done, "
    "with arguments matching the schema; do not answer with plain text."
)


def _retries(instance: OutputSpec, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"output_retries must be an integer >= 0, got {value!r:.40}")


@attrs.frozen
class OutputSpec:
    """The final-result tool (``definition``) and the retry budget of a run."""

    definition: ToolDefinition
    retries: int = attrs.field(default=DEFAULT_OUTPUT_RETRIES, validator=_retries)

    @classmethod
    def of(cls, schema: Mapping[str, Any], *, retries: int = DEFAULT_OUTPUT_RETRIES) -> OutputSpec:
        """The spec for an object JSON Schema (``InvalidInputError`` naming
        ``output_type`` for anything else)."""
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            raise InvalidInputError(
                "output_type must give a JSON Schema of an object (a dataclass, a "
                'TypedDict, a pydantic model, or a dict with "type": "object")'
            )
        try:
            definition = ToolDefinition(OUTPUT_TOOL, _DESCRIPTION, dict(schema))
        except InvalidInputError as exc:
            raise InvalidInputError(f"output_type: {exc}") from None
        return cls(definition, retries)

    @property
    def name(self) -> str:
        return self.definition.name

    def reminder(self) -> str:
        """The user message that answers a final text answer."""
        return (
            f"Your answer was not accepted: this task needs a final result. Call the tool "
            f"{self.name} with arguments matching its JSON Schema."
        )

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.definition.schema_dict(), "retries": self.retries}

    @classmethod
    def from_dict(cls, data: object, path: str) -> OutputSpec:
        if not isinstance(data, Mapping) or set(data) != {"schema", "retries"}:
            raise InvalidInputError(f"{path}: expected an object with schema and retries")
        retries = data["retries"]
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidInputError(f"{path}.retries: expected an integer >= 0")
        try:
            return cls.of(data["schema"], retries=retries)
        except InvalidInputError as exc:
            raise InvalidInputError(f"{path}.schema: {exc}") from None


def check_output(value: object, tool_names: set[str]) -> OutputSpec | None:
    """``value`` if it is an ``OutputSpec`` (or ``None``) whose tool name no tool has."""
    if value is None:
        return None
    if not isinstance(value, OutputSpec):
        raise InvalidInputError(f"output must be an OutputSpec, got {type(value).__name__}")
    if value.name in tool_names:
        raise InvalidInputError(
            f"a tool is named {value.name!r}, the name of the final-result tool of a run "
            "with an output_type: rename the tool"
        )
    return value
