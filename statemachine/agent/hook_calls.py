"""Asking the run's hooks: ``before_tool_call`` about each call, ``after_tool_call``
about each result, ``should_continue`` at a turn boundary, ``transform_context``
before each model call. The hooks are fields of the run's options record
(``Options``).

Each answer becomes the event the engine expects (``ToolPermitted``,
``ToolDenied``, ``ApprovalRequired``, ``ContinueDecided``) or the result the model
reads. A hook that raises or answers something else fails closed, explained: a call
is denied, the run stops, a result says what went wrong. The executor runs these
coroutines (``statemachine.agent.executor``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from statemachine.agent.calls import call_hook, describe
from statemachine.agent.compaction import RunViews
from statemachine.agent.hooks import Deny, RequireApproval, Stop
from statemachine.agent.options import Options
from statemachine.agent.steps import decide
from statemachine.core.events import (
    ApprovalRequired,
    ContinueDecided,
    Event,
    ToolDenied,
    ToolPermitted,
)
from statemachine.core.messages import Message, ToolCall
from statemachine.core.tools import ToolOutput
from statemachine.errors import ModelOutputError

__all__ = ["HookCaller"]


class HookCaller:
    """Calls the run's hooks and turns each answer into what the engine expects.

    ``note_failure(exc, where)`` is told of every hook that raised (the action loop's:
    a ``KeyboardInterrupt`` then aborts the run).
    """

    def __init__(
        self, hooks: Options, log: Any, note_failure: Callable[[BaseException, str], None]
    ) -> None:
        self.hooks = hooks
        self._log = log
        self._note_failure = note_failure
        self.views = RunViews(hooks.steps)  # the compaction steps' views of this run

    async def after_tool_call(self, call: ToolCall, output: ToolOutput) -> ToolOutput:
        """The result the model reads: ``output``, or the hook's replacement."""
        hook = self.hooks.after_tool_call
        if hook is None:
            return output
        try:
            replaced = await call_hook(hook, call, output)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook must not lose the result
            self._log.warning("after_tool_call_raised", call_id=call.id, error=describe(exc))
            self._note_failure(exc, "the after_tool_call hook")
            original = "\n".join(getattr(b, "text", "[image]") for b in output.content)
            return ToolOutput(
                f"The after_tool_call hook raised {describe(exc)}. The tool's own result "
                f"was:\n{original}",
                is_error=True,
            )
        if replaced is None:
            return output
        if not isinstance(replaced, ToolOutput):
            return ToolOutput(
                f"The after_tool_call hook returned {type(replaced).__name__}, expected a "
                "ToolOutput or None; the tool's own result was kept out",
                is_error=True,
            )
        return replaced

    async def transformed(self, messages: Sequence[Message]) -> Sequence[Message]:
        """What the model is sent: the compacted view (``agent/compaction.py``), then
        the ``transform_context`` hook's; a hook that raises fails the model call."""
        messages = self.views.view(messages)
        hook = self.hooks.transform_context
        if hook is None:
            return messages
        try:
            context: Sequence[Message] = await call_hook(hook, messages)
        except Exception as exc:
            self._note_failure(exc, "the transform_context hook")
            raise ModelOutputError(f"the transform_context hook raised {describe(exc)}") from exc
        return context

    async def check_permissions(
        self,
        calls: Sequence[ToolCall],
        put: Callable[[Event], None],
        stopped: Callable[[], bool],
    ) -> None:
        """Ask ``before_tool_call`` about ``calls`` in call order, one at a time (a hook
        may ask a person, one question at a time); ``put`` each answer as it comes,
        until ``stopped()`` (the engine answers the calls left unchecked on abort)."""
        hook = self.hooks.before_tool_call
        assert hook is not None
        for call in calls:
            if stopped():
                return
            decision: object
            try:
                decision = await call_hook(hook, call)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken hook fails closed
                self._log.warning("before_tool_call_raised", call_id=call.id, error=describe(exc))
                self._note_failure(exc, "the before_tool_call hook")
                decision = Deny(
                    f"the before_tool_call hook raised {describe(exc)}; the call was not run"
                )
            put(_permission(call, decision))

    async def run_step(self, name: str, messages: Sequence[Message]) -> Event:
        """Call the declared step ``name``: its ``StepDecided`` (``agent/steps.py``)."""
        step = next(s for s in self.hooks.steps if s.name == name)
        event, failure = await decide(self.views.bind(step), messages, self._note_failure)
        self.views.note(event)
        if failure is not None:
            self._log.warning("step_failed", step=name, error=failure, outcome=event.outcome)
        return event

    async def check_continue(self, messages: Sequence[Message], turn: int) -> Event:
        """Ask ``should_continue`` at the boundary after ``turn``: its ``ContinueDecided``."""
        hook = self.hooks.should_continue
        assert hook is not None
        try:
            decision: object = await call_hook(hook, messages, turn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook stops the run, explained
            self._log.warning("should_continue_raised", turn=turn, error=describe(exc))
            self._note_failure(exc, "the should_continue hook")
            decision = Stop(f"the should_continue hook raised {describe(exc)}")
        if decision is None:
            return ContinueDecided(False)
        if isinstance(decision, Stop):
            return ContinueDecided(True, decision.reason)
        return ContinueDecided(
            True,
            f"the should_continue hook returned {type(decision).__name__}, expected None or Stop",
        )


def _permission(call: ToolCall, decision: object) -> Event:
    if decision is None:
        return ToolPermitted(call.id)
    if isinstance(decision, Deny):
        return ToolDenied(call.id, decision.reason, decision.advisory)
    if isinstance(decision, RequireApproval):
        return ApprovalRequired(call.id, decision.reason)
    return ToolDenied(
        call.id,
        f"the before_tool_call hook returned {type(decision).__name__}, "
        "expected None or Deny or RequireApproval; the call was not run",
    )
