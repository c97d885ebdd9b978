"""Run journals: record every engine event of a run, and replay them exactly.

The engine is deterministic (I5), so a run is fully described by its configuration
and the sequence of engine events it accepted. A journal is that record, as JSON
Lines; ``replay`` rebuilds the engine from it and checks that the engine goes exactly
where the journal says it went, and a divergence names the line where it shows.

Format (one JSON object per line, UTF-8)::

    {"format": "statemachine-journal", "version": 1, "runId": ..., "maxTurns": ...,
     "checkPermissions": ..., "tools": [{"name", "description", "parameters"}],
     "messages": [<wire messages>], "options": {...}}               # line 1: header
    {"seq": 1, "event": {"type": "Start"}, "after": "AwaitingModel"}  # one per event
    {"instructions": "Be brief.", "turn": 1}    # when the instructions change
    {"model": "gpt-4.1-2025-04-14", "turn": 1}   # when the model that answered changes
    {"checkpoint": {"state": "Done", "turns": 2, "messages": 4,
                    "transitions": 6, "digest": "<sha256>"}}         # at each return

Each event line carries the state the engine was in *after* handling it, and a
checkpoint line is written whenever the engine reaches a state in which a driver
returns (terminal or ``AwaitingUser``), with a digest of the whole history and
transition log. Replay checks both, so a journal is not only rebuilt but verified,
and a divergence names the line where it shows. Only *accepted* events are written:
a refused event changes nothing (I8), so it is not part of the run.

An instructions line says what the model calls were sent as instructions from the
call of ``turn`` on (``null``: none); it is written before that call whenever they
change (a function's may differ at every call), and not at all for a run without
them. Replay checks the turn, and ``ReplayResult.instructions`` and
``ReplayResult.transcript()`` (the history with a ``system`` item where they changed,
what ``check_transcript`` reads) give them back. A journal written before they were
recorded simply has none.

A model line names the model that answered the call of ``turn``, as the provider named
it in its response (a ``FallbackModel`` moving on to the next model shows here); it is
written when that changes and when the client reports it (the library's adapters do,
fake models do not), and ``ReplayResult.models`` gives them back.

The events and messages are written in ``statemachine.core.wire``'s form.

``describe_event`` gives an engine event's one readable line, and ``format_step`` a
replayed step's two (the ``replay`` command prints them).

``view_html`` draws a journal as one self-contained HTML page (the diagram with the
run's path, a timeline of the events, the transcript); ``statemachine view`` writes it.
"""

from __future__ import annotations

from statemachine.journal._format import JournalError
from statemachine.journal._reader import DEFAULT_MAX_LINE_BYTES
from statemachine.journal._replay import (
    ReplayResult,
    ReplayStep,
    describe_event,
    format_step,
    replay,
)
from statemachine.journal._view import DEFAULT_MAX_VIEW_BYTES, DEFAULT_MAX_VIEW_TEXT, view_html
from statemachine.journal._writer import Journal, JournalingEngine, run_agent_journaled

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_VIEW_BYTES",
    "DEFAULT_MAX_VIEW_TEXT",
    "Journal",
    "JournalError",
    "JournalingEngine",
    "ReplayResult",
    "ReplayStep",
    "describe_event",
    "format_step",
    "replay",
    "run_agent_journaled",
    "view_html",
]
