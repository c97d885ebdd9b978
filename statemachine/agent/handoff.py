"""Handoffs: the model hands the run to another agent, whose instructions, tools and
model apply from the next model call.

How it sits on the loop
=======================

A handoff is a tool call the model makes, ``transfer_to_<name>``, and like every call
it gets exactly one result (I1): the driver runs the transfer tool, whose result says
to whom the run went (or, as an error result, why it did not). So the handoff is in
the history, in the journal and in the viewer as the call and result it is, in its
place (I2), and nothing else of the loop changes.

*Who is speaking* is read from the history alone: the agent named by the last transfer
that succeeded (an ``is_error`` result changed nothing), or the team's ``start`` agent.
So a replay, a resumed snapshot and a compacted view (the team reads the full history
of its run, not the view) all agree on it, with no state of their own.

``Handoffs`` makes one ``Agent`` of its members (``Handoffs.agent``):

* its model is the team itself: at each call it asks the speaking agent's model, with
  that agent's instructions, and offers it only that agent's tools and the transfers
  its ``routes`` allow;
* its tools are every member's tools and the transfer tools; a call to a tool the
  speaking agent was not offered (a model answering from an old context) gets an error
  result that says so, and the tool is not run;
* its first step is ``handoff_limit`` (``before_model``): a run whose history holds
  more than ``max_handoffs`` handoffs (``DEFAULT_MAX_HANDOFFS``; a history given to
  the run counts too) ends in ``HandoffLimitExceeded`` before the next model call,
  every call answered. A bounded handoff loop is a named outcome in the table, drawn
  and explored like any step.

Everything is checked when the team is made, before any model call: a route to an
agent that is not a member, a ``start`` that is not one, two members' tools that share
a name but not a definition, a member's tool named like a transfer
(``InvalidInputError``). A member's own hooks, steps and output type are not used by
the team: the team's agent has its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from statemachine.agent.agent import Agent
from statemachine.agent.calls import call_hook
from statemachine.agent.context import current_run_context
from statemachine.agent.model import CallOptions, takes_options
from statemachine.agent.model_call import answer_of
from statemachine.agent.steps import Decision, Step
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import AssistantMessage, Message, ToolResultMessage
from statemachine.core.steps import End, GoOn, Point
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.errors import InvalidInputError

__all__ = [
    "DEFAULT_MAX_HANDOFFS",
    "TRANSFER_PREFIX",
    "Handoffs",
    "handed_to",
    "speaking_agent",
]

DEFAULT_MAX_HANDOFFS: Final = 8
"""Handoffs one run may make; one more ends it in ``HandoffLimitExceeded``."""
TRANSFER_PREFIX: Final = "transfer_to_"
_MEMBER: Final = re.compile(r"[a-z][a-z0-9_]{0,47}")


def handed_to(message: Message) -> str | None:
    """The agent ``message`` handed the run to: for a transfer's result that is not an
    error, its target; else ``None``."""
    if (
        isinstance(message, ToolResultMessage)
        and not message.is_error
        and message.tool_name.startswith(TRANSFER_PREFIX)
    ):
        return message.tool_name.removeprefix(TRANSFER_PREFIX)
    return None


def speaking_agent(history: Sequence[Message], start: str) -> str:
    """The agent the run is with: the target of the last transfer that succeeded in
    ``history``, or ``start``."""
    for message in reversed(history):
        target = handed_to(message)
        if target is not None:
            return target
    return start


def _handoffs_in(history: Sequence[Message]) -> int:
    return sum(handed_to(m) is not None for m in history)


def _history(given: Sequence[Message]) -> Sequence[Message]:
    """The run's full history (the context of the run calling), else ``given``."""
    context = current_run_context()
    return context.messages if context is not None else given


@attrs.frozen
class _Transfer:
    """The transfer tool's function: hands the run to ``target`` if the speaking agent
    may, else an error result (nothing changes)."""

    team: Handoffs
    target: str

    async def __call__(self, arguments: dict[str, Any], signal: AbortSignal) -> ToolOutput:
        speaking = self.team.speaking(_history(()))
        if self.target not in self.team.routes.get(speaking, ()):
            return ToolOutput(
                f"{speaking} may not hand the run to {self.target}; nothing changed",
                is_error=True,
            )
        return ToolOutput(f"The run is now with {self.target}.")


@attrs.frozen
class _Guarded:
    """A member's tool, run only when the speaking agent was offered it."""

    team: Handoffs
    tool: Tool

    async def __call__(self, arguments: dict[str, Any], signal: AbortSignal) -> Any:
        speaking = self.team.speaking(_history(()))
        if self.tool.name not in self.team.tool_names(speaking):
            return ToolOutput(
                f"the tool {self.tool.name} is not offered to {speaking}; it was not run",
                is_error=True,
            )
        return await self.tool.execute(arguments, signal)


class Handoffs:
    """A team of agents that hand the run to one another (module docstring).

    ``members`` maps each agent's name (lower_snake_case) to its ``Agent``; ``routes``
    maps a member to the members it may hand the run to; the run starts with
    ``start``; ``max_handoffs`` bounds the handoffs of one run. ``steps`` are the
    team's own, after ``handoff_limit`` (a ``compaction``, a guardrail); ``agent`` is
    the team as one ``Agent``."""

    def __init__(
        self,
        members: Mapping[str, Agent[Any]],
        *,
        routes: Mapping[str, Sequence[str]],
        start: str,
        max_handoffs: int = DEFAULT_MAX_HANDOFFS,
        max_turns: int = 8,
        steps: Sequence[Step] = (),
    ) -> None:
        self.members = dict(members)
        self.routes = {k: tuple(v) for k, v in routes.items()}
        self.start = start
        if isinstance(max_handoffs, bool) or not isinstance(max_handoffs, int) or max_handoffs < 0:
            raise InvalidInputError("max_handoffs must be an int of at least 0")
        self.max_handoffs = max_handoffs
        self._check()
        self._tools = self._union()
        self.agent: Agent[Any] = Agent(
            self,  # a ModelClient: its complete method
            tools=self._tools,
            max_turns=max_turns,
            steps=[self._limit_step(), *steps],
        )

    # -- checks, before any call ---------------------------------------------------------

    def _check(self) -> None:
        if not self.members:
            raise InvalidInputError("a team needs at least one member")
        for name, member in self.members.items():
            if not isinstance(name, str) or not _MEMBER.fullmatch(name):
                raise InvalidInputError(f"member {name!r}: a name is lower_snake_case")
            if not isinstance(member, Agent):
                raise InvalidInputError(
                    f"member {name!r} is a {type(member).__name__}, not an Agent"
                )
        if self.start not in self.members:
            raise InvalidInputError(f"start {self.start!r} is not a member of the team")
        for source, targets in self.routes.items():
            for target in (source, *targets):
                if target not in self.members:
                    raise InvalidInputError(
                        f"the route {source} -> {', '.join(targets)} names {target!r}, "
                        f"which is not a member (members: {', '.join(self.members)})"
                    )

    def _union(self) -> list[Tool]:
        tools: dict[str, Tool] = {}
        for name, member in self.members.items():
            for tool in member.tools:
                if tool.name.startswith(TRANSFER_PREFIX):
                    raise InvalidInputError(
                        f"member {name!r}: the tool {tool.name} is named like a transfer"
                    )
                known = tools.get(tool.name)
                if known is not None and known.definition != tool.definition:
                    raise InvalidInputError(
                        f"member {name!r}: another member has a different tool {tool.name}"
                    )
                tools[tool.name] = attrs.evolve(tool, execute=_Guarded(self, tool))
        transfers = [
            Tool(
                ToolDefinition(
                    TRANSFER_PREFIX + target,
                    f"Hand the conversation to {target}"
                    + (f": {d}" if (d := self.members[target].name) else ".")
                    + " Call it alone, with no other tool.",
                ),
                _Transfer(self, target),
                sequential=True,
            )
            for target in self.members
            if any(target in ts for ts in self.routes.values())
        ]
        return [*tools.values(), *transfers]

    def _limit_step(self) -> Step:
        def limit(messages: Sequence[Message]) -> Decision:
            count = _handoffs_in(messages)
            if count > self.max_handoffs:
                return Decision("exceeded", f"{count} handoffs; at most {self.max_handoffs}")
            return Decision("within")

        return Step(
            "handoff_limit",
            Point.BEFORE_MODEL,
            {
                "within": GoOn(),
                "exceeded": End(
                    "HandoffLimitExceeded", "the agents handed the run on too many times"
                ),
            },
            limit,
        )

    # -- who speaks, with what -----------------------------------------------------------

    def speaking(self, history: Sequence[Message]) -> str:
        return speaking_agent(history, self.start)

    def tool_names(self, member: str) -> set[str]:
        names = {t.name for t in self.members[member].tools}
        return names | {TRANSFER_PREFIX + t for t in self.routes.get(member, ())}

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
        *,
        options: CallOptions | None = None,
    ) -> AssistantMessage:
        """The speaking agent's answer, asked with its instructions and its tools."""
        member = self.members[self.speaking(_history(messages))]
        offered = self.tool_names(self.speaking(_history(messages)))
        own = [d for d in tools if d.name in offered]
        client: Any = member.model
        if not takes_options(client):
            return await answer_of(client, client.complete(messages, own, signal))
        given = member.options.instructions
        instructions: object = await call_hook(given) if callable(given) else given
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidInputError(
                f"the instructions of {member.name or 'a member'} are not a str"
            )
        told = attrs.evolve(options or CallOptions(), instructions=instructions or None)
        return await answer_of(client, client.complete(messages, own, signal, options=told))
