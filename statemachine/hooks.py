"""The hooks a run calls, and the decisions they return.

``before_tool_call`` (a ``BeforeToolCall``) may return ``Deny`` or ``RequireApproval``;
``after_tool_call`` may replace a result; ``should_continue`` may return ``Stop``;
``transform_context`` rewrites what the model sees (never the history).
"""

from __future__ import annotations

from statemachine.agent.hooks import (
    AfterToolCall,
    BeforeToolCall,
    Deny,
    RequireApproval,
    ShouldContinue,
    Stop,
    TransformContext,
)

__all__ = [
    "AfterToolCall",
    "BeforeToolCall",
    "Deny",
    "RequireApproval",
    "ShouldContinue",
    "Stop",
    "TransformContext",
]
