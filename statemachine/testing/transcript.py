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
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs

from statemachine.core.invariants import Violation, history_violations
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    thaw_json,
)
from statemachine.core.wire import message_from_dict
from statemachine.errors import WireFormatError
from statemachine.testing._transcript_readers import (
    Call,
    Result,
    Turn,
    read_anthropic,
    read_converse,
    read_gemini,
    read_openai,
    read_responses,
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
Level = Literal["error", "warning"]
FORMATS: tuple[str, ...] = (
    "statemachine",
    "openai",
    "openai-responses",
    "anthropic",
    "bedrock-converse",
    "gemini",
)
# Formats whose results go in the user message right after the calls.
_NEXT_USER_MESSAGE = frozenset({"anthropic", "bedrock-converse"})
# A call id used again in a later turn: OpenAI accepts it; Anthropic accepted a recorded
# request with one and refused others ("tool_use ids must be unique"), so it is an error
# only under ``strict``; our engine refuses it.
_REUSE_STRICT = frozenset({"anthropic", "bedrock-converse"})

STRICT_RULES: Mapping[str, str] = {
    "anthropic-id-reuse": (
        "anthropic, bedrock-converse: a tool_use (toolUse) id that repeats the id of a "
        "call in an earlier turn. Anthropic accepted a recorded request with Gemini-made "
        'ids reused in a later turn, and refused others with "tool_use ids must be '
        'unique".'
    ),
    "responses-output-after-message": (
        "openai-responses: a function_call_output (any *_call_output) after a message "
        "item that follows its call. OpenAI accepts it; DeepSeek's Responses endpoint "
        'refused a recorded one with 400 "No tool output found for tool call".'
    ),
}
"""The rules that are warnings by default and errors with ``strict=True``: each is
enforced by some servers (or some of the time) and not by others."""


@attrs.frozen
class Finding(Violation):
    """A ``Violation`` with a level: ``"error"`` (the provider rejects such a history,
    or our engine refuses it) or ``"warning"`` (accepted, but likely a mistake)."""

    level: Level = "error"

    def __str__(self) -> str:
        prefix = "warning: " if self.level == "warning" else ""
        return f"{prefix}{self.invariant} at message {self.index}: {self.message}"


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
    items = _unwrap(messages)
    fmt: str = detect_format(messages) if format == "auto" else format
    if fmt == "unknown" and format == "auto":
        return [_format_finding(messages)]
    if fmt not in FORMATS:
        raise ValueError(
            f"unknown transcript format {fmt!r}: use one of {', '.join(FORMATS)} or 'auto'"
        )
    reuse: Level = id_reuse or (
        "error" if fmt == "statemachine" or (strict and fmt in _REUSE_STRICT) else "warning"
    )
    if fmt == "statemachine":
        out = _check_statemachine(items, allow_open_tail, reuse)
    else:
        reader = {
            "openai": read_openai,
            "openai-responses": read_responses,
            "bedrock-converse": read_converse,
            "gemini": read_gemini,
        }.get(fmt, read_anthropic)
        turns, problems = reader(items)
        pairing = _Pairing(fmt, allow_open_tail, reuse)
        pairing.strict = strict
        # A Responses request that continues a stored response answers calls the
        # input does not hold.
        pairing.continued = isinstance(messages, Mapping) and bool(
            messages.get("previous_response_id") or messages.get("conversation")
        )
        pairing.out += [Finding(p.invariant, p.index, p.message) for p in problems]
        if fmt == "openai-responses":
            pairing.walk_items(turns)
        elif fmt == "gemini":
            pairing.walk_gemini(turns)
        else:
            pairing.walk_turns(turns)
        out = pairing.out
    return sorted(out, key=lambda f: (f.index, f.level, f.invariant, f.message))


def _unwrap(messages: Any) -> Sequence[Any]:
    if isinstance(messages, Mapping):
        for key in ("messages", "input", "contents"):
            inner = messages.get(key)
            if key == "input" and isinstance(inner, str):
                return [{"role": "user", "content": inner}]  # the Responses shorthand
            if isinstance(inner, Sequence) and not isinstance(inner, (str, bytes)):
                return inner
        raise TypeError("a mapping must wrap the history as 'messages', 'input' or 'contents'")
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a sequence, got {type(messages).__name__}")
    return messages


def detect_format(messages: Any) -> str:
    """The format a history is in, from all the evidence of its shape: the request
    body's keys (``contents``, ``modelId``, ``input``, ``system``, the shape of
    ``tools``) and every item's role, keys and content block types. A history with
    evidence of exactly one format is in that format; a plain one (roles and text only,
    read alike by every format) is ``"openai"``. ``"unknown"`` when the evidence points
    to no format or to several: ``format_evidence`` says what it saw."""
    strong, weak = _evidence(messages)
    for signs in (strong, weak):
        if len(signs) == 1:
            return next(iter(signs))
        if signs:
            return "unknown"
    return "unknown" if _unrecognised(messages) else "openai"


def format_evidence(messages: Any) -> dict[str, list[str]]:
    """For each format the history shows a sign of, the first signs (a few words each,
    e.g. ``"messages[2]: a toolUse block"``). Plain user/assistant/system messages with
    string content or ``text`` blocks are no sign of any format: every one reads them.
    The signs of how tool calls are written (``tool_calls``, ``tool_use`` blocks,
    ``toolUse`` blocks, ``functionCall`` parts, ``*_call`` items, ...) outweigh the
    others (a ``thinking`` block, a body key): ``detect_format`` looks at the others
    only when the tool calls show no format."""
    strong, weak = _evidence(messages)
    merged = {fmt: list(signs) for fmt, signs in strong.items()}
    for fmt, signs in weak.items():
        merged.setdefault(fmt, []).extend(signs)
    return {fmt: signs[:3] for fmt, signs in merged.items()}


def _evidence(messages: Any) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The signs of each format, split into the strong ones (how tool calls and
    results are written, the key that holds the history) and the weak ones."""
    strong: dict[str, list[str]] = {}
    weak: dict[str, list[str]] = {}

    def sign(fmt: str, where: str, is_strong: bool = False) -> None:
        signs = (strong if is_strong else weak).setdefault(fmt, [])
        if len(signs) < 3:
            signs.append(where)

    if isinstance(messages, Mapping):
        _wrapper_evidence(messages, sign)
    try:
        items = _unwrap(messages)
    except TypeError:
        return strong, weak
    key = _items_key(messages)
    for i, item in enumerate(items):
        if i >= _EVIDENCE_ITEMS:
            break
        _item_evidence(item, f"{key}[{i}]", sign)
    return strong, weak


class _Sign(Protocol):
    def __call__(self, fmt: str, where: str, is_strong: bool = False) -> None: ...


_EVIDENCE_ITEMS = 10_000  # items looked at by format_evidence; the format shows early


def _items_key(messages: Any) -> str:
    if isinstance(messages, Mapping):
        return next((k for k in ("messages", "input", "contents") if k in messages), "messages")
    return "messages"


def _wrapper_evidence(body: Mapping[str, Any], sign: _Sign) -> None:
    if "contents" in body:
        sign("gemini", "the body's 'contents'", True)
    for key in ("systemInstruction", "system_instruction", "generationConfig"):
        if key in body:
            sign("gemini", f"the body's {key!r}")
    for key in ("modelId", "inferenceConfig", "additionalModelRequestFields"):
        if key in body:
            sign("bedrock-converse", f"the body's {key!r}")
    tool_config = body.get("toolConfig")  # Converse: the tools; Gemini: how to call them
    if isinstance(tool_config, Mapping) and "tools" in tool_config:
        sign("bedrock-converse", "the body's 'toolConfig' with 'tools'")
    if isinstance(body.get("input"), (list, str)) and "messages" not in body:
        sign("openai-responses", "the body's 'input'", True)
    for key in ("previous_response_id", "max_output_tokens"):
        if key in body:
            sign("openai-responses", f"the body's {key!r}")
    for key in ("anthropic_version", "stop_sequences", "mcp_servers", "container"):
        if key in body:
            sign("anthropic", f"the body's {key!r}")
    for key in ("max_completion_tokens", "response_format", "stream_options", "logprobs"):
        if key in body and "messages" in body:
            sign("openai", f"the body's {key!r}")
    for key in ("instructions", "store", "include", "text", "reasoning"):
        if key in body and "input" in body:
            sign("openai-responses", f"the body's {key!r}")
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") in ("auto", "any", "tool", "none"):
        sign("anthropic", f"the body's tool_choice of type {choice['type']!r}")
    system = body.get("system")
    if isinstance(system, str):
        sign("anthropic", "a 'system' string in the body")
    elif isinstance(system, list) and system and isinstance(system[0], Mapping):
        if "type" in system[0]:
            sign("anthropic", "typed 'system' blocks in the body")
        elif "text" in system[0]:
            sign("bedrock-converse", "untyped 'system' blocks in the body")
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping):
            continue
        if "toolSpec" in tool:
            sign("bedrock-converse", "a 'toolSpec' tool")
        elif "functionDeclarations" in tool or "function_declarations" in tool:
            sign("gemini", "a 'functionDeclarations' tool")
        elif "input_schema" in tool:
            sign("anthropic", "a tool with 'input_schema'")
        elif tool.get("type") == "function" and "function" in tool:
            sign("openai", "a Chat Completions function tool")
        elif tool.get("type") == "function" and "name" in tool:
            sign("openai-responses", "a Responses function tool")


_ANTHROPIC_ONLY = frozenset(
    {
        "tool_use",
        "tool_result",
        "server_tool_use",
        "mcp_tool_use",
        "thinking",
        "redacted_thinking",
        "document",
        "image",
        "search_result",
    }
)
_ANTHROPIC_TOOLS = frozenset({"tool_use", "tool_result", "server_tool_use", "mcp_tool_use"})
_OPENAI_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
_RESPONSES_PARTS = frozenset(
    {"input_text", "output_text", "input_image", "input_file", "input_audio", "refusal"}
)
_RESPONSES_ITEMS = frozenset({"message", "reasoning", "item_reference", "compaction"})
_CONVERSE_KEYS = frozenset(
    {
        "toolUse",
        "toolResult",
        "reasoningContent",
        "cachePoint",
        "guardContent",
        "citationsContent",
        "video",
    }
)
_GEMINI_KEYS = frozenset(
    {
        "functionCall",
        "function_call",
        "functionResponse",
        "function_response",
        "inlineData",
        "inline_data",
        "fileData",
        "file_data",
        "thought",
        "thoughtSignature",
        "thought_signature",
        "executableCode",
        "codeExecutionResult",
    }
)


def _item_evidence(item: Any, where: str, sign: _Sign) -> None:
    if isinstance(item, (UserMessage, AssistantMessage, ToolResultMessage)):
        sign("statemachine", f"{where}: a statemachine message", True)
        return
    if not isinstance(item, Mapping):
        return
    role = item.get("role")
    kind = item.get("type")
    if role == "toolResult" or "stopReason" in item or "toolCallId" in item:
        sign("statemachine", f"{where}: a statemachine wire message", True)
    if "parts" in item or role == "model":
        sign("gemini", f"{where}: 'parts' or the role 'model'", True)
    if isinstance(kind, str) and (
        kind.endswith("_call") or kind.endswith("_output") or kind in _RESPONSES_ITEMS
    ):
        sign("openai-responses", f"{where}: a {kind!r} item", True)
    if "tool_calls" in item or "function_call" in item or role in ("tool", "function"):
        what = "tool_calls" if "tool_calls" in item else f"role {role!r}"
        sign("openai", f"{where}: {what}", True)
    content = item.get("content")
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, Mapping):
            continue
        btype = block.get("type")
        if btype is not None and not isinstance(btype, str):
            continue  # unreadable: the format's reader says so
        if btype is None:
            if "toolUse" in block or "toolResult" in block:
                sign("bedrock-converse", f"{where}: a {next(iter(block))!r} block", True)
            elif _CONVERSE_KEYS.intersection(block) or (
                set(block) <= {"text", "image", "document"} and block
            ):
                sign("bedrock-converse", f"{where}: an untyped {next(iter(block))!r} block")
        elif btype in _ANTHROPIC_TOOLS:
            sign("anthropic", f"{where}: a {btype!r} block", True)
        elif btype in _ANTHROPIC_ONLY:
            sign("anthropic", f"{where}: a {btype!r} block")
        elif btype == "toolCall":
            sign("statemachine", f"{where}: a 'toolCall' block", True)
        elif btype in _RESPONSES_PARTS and btype not in _OPENAI_PARTS:
            sign("openai-responses", f"{where}: an {btype!r} part")
        elif btype in _OPENAI_PARTS and btype not in _RESPONSES_PARTS:
            sign("openai", f"{where}: an {btype!r} part")
    parts = item.get("parts")
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, Mapping) and _GEMINI_KEYS.intersection(part):
            # "parts" already signed Gemini strongly
            sign("gemini", f"{where}: a {sorted(_GEMINI_KEYS.intersection(part))[0]!r} part")
            break


def _unrecognised(messages: Any) -> bool:
    """Whether a history without a sign of any format still holds something no format
    reads: a role none of them has, or an item that is not a message."""
    try:
        items = _unwrap(messages)
    except TypeError:
        return False
    known = ("user", "assistant", "system", "developer", None)
    return any(
        not isinstance(item, Mapping) or item.get("role") not in known
        for item in items[:_EVIDENCE_ITEMS]
    )


def _format_finding(messages: Any) -> Finding:
    strong, weak = _evidence(messages)
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


# -- a result under a wrong id -------------------------------------------------------------


def _stand_ins(
    call_ids: Sequence[str], result_ids: Sequence[str], known: set[str]
) -> list[tuple[int, int]]:
    """The results of one assistant message's answer that were sent under a wrong id,
    as (result position, call position) pairs: a result whose id no call in the whole
    history has, where a call of the message has no result. Paired in order, and only
    when there are as many such results as such calls (else nothing is clear)."""
    strangers = [n for n, rid in enumerate(result_ids) if rid not in known]
    answered = set(result_ids)
    orphans = [n for n, cid in enumerate(call_ids) if cid not in answered]
    if not strangers or len(strangers) != len(orphans):
        return []
    return list(zip(strangers, orphans, strict=True))


def _wrong_id(result_id: str, call_id: str, name: str, call_index: int) -> str:
    return (
        f"the result for tool call {result_id!r} answers no call: it stands where the "
        f"result of call {call_id!r} ({name}, message {call_index}) belongs, which has no "
        "other result (a result sent under a wrong id)"
    )


# -- our format ----------------------------------------------------------------------


def _check_statemachine(items: Sequence[Any], allow_open_tail: bool, reuse: Level) -> list[Finding]:
    neutral: list[Message] = []
    origin: list[int] = []
    out: list[Finding] = []
    for i, item in enumerate(items):
        if isinstance(item, (UserMessage, AssistantMessage, ToolResultMessage)):
            neutral.append(item)
            origin.append(i)
        elif isinstance(item, Mapping):
            try:
                neutral.append(message_from_dict(item, path=f"messages[{i}]"))
            except WireFormatError as exc:
                out.append(Finding("format", i, str(exc)))
                salvaged = _salvage(item)
                if salvaged is None:
                    continue
                neutral.append(salvaged)
            origin.append(i)
        else:
            out.append(
                Finding("format", i, f"a {type(item).__name__} is not a message or a wire dict")
            )
    stand_in_calls = _mend_wrong_ids(neutral, origin, out)
    for v in history_violations(neutral, allow_open_tail=allow_open_tail):
        index = origin[v.index] if 0 <= v.index < len(origin) else v.index
        if v.invariant == "I2" and _skips_only(v.message, stand_in_calls):
            continue  # the mended result is named already; the results after it are in place
        level: Level = "error"
        if "repeats the id" in v.message and f"message {v.index}" not in v.message:
            level = reuse
        out.append(Finding(v.invariant, index, _renumber(v.message, origin), level))
    return out


def _mend_wrong_ids(neutral: list[Message], origin: list[int], out: list[Finding]) -> set[str]:
    """Names each result sent under a wrong id (``_stand_ins``) and gives it the id of
    the call it stands for, so that the pairing check does not also accuse the call of
    having no result or the results after it of coming early. Returns those calls' ids."""
    known = {c.id for m in neutral if isinstance(m, AssistantMessage) for c in m.tool_calls}
    mended: set[str] = set()
    for n, message in enumerate(neutral):
        if not isinstance(message, AssistantMessage) or not message.tool_calls:
            continue
        run = n + 1
        while run < len(neutral) and isinstance(neutral[run], ToolResultMessage):
            run += 1
        results = [m for m in neutral[n + 1 : run] if isinstance(m, ToolResultMessage)]
        calls = message.tool_calls
        pairs = _stand_ins([c.id for c in calls], [r.tool_call_id for r in results], known)
        for r, c in pairs:
            call = calls[c]
            out.append(
                Finding(
                    "I1",
                    origin[n + 1 + r],
                    _wrong_id(results[r].tool_call_id, call.id, call.name, origin[n]),
                )
            )
            neutral[n + 1 + r] = attrs.evolve(results[r], tool_call_id=call.id, tool_name=call.name)
            mended.add(call.id)
    return mended


def _skips_only(sentence: str, call_ids: set[str]) -> bool:
    """Whether an I2 sentence ("... before the result(s) of earlier call(s) 'a', 'b' of
    the same assistant message") names only calls in ``call_ids``."""
    match = re.search(r"earlier call\(s\) (.+) of the same", sentence)
    if match is None or not call_ids:
        return False
    named = set(re.findall(r"'([^']*)'", match.group(1)))
    return bool(named) and named <= call_ids


def _salvage(item: Mapping[str, Any]) -> Message | None:
    """What pairing needs from an unreadable wire dict (its calls, or the call its
    result answers), so that one bad field does not orphan every call around it."""
    role = item.get("role")
    if role == "assistant":
        content = item.get("content")
        calls = [
            ToolCall(b["id"], str(b.get("name", "")), {})
            for b in (content if isinstance(content, list) else ())
            if isinstance(b, Mapping)
            and b.get("type") == "toolCall"
            and isinstance(b.get("id"), str)
        ]
        return AssistantMessage(tuple(calls), stop_reason="toolUse" if calls else "stop")
    if role == "toolResult" and isinstance(item.get("toolCallId"), str):
        name = item.get("toolName")
        return ToolResultMessage(item["toolCallId"], name if isinstance(name, str) else "", "")
    return UserMessage("") if role == "user" else None


def _renumber(sentence: str, origin: list[int]) -> str:
    # history_violations names other messages as "message N" in neutral numbering.
    def sub(match: re.Match[str]) -> str:
        n = int(match.group(1))
        return f"message {origin[n] if 0 <= n < len(origin) else n}"

    return re.sub(r"message (\d+)", sub, sentence)


# -- the providers' rules -----------------------------------------------------------------


class _Pairing:
    """Walks a provider's turns, pairing each result with the call that owns its id
    (the latest call with that id, so ids reused across turns pair correctly)."""

    def __init__(self, format: str, allow_open_tail: bool, reuse: Level) -> None:
        self.format = format
        self.allow_open_tail = allow_open_tail
        self.reuse = reuse
        self.out: list[Finding] = []
        self.pending: list[Call] = []  # calls of the last assistant turn still unanswered
        self.damaged = False  # a damaged turn since those calls: stay silent about them
        self.seen: dict[str, int] = {}  # call id -> index of the latest call with it
        self.answered: dict[str, Call] = {}
        self.abandoned: dict[str, tuple[Call, Turn]] = {}  # id -> (call, turn that cut in)
        self.continued = False
        self.strict = False
        self.stand_ins: set[int] = set()  # calls whose result came under a wrong id

    def add(self, invariant: str, index: int, message: str, level: Level = "error") -> None:
        self.out.append(Finding(invariant, index, message, level))

    # Chat Completions and Messages: turn after turn ------------------------------------

    def walk_turns(self, turns: list[Turn]) -> None:
        self.mend_wrong_ids(turns)
        last_assistant = max((n for n, t in enumerate(turns) if t.role == "assistant"), default=-1)
        for n, turn in enumerate(turns):
            if turn.role == "assistant":
                self.close(turn)
                self.server_calls(turn, is_last=n == last_assistant)
                self.open(turn)
            elif turn.role in ("tool", "function") and self.format == "openai":
                self.damaged |= turn.damaged
                for result in turn.results:
                    self.answer(result, turn)
            elif turn.role == "user" and self.format in _NEXT_USER_MESSAGE:
                self.damaged |= turn.damaged
                for result in turn.results:
                    if result.after_other_content:
                        self.add(
                            "I1",
                            result.index,
                            f"the tool_result for {result.id!r} comes after other content: "
                            "tool_result blocks must come first in the user message",
                        )
                    else:
                        self.answer(result, turn)
                self.close(turn)
            else:
                self.close(turn)
        if self.pending and not self.allow_open_tail and not self.damaged:
            for call in self.pending:
                self.missing(call, "and the transcript ends")
        self.pending = []

    def mend_wrong_ids(self, turns: list[Turn]) -> None:
        """Names each result sent under a wrong id (``_stand_ins``) and gives it its
        call's id, so that the walk neither reports the call unanswered nor the results
        after it early."""
        known = {c.id for t in turns for c in t.calls}
        answer_roles = ("tool", "function") if self.format == "openai" else ("user",)
        for n, turn in enumerate(turns):
            if turn.role != "assistant" or not turn.calls:
                continue
            results: list[Result] = []
            for later in turns[n + 1 :]:
                if later.role not in answer_roles:
                    break
                results += [r for r in later.results if not r.legacy]
                if self.format != "openai":
                    break  # one user message holds all of them
            calls = [c for c in turn.calls if not c.legacy]
            pairs = _stand_ins([c.id for c in calls], [r.id for r in results], known)
            for r, c in pairs:
                result, call = results[r], calls[c]
                self.add("I1", result.index, _wrong_id(result.id, call.id, call.name, call.index))
                result.id, result.name = call.id, None
                self.stand_ins.add(id(call))

    def open(self, turn: Turn) -> None:
        self.pending = []
        self.damaged = turn.damaged
        ids_here: set[str] = set()
        for call in turn.calls:
            self.check_id(call, ids_here)
            self.pending.append(call)

    def check_id(self, call: Call, ids_here: set[str]) -> None:
        if not call.id and not call.legacy:
            self.add("I1", call.index, f"tool call {call.name} has an empty id")
        elif call.id in ids_here:
            self.add(
                "I1", call.index, f"tool call id {call.id!r} appears twice in the same message"
            )
        elif call.id in self.seen and not call.legacy:
            self.add(
                "I1",
                call.index,
                f"tool call id {call.id!r} reuses the id of a call in message "
                f"{self.seen[call.id]}"
                + (
                    " (ids must be unique across the request)"
                    if self.reuse == "error"
                    else " (Anthropic has accepted such requests and refused others: an "
                    "error under strict; the results pair with the latest call)"
                    if self.format in _REUSE_STRICT
                    else " (the provider accepts it; the results pair with the latest call)"
                ),
                self.reuse,
            )
        ids_here.add(call.id)
        self.seen[call.id] = call.index
        self.answered.pop(call.id, None)
        self.abandoned.pop(call.id, None)

    def close(self, turn: Turn) -> None:
        """``turn`` comes after the results: calls still unanswered never get one."""
        if turn.damaged:
            self.damaged = True
        for call in self.pending:
            self.abandoned[call.id] = (call, turn)
            if not self.damaged:
                self.missing(call, f"before message {turn.index} ({turn.role})")
        self.pending = []

    def missing(self, call: Call, where: str) -> None:
        if call.legacy:
            self.add(
                "I1",
                call.index,
                f"function_call {call.name!r} has no function message {where} (legacy "
                "functions are not checked by the API)",
                "warning",
            )
            return
        rule = {
            "anthropic": "tool_result blocks must open the next user message",
            "bedrock-converse": "toolResult blocks must be in the next user message",
        }.get(self.format, "tool messages must follow the assistant message directly")
        self.add(
            "I1", call.index, f"tool call {call.id!r} ({call.name}) has no result {where}: {rule}"
        )

    def answer(self, result: Result, turn: Turn) -> None:
        match = next(
            (c for c in self.pending if c.id == result.id and c.legacy == result.legacy), None
        )
        if match is not None:
            self.matched(match, result)
            return
        if self.damaged or result.legacy:
            if result.legacy and not self.damaged:
                self.add(
                    "I1",
                    result.index,
                    f"function message {result.name!r} answers no function_call right "
                    "before it (legacy functions are not checked by the API)",
                    "warning",
                )
            return
        self.unmatched(result)

    def matched(self, call: Call, result: Result) -> None:
        position = self.pending.index(call)
        # A result sent under a wrong id is named already: the others are in place.
        earlier = [c for c in self.pending[:position] if id(c) not in self.stand_ins]
        if earlier and id(call) not in self.stand_ins:
            skipped = ", ".join(repr(c.id) for c in earlier)
            self.add(
                "I2",
                result.index,
                f"result for tool call {call.id!r} comes before the result(s) of earlier "
                f"call(s) {skipped} of message {call.index} (the provider accepts it)",
                "warning",
            )
        if result.name is not None and result.name != call.name and not call.legacy:
            self.add(
                "I1",
                result.index,
                f"result for tool call {call.id!r} names tool {result.name!r}, but the call "
                f"(message {call.index}) was to {call.name!r} (the provider does not check it)",
                "warning",
            )
        self.pending.remove(call)
        self.answered[call.id] = call

    def unmatched(self, result: Result) -> None:
        if result.id in self.answered:
            self.add("I1", result.index, f"a second result for tool call {result.id!r}")
        elif result.id in self.abandoned:
            call, cut = self.abandoned[result.id]
            if cut.role == "assistant":
                where = f"comes after the next assistant message (message {cut.index})"
            elif self.format in _NEXT_USER_MESSAGE:
                where = (
                    f"must be in the user message right after the assistant message "
                    f"(message {call.index})"
                )
            else:
                where = (
                    f"must come right after the assistant message (message {call.index}), "
                    f"before any other message (message {cut.index} comes first)"
                )
            self.add("I1", result.index, f"the result for tool call {result.id!r} {where}")
        else:
            self.add("I1", result.index, f"result for tool call {result.id!r} has no matching call")

    # Anthropic server tools: call and result inside one assistant turn ---------------

    def server_calls(self, turn: Turn, *, is_last: bool) -> None:
        open_: dict[str, Call] = {}
        done: set[str] = set()
        for block in turn.server_blocks:
            if isinstance(block, Call):
                self.check_id(block, set(open_) | done)
                open_[block.id] = block
            elif block.id in open_:
                done.add(block.id)
                del open_[block.id]
            elif block.id in done:
                self.add("I1", block.index, f"a second result for server tool call {block.id!r}")
            elif not turn.damaged:
                self.add(
                    "I1",
                    block.index,
                    f"server tool result for {block.id!r} has no server_tool_use (or "
                    "mcp_tool_use) block before it in the assistant message",
                )
        # The last assistant message may stop mid server call (pause_turn): sending it
        # back is how the caller lets the provider finish it.
        if not is_last and not turn.damaged:
            for call in open_.values():
                self.add(
                    "I1",
                    call.index,
                    f"server tool call {call.id!r} ({call.name}) has no result block in its "
                    "assistant message",
                )

    # Gemini contents: a function call turn, then a function response turn ---------------

    def walk_gemini(self, turns: list[Turn]) -> None:
        """Gemini wants each model turn with ``functionCall`` parts followed directly by
        a turn with as many ``functionResponse`` parts ("Please ensure that the number of
        function response parts is equal to the number of function call parts of the
        function call turn"), and a function response turn only right after a function
        call turn. Parts pair by ``id`` when both carry one, else by name."""
        pending: list[Call] = []
        owner = -1
        for turn in turns:
            self.damaged |= turn.damaged
            if turn.results:
                self.gemini_responses(turn, pending, owner)
                pending = []
                continue
            if pending and not self.damaged:
                for call in pending:
                    self.add(
                        "I1",
                        call.index,
                        f"functionCall {call.name!r} has no functionResponse before message "
                        f"{turn.index}: the function response turn must come right after "
                        "the function call turn",
                    )
            pending = []
            if turn.role == "assistant" and turn.calls:
                self.damaged = turn.damaged
                ids_here: set[str] = set()
                for call in turn.calls:
                    if call.id:
                        self.check_id(call, ids_here)
                pending, owner = list(turn.calls), turn.index
        if pending and not self.allow_open_tail and not self.damaged:
            for call in pending:
                self.add(
                    "I1",
                    call.index,
                    f"functionCall {call.name!r} has no functionResponse and the transcript ends",
                )

    def gemini_responses(self, turn: Turn, pending: list[Call], owner: int) -> None:
        if not pending:
            if not self.damaged:
                self.add(
                    "I1",
                    turn.index,
                    f"{len(turn.results)} functionResponse part(s) with no function call turn "
                    "right before them: a function response turn must come right after its "
                    "function call turn",
                )
            return
        if len(turn.results) != len(pending):
            if not self.damaged:
                self.add(
                    "I1",
                    turn.index,
                    f"{len(turn.results)} functionResponse part(s) answer the "
                    f"{len(pending)} functionCall part(s) of message {owner}: Gemini wants as "
                    "many responses as calls",
                )
            return
        unpaired = list(pending)
        for result in turn.results:
            match = next(
                (
                    c
                    for c in unpaired
                    if (c.id == result.id if c.id and result.id else c.name == result.name)
                ),
                None,
            )
            if match is None:
                self.add(
                    "I1",
                    result.index,
                    f"the functionResponse {result.name!r}"
                    + (f" (id {result.id!r})" if result.id else "")
                    + f" answers no functionCall of message {owner} by "
                    + ("id" if result.id else "name")
                    + " (Gemini checks only the count)",
                    "warning",
                )
                continue
            unpaired.remove(match)
            if match.id and result.id and match.name != result.name:
                self.add(
                    "I1",
                    result.index,
                    f"the functionResponse for {result.id!r} names {result.name!r}, but the "
                    f"call was to {match.name!r}",
                    "warning",
                )

    # Responses API: a flat list of items -----------------------------------------------

    def walk_items(self, turns: list[Turn]) -> None:
        open_: dict[str, Call] = {}
        interrupted: set[str] = set()  # open calls with a message item after them
        early: set[str] = set()  # outputs seen before their call
        ids_later = {c.id: t.index for t in turns for c in t.calls}
        for turn in turns:
            # An unreadable call may be the one any unmatched output answers.
            self.damaged |= turn.damaged and turn.role.endswith("_call")
            for call in turn.calls:
                if call.id in open_:
                    self.add(
                        "I1", call.index, f"call id {call.id!r} repeats an unanswered call's id"
                    )
                    self.seen[call.id] = call.index
                else:
                    self.check_id(call, set())
                if call.id in early:
                    early.discard(call.id)  # reported with its output already
                    continue
                open_[call.id] = call
            for result in turn.results:
                if result.id in open_:
                    if result.id in interrupted:
                        self.add(
                            "I1",
                            result.index,
                            f"the output for {result.id!r} comes after a message item that "
                            "follows its call (OpenAI accepts it; some compatible servers, "
                            "such as DeepSeek's, do not: an error under strict)",
                            "error" if self.strict else "warning",
                        )
                    self.answered[result.id] = open_.pop(result.id)
                    interrupted.discard(result.id)
                elif result.id in self.answered:
                    self.add("I1", result.index, f"a second output for call {result.id!r}")
                elif ids_later.get(result.id, -1) > result.index:
                    self.add(
                        "I1", result.index, f"the output for {result.id!r} comes before its call"
                    )
                    early.add(result.id)
                elif not (turn.damaged or self.damaged or self.continued):
                    self.add("I1", result.index, f"no tool call found for the output {result.id!r}")
            if turn.role in ("user", "assistant", "system", "developer"):
                interrupted |= set(open_)
        for call_id, call in open_.items():
            if self.allow_open_tail and call_id not in interrupted:
                continue
            self.add("I1", call.index, f"no tool output found for call {call_id!r} ({call.name})")


# -- rendering -----------------------------------------------------------------------------


def render_transcript(messages: Sequence[Message]) -> str:
    """One line per message, for failure reports."""
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
            bits = [f"{i:>3} assistant [{message.stop_reason.value}]"]
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
            lines.append(
                f"{i:>3} result{flag} {message.tool_name}#{message.tool_call_id}: {text!r}"
            )
    return "\n".join(lines)
