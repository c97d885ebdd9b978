"""The explanations an engine gives when a run returns to its caller, worded here.

Each function turns the facts the engine hands it into the sentence a person reads in
``Engine.explanation`` and ``ReturnToCaller``: what ended the run (or why it waits), and
what to do next. The engine decides which one applies (``Engine._enter_<State>``);
nothing here reads an engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from statemachine.core.messages import ToolCall, ToolResultMessage, Usage
from statemachine.core.output import TEXT_OUTPUT

__all__ = [
    "aborted",
    "aborted_response",
    "denied_by_policy",
    "failed",
    "final_answer",
    "output_accepted",
    "output_invalid",
    "sentence",
    "stopped_by_hook",
    "tool_retries",
    "turn_limit",
    "usage_limit",
    "waiting_for_approval",
]

QUOTE_LIMIT = 160
"""How much of a tool's last result the turn-limit explanation quotes."""


def sentence(text: str) -> str:
    """``text`` made a sentence that another can follow: stripped, and ended with a full
    stop unless it ends with one already, a question or exclamation mark or an ellipsis
    (a text quoted from elsewhere, a provider's or a hook's, may end any way)."""
    text = text.strip()
    return text if text.endswith((".", "?", "!", "\u2026")) else f"{text}."


def final_answer() -> str:
    return "The model answered without tool calls: the task is complete."


def stopped_by_hook(reason: str | None) -> str:
    return sentence(f"Stopped at a turn boundary by should_continue: {reason}")


def failed(detail: str | None, *, reported_by_response: bool, turn: int) -> str:
    """The model call raised (``detail``: its error), or its response reported an error.

    A call that raised may have been retried by the model client already (a provider
    adapter retries transient failures before it gives up), so only a reported error
    is said to have had no retry at all."""
    if reported_by_response:
        reported = sentence(f"The model reported an error: {detail or 'no details given'}")
        return (
            f"{reported} The run stopped without retrying (turn {turn}); fix the cause, "
            "then run again on this history."
        )
    return (
        f"{sentence(detail or 'The model call failed')} The run stopped (turn {turn}): the "
        "run itself does not retry a model call that raised (retries are the model "
        "client's); fix the cause, then run again on this history."
    )


def aborted_response(detail: str | None, turn: int) -> str:
    """The model's response reports that it was aborted (its own error message)."""
    return (
        f"The model's response reports that it was aborted"
        f"{': ' + detail if detail else ''} (turn {turn})."
    )


def aborted(where: str, reason: str, abandoned: Sequence[str]) -> str:
    """An abort ended the run ``where`` it was; ``abandoned``: the operations the
    driver gave up on, which may still be running."""
    if abandoned:
        cleanup = (
            f" (the driver abandoned {', '.join(abandoned)}: it ignored cancellation and "
            "was still running at the end of the grace period, so its cleanup may not "
            "have finished)."
        )
    else:
        cleanup = " and finished its cleanup."
    what = sentence(f"Aborted {where}: {reason}")
    return f"{what} Every tool call that had started has a result{cleanup}"


def _last_operation(last_result: ToolResultMessage | None) -> str:
    if last_result is None:
        return "the model's last response"
    outcome = "failed" if last_result.is_error else "returned"
    return (
        f"tool {last_result.tool_name} (call {last_result.tool_call_id}) {outcome}: "
        f"{_short(last_result.text) or '(no text)'}"
    )


def turn_limit(max_turns: int, last_result: ToolResultMessage | None, queued: int) -> str:
    """The turn limit was reached with work asked for; ``last_result``: the last result
    of the batch, if any (else the model's response was the last operation)."""
    operation = _last_operation(last_result)
    waiting = f" and {queued} queued input message(s) wait" if queued else ""
    return (
        f"Stopped at the turn limit: max_turns={max_turns} model calls were made and the "
        f"model still had work to do{waiting}. Last operation: {operation}. To continue, "
        "run again on this history with a higher max_turns, or add a user message that "
        "narrows the task."
    )


def usage_limit(
    reached: tuple[str, int, int],
    usage: Usage,
    requests: int,
    last_result: ToolResultMessage | None,
    queued: int,
) -> str:
    """A usage limit was reached with work asked for: ``reached`` is the limit's
    ``(name, limit, used)``; ``usage`` and ``requests`` the run's usage so far."""
    name, limit, used = reached
    operation = _last_operation(last_result)
    waiting = f" and {queued} queued input message(s) wait" if queued else ""
    prompt = usage.input + usage.cache_read + usage.cache_write
    if name == "tool_calls":  # passed by the calls refused (core/limits.py)
        spent = f"{used} asked, so {used - limit} were not run"
    else:
        spent = f"{used} used, so the next model call would exceed it"
    return (
        f"Stopped at the usage limit {name}={limit}: {spent}, and the model still had "
        f"work to do{waiting}. Usage so far: "
        f"{requests} request(s), {prompt} input, {usage.output} output, "
        f"{usage.total_tokens} total tokens. Last operation: {operation}. To continue, "
        "run again on this history with higher usage_limits."
    )


def output_accepted(call_id: str) -> str:
    """``call_id``: the accepted final-result call, or ``TEXT_OUTPUT`` (native mode)."""
    if call_id == TEXT_OUTPUT:
        return "The model gave its final result as its final text; it is the run's output."
    return f"The model gave its final result (call {call_id}); it is the run's output."


def output_invalid(retries: int, failures: int, error: str | None) -> str:
    """No valid final result within the retries; ``error``: why the last one failed."""
    last = sentence(f"Last error: {_short(error or 'unknown')}")
    return (
        f"Stopped: the model gave no valid final result in {failures} attempt(s) "
        f"(output_retries={retries}). {last} Run again with a clearer task or "
        "instructions, or a larger output_retries."
    )


def tool_retries(tool: str, budget: int, message: str) -> str:
    """A tool asked for a retry more often in a row than its budget allows."""
    last = sentence(f"Its last message: {_short(message or '(none)')}")
    return (
        f"Stopped: the tool {tool} asked the model to try again {budget + 1} time(s) in a "
        f"row (retries={budget}). {last} Give the tool a larger retries, or the model "
        "clearer instructions."
    )


def waiting_for_approval(pending: Sequence[tuple[ToolCall, str]]) -> str:
    """Calls wait for a person's approval (each with the hook's reason)."""
    listed = "; ".join(
        f"{call.name} (call {call.id}){': ' + note if note else ''}" for call, note in pending
    )
    waiting = sentence(f"Waiting for a person to approve {len(pending)} tool call(s): {listed}")
    return f"{waiting} Resume with a decision for each call, or with a new user message."


def denied_by_policy(call: ToolCall, reason: str) -> str:
    denied = sentence(
        f"Waiting for a person: tool call {call.name} (call {call.id}) was denied by "
        f"policy: {reason}"
    )
    return f"{denied} Resume with a new user message on this history."


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= QUOTE_LIMIT else text[: QUOTE_LIMIT - 1] + "\u2026"
