"""The hooks a run calls, the decisions they return, and the questions a person answers.

``before_tool_call`` (a ``BeforeToolCall``) may return ``Deny`` or ``RequireApproval``;
``after_tool_call`` may replace a result; ``should_continue`` may return ``Stop``;
``transform_context`` rewrites what the model sees (never the history).

A running tool may ask a person a question through its run (an MCP server's
elicitation, ``MCPServer(elicitation="run")``): the run tells ``ToolAsked`` with the
``ToolQuestion``, lists it in ``AgentRun.pending_questions()``, takes the answer with
``AgentRun.answer(question_id, answer)`` and tells ``ToolAnswered`` with how it ended;
at most ``MAX_PENDING_QUESTIONS`` are pending on a run at once.
"""

from __future__ import annotations

from statemachine.agent.events import ToolAnswered, ToolAsked, ToolQuestion
from statemachine.agent.hooks import (
    AfterToolCall,
    BeforeToolCall,
    Deny,
    RequireApproval,
    ShouldContinue,
    Stop,
    TransformContext,
)
from statemachine.agent.questions import MAX_PENDING_QUESTIONS, Answer

__all__ = [
    "MAX_PENDING_QUESTIONS",
    "AfterToolCall",
    "Answer",
    "BeforeToolCall",
    "Deny",
    "RequireApproval",
    "ShouldContinue",
    "Stop",
    "ToolAnswered",
    "ToolAsked",
    "ToolQuestion",
    "TransformContext",
]
