"""Run journals: record every event and action of a run, and replay them exactly.

A journal is a JSON Lines file: a header (the table's digest, the run's parameters),
then one line per event the engine accepted with the actions it announced, then a
footer. ``replay`` feeds the recorded events to a fresh engine and checks that every
action and checkpoint is what the journal says.
"""

from __future__ import annotations

from statemachine.journal._format import JournalError
from statemachine.journal._replay import ReplayResult, replay
from statemachine.journal._writer import Journal, JournalingEngine, run_agent_journaled

__all__ = [
    "Journal",
    "JournalError",
    "JournalingEngine",
    "ReplayResult",
    "replay",
    "run_agent_journaled",
]
