"""The tool boundary: definitions, runtimes, argument validation, and ``@tool``.

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

A ``Tool`` adds the runtime: ``async execute(arguments, signal)``. ``@tool`` builds one
from a typed Python function.

What abort can do to a tool
---------------------------
An async tool receives the run's ``AbortSignal``; when the run is aborted the driver
waits a grace period for it to finish its cleanup, then cancels its task (a
``CancelledError`` at its next ``await``). A *sync* function decorated with ``@tool``
runs in a worker thread, and Python cannot interrupt a thread: abort sets the signal
(the function may poll ``signal.aborted`` if it takes a ``signal`` parameter), and
after the grace period the run stops waiting and records "Operation aborted", but the
thread runs on to its natural end in the background and its return value is dropped.
Keep sync tools short, or make them check the signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import re
import types
import typing
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias, Union, overload

import attrs
import jsonschema
import jsonschema.validators
import referencing

from ._abort import AbortSignal
from ._errors import InvalidInputError
from ._messages import (
    ImageContent,
    TextContent,
    ToolResultContent,
    freeze_json,
    thaw_json,
)
from ._signature import Converter, check_return, compile_annotation, result_value

__all__ = [
    "ResourceKeys",
    "Scheduling",
    "Tool",
    "ToolDefinition",
    "ToolExecute",
    "ToolOutput",
    "ToolReturn",
    "tool",
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
    frozen: Mapping[str, Any] = freeze_json(value, "parameters")
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
    done: set[_Pointer] = set()
    path: list[_Pointer] = []

    def visit(target: _Pointer) -> None:
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
                    visit(inner)
        path.pop()
        done.add(target)

    visit(())


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


@attrs.frozen
class ToolOutput:
    """What a tool may return when it wants to say more than a string: content blocks
    and whether they describe a failure the model should see as such."""

    content: tuple[ToolResultContent, ...] = attrs.field(converter=_output_content)
    is_error: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


ToolReturn: TypeAlias = str | Sequence[ToolResultContent] | ToolOutput
ToolExecute: TypeAlias = Callable[[dict[str, Any], AbortSignal], Awaitable[ToolReturn]]


ResourceKeys: TypeAlias = Callable[[Mapping[str, Any]], "Iterable[str]"]
"""``resources(arguments)``: the names of what a call touches (e.g. resolved paths)."""


def _check_timeout(_: object, __: object, value: float | None) -> None:
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


@attrs.frozen
class Tool:
    """A definition plus ``async execute(arguments, signal)``.

    ``arguments`` is a fresh ``dict`` per call, already validated against the schema.
    ``sequential`` and ``resources`` say how its calls may run concurrently (see
    ``Scheduling``); ``timeout`` (seconds) gives a call that runs longer a "timed out"
    error result, after its signal fired and its cleanup had a grace period.
    """

    definition: ToolDefinition = attrs.field(validator=attrs.validators.instance_of(ToolDefinition))
    execute: ToolExecute = attrs.field(validator=attrs.validators.is_callable())
    sequential: bool = attrs.field(default=False, kw_only=True)
    resources: ResourceKeys | None = attrs.field(default=None, kw_only=True)
    timeout: float | None = attrs.field(default=None, kw_only=True, validator=_check_timeout)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def scheduling(self) -> Scheduling:
        return Scheduling(self.sequential, self.resources)


# -- @tool: a Tool from a typed function -------------------------------------------------------


_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$"
)


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Summary text and per-parameter descriptions from a Google-style docstring."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        match = _SECTION.match(line)
        if match:
            section = match.group(1)
            current = None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            item = re.match(r"^\s{0,8}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if item and not line.startswith(" " * 9):
                current = item.group(1)
                params[current] = item.group(2).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
    return "\n".join(summary).strip(), params


def _build_tool(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    options: dict[str, Any] | None = None,
) -> Tool:
    tool_name = name or fn.__name__
    where = f"@tool {tool_name}"
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # noqa: BLE001 - any failure here is a bad annotation
        raise InvalidInputError(f"{where}: cannot read type hints: {exc}") from None
    summary, param_docs = _parse_docstring(fn.__doc__)
    signature = inspect.signature(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, Converter] = {}
    wants_signal = False
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidInputError(f"{where}: *args and **kwargs cannot be tool arguments")
        if param.kind is param.POSITIONAL_ONLY:
            raise InvalidInputError(f"{where}: positional-only parameter {param.name!r}")
        annotation = hints.get(param.name, inspect.Parameter.empty)
        if param.name == "signal" and annotation in (
            AbortSignal,
            AbortSignal | None,
            inspect.Parameter.empty,
        ):
            wants_signal = True
            continue
        schema, convert = compile_annotation(annotation, f"{where}, parameter {param.name!r}")
        if convert is not None:
            converters[param.name] = convert
        if param.name in param_docs and "description" not in schema:
            schema = {**schema, "description": param_docs[param.name]}
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        else:
            # A default that is not JSON is still a default, just not advertised.
            with contextlib.suppress(InvalidInputError):
                schema = {**schema, "default": thaw_json(freeze_json(param.default))}
        properties[param.name] = schema
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        parameters["required"] = required
    check_return(hints.get("return", inspect.Parameter.empty), where, _is_result_type)
    definition = ToolDefinition(
        name=tool_name,
        description=description if description is not None else summary,
        parameters=parameters,
    )
    is_async = inspect.iscoroutinefunction(fn)

    async def execute(arguments: dict[str, Any], signal: AbortSignal) -> ToolReturn:
        kwargs = {k: converters[k](v) if k in converters else v for k, v in arguments.items()}
        if wants_signal:
            kwargs["signal"] = signal
        if is_async:
            result = await fn(**kwargs)
        else:
            # A thread cannot be interrupted; see the module docstring.
            result = await asyncio.to_thread(functools.partial(fn, **kwargs))
        if isinstance(result, (str, ToolOutput)) or _is_content(result):
            return typing.cast(ToolReturn, result)
        return result_value(result, tool_name)  # data: its JSON (see _signature)

    execute.__name__ = f"execute_{tool_name}"
    return Tool(definition=definition, execute=execute, **(options or {}))


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    sequential: bool = False,
    resources: ResourceKeys | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    sequential: bool = False,
    resources: ResourceKeys | None = None,
    timeout: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Build a ``Tool`` from a typed function, async or sync.

    The JSON Schema comes from the signature: JSON types, ``Literal``, ``Enum``,
    optional values and unions, lists, tuples and sets, ``dict[str, T]``,
    dataclasses, attrs classes, ``TypedDict``s and pydantic models (the arguments
    arrive as those Python values); a parameter with a default is optional; an
    annotation that cannot be expressed is refused here, naming the parameter (the
    return annotation is checked too). The description comes from the docstring's
    summary, each parameter's from ``Annotated[T, "..."]`` or the docstring's
    ``Args:`` section. A parameter named ``signal`` receives the run's
    ``AbortSignal`` and is not shown to the model. The function may return a
    ``str`` (the result text), content blocks or a ``ToolOutput`` (used as they
    are), or any JSON data (dicts, lists, numbers, booleans, ``None``, dataclasses,
    attrs classes, pydantic models, enums), which becomes its JSON text; raising an
    exception gives the model an error result with the exception's text. See
    ``statemachine._signature`` for the exact rules. ``sequential``, ``resources``
    and ``timeout`` are passed to ``Tool``.
    """
    options = {"sequential": sequential, "resources": resources, "timeout": timeout}
    if fn is not None:
        return _build_tool(fn, name, description, options)
    return lambda f: _build_tool(f, name, description, options)


def _is_content(value: object) -> bool:
    """A non-empty sequence of content blocks (an empty list is data: ``[]``)."""
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(isinstance(block, (TextContent, ImageContent)) for block in value)
    )


def _is_result_type(annotation: Any) -> bool:
    """Return annotations that name a result rather than data."""
    if annotation in (str, ToolOutput, TextContent, ImageContent):
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return all(_is_result_type(a) or a in (str,) for a in args)
    if typing.get_origin(annotation) in (list, tuple, Sequence) and args:
        return all(a is Ellipsis or _is_result_type(a) for a in args)
    return False


def tool_output_from(value: object) -> ToolOutput | None:
    """Normalise what a tool returned; ``None`` if it is not a supported type."""
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput((TextContent(value),))
    if isinstance(value, (list, tuple)) and all(
        isinstance(block, (TextContent, ImageContent)) for block in value
    ):
        return ToolOutput(tuple(value))
    return None
