"""Usage limits: a budget of model requests and tokens for one run.

``UsageLimits`` is checked by the engine at the turn boundary, before the model call
that would exceed it (the ``usage_limit_reached`` guard of ``core/table.py``). The
usage it is held to is what the provider reported on each ``AssistantMessage``
(``usage``), summed over the run (a resumed run goes on counting); a message without
usage counts as zero tokens. A tool's output may carry the usage it spent on the
run's behalf (``ToolOutput.usage``: a sub-agent's, ``Agent.as_tool``); it joins the
run's usage when its result arrives. One call's size is known only once it has been made, so
one call may take the usage past a token limit; no further call is made after it.

The counts a limit reads:

* ``requests``: the model calls made in the run (``Engine.turns``), and those of the
  sub-agents whose usage joined it (``ToolOutput.requests``, ``Engine.delegated_requests``);
* ``input_tokens``: prompt tokens, cached or not (``input + cache_read + cache_write``);
* ``output_tokens``: ``output``;
* ``total_tokens``: ``total_tokens`` as the provider reported it;
* ``tool_calls``: the tool calls asked (the final-result tool's excepted); a call
  past the limit is answered "not run" instead, and the run ends at the boundary. A
  run may make exactly as many calls as the limit and go on (as PydanticAI's
  ``tool_calls_limit``): this limit is reached only once a call was refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from statemachine.core.checks import positive_int
from statemachine.core.messages import Usage
from statemachine.errors import InvalidInputError

__all__ = ["UsageLimits", "check_usage_limits", "input_tokens"]

_FIELDS = ("requests", "input_tokens", "output_tokens", "total_tokens", "tool_calls")


def _limit(instance: UsageLimits, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        positive_int(f"usage_limits.{attribute.name}", value)


@attrs.frozen
class UsageLimits:
    """The most a run may use: each field a positive int, or ``None`` for no limit.

    The engine checks them at each turn boundary, before the next model call: once the
    usage so far has reached a limit, no further call is made and the run ends
    ``UsageLimitExceeded``. ``requests`` counts model calls; the token fields count
    what the provider reported (see ``statemachine.core.limits``); ``tool_calls``
    counts the tool calls asked (PydanticAI's ``tool_calls_limit``): a call past it
    is not run (its error result says so) and the run ends at the turn boundary; a run
    that made exactly as many goes on.
    """

    requests: int | None = attrs.field(default=None, validator=_limit, kw_only=True)
    input_tokens: int | None = attrs.field(default=None, validator=_limit, kw_only=True)
    output_tokens: int | None = attrs.field(default=None, validator=_limit, kw_only=True)
    total_tokens: int | None = attrs.field(default=None, validator=_limit, kw_only=True)
    tool_calls: int | None = attrs.field(default=None, validator=_limit, kw_only=True)

    def reached(
        self, usage: Usage, requests: int, tool_calls: int = 0
    ) -> tuple[str, int, int] | None:
        """The first limit (in field order) that the usage so far has reached, as
        ``(name, limit, used)``; ``None`` while another model call is allowed."""
        used = _used(usage, requests, tool_calls)
        for name in _FIELDS:
            limit = getattr(self, name)
            # The tool-call count passes its limit only by a call refused (module docstring).
            if limit is not None and used[name] >= limit + (name == "tool_calls"):
                return name, limit, used[name]
        return None

    def remaining(self, usage: Usage, requests: int, tool_calls: int = 0) -> UsageLimits | None:
        """The limits left once ``usage``, ``requests`` and ``tool_calls`` are spent
        (what a sub-agent may still use); ``None`` when one of them is already reached."""
        if self.reached(usage, requests, tool_calls) is not None:
            return None
        used = _used(usage, requests, tool_calls)
        left = {n: getattr(self, n) - used[n] for n in _FIELDS if getattr(self, n) is not None}
        if 0 in left.values():  # every tool call spent: nothing left to give a sub-agent
            return None
        return UsageLimits(**left)

    def tightest(self, other: UsageLimits | None) -> UsageLimits:
        """Each field the smaller of ``self``'s and ``other``'s (``None``: no limit)."""
        if other is None:
            return self
        values: dict[str, int | None] = {}
        for name in _FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            values[name] = theirs if mine is None else mine if theirs is None else min(mine, theirs)
        return UsageLimits(**values)

    def to_dict(self) -> dict[str, int]:
        """The limits that are set, as JSON (``requests``, ``inputTokens``...)."""
        return {_CAMEL[n]: getattr(self, n) for n in _FIELDS if getattr(self, n) is not None}

    @classmethod
    def from_dict(cls, data: object, path: str) -> UsageLimits:
        """Read ``to_dict``'s output; ``InvalidInputError`` naming ``path`` otherwise."""
        if not isinstance(data, Mapping):
            raise InvalidInputError(f"{path}: expected an object, got {type(data).__name__}")
        unknown = set(data) - set(_FROM_CAMEL)
        if unknown:
            raise InvalidInputError(
                f"{path}: unknown key(s) {', '.join(sorted(map(str, unknown)))}"
            )
        values: dict[str, Any] = {}
        for key, value in data.items():
            name = _FROM_CAMEL[key]
            positive_int(f"{path}.{key}", value)
            values[name] = value
        return cls(**values)


def _used(usage: Usage, requests: int, tool_calls: int) -> dict[str, int]:
    return {
        "requests": requests,
        "input_tokens": input_tokens(usage),
        "output_tokens": usage.output,
        "total_tokens": usage.total_tokens,
        "tool_calls": tool_calls,
    }


_CAMEL = {
    "requests": "requests",
    "input_tokens": "inputTokens",
    "output_tokens": "outputTokens",
    "total_tokens": "totalTokens",
    "tool_calls": "toolCalls",
}
_FROM_CAMEL = {v: k for k, v in _CAMEL.items()}


def input_tokens(usage: Usage) -> int:
    """The prompt tokens of ``usage``, cached or not (what ``input_tokens`` limits)."""
    return usage.input + usage.cache_read + usage.cache_write


def check_usage_limits(value: object) -> UsageLimits | None:
    """``value`` if it is a ``UsageLimits`` or ``None``; else ``InvalidInputError``."""
    if value is not None and not isinstance(value, UsageLimits):
        raise InvalidInputError(
            f"usage_limits must be a UsageLimits(requests=..., input_tokens=..., "
            f"output_tokens=..., total_tokens=...) or None, got {type(value).__name__}"
        )
    return value
