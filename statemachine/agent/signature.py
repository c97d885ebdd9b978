"""Typed functions as tools: annotations to JSON Schema, JSON back to Python values,
return values to result text.

``@tool`` reads a function's signature once, when the tool is defined. Each
parameter's annotation gives a JSON Schema (what the model is shown) and a
converter (how the validated JSON argument becomes the Python value the function
was written for: an ``Enum`` member, a dataclass instance...). Anything this module
cannot express is refused right there, naming the parameter, never at a call.

Supported parameter types: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``;
``Literal``; ``Enum`` subclasses (by value); ``Optional``/unions (a union of several
structured types is refused: a JSON value would not say which one it is); ``list``,
``tuple``, ``set``, ``frozenset``, ``Sequence``; ``dict``/``Mapping`` with ``str``
keys; dataclasses, attrs classes and ``TypedDict``s (their fields, recursively; a
type that contains itself is refused); pydantic models (their own JSON Schema);
``Annotated[T, "description"]`` (the first string, or an object's ``description``
attribute, describes the parameter).

Return values become the result in one way: a ``str`` is the result text as it is; a
``ToolOutput`` or a sequence of content blocks is used as it is; anything else is
data and becomes its JSON (dataclasses, attrs classes and pydantic models as their
fields; ``Enum`` members as their values; sets as lists). A value that is not JSON
data is the tool's error, reported as an error result naming its type.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeAlias, Union

import attrs

from statemachine.errors import InvalidInputError, ToolOutputError

__all__ = ["Converter", "check_return", "compile_annotation", "result_value"]

Converter: TypeAlias = Callable[[Any], Any]
"""Turns a validated JSON value into the Python value a parameter expects."""

_SCALARS: dict[object, dict[str, Any]] = {
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    type(None): {"type": "null"},
    None: {"type": "null"},
}
_ARRAYS: dict[object, Callable[[Any], Any]] = {
    list: list,
    Sequence: list,
    tuple: tuple,
    set: set,
    frozenset: frozenset,
}


def compile_annotation(
    annotation: Any, where: str, seen: tuple[type, ...] = ()
) -> tuple[dict[str, Any], Converter | None]:
    """The JSON Schema of ``annotation`` and its converter (``None``: use as is)."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return {}, None
    if annotation in _SCALARS:
        # An integer is a valid JSON number: a float parameter gets a float.
        return dict(_SCALARS[annotation]), (_to_float if annotation is float else None)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [member.value for member in annotation]}, annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Required, typing.NotRequired):  # TypedDict key qualifiers
        return compile_annotation(args[0], where, seen)
    if origin is Annotated:
        schema, convert = compile_annotation(args[0], where, seen)
        description = _description(args[1:])
        return ({**schema, "description": description} if description else schema), convert
    if origin is Literal:
        return {"enum": list(args)}, None
    if origin in (Union, types.UnionType):
        return _union(args, where, seen)
    if origin in _ARRAYS or annotation in _ARRAYS:
        return _array(origin or annotation, args, where, seen)
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        return _mapping(args, where, seen)
    if isinstance(annotation, type):
        return _structured(annotation, where, seen)
    raise InvalidInputError(f"{where}: cannot express {annotation!r} as JSON Schema")


def _description(metadata: Sequence[Any]) -> str | None:
    for item in metadata:
        if isinstance(item, str):
            return item
        text = getattr(item, "description", None) or getattr(item, "documentation", None)
        if isinstance(text, str):
            return text
    return None


def _union(
    args: tuple[Any, ...], where: str, seen: tuple[type, ...]
) -> tuple[dict[str, Any], Converter | None]:
    compiled = [compile_annotation(a, where, seen) for a in args]
    schema = {"anyOf": [s for s, _ in compiled]}
    converting = [
        (a, c) for a, (_, c) in zip(args, compiled, strict=True) if c is not None and a is not float
    ]
    if len(converting) > 1:
        raise InvalidInputError(
            f"{where}: a union of {', '.join(_name(a) for a, _ in converting)} is ambiguous "
            "(a JSON value does not say which one it is); use one type, or a Literal tag"
        )
    if not converting:
        if float in args and int not in args:  # an integer given for a float
            return schema, _to_float
        return schema, None
    member, convert = converting[0]
    accepts = _shape_test(member)

    def convert_union(value: Any) -> Any:
        # The one member that needs converting takes the values of its JSON shape.
        return convert(value) if accepts(value) else value

    return schema, convert_union


def _shape_test(annotation: Any) -> Callable[[Any], bool]:
    """Whether a JSON value has the shape of ``annotation`` (for picking a union member)."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        return lambda value: any(value == v and type(value) is type(v) for v in values)
    if (typing.get_origin(annotation) or annotation) in _ARRAYS:
        return lambda value: isinstance(value, list)
    return lambda value: isinstance(value, dict)


def _to_float(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _array(
    origin: Any, args: tuple[Any, ...], where: str, seen: tuple[type, ...]
) -> tuple[dict[str, Any], Converter | None]:
    make = _ARRAYS[origin]
    if origin is tuple and args and args[-1] is not Ellipsis:
        items = [compile_annotation(a, where, seen) for a in args]
        schema = {
            "type": "array",
            "prefixItems": [s for s, _ in items],
            "minItems": len(args),
            "maxItems": len(args),
        }
        converts = [c or _same for _, c in items]
        return schema, lambda value: tuple(c(v) for c, v in zip(converts, value, strict=True))
    schema = {"type": "array"}
    if origin in (set, frozenset):
        schema["uniqueItems"] = True
    convert: Converter | None = None
    if args:
        schema["items"], convert = compile_annotation(args[0], where, seen)
    item = convert or _same
    if make is list and convert is None:
        return schema, None
    return schema, lambda value: make(item(v) for v in value)


def _mapping(
    args: tuple[Any, ...], where: str, seen: tuple[type, ...]
) -> tuple[dict[str, Any], Converter | None]:
    schema: dict[str, Any] = {"type": "object"}
    if len(args) != 2:
        return schema, None
    if args[0] is not str:
        raise InvalidInputError(f"{where}: JSON object keys are strings, not {args[0]!r}")
    schema["additionalProperties"], convert = compile_annotation(args[1], where, seen)
    if convert is None:
        return schema, None
    return schema, lambda value: {k: convert(v) for k, v in value.items()}


def _structured(
    cls: type, where: str, seen: tuple[type, ...]
) -> tuple[dict[str, Any], Converter | None]:
    if cls in seen:
        raise InvalidInputError(f"{where}: {cls.__name__} contains itself (a recursive type)")
    seen = (*seen, cls)
    model_schema = getattr(cls, "model_json_schema", None)
    model_validate = getattr(cls, "model_validate", None)
    if callable(model_schema) and callable(model_validate):
        # a pydantic model: its own schema and its own validation
        return dict(model_schema()), model_validate
    if typing.is_typeddict(cls):
        fields = _hints(cls, where)
        # Read Required/NotRequired from the resolved hints: __required_keys__ misses
        # them when the class was written under "from __future__ import annotations".
        total = getattr(cls, "__total__", True)
        required = {
            name
            for name, hint in fields.items()
            if typing.get_origin(hint) is typing.Required
            or (total and typing.get_origin(hint) is not typing.NotRequired)
        }
        return _object(cls, fields, required, where, seen, make=dict)
    if dataclasses.is_dataclass(cls) or attrs.has(cls):
        hints = _hints(cls, where)
        names = _init_fields(cls)
        fields = {name: hints.get(name, Any) for name, _ in names}
        required = {name for name, needed in names if needed}
        return _object(cls, fields, required, where, seen, make=cls)
    raise InvalidInputError(
        f"{where}: cannot express {cls.__name__} as JSON Schema (use a dataclass, an attrs "
        "class, a TypedDict, a pydantic model, or JSON types)"
    )


def _object(
    cls: type,
    fields: Mapping[str, Any],
    required: set[str],
    where: str,
    seen: tuple[type, ...],
    *,
    make: Callable[..., Any],
) -> tuple[dict[str, Any], Converter]:
    properties: dict[str, Any] = {}
    converters: dict[str, Converter] = {}
    for name, annotation in fields.items():
        properties[name], convert = compile_annotation(annotation, f"{where}, field {name!r}", seen)
        if convert is not None:
            converters[name] = convert
    schema: dict[str, Any] = {
        "type": "object",
        "title": cls.__name__,
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = [name for name in fields if name in required]

    def convert_object(value: Mapping[str, Any]) -> Any:
        return make(**{k: converters[k](v) if k in converters else v for k, v in value.items()})

    return schema, convert_object


def _init_fields(cls: Any) -> list[tuple[str, bool]]:
    """(name, required) of the fields a dataclass's or attrs class's __init__ takes."""
    if attrs.has(cls):
        return [(a.name, a.default is attrs.NOTHING) for a in attrs.fields(cls) if a.init]
    missing = dataclasses.MISSING
    return [
        (f.name, f.default is missing and f.default_factory is missing)
        for f in dataclasses.fields(cls)
        if f.init
    ]


def _hints(cls: type, where: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # noqa: BLE001 - any failure here is a bad annotation
        raise InvalidInputError(
            f"{where}: cannot read the type hints of {cls.__name__}: {exc}"
        ) from None


def _same(value: Any) -> Any:
    return value


def _name(annotation: Any) -> str:
    return getattr(annotation, "__name__", repr(annotation))


# -- return values ----------------------------------------------------------------------------


def check_return(annotation: Any, where: str, is_result: Callable[[Any], bool]) -> None:
    """Refuse a return annotation whose values could not become a result."""
    if annotation is inspect.Parameter.empty or is_result(annotation):
        return
    try:
        compile_annotation(annotation, where)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{exc} (the return annotation)") from None


def result_value(value: Any, tool: str) -> str:
    """The JSON text of a tool's data return value (see the module docstring)."""
    try:
        data = _jsonable(value, 0)
        return json.dumps(data, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ToolOutputError(
            f"tool {tool} returned a {type(value).__name__} that is not JSON data: {exc}"
        ) from None


_MAX_DEPTH = 200


def _jsonable(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError(f"nested more than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a JSON number")
        return value
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, depth + 1)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"a key {key!r} is not a string")
            out[key] = _jsonable(item, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        items = [_jsonable(item, depth + 1) for item in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _jsonable(fields, depth + 1)
    if attrs.has(type(value)):
        fields = {a.name: getattr(value, a.name) for a in attrs.fields(type(value))}
        return _jsonable(fields, depth + 1)
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a pydantic model
        return dump(mode="json")
    raise TypeError(f"a {type(value).__name__} is not JSON data")
