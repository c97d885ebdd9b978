"""The tool runtime: ``Tool`` (a definition plus ``async execute``) and ``@tool``.

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Union, overload

import attrs

from statemachine.agent.context import RunContext, context_type, current_run_context
from statemachine.agent.signature import Converter, check_return, compile_annotation, result_value
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import (
    ImageContent,
    TextContent,
    freeze_json,
    thaw_json,
)
from statemachine.core.tools import (
    DEFAULT_TOOL_RETRIES,
    ResourceKeys,
    Scheduling,
    ToolDefinition,
    ToolExecute,
    ToolOutput,
    ToolReturn,
    check_timeout,
)
from statemachine.errors import InvalidInputError, UsageError, WireFormatError

__all__ = ["Tool", "check_tools", "retries_of", "scheduling_of", "tool", "tool_output_from"]


def _retries(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"retries must be an integer >= 0, got {value!r:.40}")


@attrs.frozen
class Tool:
    """A definition plus ``async execute(arguments, signal)``.

    ``arguments`` is a fresh ``dict`` per call, already validated against the schema.
    ``sequential`` and ``resources`` say how its calls may run concurrently (see
    ``Scheduling``); ``timeout`` (seconds) gives a call that runs longer a "timed out"
    error result, after its signal fired and its cleanup had a grace period.
    ``retries`` is how many retry requests in a row (the tool raised ``ModelRetry``)
    the run allows before it ends ``ToolRetriesExceeded`` (default
    ``DEFAULT_TOOL_RETRIES``, 1; rule 14 of ``core/table.py``); the tool reads the
    attempt number as ``RunContext.retry``.
    """

    definition: ToolDefinition = attrs.field(validator=attrs.validators.instance_of(ToolDefinition))
    execute: ToolExecute = attrs.field(validator=attrs.validators.is_callable())
    sequential: bool = attrs.field(default=False, kw_only=True)
    resources: ResourceKeys | None = attrs.field(default=None, kw_only=True)
    timeout: float | None = attrs.field(default=None, kw_only=True, validator=check_timeout)
    retries: int = attrs.field(default=DEFAULT_TOOL_RETRIES, kw_only=True, validator=_retries)
    # The deps type its function's RunContext[T] parameter names (None: any or none).
    deps_type: Any = attrs.field(default=None, kw_only=True)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def scheduling(self) -> Scheduling:
        return Scheduling(self.sequential, self.resources)


def scheduling_of(tools: Sequence[Tool]) -> dict[str, Scheduling]:
    """What the engine is told of how the calls of ``tools`` may run: a tool whose calls
    run beside everything (the default) is left out, as the engine treats it the same,
    so that most runs hold no scheduling of their own."""
    return {t.name: t.scheduling for t in tools if t.sequential or t.resources is not None}


def retries_of(tools: Sequence[Tool]) -> Mapping[str, int]:
    """The budgets of retry requests in a row that are not the engine's default, for
    the engine (rule 14): usually none; else one read-only mapping shared by every run
    of the same tools, so a waiting run holds no dict of its own for it."""
    return _budgets(tuple((t.name, t.retries) for t in tools if t.retries != DEFAULT_TOOL_RETRIES))


@functools.lru_cache(maxsize=256)
def _budgets(pairs: tuple[tuple[str, int], ...]) -> Mapping[str, int]:
    return MappingProxyType(dict(pairs))


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
    # A partial's name, hints and docstring are its function's; the arguments it binds
    # are the application's, neither shown to the model nor open to it.
    target = fn.func if isinstance(fn, functools.partial) else fn
    bound = frozenset(fn.keywords) if isinstance(fn, functools.partial) else frozenset()
    tool_name = name or _name_of(fn, target)
    where = f"@tool {tool_name}"
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception as exc:  # noqa: BLE001 - any failure here is a bad annotation
        raise InvalidInputError(f"{where}: cannot read type hints: {exc}") from None
    summary, param_docs = _parse_docstring(target.__doc__)
    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in bound]
    takes_context, deps = (
        context_type(hints.get(params[0].name, params[0].annotation)) if params else (False, None)
    )
    parameters, converters, wants_signal = _parameters(
        params[1:] if takes_context else params, hints, param_docs, where
    )
    check_return(hints.get("return", inspect.Parameter.empty), where, _is_result_type)
    definition = ToolDefinition(
        name=tool_name,
        description=description if description is not None else summary,
        parameters=parameters,
    )
    execute = _executor(fn, tool_name, converters, wants_signal, takes_context)
    return Tool(definition=definition, execute=execute, deps_type=deps, **(options or {}))


def _name_of(fn: Callable[..., Any], target: Callable[..., Any]) -> str:
    """The tool's default name: its function's ``__name__``."""
    found = getattr(target, "__name__", None)
    if not isinstance(found, str):
        raise InvalidInputError(
            f"@tool: a {type(fn).__name__} has no __name__ to name the tool by: pass "
            "name=..., or give a function (or a functools.partial of one)"
        )
    return found


def _parameters(
    params: Sequence[inspect.Parameter],
    hints: dict[str, Any],
    param_docs: dict[str, str],
    where: str,
) -> tuple[dict[str, Any], dict[str, Converter], bool]:
    """The JSON schema of the arguments ``params`` (a function's, without its
    ``RunContext`` and what a partial binds), their converters, and whether the
    function takes the call's ``signal``."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, Converter] = {}
    wants_signal = False
    for param in params:
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
            with contextlib.suppress(WireFormatError):
                schema = {**schema, "default": thaw_json(freeze_json(param.default))}
        properties[param.name] = schema
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        parameters["required"] = required
    return parameters, converters, wants_signal


def _executor(
    fn: Callable[..., Any],
    tool_name: str,
    converters: dict[str, Converter],
    wants_signal: bool,
    takes_context: bool = False,
) -> Callable[[dict[str, Any], AbortSignal], Awaitable[ToolReturn]]:
    """What runs a call of ``fn``: its arguments converted, its result normalised; with
    ``takes_context``, the run's ``RunContext`` first."""
    is_async = inspect.iscoroutinefunction(fn)
    if takes_context:
        fn = _with_context(fn, tool_name, is_async)

    async def execute(arguments: dict[str, Any], signal: AbortSignal) -> ToolReturn:
        if converters:
            kwargs = {k: converters[k](v) if k in converters else v for k, v in arguments.items()}
        elif wants_signal:
            kwargs = dict(arguments)
        else:  # JSON values as they are: fn(**arguments) copies them, the caller's is kept
            kwargs = arguments
        if wants_signal:
            kwargs["signal"] = signal
        if is_async:
            result = await fn(**kwargs)
        else:
            # A thread cannot be interrupted; see the module docstring.
            result = await asyncio.to_thread(functools.partial(fn, **kwargs))
        if result.__class__ is str or isinstance(result, (str, ToolOutput)) or _is_content(result):
            return result  # type: ignore[no-any-return]
        return result_value(result, tool_name)  # data: its JSON (see _signature)

    execute.__name__ = f"execute_{tool_name}"
    return execute


def _with_context(fn: Callable[..., Any], tool_name: str, is_async: bool) -> Callable[..., Any]:
    """``fn`` with the run's context as its first argument, read when it is called."""

    def context() -> RunContext[Any]:
        found = current_run_context()
        if found is None:
            raise UsageError(f"tool {tool_name} takes a RunContext: run it with the driver")
        return found

    if is_async:

        async def call_async(**kwargs: Any) -> Any:
            return await fn(context(), **kwargs)

        return call_async

    def call(**kwargs: Any) -> Any:
        return fn(context(), **kwargs)

    return call


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
    retries: int = DEFAULT_TOOL_RETRIES,
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
    retries: int = DEFAULT_TOOL_RETRIES,
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
    ``AbortSignal`` and is not shown to the model; neither is a first parameter
    annotated ``RunContext[Deps]``, which receives the run's context (its ``deps``;
    ``statemachine.agent.context``). The function may return a
    ``str`` (the result text), content blocks or a ``ToolOutput`` (used as they
    are), or any JSON data (dicts, lists, numbers, booleans, ``None``, dataclasses,
    attrs classes, pydantic models, enums), which becomes its JSON text; raising an
    exception gives the model an error result with the exception's text. See
    ``statemachine.agent.signature`` for the exact rules. ``sequential``, ``resources``,
    ``timeout`` and ``retries`` are passed to ``Tool``; raising ``ModelRetry`` asks the
    model to call again (a retry request, counted against ``retries``).

    A ``functools.partial`` of such a function is a tool too, named and described by
    the function; the arguments it binds are the application's: they are not shown to
    the model, which cannot override them.
    """
    options = {
        "sequential": sequential,
        "resources": resources,
        "timeout": timeout,
        "retries": retries,
    }
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
        return ToolOutput(value)  # wrapped in one TextContent by ToolOutput itself
    if isinstance(value, (list, tuple)) and all(
        isinstance(block, (TextContent, ImageContent)) for block in value
    ):
        return ToolOutput(tuple(value))
    return None


def check_tools(tools: Sequence[Tool]) -> None:
    """Refuse ``tools`` that are not a sequence of ``Tool`` with unique names."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidInputError("tools must be a sequence of Tool")
    seen: set[str] = set()
    for i, item in enumerate(tools):
        if not isinstance(item, Tool):
            raise InvalidInputError(
                f"tools[{i}] is a {type(item).__name__}, not a Tool (see statemachine.tool)"
            )
        if item.name in seen:
            raise InvalidInputError(f"duplicate tool name {item.name!r}: tool names must be unique")
        seen.add(item.name)
