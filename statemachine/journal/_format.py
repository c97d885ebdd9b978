"""The journal's format: its header (everything needed to rebuild the engine), the
error every reading problem becomes, and the format's name and version.

The engine is deterministic (I5), so a run is fully described by its configuration
and the sequence of engine events it accepted; the header holds the configuration.
``statemachine.journal`` describes the format line by line.

``options`` holds the engine's other keyword arguments (``check_continue``, the tools'
``scheduling``...): JSON scalars as they are, the rest through ``_OPTION_CODECS``. A
tool whose scheduling names its resources with a function cannot be written down;
``replay`` then asks for the scheduling back.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from statemachine.core.engine import Engine
from statemachine.core.limits import UsageLimits
from statemachine.core.messages import AssistantMessage, Message
from statemachine.core.output import OutputSpec
from statemachine.core.steps import table_from_data, table_to_data
from statemachine.core.table import Table
from statemachine.core.tools import Scheduling, ToolDefinition, check_tool_retries
from statemachine.core.wire import (
    message_from_dict,
    messages_to_dicts,
    scheduling_from_dict,
    scheduling_to_dict,
    tool_definition_from_dict,
    tool_definition_to_dict,
)
from statemachine.errors import (
    InvalidInputError,
    JournalError,
    StepDeclarationError,
    WireFormatError,
)

__all__ = [
    "FORMAT",
    "MAX_MODEL_CHARS",
    "VERSION",
    "JournalError",
    "JournalHeader",
    "read_instructions",
    "read_model",
    "with_instructions",
]

FORMAT: Final = "statemachine-journal"
VERSION: Final = 1


_Encode = Callable[[Any], Any]
_Decode = Callable[[Any, str], Any]


def _fail(path: str, expected: str, value: Any) -> WireFormatError:
    return WireFormatError(f"{path}: expected {expected}, got {type(value).__name__}")


def _typed(value: Any, kind: type, path: str) -> Any:
    # bool is an int in Python, but a JSON true is never a count.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _fail(path, kind.__name__, value)
    return value


def short(text: str, limit: int = 60) -> str:
    """``text`` on one line, cut to ``limit`` characters (for quoting it in an error)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# -- the engine configuration (the header) ------------------------------------------------


# Engine keyword arguments the header holds in fields of its own; other engine options
# are JSON scalars (flags, counts, names) kept as they are in ``options``, or have an
# entry in ``_OPTION_CODECS``.
HEADER_FIELDS = frozenset({"tools", "messages", "max_turns", "check_permissions", "run_id"})
NOT_RECORDED = frozenset({"logger", "transition_hook"})  # no effect on what the engine decides


def _encode_scheduling(value: Mapping[str, Scheduling]) -> dict[str, Any]:
    # A resources function cannot be written down: the journal records that there was
    # one, and replay asks for it back (see ``replay``).
    return {
        name: scheduling_to_dict(s)
        for name, s in sorted(value.items())
        if s.sequential or s.resources is not None
    }


def _decode_scheduling(value: Any, path: str) -> dict[str, Scheduling]:
    if not isinstance(value, Mapping):
        raise _fail(path, "an object", value)
    return {
        str(name): scheduling_from_dict(entry, f"{path}.{short(str(name))}")
        for name, entry in value.items()
    }


def _decode_flag(value: Any, path: str) -> bool:
    if type(value) is not bool:
        raise _fail(path, "a boolean", value)
    return value


def _needs_functions(options: Mapping[str, Any]) -> list[str]:
    """Tools whose scheduling used a resources function (replay needs it back)."""
    raw = options.get("scheduling", {})
    if not isinstance(raw, Mapping):
        return []
    return sorted(
        str(n) for n, e in raw.items() if isinstance(e, Mapping) and e.get("resources") is True
    )


def _optional_codec(from_dict: Callable[[Any, str], Any]) -> tuple[_Encode, _Decode]:
    """The codec of an optional record with ``to_dict()`` and ``from_dict(value, path)``
    (usage limits, the output spec): ``None`` stays ``None``; a refused value is a
    ``WireFormatError``."""

    def decode(value: Any, path: str) -> Any:
        if value is None:
            return None
        try:
            return from_dict(value, path)
        except InvalidInputError as exc:
            raise WireFormatError(str(exc)) from None

    return (lambda value: None if value is None else value.to_dict()), decode


def _decode_table(value: Any, path: str) -> Table:
    try:
        return table_from_data(value, path)
    except StepDeclarationError as exc:
        raise WireFormatError(str(exc)) from None


def _decode_tool_retries(value: Any, path: str) -> dict[str, int] | None:
    if value is None:
        return None
    try:
        return check_tool_retries(value)
    except InvalidInputError as exc:
        raise WireFormatError(f"{path}: {exc}") from None


_OPTION_CODECS: dict[str, tuple[_Encode, _Decode]] = {
    "scheduling": (_encode_scheduling, _decode_scheduling),
    "table": (table_to_data, _decode_table),  # a team's steps, as their declarations
    "check_continue": (lambda v: v, _decode_flag),
    "usage_limits": _optional_codec(UsageLimits.from_dict),
    "output": _optional_codec(OutputSpec.from_dict),
    "tool_retries": (lambda v: None if v is None else dict(v), _decode_tool_retries),
}
_HEADER_KEYS: Final = frozenset(
    {"format", "version", "runId", "maxTurns", "checkPermissions", "tools", "messages", "options"}
)


def _check_options(options: Any) -> None:
    """A header's options: each once (the header decoder refuses a repeated key), none
    that the header holds itself, each of its codec's type or a JSON scalar."""
    if not isinstance(options, dict):
        raise _fail("header.options", "an object", options)
    for name, value in options.items():
        if name in HEADER_FIELDS or name in NOT_RECORDED:
            raise WireFormatError(f"header.options.{name}: not an option the header records")
        if name in _OPTION_CODECS:
            _OPTION_CODECS[name][1](value, f"header.options.{name}")
        elif not (value is None or type(value) in (bool, int, float, str)):
            raise _fail(f"header.options.{short(name)}", "a JSON scalar", value)


def _engine_keywords(engine_class: type) -> set[str]:
    """The keyword arguments the constructors of ``engine_class`` name."""
    names: set[str] = set()
    for cls in engine_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None or cls is object:
            continue
        for parameter in inspect.signature(init).parameters.values():
            if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                names.add(parameter.name)
    return names


@attrs.frozen
class JournalHeader:
    """What a journal's first line holds: everything needed to rebuild the engine."""

    run_id: str
    tools: tuple[ToolDefinition, ...]
    messages: tuple[Message, ...]
    max_turns: int
    check_permissions: bool
    options: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def of(cls, engine: Engine, messages: Sequence[Message], **options: Any) -> JournalHeader:
        """The header of ``engine`` (freshly made from ``messages`` and ``options``)."""
        recorded: dict[str, Any] = {}
        for name, value in options.items():
            if name in _OPTION_CODECS:
                recorded[name] = _OPTION_CODECS[name][0](value)
            elif value is None or isinstance(value, (bool, int, float, str)):
                recorded[name] = value
            else:
                raise InvalidInputError(
                    f"the journal cannot record engine option {name}={value!r}: only JSON "
                    "scalars (flags, numbers, names) and the options in _OPTION_CODECS "
                    "can be replayed"
                )
        return cls(
            run_id=engine.run_id,
            tools=engine.tools,
            messages=tuple(messages),
            max_turns=engine.max_turns,
            check_permissions=engine.check_permissions,
            options=recorded,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "version": VERSION,
            "runId": self.run_id,
            "maxTurns": self.max_turns,
            "checkPermissions": self.check_permissions,
            "tools": [tool_definition_to_dict(d) for d in self.tools],
            "messages": messages_to_dicts(self.messages),
        }
        if self.options:
            out["options"] = dict(self.options)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> JournalHeader:
        if not isinstance(d, Mapping) or d.get("format") != FORMAT:
            raise WireFormatError(
                f"not a statemachine journal (the first line must be an object with "
                f'"format": "{FORMAT}")'
            )
        if type(d.get("version")) is not int or d.get("version") != VERSION:
            raise WireFormatError(
                f"journal format version {d.get('version')!r} is not supported (this "
                f"library reads version {VERSION})"
            )
        raw_tools = d.get("tools")
        if not isinstance(raw_tools, list):
            raise _fail("header.tools", "an array", raw_tools)
        tools = [
            tool_definition_from_dict(t, f"header.tools[{i}]") for i, t in enumerate(raw_tools)
        ]
        raw_messages = d.get("messages")
        if not isinstance(raw_messages, list):
            raise _fail("header.messages", "an array", raw_messages)
        unknown = set(d) - _HEADER_KEYS
        if unknown:
            raise WireFormatError(f"header: unknown key(s) {short(', '.join(sorted(unknown)))}")
        options = d.get("options", {})
        _check_options(options)
        return cls(
            run_id=_typed(d.get("runId"), str, "header.runId"),
            tools=tuple(tools),
            messages=tuple(
                message_from_dict(m, path=f"header.messages[{i}]")
                for i, m in enumerate(raw_messages)
            ),
            max_turns=_typed(d.get("maxTurns"), int, "header.maxTurns"),
            check_permissions=_typed(d.get("checkPermissions"), bool, "header.checkPermissions"),
            options=options,
        )

    def engine(self, engine_class: type[Engine] = Engine, **kwargs: Any) -> Engine:
        """A fresh engine with this configuration; ``kwargs`` (e.g. ``logger``, or the
        ``scheduling`` a journal could not hold) override what the header says."""
        unknown = sorted(set(self.options) - _engine_keywords(engine_class))
        if unknown:
            raise InvalidInputError(
                f"header.options: {engine_class.__name__} has no option(s) "
                f"{short(', '.join(unknown))}"
            )
        missing = _needs_functions(self.options)
        if missing and "scheduling" not in kwargs:
            raise InvalidInputError(
                f"tool(s) {', '.join(missing)} chose their resources with a function, which "
                "a journal cannot hold: pass the tools' scheduling to replay "
                "(scheduling={t.name: t.scheduling for t in tools})"
            )
        options = {
            name: _OPTION_CODECS[name][1](value, f"header.options.{name}")
            if name in _OPTION_CODECS
            else value
            for name, value in self.options.items()
        }
        options.update(kwargs)
        return engine_class(
            tools=self.tools,
            messages=self.messages,
            max_turns=self.max_turns,
            check_permissions=self.check_permissions,
            run_id=self.run_id,
            **options,
        )


# -- the instructions lines ---------------------------------------------------------------

_INSTRUCTIONS_KEYS: Final = frozenset({"instructions", "turn"})


def read_instructions(record: Mapping[str, Any], turns: int, number: int) -> tuple[int, str | None]:
    """An instructions line (``{"instructions": text or null, "turn": n}``, written
    before the model call of turn ``n`` whenever they change), checked against the
    replayed engine's ``turns``: ``(turn, text)``, or a ``JournalError`` naming line
    ``number``."""
    _check_keys(record, _INSTRUCTIONS_KEYS, "an instructions", number)
    text = record["instructions"]
    if text is not None and type(text) is not str:
        raise JournalError(
            number, f"'instructions': expected a string or null, got {type(text).__name__}"
        )
    when = "they are written when its model call starts"
    turn = _this_turn(record["turn"], turns, number, "instructions for turn", when)
    return turn, text


def _check_keys(record: Mapping[str, Any], keys: frozenset[str], kind: str, number: int) -> None:
    """A ``JournalError`` unless ``record`` has exactly the ``keys`` of a ``kind`` record."""
    if record.keys() != keys:
        expected = ", ".join(map(repr, sorted(keys)))
        got = ", ".join(map(repr, sorted(record)))
        raise JournalError(number, f"{kind} record has keys {expected}; got {short(got)}")


def _this_turn(turn: Any, turns: int, number: int, what: str, when: str) -> int:
    """``turn``, a per-turn record's, if it is the replayed run's turn ``turns``; else a
    ``JournalError`` saying ``what`` it was for and ``when`` such a record is written."""
    if type(turn) is not int or turn != turns or turn < 1:
        raise JournalError(
            number,
            f"{what} {short(repr(turn))}, but the replayed run is at turn {turns} ({when})",
        )
    return turn


# -- the model lines -----------------------------------------------------------------------

_MODEL_KEYS: Final = frozenset({"model", "turn"})

MAX_MODEL_CHARS: Final = 256
"""The longest model name a journal holds (a provider's name is cut to it when written)."""


def read_model(record: Mapping[str, Any], turns: int, number: int) -> tuple[int, str]:
    """A model line (``{"model": name, "turn": n}``, written while the call of turn
    ``n`` is answered, whenever the model that answered changes), checked against the
    replayed engine's ``turns``: ``(turn, name)``, or a ``JournalError`` naming line
    ``number``."""
    _check_keys(record, _MODEL_KEYS, "a model", number)
    name = record["model"]
    if type(name) is not str or not name or len(name) > MAX_MODEL_CHARS:
        raise JournalError(number, f"'model': expected a name of 1 to {MAX_MODEL_CHARS} characters")
    when = "it is written while that turn's model call is answered"
    turn = _this_turn(record["turn"], turns, number, "the model of turn", when)
    return turn, name


def with_instructions(
    before: Sequence[Message],
    messages: Sequence[Message],
    instructions: Sequence[tuple[int, str | None]],
) -> list[dict[str, Any]]:
    """``messages`` as wire dicts, with a ``system`` item holding the instructions of
    each turn where they changed, before that turn's assistant message (the run's
    turns count the assistant messages after ``before``, the history it was given)."""
    changes = dict(instructions)
    first = sum(isinstance(m, AssistantMessage) for m in before)
    out: list[dict[str, Any]] = []
    answers = 0
    for item, message in zip(messages_to_dicts(messages), messages, strict=True):
        if isinstance(message, AssistantMessage):
            answers += 1
            turn = answers - first
            if turn in changes:
                out.append({"role": "system", "content": changes[turn] or ""})
        out.append(item)
    return out
