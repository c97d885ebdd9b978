"""``check_transcript``: the history invariants over any transcript, ours or a provider's.

Four formats are read:

* ``"statemachine"``: our message objects, or their wire dicts (camelCase, see
  ``statemachine.core.messages``). Checked by
  ``statemachine.core.invariants.history_violations``, the same
  definition the engine uses to refuse an invalid input history.
* ``"openai"``: Chat Completions histories: assistant messages with ``tool_calls``
  answered by ``{"role": "tool", "tool_call_id"}`` messages, and the legacy
  ``function_call`` answered by a ``{"role": "function", "name"}`` message.
* ``"openai-responses"``: Responses API input items: ``function_call`` (and every
  other ``*_call`` item with a ``call_id``) answered by its ``*_call_output``, among
  ``message`` items.
* ``"anthropic"``: Messages API histories: ``tool_use`` blocks answered by
  ``tool_result`` blocks at the start of the next user message, and server tools
  (``server_tool_use``, ``mcp_tool_use``) answered inside the assistant message by
  their ``*_tool_result`` block.

``"auto"`` picks one from the shape. A provider's history is checked by that
provider's own rules, the ones its API enforces when it accepts or rejects a request:
what it rejects is an ``error`` finding; what it accepts but is likely a mistake (an id
reused across turns, results out of call order, a result naming another tool) is a
``warning``; ``strict=True`` makes errors of the warnings that some servers enforce
(``STRICT_RULES``). ``check_transcript`` returns the errors, ``transcript_findings`` both. A
field that cannot be read is one ``format`` finding, never a cascade of pairing
findings.

This module is the public face; the parts live beside it: ``_transcript_formats``
(which format a log is in), ``_transcript_readers`` (a provider's log as turns),
``_transcript_rules`` (findings, and the providers' pairing and order rules) and
``_transcript_ours`` (our format, by the engine's own invariants).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from statemachine.agent.handoff import handed_to
from statemachine.core.invariants import Violation
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    TextContent,
    UserMessage,
    thaw_json,
)
from statemachine.testing._transcript_formats import (
    detect_format,
    format_evidence,
    split_evidence,
    unwrap,
)
from statemachine.testing._transcript_ours import check_statemachine
from statemachine.testing._transcript_rules import (
    REUSE_STRICT,
    Finding,
    Level,
    check_provider,
)

__all__ = [
    "STRICT_RULES",
    "Finding",
    "Level",
    "TranscriptFormat",
    "check_transcript",
    "detect_format",
    "format_evidence",
    "render_transcript",
    "transcript_findings",
]

TranscriptFormat = Literal[
    "statemachine",
    "openai",
    "openai-responses",
    "anthropic",
    "bedrock-converse",
    "gemini",
    "auto",
]
FORMATS: tuple[str, ...] = (
    "statemachine",
    "openai",
    "openai-responses",
    "anthropic",
    "bedrock-converse",
    "gemini",
)

STRICT_RULES: Mapping[str, str] = {
    "anthropic-id-reuse": (
        "anthropic, bedrock-converse: a tool_use (toolUse) id that repeats the id of a "
        "call in an earlier turn. Anthropic accepted a recorded request with Gemini-made "
        'ids reused in a later turn, and refused others with "tool_use ids must be '
        'unique".'
    ),
    "converse-tool-result-with-content": (
        "bedrock-converse: a user message holding a toolResult block and a text, image, "
        "document or video block. Bedrock refuses it for Llama, Mistral and Writer models "
        '("Conversation blocks and tool result blocks cannot be provided in the same '
        'turn") and accepts it for Anthropic and Nova models; a body whose modelId names '
        "a refusing family gets an error without strict."
    ),
    "responses-output-after-message": (
        "openai-responses: a function_call_output (any *_call_output) after a message "
        "item that follows its call. OpenAI accepts it; DeepSeek's Responses endpoint "
        'refused a recorded one with 400 "No tool output found for tool call".'
    ),
}
"""The rules that are warnings by default and errors with ``strict=True``: each is
enforced by some servers (or some of the time) and not by others."""


def check_transcript(
    messages: Any,
    format: TranscriptFormat = "statemachine",
    *,
    allow_open_tail: bool = False,
    id_reuse: Level | None = None,
    strict: bool = False,
) -> list[Violation]:
    """Every error-level pairing and order violation in a transcript, each with the
    invariant it breaks (``"I1"``, ``"I2"``, ``"format"``), the index of the message
    where it shows, and a sentence. An empty list means the transcript is valid.

    Catches at least: a call without a result, two results for one call, a result
    without a call, results out of call order (where the format requires the order),
    a result after the next assistant message or not where the provider wants it,
    and duplicate (or empty) call ids. Options as for ``transcript_findings``.
    """
    found = transcript_findings(
        messages, format, allow_open_tail=allow_open_tail, id_reuse=id_reuse, strict=strict
    )
    return [f for f in found if f.level == "error"]


def transcript_findings(
    messages: Any,
    format: TranscriptFormat = "statemachine",
    *,
    allow_open_tail: bool = False,
    id_reuse: Level | None = None,
    strict: bool = False,
) -> list[Finding]:
    """Every finding, errors and warnings, sorted by message index.

    ``messages`` is the list, or a request body wrapping it (``{"messages": [...]}``;
    ``{"input": [...]}`` for the Responses API, where a ``previous_response_id`` or
    ``conversation`` lets outputs answer calls the input does not hold; ``{"contents":
    [...]}`` for Gemini). With ``format="auto"`` a log whose evidence points to no
    format or to several (``detect_format`` gives ``"unknown"``) is one ``format``
    error naming what was seen, and nothing else is checked.

    ``allow_open_tail`` accepts a log that ends mid-turn: the calls of the last
    assistant message (Responses: calls after the last message item) may lack
    results. ``id_reuse`` is the level of a call id that repeats the id of a call in
    an earlier turn: ``"warning"`` by default for the providers' formats (OpenAI
    accepts it, Anthropic has accepted it), ``"error"`` for ours (our engine refuses
    it). Two calls with one id in the same message are always errors.

    ``strict`` makes errors of the rules some servers enforce and others do not
    (``STRICT_RULES``, one sentence each): for a log meant for any of them.

    Raises ``TypeError`` for something that is not a list (or a wrapper of one) and
    ``ValueError`` for an unknown format.
    """
    items = unwrap(messages)
    fmt: str = detect_format(messages) if format == "auto" else format
    if fmt == "unknown" and format == "auto":
        return [_format_finding(messages)]
    if fmt not in FORMATS:
        raise ValueError(
            f"unknown transcript format {fmt!r}: use one of {', '.join(FORMATS)} or 'auto'"
        )
    reuse: Level = id_reuse or (
        "error" if fmt == "statemachine" or (strict and fmt in REUSE_STRICT) else "warning"
    )
    if fmt == "statemachine":
        out = check_statemachine(items, allow_open_tail, reuse)
    else:
        out = check_provider(
            messages, items, fmt, allow_open_tail=allow_open_tail, reuse=reuse, strict=strict
        )
    return sorted(out, key=lambda f: (f.index, f.level, f.invariant, f.message))


def _format_finding(messages: Any) -> Finding:
    """The one finding of a log whose evidence points to no format or to several (with
    ``format="auto"``): what was seen, so that the caller can name the format."""
    strong, weak = split_evidence(messages)
    evidence = strong or weak
    if not evidence:
        return Finding(
            "format",
            0,
            "the log matches no known format (no sign of any, and an item that is not a "
            "user, assistant or system message): give the format",
        )
    signs = "; ".join(f"{fmt}: {', '.join(where)}" for fmt, where in sorted(evidence.items()))
    return Finding(
        "format",
        0,
        f"the log matches several formats differently ({signs}): give the format",
    )


# -- rendering -----------------------------------------------------------------------------


def render_transcript(messages: Sequence[Message], *, first_agent: str | None = None) -> str:
    """One line per message, for failure reports.

    A team's run (``statemachine.steps.Handoffs``) names the agent of each assistant
    message: ``first_agent`` (the team's ``start``) until a transfer's result that is
    not an error hands the run on, as ``speaking_agent`` reads it. A history holding
    such a transfer is named so without ``first_agent`` too ("the first agent" until
    then); the transfer's result says to whom the run went.
    """
    speaker = first_agent
    if speaker is None and any(handed_to(m) for m in messages):
        speaker = "the first agent"
    lines = []
    for i, message in enumerate(messages):
        if isinstance(message, UserMessage):
            text = "".join(b.text for b in message.content if isinstance(b, TextContent))
            lines.append(f"{i:>3} user: {text!r}")
        elif isinstance(message, AssistantMessage):
            calls = ", ".join(
                f"{c.name}#{c.id}({json.dumps(thaw_json(c.arguments), sort_keys=True)})"
                for c in message.tool_calls
            )
            who = "assistant" if speaker is None else f"assistant ({speaker})"
            bits = [f"{i:>3} {who} [{message.stop_reason.value}]"]
            if message.text:
                bits.append(repr(message.text))
            if calls:
                bits.append(f"calls {calls}")
            if message.error_message:
                bits.append(f"error {message.error_message!r}")
            lines.append(" ".join(bits))
        else:
            flag = " ERROR" if message.is_error else ""
            text = message.text if len(message.text) <= 100 else message.text[:99] + "\u2026"
            line = f"{i:>3} result{flag} {message.tool_name}#{message.tool_call_id}: {text!r}"
            target = handed_to(message)
            if target is not None:
                speaker = target
                line += f" (handed to {target})"
            lines.append(line)
    return "\n".join(lines)
