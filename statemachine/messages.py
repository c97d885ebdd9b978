"""Messages and their content, and their one JSON form.

A history is a sequence of ``UserMessage``, ``AssistantMessage`` (text, thinking and
``ToolCall`` blocks) and ``ToolResultMessage``. ``message_to_dict`` and
``message_from_dict`` convert to and from the wire form (camelCase JSON objects).
"""

from __future__ import annotations

from statemachine.core.messages import (
    AssistantContent,
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultContent,
    ToolResultMessage,
    Usage,
    UserContent,
    UserMessage,
)
from statemachine.core.wire import (
    message_from_dict,
    message_to_dict,
    messages_from_dicts,
    messages_to_dicts,
)

__all__ = [
    "AssistantContent",
    "AssistantMessage",
    "ImageContent",
    "Message",
    "StopReason",
    "TextContent",
    "ThinkingContent",
    "ToolCall",
    "ToolResultContent",
    "ToolResultMessage",
    "Usage",
    "UserContent",
    "UserMessage",
    "message_from_dict",
    "message_to_dict",
    "messages_from_dicts",
    "messages_to_dicts",
]
