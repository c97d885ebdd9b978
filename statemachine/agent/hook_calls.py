"""Asking the run's hooks: ``before_tool_call`` about each call, ``after_tool_call``
about each result, ``should_continue`` at a turn boundary.

Each answer becomes the input event the engine expects (``ToolPermitted``,
``ToolDenied``, ``ApprovalRequired``, ``ContinueDecided``) or the result the model
reads. A hook that raises or answers something else fails closed, explained: a call
is denied, the run stops, a result says what went wrong. The executor runs these
coroutines as helper tasks (``statemachine.agent.executor``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from statemachine.agent.hooks import Deny, RequireApproval, Stop, _call_hook, _describe
from statemachine.agent.loop import ActionLoop
from statemachine.core.events import (
    ApprovalRequired,
    ContinueDecided,
    Event,
    ToolDenied,
    ToolPermitted,
)
from statemachine.core.messages import ToolCall
from statemachine.core.tools import ToolOutput

__all__ = ["HookCalls"]


class HookCalls(ActionLoop):
    """The action loop's calls of the run's hooks."""

    _before: Callable[..., Any] | None
    _after: Callable[..., Any] | None
    _should_continue: Callable[..., Any] | None

    async def _after_hook(self, call: ToolCall, output: ToolOutput) -> ToolOutput:
        assert self._after is not None
        try:
            replaced = await _call_hook(self._after, call, output)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook must not lose the result
            self._log.warning("after_tool_call_raised", call_id=call.id, error=_describe(exc))
            self._note_failure(exc, "the after_tool_call hook")
            original = "\n".join(getattr(b, "text", "[image]") for b in output.content)
            return ToolOutput(
                f"The after_tool_call hook raised {_describe(exc)}. The tool's own result "
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

    async def _check_permissions(self, calls: list[ToolCall]) -> None:
        hook = self._before
        assert hook is not None
        assert self._inbox is not None
        # In call order, one at a time: a hook may ask a person, one question at a time.
        for call in calls:
            if self._aborting or self._fatal is not None:
                return  # the engine answers the calls left unchecked when it aborts
            decision: object
            try:
                decision = await _call_hook(hook, call)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken hook fails closed
                self._log.warning("before_tool_call_raised", call_id=call.id, error=_describe(exc))
                self._note_failure(exc, "the before_tool_call hook")
                decision = Deny(
                    f"the before_tool_call hook raised {_describe(exc)}; the call was not run"
                )
            event: Event
            if decision is None:
                event = ToolPermitted(call.id)
            elif isinstance(decision, Deny):
                event = ToolDenied(call.id, decision.reason, decision.advisory)
            elif isinstance(decision, RequireApproval):
                event = ApprovalRequired(call.id, decision.reason)
            else:
                event = ToolDenied(
                    call.id,
                    f"the before_tool_call hook returned {type(decision).__name__}, "
                    "expected None or Deny or RequireApproval; the call was not run",
                )
            self._inbox.put_nowait(event)

    async def _check_continue(self, turn: int) -> None:
        hook = self._should_continue
        assert hook is not None
        assert self._inbox is not None
        try:
            decision: object = await _call_hook(hook, self.engine.messages, turn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook stops the run, explained
            self._log.warning("should_continue_raised", turn=turn, error=_describe(exc))
            self._note_failure(exc, "the should_continue hook")
            decision = Stop(f"the should_continue hook raised {_describe(exc)}")
        if decision is None:
            self._inbox.put_nowait(ContinueDecided(False))
        elif isinstance(decision, Stop):
            self._inbox.put_nowait(ContinueDecided(True, decision.reason))
        else:
            self._inbox.put_nowait(
                ContinueDecided(
                    True,
                    f"the should_continue hook returned {type(decision).__name__}, "
                    "expected None or Stop",
                )
            )
