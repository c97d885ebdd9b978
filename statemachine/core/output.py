"""Structured output: the final-result tool a run offers the model, and its retry budget.

A run with an ``OutputSpec`` offers the model one more tool, ``final_result`` by
default, whose parameters are the output's JSON Schema. The engine answers a call of
it itself (it never reaches the driver): arguments that validate are the run's output
(the call gets the result "Final result accepted.", so I1 holds) and the run ends
``Done`` at the turn boundary; arguments that do not validate go back to the model as
an error result naming the problems, and a final text answer goes back as a user
message asking for the tool. Each such attempt spends one of ``retries``; one more
failure than that ends the run ``OutputInvalid`` (rules 7 and 13 of ``core/table.py``).

**Native mode** (``native=True``): where the model client has a JSON-schema output
mode of its own (OpenAI's ``response_format``/``text.format``, Gemini's
``response_json_schema``), the run offers no tool; the client sends the schema and the
model's final text carries the output. The rows are the same: a final answer whose
text is a JSON object that validates is the output (``output_call`` is then
``TEXT_OUTPUT``, since no call carried it) and the run ends ``Done``; text that does
not parse or validate is ``output_missing``, one failed attempt, and the next model
call is preceded by a user message naming the problems. A native run's model may
still call the run's other tools; only its final answer is judged.

**The type's own judgement** (``check``): arguments (or a native text) that match the
schema are then given to ``check``, the driver's validation by the output type itself
(a pydantic model's validators, a dataclass's ``__post_init__``, an output validator
that asks for a retry); a problem it names is one failed attempt like a schema
violation, through the same rows. The check is code, not data: a snapshot does not
hold it, and a run restored without one judges by the schema alone.

**Text** (``text=True``, tool mode only): an output type that admits plain text
(``str | Model``) accepts a final text answer as the output (``TEXT_OUTPUT``), and
offers the tool for the rest. The type's judgement (``check``, its output validators)
holds for the text too: a text it refuses is a failed attempt, answered with a message
naming why (``missed``, ``reminder``).

**One tool per member** (``others``, tool mode only): an output that may be one of
several types (a union, a list of types) offers one final-result tool per member,
``final_result_A``, ``final_result_B`` (as PydanticAI names them), each with its own
member's schema; ``definition`` is the first member's, ``others`` the rest. Each call
is judged by its own tool's schema and ``check``; the first valid one, whichever tool,
is the output.

**The end strategy** (``end_strategy``): what becomes of the other calls of a
response whose final-result call gave the output. ``"exhaustive"`` runs them as
usual before the run ends ``Done``; ``"early"`` runs none of them: each is answered
``NOT_RUN_EARLY`` at once (an error result, so I1 holds) and the run ends at the
turn boundary. The engine's default is ``"exhaustive"``, what every snapshot and
journal written before the choice existed did; the ``Agent``'s is ``"early"``,
PydanticAI's documented default (``statemachine.agent.output``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

import attrs

from statemachine.core.messages import AssistantMessage, StopReason
from statemachine.core.tools import ToolDefinition, validate_arguments
from statemachine.errors import InvalidInputError

__all__ = [
    "DEFAULT_OUTPUT_RETRIES",
    "END_STRATEGIES",
    "NOT_RUN_EARLY",
    "OUTPUT_ACCEPTED",
    "OUTPUT_TOOL",
    "TEXT_OUTPUT",
    "EndStrategy",
    "OutputCheck",
    "OutputSpec",
    "check_end_strategy",
    "is_output_tool",
    "parse_text_output",
]

OUTPUT_TOOL: Final = "final_result"
"""The name of the tool that carries the final result."""

DEFAULT_OUTPUT_RETRIES: Final = 2
"""How many failed attempts at the final result a run allows before ``OutputInvalid``."""

OUTPUT_ACCEPTED: Final = "Final result accepted."
"""The result of the final-result call whose arguments became the output."""

NOT_RUN_EARLY: Final = "Tool call not run: a final result was already accepted."
"""The result of every other call of a response whose final result ended the run
early (``end_strategy="early"``)."""

EndStrategy: TypeAlias = Literal["early", "exhaustive"]
"""What becomes of a response's other calls once its final result is accepted
(module docstring)."""

END_STRATEGIES: Final = ("early", "exhaustive")

TEXT_OUTPUT: Final = "(final text)"
"""The ``output_call`` of a native-mode run whose final text was accepted: no call
carried the output, the run's last assistant message did."""

_SCHEMA_CHARS: Final = 2_000
"""At most this much of the schema is quoted in a reminder (the client sent it whole)."""

_DESCRIPTION: Final = (
    "Give the final result of the task. Call this exactly once, when the task is done, "
    "with arguments matching the schema; do not answer with plain text."
)


OutputCheck: TypeAlias = Callable[[Any, str], "str | None"]
"""``check(value, tool)``: why a value that matches the schema of the final-result
tool named ``tool`` (``TEXT_OUTPUT`` for a final text) is still not the output
(``None``: it is). Must not raise."""


def _retries(instance: OutputSpec, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"output_retries must be an integer >= 0, got {value!r:.40}")


def check_end_strategy(value: object) -> EndStrategy:
    """``value`` if it is an end strategy (``InvalidInputError`` naming it otherwise)."""
    if value == "early" or value == "exhaustive":
        return value
    raise InvalidInputError(f"end_strategy must be 'early' or 'exhaustive', got {value!r:.40}")


def _end_strategy(instance: OutputSpec, attribute: attrs.Attribute[Any], value: object) -> None:
    check_end_strategy(value)


@attrs.frozen
class OutputSpec:
    """The final-result tool (``definition``; ``others``: one per further member of a
    union) and the retry budget of a run; ``native``: the output is the final text, in
    the client's JSON-schema mode; ``end_strategy``: what becomes of a response's other
    calls (module docstring)."""

    definition: ToolDefinition
    retries: int = attrs.field(default=DEFAULT_OUTPUT_RETRIES, validator=_retries)
    native: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    text: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    # code, not data: left out of equality and of snapshots (module docstring)
    check: OutputCheck | None = attrs.field(default=None, eq=False, repr=False)
    end_strategy: EndStrategy = attrs.field(default="exhaustive", validator=_end_strategy)
    others: tuple[ToolDefinition, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.others and self.native:
            raise InvalidInputError("output_type: native output gives one schema, not a tool each")
        if len({d.name for d in self.tools}) != len(self.tools):
            raise InvalidInputError("output_type: two final-result tools have one name")

    @classmethod
    def of(
        cls,
        schema: Mapping[str, Any],
        *,
        retries: int = DEFAULT_OUTPUT_RETRIES,
        native: bool = False,
        text: bool = False,
        check: OutputCheck | None = None,
    ) -> OutputSpec:
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
        return cls(definition, retries, native, text and not native, check)

    @classmethod
    def of_members(
        cls,
        members: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        retries: int = DEFAULT_OUTPUT_RETRIES,
        text: bool = False,
        check: OutputCheck | None = None,
    ) -> OutputSpec:
        """The spec offering one final-result tool per member: ``(name, schema)`` each,
        ``final_result_<name>`` (tool mode; module docstring)."""
        specs = [cls.of(schema, retries=retries) for _, schema in members]
        tools = [
            ToolDefinition(f"{OUTPUT_TOOL}_{name}", _DESCRIPTION, s.definition.schema_dict())
            for (name, _), s in zip(members, specs, strict=True)
        ]
        return cls(tools[0], retries, False, text, check, others=tuple(tools[1:]))

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def tools(self) -> tuple[ToolDefinition, ...]:
        """Every final-result tool: one, or one per member of a union."""
        return (self.definition, *self.others)

    def owns(self, tool: str) -> bool:
        """Whether ``tool`` is one of the final-result tools (never, in native mode)."""
        if self.native:
            return False
        return tool == self.definition.name or any(d.name == tool for d in self.others)

    def offered(self, tools: tuple[ToolDefinition, ...]) -> tuple[ToolDefinition, ...]:
        """The tools a model call offers: ``tools``, and the final-result tools unless
        the output comes as text (native mode)."""
        return tools if self.native else (*tools, *self.tools)

    def accepts(self, message: AssistantMessage) -> bool:
        """True if ``message`` is a final answer whose text is the output (native mode
        only: a tool-mode output comes in a call)."""
        if message.tool_calls or message.stop_reason in (StopReason.ERROR, StopReason.ABORTED):
            return False
        if self.text:  # the type's judgement of the text (its output validators)
            return self.judged(message.text, TEXT_OUTPUT) is None
        return self.native and not self.text_problems(message.text)

    def text_problems(self, text: str) -> list[str]:
        """Why ``text`` is not the output: it is not JSON, not an object, or each
        violation of the schema; empty if it is."""
        try:
            value = parse_text_output(text)
        except ValueError as exc:
            return [f"the final text is not JSON ({exc})"]
        if not isinstance(value, dict):
            return [f"the final text is a JSON {type(value).__name__}, not an object"]
        problems = validate_arguments(self.definition, value)
        if problems:
            return [p.replace("arguments", "output", 1) for p in problems]
        problem = self.judged(value, TEXT_OUTPUT)
        return [] if problem is None else [problem]

    def judged(self, value: Any, tool: str) -> str | None:
        """Why ``value``, which matches the schema of ``tool``, is still not the output
        (``check``)."""
        return None if self.check is None else self.check(value, tool)

    def _called(self) -> str:
        names = [d.name for d in self.tools]
        return names[0] if len(names) == 1 else "one of " + ", ".join(names)

    def missed(self, message: AssistantMessage) -> str:
        """Why the final answer ``message`` gave no output (a failed attempt)."""
        if self.text:  # a text the type refused (``accepts``)
            problem = self.judged(message.text, TEXT_OUTPUT) or "it was refused"
            return f"the final text was not accepted: {problem}"
        if not self.native:
            return f"the model answered with text instead of calling {self._called()}"
        return "; ".join(self.text_problems(message.text))

    def reminder(self, error: str | None = None) -> str:
        """The user message that answers a final text answer that gave no output
        (``error``: why, in native mode or for a text the type refused)."""
        if self.text and error:
            return (
                f"Your answer was not accepted: {error}. Answer again, or call the tool "
                f"{self._called()} with arguments matching its JSON Schema."
            )
        if not self.native:
            return (
                f"Your answer was not accepted: this task needs a final result. Call the tool "
                f"{self._called()} with arguments matching its JSON Schema."
            )
        schema = json.dumps(self.definition.schema_dict(), separators=(",", ":"))
        if len(schema) > _SCHEMA_CHARS:
            schema = schema[:_SCHEMA_CHARS] + "..."
        return (
            f"Your answer was not accepted: {error or 'it is not the final result'}. Answer "
            f"with only a JSON object matching this JSON Schema: {schema}"
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"schema": self.definition.schema_dict(), "retries": self.retries}
        if self.others:  # a tool per member: each named (one tool: as it always was)
            del data["schema"]
            data["tools"] = [{"name": d.name, "schema": d.schema_dict()} for d in self.tools]
        if self.native:  # absent for the tool, as in what was written before native mode
            data["native"] = True
        if self.text:  # likewise absent unless the output admits text
            data["text"] = True
        if self.end_strategy != "exhaustive":  # absent: what was written before the choice
            data["endStrategy"] = self.end_strategy
        return data

    @classmethod
    def from_dict(cls, data: object, path: str) -> OutputSpec:
        if not isinstance(data, Mapping) or not (
            ({"schema", "retries"} <= set(data) or {"tools", "retries"} <= set(data))
            and set(data) <= _KEYS
            and not {"schema", "tools"} <= set(data)
        ):
            raise InvalidInputError(f"{path}: expected an object with schema and retries")
        retries = data["retries"]
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidInputError(f"{path}.retries: expected an integer >= 0")
        native, text = data.get("native", False), data.get("text", False)
        if not isinstance(native, bool) or not isinstance(text, bool):
            raise InvalidInputError(f"{path}.native and .text: expected booleans")
        try:
            end_strategy = check_end_strategy(data.get("endStrategy", "exhaustive"))
        except InvalidInputError as exc:
            raise InvalidInputError(f"{path}.endStrategy: {exc}") from None
        try:
            if "tools" in data:
                spec = cls.of_members(_members_of(data["tools"]), retries=retries, text=text)
            else:
                spec = cls.of(data["schema"], retries=retries, native=native, text=text)
        except InvalidInputError as exc:
            where = "tools" if "tools" in data else "schema"
            raise InvalidInputError(f"{path}.{where}: {exc}") from None
        return attrs.evolve(spec, end_strategy=end_strategy)


_KEYS: Final = frozenset({"schema", "tools", "retries", "native", "text", "endStrategy"})


def _members_of(data: object) -> list[tuple[str, Mapping[str, Any]]]:
    """The ``(member, schema)`` pairs of a snapshot's per-member tools."""
    prefix = OUTPUT_TOOL + "_"
    if not isinstance(data, list) or len(data) < 2:
        raise InvalidInputError("expected a list of at least two tools")
    members = []
    for item in data:
        name = item.get("name") if isinstance(item, Mapping) else None
        if (
            not isinstance(name, str)
            or not name.startswith(prefix)
            or set(item) != {"name", "schema"}
        ):
            raise InvalidInputError(f"expected {{name: {prefix}..., schema}}, got {item!r:.60}")
        members.append((name.removeprefix(prefix), item["schema"]))
    return members


def is_output_tool(name: str) -> bool:
    """Whether ``name`` is a final-result tool's name: ``final_result``, or a union
    member's, ``final_result_<member>`` (what a reader of a history without its spec,
    a fake model or a stored run, can tell)."""
    return name == OUTPUT_TOOL or name.startswith(OUTPUT_TOOL + "_")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_text_output(text: str) -> Any:
    """The JSON value of a native-mode final text (``ValueError`` if it is not JSON:
    ``NaN`` and ``Infinity`` are not, and nesting too deep to parse is refused)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def check_output(value: object, tool_names: set[str]) -> OutputSpec | None:
    """``value`` if it is an ``OutputSpec`` (or ``None``) whose tool name no tool has."""
    if value is None:
        return None
    if not isinstance(value, OutputSpec):
        raise InvalidInputError(f"output must be an OutputSpec, got {type(value).__name__}")
    clash = [name for name in sorted(tool_names) if value.owns(name)]
    if clash:
        raise InvalidInputError(
            f"a tool is named {clash[0]!r}, the name of a final-result tool of a run "
            "with an output_type: rename the tool"
        )
    return value
