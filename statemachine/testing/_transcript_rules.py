"""The pairing and order rules: a finding and its level, the rules every format
shares, and each provider's own, walked over the turns its reader gives.

A provider's history is checked by the rules its API enforces when it accepts or
rejects a request: what it rejects is an ``error``; what it accepts but is likely a
mistake is a ``warning``. Two rules hold for every format, ours included: a result
sent under a wrong id is named once (``stand_ins``), and an id reused across turns has
the level the caller asks for (``REUSE_STRICT``: the formats where ``strict`` makes it
an error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from statemachine.core.invariants import Violation
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

__all__ = ["REUSE_STRICT", "Finding", "Level", "check_provider", "stand_ins", "wrong_id"]

Level = Literal["error", "warning"]
# Formats whose results go in the user message right after the calls.
_NEXT_USER_MESSAGE = frozenset({"anthropic", "bedrock-converse"})
# A call id used again in a later turn: OpenAI accepts it; Anthropic accepted a recorded
# request with one and refused others ("tool_use ids must be unique"), so it is an error
# only under ``strict``; our engine refuses it.
REUSE_STRICT = frozenset({"anthropic", "bedrock-converse"})
# What may share a Converse user message with a toolResult, by model family as a body's
# ``modelId`` names it: Llama, Mistral and Writer models refuse any conversation block
# there ("Conversation blocks and tool result blocks cannot be provided in the same
# turn"); Anthropic models accept text, images and documents, Nova models all four
# (pydantic-ai's Bedrock model profiles, each checked against the live service, and
# its recorded requests).
_BESIDE_RESULTS: dict[str, frozenset[str]] = {
    "meta.": frozenset(),
    "llama": frozenset(),
    "mistral.": frozenset(),
    "pixtral": frozenset(),
    "writer.": frozenset(),
    "palmyra": frozenset(),
    "anthropic.": frozenset({"text", "image", "document"}),
    "nova": frozenset({"text", "image", "document", "video"}),
}
# Each provider's reader; the Messages API's reads whatever has no reader of its own.
_READERS = {
    "openai": read_openai,
    "openai-responses": read_responses,
    "bedrock-converse": read_converse,
    "gemini": read_gemini,
}


@attrs.frozen
class Finding(Violation):
    """A ``Violation`` with a level: ``"error"`` (the provider rejects such a history,
    or our engine refuses it) or ``"warning"`` (accepted, but likely a mistake)."""

    level: Level = "error"

    def __str__(self) -> str:
        prefix = "warning: " if self.level == "warning" else ""
        return f"{prefix}{self.invariant} at message {self.index}: {self.message}"


# -- a result under a wrong id -------------------------------------------------------------


def stand_ins(
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


def wrong_id(result_id: str, call_id: str, name: str, call_index: int) -> str:
    """The sentence that names a result sent under a wrong id, and the call it stands for."""
    return (
        f"the result for tool call {result_id!r} answers no call: it stands where the "
        f"result of call {call_id!r} ({name}, message {call_index}) belongs, which has no "
        "other result (a result sent under a wrong id)"
    )


# -- the providers' rules -----------------------------------------------------------------


def check_provider(
    messages: Any,
    items: Sequence[Any],
    fmt: str,
    *,
    allow_open_tail: bool,
    reuse: Level,
    strict: bool,
) -> list[Finding]:
    """The findings of a provider's history (``items``, unwrapped from ``messages``):
    read into turns by the provider's reader, whose problems come first, then walked
    by the provider's pairing rules."""
    turns, problems = _READERS.get(fmt, read_anthropic)(items)
    pairing = _Pairing(fmt, allow_open_tail, reuse)
    pairing.strict = strict
    # A Responses request that continues a stored response answers calls the
    # input does not hold.
    pairing.continued = isinstance(messages, Mapping) and bool(
        messages.get("previous_response_id") or messages.get("conversation")
    )
    pairing.out += [Finding(p.invariant, p.index, p.message) for p in problems]
    model_id = messages.get("modelId") if isinstance(messages, Mapping) else None
    pairing.model_id = model_id if isinstance(model_id, str) else None
    if fmt == "openai-responses":
        pairing.walk_items(turns)
    elif fmt == "gemini":
        pairing.walk_gemini(turns)
    else:
        pairing.walk_turns(turns)
    return pairing.out


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
        self.model_id: str | None = None  # a Converse body's modelId

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
                if self.format == "bedrock-converse" and turn.results and turn.conversation_blocks:
                    self.results_not_alone(turn)
                self.close(turn)
            else:
                self.close(turn)
        if self.pending and not self.allow_open_tail and not self.damaged:
            for call in self.pending:
                self.missing(call, "and the transcript ends")
        self.pending = []

    def results_not_alone(self, turn: Turn) -> None:
        """A Converse user message with toolResult blocks and a conversation block
        (text, image, document, video): refused by Bedrock for some model families,
        accepted for others (``_BESIDE_RESULTS``). An error when the body's ``modelId``
        names a family that refuses such a block; nothing when it names one that takes
        it; without a known family a warning, an error under ``strict``."""
        kinds = sorted(set(turn.conversation_blocks))
        model = (self.model_id or "").lower()
        family = next((f for f in _BESIDE_RESULTS if f in model), None)
        refused = [k for k in kinds if family is None or k not in _BESIDE_RESULTS[family]]
        if not refused:
            return
        sentence = (
            f"a {', '.join(refused)} block cannot share a user message with a toolResult "
            'on Llama, Mistral and Writer models (Bedrock: "Conversation blocks and tool '
            'result blocks cannot be provided in the same turn")'
        )
        if family is not None:
            self.add("I1", turn.index, f"{sentence}, nor on {self.model_id!r}")
        else:
            self.add(
                "I1",
                turn.index,
                f"{sentence}; Anthropic and Nova models accept text there (an error under "
                "strict, or with the modelId of a model that refuses it)",
                "error" if self.strict else "warning",
            )

    def mend_wrong_ids(self, turns: list[Turn]) -> None:
        """Names each result sent under a wrong id (``stand_ins``) and gives it its
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
            pairs = stand_ins([c.id for c in calls], [r.id for r in results], known)
            for r, c in pairs:
                result, call = results[r], calls[c]
                self.add("I1", result.index, wrong_id(result.id, call.id, call.name, call.index))
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
                    if self.format in REUSE_STRICT
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
        a turn (consecutive user contents, merged) with as many ``functionResponse``
        parts ("Please ensure that the number of function response parts is equal to
        the number of function call parts of the function call turn"), and a function
        response turn only right after a function call turn. Parts pair by ``id`` when
        both carry one, else by name."""
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
        # The content that holds the first response (a merged turn may open with text).
        where = turn.results[0].index
        if not pending:
            if not self.damaged:
                self.add(
                    "I1",
                    where,
                    f"{len(turn.results)} functionResponse part(s) with no function call turn "
                    "right before them: a function response turn must come right after its "
                    "function call turn",
                )
            return
        if len(turn.results) != len(pending):
            if not self.damaged:
                self.add(
                    "I1",
                    where,
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
