"""What entering each state does: the entry effects the table's states name.

``Engine._fire`` moves the state, then calls ``_enter_<State>(source)`` for the state it
entered: entering ``AwaitingModel`` injects queued input and asks for a model call,
``DispatchingTools`` answers the calls no tool can run and asks for permissions,
``Aborting`` cancels what runs, and each state that returns to the caller writes its
explanation and announces ``RunEnded``. ``EntryEffects`` is that part of the engine.
"""

from __future__ import annotations

import json

from statemachine.core.batch import RUNNING, WAITING_PERMISSION, BatchBookkeeping
from statemachine.core.events import (
    CallModel,
    CancelOperations,
    CheckContinue,
    CheckPermission,
    HistoryView,
    ModelResponded,
    RunEnded,
)
from statemachine.core.messages import AssistantMessage
from statemachine.core.table import TurnState
from statemachine.core.tools import validate_arguments

__all__ = ["EntryEffects"]

S = TurnState


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class EntryEffects(BatchBookkeeping):
    """The engine's entry effects (mixed into ``Engine``)."""

    def _enter_AwaitingModel(self, source: TurnState) -> None:
        if self._steer or self._follow_up:
            self._inject_queued()
        self.turns += 1
        self._model_outstanding = True
        self._batch = []  # a new, empty batch
        self._slots = {}
        self._flushed = 0
        self._actions.append(CallModel(HistoryView(self._history), self._tools, self.turns))

    def _enter_DispatchingTools(self, source: TurnState) -> None:
        answered = False  # whether a call was answered here (its result to flush)
        for slot in self._batch:
            definition = self._tools_by_name.get(slot.call.name)
            if definition is None:
                self._resolve(slot, self._unknown_tool_text(slot.call.name), is_error=True)
                answered = True
                continue
            if slot.call.parse_error is not None:
                # Checked before the schema: empty arguments may satisfy it, and the
                # model asked for something else that nobody could read.
                text = (
                    f"Invalid arguments for tool {slot.call.name}: "
                    f"{slot.call.parse_error.rstrip('.')}. The tool was not run. Call it "
                    "again with a JSON object matching this JSON Schema: "
                    + json.dumps(definition.schema_dict(), sort_keys=True)
                )
                self._resolve(slot, text, is_error=True)
                answered = True
                continue
            problems = validate_arguments(definition, slot.call.arguments)
            if problems:
                text = (
                    f"Invalid arguments for tool {slot.call.name}:\n"
                    + "\n".join(f"- {p}" for p in problems)
                    + "\nExpected arguments matching this JSON Schema: "
                    + json.dumps(definition.schema_dict(), sort_keys=True)
                )
                self._resolve(slot, text, is_error=True)
                answered = True
                continue
            self._classify(slot)
            if self.check_permissions:
                slot.status = WAITING_PERMISSION
                self._actions.append(CheckPermission(slot.call, self.turns))
        if answered:
            self._flush()

    def _enter_CollectingResults(self, source: TurnState) -> None:
        self._start_runnable()

    def _enter_TurnBoundary(self, source: TurnState) -> None:
        if self.check_continue:
            self._continue_pending = True
            self._actions.append(CheckContinue(self.turns))

    def _enter_Aborting(self, source: TurnState) -> None:
        reason = self.abort_reason or "aborted"
        self._answer_unresolved(f"Tool call not started: the run was aborted ({reason})")
        running = tuple(s.call.id for s in self._batch if s.status == RUNNING)
        self._actions.append(CancelOperations(self._model_outstanding, running, reason))
        self._abort_context = (
            f"during the model call of turn {self.turns}"
            if self._model_outstanding
            else f"while the tool calls of turn {self.turns} were "
            + ("running" if source is S.CollectingResults else "being dispatched")
        )

    def _enter_Done(self, source: TurnState) -> None:
        if source is S.TurnBoundary:
            self._finish(f"Stopped at a turn boundary by should_continue: {self._stop_reason}.")
        else:
            self._finish("The model answered without tool calls: the task is complete.")

    def _enter_Failed(self, source: TurnState) -> None:
        last = self._history[-1]
        detail = last.error_message if isinstance(last, AssistantMessage) else None
        if isinstance(self._event, ModelResponded):
            self._answer_unresolved(
                "Tool call not run: the model's response reported an error, so its "
                "arguments may be incomplete"
            )
            text = f"The model reported an error: {detail or 'no details given'}"
        else:
            text = detail or "The model call failed."
        self._finish(
            f"{text.rstrip('.')}. The run stopped without retrying (turn {self.turns}); fix "
            "the cause, then run again on this history."
        )

    def _enter_Aborted(self, source: TurnState) -> None:
        if source is S.AwaitingModel:
            last = self._history[-1]  # the aborted response, before its calls' results
            detail = last.error_message if isinstance(last, AssistantMessage) else None
            self._answer_unresolved(
                "Tool call not run: the model's response was aborted, so its arguments "
                "may be incomplete"
            )
            self._finish(
                f"The model's response reports that it was aborted"
                f"{': ' + detail if detail else ''} (turn {self.turns})."
            )
            return
        reason = self.abort_reason or "aborted"
        self._answer_unresolved(f"Tool call not started: the run was aborted ({reason})")
        contexts = {
            S.Aborting: self._abort_context,
            S.Ready: "before the first model call",
            S.TurnBoundary: f"at the turn boundary after turn {self.turns}",
            S.AwaitingUser: "while waiting for a person",
        }
        if self._abandoned:
            cleanup = (
                f" (the driver abandoned {', '.join(self._abandoned)}: it ignored "
                "cancellation and was still running at the end of the grace period, so its "
                "cleanup may not have finished)."
            )
        else:
            cleanup = " and finished its cleanup."
        self._finish(
            f"Aborted {contexts[source]}: {reason}. Every tool call that had started has "
            f"a result{cleanup}"
        )

    def _enter_TurnLimitExceeded(self, source: TurnState) -> None:
        last = self._batch[-1].result if self._batch else None
        if last is not None:
            outcome = "failed" if last.is_error else "returned"
            operation = (
                f"tool {last.tool_name} (call {last.tool_call_id}) {outcome}: "
                f"{_short(last.text) or '(no text)'}"
            )
        else:
            operation = "the model's last response"
        queued = len(self._steer) + len(self._follow_up)
        waiting = f" and {queued} queued input message(s) wait" if queued else ""
        self._finish(
            f"Stopped at the turn limit: max_turns={self.max_turns} model calls were made "
            f"and the model still had work to do{waiting}. Last operation: {operation}. To "
            "continue, run again on this history with a higher max_turns, or add a user "
            "message that narrows the task."
        )

    def _enter_AwaitingUser(self, source: TurnState) -> None:
        pending = self.pending_approvals()
        if pending:
            listed = "; ".join(
                f"{call.name} (call {call.id}){': ' + note if note else ''}"
                for call, note in pending
            )
            self._finish(
                f"Waiting for a person to approve {len(pending)} tool call(s): {listed}. "
                "Resume with a decision for each call, or with a new user message."
            )
            return
        assert self._denial is not None
        call, reason = self._denial
        self._denial = None
        self._finish(
            f"Waiting for a person: tool call {call.name} (call {call.id}) was denied by "
            f"policy: {reason}. Resume with a new user message on this history."
        )

    def _finish(self, explanation: str) -> None:
        self.explanation = explanation
        self._actions.append(RunEnded(self._state, explanation))
        self._log.info(
            "run_ended", turn=self.turns, state=self._state.value, explanation=explanation
        )

    def _inject_queued(self) -> None:
        """Queued input enters history at the start of a model call (rule 6)."""
        if self._steer:
            self._history.extend(self._steer)
            self._steer = []
        elif self._follow_up and self._model_would_finish():
            self._history.extend(self._follow_up)
            self._follow_up = []

    def _model_would_finish(self) -> bool:
        # Only a final answer ends a run: the last message is the model's, without a tool
        # call. A user message after it (a continued conversation, steering) or a tool
        # result still awaits the model's answer, as a run's first message does.
        last = self._history[-1] if self._history else None
        return isinstance(last, AssistantMessage) and not last.tool_calls
