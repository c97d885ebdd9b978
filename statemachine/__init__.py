"""statemachine: the LLM agent loop as a deterministic, explicit state machine.

This module is what an application writes against: run and resume an agent, define
tools, read messages and results, approve or deny calls, abort, and the errors to catch.
Every name here is also exported by the public module of its subject, which holds the
rest of that subject:

* ``statemachine.engine``: the sans-IO engine (``Engine``, its events and actions) for
  embedding the loop in your own driver;
* ``statemachine.messages``: every message and content type, and their JSON form;
* ``statemachine.errors``: the whole error hierarchy;
* ``statemachine.hooks``: the hook signatures and the decisions hooks return;
* ``statemachine.journal``: record a run and replay it exactly;
* ``statemachine.testing``: the conformance kit, fake models, the checker;
* ``statemachine.workspace``, ``statemachine.providers``, ``statemachine.mcp``,
  ``statemachine.otel``: file tools, model clients, MCP tools, OpenTelemetry.

The folders ``core``, ``agent`` and ``cli`` are internal layers: import from the
modules above, never from them.
"""

# First: fail with a clear message if python-statemachine shadows this package.
from statemachine import _shadow  # noqa: F401  # isort: skip

import typing as _typing

from statemachine._deprecated import renamed as _renamed
from statemachine._version import __version__
from statemachine.agent.agent import Agent
from statemachine.agent.context import RunContext
from statemachine.agent.events import (
    EventsDropped,
    MessageAdded,
    RunEvent,
    RunResult,
    RunReturned,
    RunStarted,
    RunStats,
    StateChanged,
    TextDelta,
    ToolCallDelta,
    ToolEnded,
    ToolLog,
    ToolProgress,
    ToolStarted,
    TurnEnded,
    TurnStarted,
)
from statemachine.agent.hooks import (
    Deny,
    RequireApproval,
    Stop,
)
from statemachine.agent.model import ModelClient, ModelSettings
from statemachine.agent.model import use_model_strings as _use_model_strings
from statemachine.agent.options import AgentOptions, NewRunOptions, ResumeOptions, RunOptions
from statemachine.agent.resume import resume_agent, resume_agent_sync, resume_run
from statemachine.agent.run import (
    AgentRun,
    run_agent,
    run_agent_sync,
)
from statemachine.agent.running import (
    current_tool_call,
    report_progress,
)
from statemachine.agent.tools import Tool, tool
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.limits import UsageLimits
from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.errors import (
    AbortedError,
    InvalidInputError,
    ModelFailedError,
    ModelRetry,
    StateMachineError,
    TurnLimitExceededError,
    UsageError,
)
from statemachine.providers.registry import model_from_string as _model_from_string

_use_model_strings(_model_from_string)  # "openai:gpt-4.1" wherever a client is taken

__all__ = [
    "AbortController",
    "AbortSignal",
    "AbortedError",
    "Agent",
    "AgentOptions",
    "AgentRun",
    "AssistantMessage",
    "Deny",
    "EventsDropped",
    "ImageContent",
    "InvalidInputError",
    "Message",
    "MessageAdded",
    "ModelClient",
    "ModelFailedError",
    "ModelRetry",
    "ModelSettings",
    "NewRunOptions",
    "RequireApproval",
    "ResumeOptions",
    "RunContext",
    "RunEvent",
    "RunOptions",
    "RunResult",
    "RunReturned",
    "RunStarted",
    "RunStats",
    "StateChanged",
    "StateMachineError",
    "Stop",
    "TextContent",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolDefinition",
    "ToolEnded",
    "ToolLog",
    "ToolOutput",
    "ToolProgress",
    "ToolResultMessage",
    "ToolStarted",
    "TurnEnded",
    "TurnLimitExceededError",
    "TurnStarted",
    "TurnState",
    "UsageError",
    "UsageLimits",
    "UserMessage",
    "__version__",
    "current_tool_call",
    "report_progress",
    "resume_agent",
    "resume_agent_sync",
    "resume_run",
    "run_agent",
    "run_agent_sync",
    "tool",
]


if not _typing.TYPE_CHECKING:  # a type checker reports the old name as missing

    def __getattr__(name: str) -> _typing.Any:
        return _renamed(__name__, name, {"RunFinished": "RunReturned"}, globals())
