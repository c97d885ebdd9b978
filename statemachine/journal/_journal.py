"""The journal's names in one place, for the modules that import them from here.

The journal lives in ``_format`` (the header and the errors), ``_digest`` (the
checkpoint), ``_writer`` (writing), ``_reader`` (reading lines, with their limits),
``_fast`` (replay's fast decoder) and ``_replay``; the codec is
``statemachine.core.wire``'s and the command ``statemachine.cli.replay``'s.
"""

from __future__ import annotations

from statemachine.core.wire import event_from_dict, event_to_dict
from statemachine.journal._digest import history_digest
from statemachine.journal._format import FORMAT, VERSION, JournalError, JournalHeader
from statemachine.journal._reader import DEFAULT_MAX_LINE_BYTES, MAX_DEPTH, MAX_INT_DIGITS
from statemachine.journal._replay import (
    ReplayResult,
    ReplayStep,
    describe_event,
    format_step,
    replay,
)
from statemachine.journal._writer import Journal, JournalingEngine, run_agent_journaled

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "FORMAT",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "VERSION",
    "Journal",
    "JournalError",
    "JournalHeader",
    "JournalingEngine",
    "ReplayResult",
    "ReplayStep",
    "describe_event",
    "event_from_dict",
    "event_to_dict",
    "format_step",
    "history_digest",
    "replay",
    "run_agent_journaled",
]
