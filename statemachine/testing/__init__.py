"""``statemachine.testing``: verify an agent loop, ours or yours.

A supported public module (like ``structlog.testing``). It offers:

* **fake models** for your own tests: ``ScriptedModel(*responses)`` answers from a
  script, ``FunctionModel(fn)`` answers what a function of the context decides; both
  record every ``Request`` they were sent (``statemachine.testing.models``);
* **scenarios**: ``Scenario`` and its parts describe one run completely (the
  scripted model responses, each tool call's behaviour, the abort instant, the turn
  limit); ``run_scenario`` runs one through any loop of the shape
  ``async loop(*, model, tools, messages, max_turns, signal)`` returning a message
  sequence or a ``RunResult`` (``agent_loop()`` adapts ``run_agent``) and returns a
  ``RunRecord`` of what happened;
* **strategies**: ``statemachine.testing.strategies`` generates scenarios with
  Hypothesis (model scripts, tool behaviours, completion orders, abort instants,
  limits);
* **properties**: ``check_record`` and the ``check_*`` functions judge a record
  against the invariants I1–I8 (listed in the README);
* **conformance**: ``run_conformance(loop)`` searches for a scenario that breaks a
  property and reports it shrunk, on ``IdleSkippingLoop`` (``statemachine.testing.clock``),
  an event loop whose clock skips idle waits;
* **transcripts**: ``check_transcript`` finds pairing and order violations in our
  histories and in OpenAI (Chat Completions, Responses) or Anthropic ones, each by
  the provider's own rules; ``transcript_findings`` adds the warnings;
* **stateful testing**: ``AgentEngineMachine``, a Hypothesis
  ``RuleBasedStateMachine`` to subclass for your own engine;
* **pytest**: the opt-in plugin ``statemachine.testing.plugin``.

The searches (``run_conformance``, ``AgentEngineMachine``) need Hypothesis and pytest:
``pip install 'agent-statemachine[test]'``. They are imported when first used, so the
rest (the transcript checker, the properties, ``run_scenario``) works on a core install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from statemachine.core.invariants import Violation
from statemachine.testing.bridge import bridge_loop as bridge_loop
from statemachine.testing.clock import IdleSkippingLoop
from statemachine.testing.models import FunctionModel, Request, ScriptedModel, TestModel
from statemachine.testing.properties import (
    PROPERTIES,
    PROPERTY_TITLES,
    Expectation,
    check_abort,
    check_control,
    check_determinism,
    check_limits,
    check_no_crash,
    check_order,
    check_pairing,
    check_record,
    check_terminal,
    expected_run,
)
from statemachine.testing.runner import agent_loop, run_scenario, run_scenario_async
from statemachine.testing.scenario import (
    KNOWN_TOOLS,
    UNKNOWN_TOOL,
    AbortAt,
    AbortKind,
    AgentLoop,
    Execution,
    ModelTurn,
    OnAbort,
    Outcome,
    RunRecord,
    Scenario,
    ScriptedCall,
    ToolBehaviour,
    call_key,
)
from statemachine.testing.transcript import (
    Finding,
    TranscriptFormat,
    check_transcript,
    render_transcript,
    transcript_findings,
)
from statemachine.testing.world import ScenarioModel, Scripted

if TYPE_CHECKING:
    from statemachine.testing.conformance import ConformanceReport, Failure, run_conformance
    from statemachine.testing.rules import AgentEngineMachine, assistant_messages

# What needs Hypothesis, by the module that holds it.
_LAZY = {
    "ConformanceReport": "conformance",
    "Failure": "conformance",
    "run_conformance": "conformance",
    "AgentEngineMachine": "rules",
    "assistant_messages": "rules",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(f".{module}", __name__), name)
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith(("hypothesis", "pytest")):
            raise
        raise ImportError(
            f"statemachine.testing.{name} needs Hypothesis and pytest: "
            "pip install 'agent-statemachine[test]'"
        ) from exc


__all__ = [
    "KNOWN_TOOLS",
    "PROPERTIES",
    "PROPERTY_TITLES",
    "UNKNOWN_TOOL",
    "AbortAt",
    "AbortKind",
    "AgentEngineMachine",
    "AgentLoop",
    "ConformanceReport",
    "Execution",
    "Expectation",
    "Failure",
    "Finding",
    "FunctionModel",
    "IdleSkippingLoop",
    "ModelTurn",
    "OnAbort",
    "Outcome",
    "Request",
    "RunRecord",
    "Scenario",
    "ScenarioModel",
    "Scripted",
    "ScriptedCall",
    "ScriptedModel",
    "TestModel",
    "ToolBehaviour",
    "TranscriptFormat",
    "Violation",
    "agent_loop",
    "assistant_messages",
    "call_key",
    "check_abort",
    "check_control",
    "check_determinism",
    "check_limits",
    "check_no_crash",
    "check_order",
    "check_pairing",
    "check_record",
    "check_terminal",
    "check_transcript",
    "expected_run",
    "render_transcript",
    "run_conformance",
    "run_scenario",
    "run_scenario_async",
    "transcript_findings",
]
