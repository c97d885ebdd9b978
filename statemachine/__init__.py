"""statemachine: the LLM agent loop as a deterministic, explicit state machine.

The public surface is what this module exports; everything in a ``_``-module is
private. ``statemachine.testing`` (conformance kit) and ``statemachine.workspace``
(file tools) are public submodules.
"""

from __future__ import annotations

from ._abort import AbortController, AbortSignal
from ._driver import BeforeToolCall, Deny, RunResult, run_agent, run_agent_sync
from ._engine import Engine, TransitionRecord
from ._errors import (
    AbortedError,
    AwaitingUserError,
    BadOutputError,
    InvalidInputError,
    ModelFailedError,
    ModelOutputError,
    ProtocolError,
    RunEndedError,
    StateMachineError,
    ToolOutputError,
    TurnLimitExceededError,
    UsageError,
    WireFormatError,
)
from ._events import (
    AbortRequested,
    Action,
    CallModel,
    CancelOperations,
    CheckPermission,
    Event,
    HistoryView,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    RunEnded,
    Start,
    StartTool,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from ._messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    message_from_dict,
    message_to_dict,
    messages_from_dicts,
    messages_to_dicts,
)
from ._model import ModelClient
from ._table import TurnState
from ._tools import Tool, ToolDefinition, ToolOutput, tool, validate_arguments

__version__ = "0.1.0"

__all__ = [
    "AbortController",
    "AbortRequested",
    "AbortSignal",
    "AbortedError",
    "Action",
    "AssistantMessage",
    "AwaitingUserError",
    "BadOutputError",
    "BeforeToolCall",
    "CallModel",
    "CancelOperations",
    "CheckPermission",
    "Deny",
    "Engine",
    "Event",
    "HistoryView",
    "ImageContent",
    "InvalidInputError",
    "Message",
    "ModelCancelled",
    "ModelClient",
    "ModelFailed",
    "ModelFailedError",
    "ModelOutputError",
    "ModelResponded",
    "ProtocolError",
    "RunEnded",
    "RunEndedError",
    "RunResult",
    "Start",
    "StartTool",
    "StateMachineError",
    "StopReason",
    "TextContent",
    "ThinkingContent",
    "Tool",
    "ToolCall",
    "ToolCancelled",
    "ToolDefinition",
    "ToolDenied",
    "ToolFinished",
    "ToolOutput",
    "ToolOutputError",
    "ToolPermitted",
    "ToolResultMessage",
    "TransitionRecord",
    "TurnLimitExceededError",
    "TurnState",
    "Usage",
    "UsageError",
    "UserMessage",
    "WireFormatError",
    "__version__",
    "message_from_dict",
    "message_to_dict",
    "messages_from_dicts",
    "messages_to_dicts",
    "run_agent",
    "run_agent_sync",
    "tool",
    "validate_arguments",
]
