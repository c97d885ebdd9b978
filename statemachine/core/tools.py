"""Tool definitions as the sans-IO core sees them: name, schema, output, scheduling.

A ``ToolDefinition`` is what the model sees (name, description, JSON Schema of the
arguments); it is checked when it is made, so a broken schema is the caller's error
at start-up, never a mystery at the first call. Its compiled validator lives on it,
because validation is pure computation and belongs to the sans-IO core: the engine
rejects bad arguments with an error result before any tool code runs.

References (``$ref``) are checked with the schema: only local, non-recursive ones
(``#/$defs/...``, ``#/properties/...``, ``#anchor``) are allowed, and every one must
resolve. A remote or relative reference would make jsonschema fetch it (over the
network, or from a ``file:`` URI) at the first validation, and a recursive schema is
one that several providers refuse; both are ``InvalidInputError`` when the tool is
defined, naming the tool and the reference. The compiled validator is also given a
registry that cannot retrieve anything, so validation never touches the network or
the filesystem whatever the schema says.

The runtime half (``Tool``, ``@tool``) is in ``statemachine.agent.tools``.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs
import jsonschema
import jsonschema.validators
import referencing

from statemachine.core.abort import AbortSignal
from statemachine.core.messages import (
    ImageContent,
    TextContent,
    ToolResultContent,
    Usage,
    _validate,
    freeze_json,
    thaw_json,
)
from statemachine.errors import InvalidInputError, WireFormatError

__all__ = [
    "DEFAULT_TOOL_RETRIES",
    "ResourceKeys",
    "Scheduling",
    "ToolDefinition",
    "ToolExecute",
    "ToolOutput",
    "ToolReturn",
    "check_retry_budget",
    "check_tool_retries",
    "validate_arguments",
]

# Providers restrict tool names; OpenAI's rule is the strictest common one.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _check_name(_: object, __: object, value: str) -> None:
    if not isinstance(value, str) or not _TOOL_NAME.match(value):
        raise InvalidInputError(
            f"tool name {value!r} is invalid: use 1 to 64 letters, digits, '_' or '-'"
        )


def _freeze_schema(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(
            f"tool parameters must be a JSON Schema object (a mapping), got {type(value).__name__}"
        )
    try:
        frozen: Mapping[str, Any] = freeze_json(value, "parameters")
    except WireFormatError as exc:  # the caller's schema: misuse, not bad data
        raise InvalidInputError(str(exc)) from None
    return frozen


@attrs.frozen
class ToolDefinition:
    """What the model is told about a tool. ``parameters`` is a JSON Schema with
    ``"type": "object"``; it is checked here and compiled once."""

    name: str = attrs.field(validator=_check_name)
    description: str = attrs.field(validator=attrs.validators.instance_of(str))
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}, converter=_freeze_schema
    )
    _validator: Any = attrs.field(init=False, repr=False, eq=False)
    _certainly_valid: Callable[[Mapping[str, Any]], bool] | None = attrs.field(
        init=False, repr=False, eq=False
    )

    def __attrs_post_init__(self) -> None:
        schema = thaw_json(self.parameters)
        if schema.get("type") != "object":
            raise InvalidInputError(
                f"tool {self.name!r}: parameters must be a JSON Schema whose type is "
                f"'object' (tool arguments are a JSON object), got type {schema.get('type')!r}"
            )
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.path) or "(root)"
            raise InvalidInputError(
                f"tool {self.name!r}: parameters is not a valid JSON Schema at {where}: "
                f"{exc.message}"
            ) from None
        _check_references(self.name, schema)
        # An empty registry retrieves nothing: jsonschema's default one would fetch
        # an unknown URI with urlopen (http and file alike) in the middle of a run.
        object.__setattr__(self, "_validator", cls(schema, registry=referencing.Registry()))
        object.__setattr__(self, "_certainly_valid", _fast_check(schema))

    def schema_dict(self) -> dict[str, Any]:
        """A plain, mutable copy of the parameters schema (for provider requests)."""
        schema: dict[str, Any] = thaw_json(self.parameters)
        return schema


# Keywords whose value is a schema, a list of schemas, or a map of schemas, across
# drafts 4 to 2020-12 (a superset: a keyword another draft ignores may only make a
# reference be checked that would never be followed, never the other way round).
_SUBSCHEMA = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_SUBSCHEMA_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_SUBSCHEMA_MAP = frozenset(
    {"properties", "patternProperties", "dependentSchemas", "dependencies", "$defs", "definitions"}
)
_DEFINITIONS = frozenset({"$defs", "definitions"})
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")

_Pointer: TypeAlias = tuple[str | int, ...]


def _subschemas(
    schema: Any, at: _Pointer, *, definitions: bool = True
) -> Iterable[tuple[_Pointer, Mapping[str, Any]]]:
    """``(pointer, subschema)`` for ``schema`` and every schema object inside it.

    ``definitions=False`` skips ``$defs``: what validating against ``schema`` can
    reach, as opposed to everything the document holds.
    """
    if not isinstance(schema, Mapping):
        return
    yield at, schema
    for key, value in schema.items():
        if key in _DEFINITIONS and not definitions:
            continue
        if key in _SUBSCHEMA_LIST and isinstance(value, list):
            for i, item in enumerate(value):
                yield from _subschemas(item, (*at, key, i), definitions=definitions)
        elif key in _SUBSCHEMA_MAP and isinstance(value, Mapping):
            for name, item in value.items():
                yield from _subschemas(item, (*at, key, name), definitions=definitions)
        elif key in _SUBSCHEMA:
            yield from _subschemas(value, (*at, key), definitions=definitions)


def _where(pointer: _Pointer) -> str:
    return "/".join(str(p) for p in pointer) or "(root)"


def _ref_target(
    ref: str, schema: Mapping[str, Any], anchors: Mapping[str, _Pointer]
) -> _Pointer | None:
    """Where a ``#...`` reference points inside ``schema``; None if nowhere."""
    fragment = urllib.parse.unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        return anchors.get(fragment)
    node: Any = schema
    pointer: list[str | int] = []
    for raw in fragment.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and token.isdigit() and int(token) < len(node):
            pointer.append(int(token))
            node = node[int(token)]
        elif isinstance(node, Mapping) and token in node:
            pointer.append(token)
            node = node[token]
        else:
            return None
    return tuple(pointer) if isinstance(node, (Mapping, bool)) else None


def _check_references(tool_name: str, schema: Mapping[str, Any]) -> None:
    """Refuse remote, relative, dangling and recursive references (module docstring)."""

    def refuse(ref: str, at: _Pointer, why: str) -> InvalidInputError:
        return InvalidInputError(
            f"tool {tool_name!r}: parameters reference {ref!r} (at {_where(at)}) {why}; "
            "only local references such as '#/$defs/Name' to a part of the same schema "
            "that does not refer back to itself are allowed"
        )

    anchors: dict[str, _Pointer] = {}
    refs: list[tuple[_Pointer, str]] = []
    for at, sub in _subschemas(schema, ()):
        if at and "$id" in sub:
            raise refuse(str(sub["$id"]), at, "is an embedded $id, which moves the base URI")
        for keyword in ("$anchor", "$dynamicAnchor"):
            if isinstance(sub.get(keyword), str):
                anchors.setdefault(sub[keyword], at)
        refs.extend((at, sub[k]) for k in _REF_KEYWORDS if isinstance(sub.get(k), str))
    for at, ref in refs:
        if not ref.startswith("#"):
            raise refuse(ref, at, "is not local: it would be fetched at validation time")
        if _ref_target(ref, schema, anchors) is None:
            raise refuse(ref, at, "does not resolve inside the schema")
    _check_acyclic(schema, anchors, refuse)


def _check_acyclic(
    schema: Mapping[str, Any],
    anchors: Mapping[str, _Pointer],
    refuse: Callable[[str, _Pointer, str], InvalidInputError],
) -> None:
    """Depth-first over what each reference reaches; a target met again on the
    current path is a recursive schema."""
    _visit((), schema, anchors, refuse, path=[], done=set())


def _visit(
    target: _Pointer,
    schema: Mapping[str, Any],
    anchors: Mapping[str, _Pointer],
    refuse: Callable[[str, _Pointer, str], InvalidInputError],
    *,
    path: list[_Pointer],
    done: set[_Pointer],
) -> None:
    """One step of ``_check_acyclic`` (a module function: a closure calling itself is a
    reference cycle that only the cycle collector frees)."""
    path.append(target)
    node: Any = schema
    for token in target:
        node = node[token]
    for at, sub in _subschemas(node, target, definitions=False):
        for ref in (sub[k] for k in _REF_KEYWORDS if isinstance(sub.get(k), str)):
            inner = _ref_target(ref, schema, anchors)
            if inner in path:
                raise refuse(ref, at, "makes the schema recursive")
            if inner is not None and inner not in done:
                _visit(inner, schema, anchors, refuse, path=path, done=done)
    path.pop()
    done.add(target)


_FAST_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


def _fast_check(schema: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool] | None:
    """A check that can only say "certainly valid", for flat schemas like ``@tool``'s.

    Validation is the largest per-call cost of the loop (bench/); most schemas are a
    flat object of primitive properties. For those this answers True only where
    jsonschema would; False means "not sure", and jsonschema decides and writes the
    errors, so no decision and no message changes. ``None``: the schema is not flat.
    """
    if set(schema) - {"type", "properties", "required", "additionalProperties", "description"}:
        return None
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return None
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, sub in properties.items():
        if not isinstance(sub, dict) or set(sub) - {"type", "description", "default"}:
            return None
        kind = sub.get("type")
        check = _FAST_TYPES.get(kind) if isinstance(kind, str) else None
        if check is None:
            return None
        checks[name] = check
    required = schema.get("required", [])
    additional = schema.get("additionalProperties", True)
    if not isinstance(required, list) or not isinstance(additional, bool):
        return None
    required_names = tuple(required)

    def certainly_valid(arguments: Mapping[str, Any]) -> bool:
        for name in required_names:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            check = checks.get(name)
            if check is None:
                if not additional:
                    return False
            elif not check(value):
                return False
        return True

    return certainly_valid


def validate_arguments(definition: ToolDefinition, arguments: Mapping[str, Any]) -> list[str]:
    """Every schema violation of ``arguments``, each naming its path; empty if valid.

    Sorted by path, so the text is the same whatever order jsonschema walks in
    (determinism, I5).
    """
    fast = definition._certainly_valid
    if fast is not None and fast(arguments):
        return []
    instance = thaw_json(arguments)
    errors = sorted(
        definition._validator.iter_errors(instance),
        # Paths sort as paths: array indices by number ([2] before [10]), keys by name.
        key=lambda e: ([(isinstance(p, str), p) for p in e.absolute_path], e.message),
    )
    out = []
    for error in errors:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        out.append(f"arguments{path}: {error.message}")
    return out


def _output_content(value: Any) -> tuple[ToolResultContent, ...]:
    if isinstance(value, str):
        return (TextContent(value),)
    blocks = tuple(value)
    for i, block in enumerate(blocks):
        if not isinstance(block, (TextContent, ImageContent)):
            raise TypeError(
                f"tool output content[{i}] is a {type(block).__name__}; "
                "expected TextContent or ImageContent"
            )
    return blocks


DEFAULT_TOOL_RETRIES: Final = 1
"""How many retry requests in a row a tool may make before the run ends
``ToolRetriesExceeded`` (``Tool(retries=...)``; rule 14 of ``core/table.py``)."""


def check_tool_retries(value: Mapping[str, int]) -> dict[str, int]:
    """``value`` (tool name -> retry budget) checked: each budget an integer >= 0."""
    if not isinstance(value, Mapping):
        raise InvalidInputError("tool_retries must map tool names to integers >= 0")
    for name, budget in value.items():
        check_retry_budget(f"tool_retries[{name!r:.40}]", budget)
    return dict(value)


def check_retry_budget(name: str, value: object) -> int:
    """``value`` if it is a retry budget: an ``int`` of at least 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be an integer >= 0, got {value!r:.40}")
    return value


def _requests(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"ToolOutput.requests must be an integer >= 0, got {value!r:.40}")


@attrs.frozen(init=False)
class ToolOutput:
    """What a tool may return when it wants to say more than a string: content blocks
    and whether they describe a failure the model should see as such."""

    content: tuple[ToolResultContent, ...] = attrs.field(converter=_output_content)
    is_error: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    # What the tool spent on the run's behalf (a sub-agent's model calls and tokens):
    # it joins the run's usage and counts against its usage limits (core/limits.py).
    usage: Usage | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(Usage)),
        kw_only=True,
    )
    requests: int = attrs.field(default=0, validator=_requests, kw_only=True)
    # The tool asked the model to try again (it raised ModelRetry): an error result
    # counted against the tool's retry budget (rule 14 of core/table.py).
    retry: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool), kw_only=True
    )

    # Its own __init__, as the messages write theirs (core/messages.py): one is made per
    # tool call, and a str, the usual output, is wrapped on one type test; anything
    # else goes through the field's converter and validator, so the same errors.
    def __init__(
        self,
        content: Any,
        is_error: bool = False,
        *,
        usage: Usage | None = None,
        requests: int = 0,
        retry: bool = False,
    ) -> None:
        if content.__class__ is str:
            _set(self, "content", (TextContent(content),))
        else:
            _set(self, "content", _output_content(content))
        _set(self, "is_error", is_error)
        if is_error.__class__ is not bool:
            _validate(ToolOutput, "is_error", self, is_error)
        _set(self, "usage", usage)
        _set(self, "requests", requests)
        _set(self, "retry", retry)
        if usage is not None or requests != 0 or retry is not False:  # the usual output
            _validate(ToolOutput, "usage", self, usage)
            _validate(ToolOutput, "requests", self, requests)
            _validate(ToolOutput, "retry", self, retry)


_set = object.__setattr__

ToolReturn: TypeAlias = str | Sequence[ToolResultContent] | ToolOutput
ToolExecute: TypeAlias = Callable[[dict[str, Any], AbortSignal], Awaitable[ToolReturn]]


ResourceKeys: TypeAlias = Callable[[Mapping[str, Any]], "Iterable[str]"]
"""``resources(arguments)``: the names of what a call touches (e.g. resolved paths)."""


def check_timeout(_: object, __: object, value: float | None) -> None:
    if value is not None and (
        # "not > 0" also refuses NaN, which no comparison would ever time out against
        isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
    ):
        raise InvalidInputError(f"tool timeout must be a positive number of seconds, got {value!r}")


@attrs.frozen
class Scheduling:
    """How the calls of one tool may run beside the other calls of their batch.

    The engine reads it (it decides what starts when, so the order is deterministic).
    ``sequential``: a barrier; the call runs alone, after every call before it.
    ``resources``: a pure function of the arguments naming what the call touches;
    calls whose resources overlap run one after another, in call order. Everything
    else runs concurrently.
    """

    sequential: bool = False
    resources: ResourceKeys | None = None
