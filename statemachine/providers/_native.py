"""A run's output schema in a provider's own JSON-schema output mode (native
structured output, ``statemachine.agent.output``): the name it goes by and whether
OpenAI's ``strict`` mode can take it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from statemachine.errors import InvalidInputError

__all__ = ["OUTPUT_SCHEMA_NAME", "checked_flag", "openai_json_schema"]

OUTPUT_SCHEMA_NAME: Final = "final_result"
"""The name a provider is given for the output's schema (as the tool mode's tool)."""


def openai_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's ``json_schema`` object for ``schema``: ``strict`` only where strict
    mode accepts the schema (every object closed, every property required), since the
    API refuses a strict schema that is not; the run validates the answer either way."""
    return {"name": OUTPUT_SCHEMA_NAME, "schema": dict(schema), "strict": _strict_ready(schema)}


def _strict_ready(schema: object, depth: int = 0) -> bool:
    """True if every object schema within ``schema`` is closed and requires all of its
    properties (a schema nested deeper than 64 levels is taken as not)."""
    if depth > 64:
        return False
    if isinstance(schema, Mapping):
        properties = schema.get("properties")
        if properties is not None or schema.get("type") == "object":
            names = set(properties or {})
            if schema.get("additionalProperties") is not False:
                return False
            if set(schema.get("required") or ()) != names:
                return False
        return all(_strict_ready(v, depth + 1) for v in schema.values())
    if isinstance(schema, list):
        return all(_strict_ready(v, depth + 1) for v in schema)
    return True


def checked_flag(value: object) -> bool:
    """An adapter's ``native_output`` argument (``InvalidInputError`` unless a bool)."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"native_output must be True or False, got {value!r:.40}")
    return value
