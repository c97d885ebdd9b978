"""The model boundary.

A ``ModelClient`` turns a context into one assistant message. It owns everything
provider-specific, retries of transient errors included (the engine never retries:
any exception from ``complete`` is one failed call and ends the run ``Failed``).

On abort, a well-behaved client stops promptly and *returns* an ``AssistantMessage``
with stop reason ``aborted`` holding what had arrived, partial tool calls dropped.
A client that ignores the signal is cancelled by the driver after the grace period.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from statemachine.core.abort import AbortSignal
from statemachine.core.messages import AssistantMessage, Message
from statemachine.core.tools import ToolDefinition

__all__ = ["ModelClient"]


@runtime_checkable
class ModelClient(Protocol):
    """``async complete(messages, tools, signal) -> AssistantMessage``."""

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
    ) -> AssistantMessage: ...
