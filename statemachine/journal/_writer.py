"""Writing a journal: ``Journal`` (the writer), ``JournalingEngine`` (an ``Engine``
that writes every event it accepts) and ``run_agent_journaled``.

Only *accepted* events are written: a refused event changes nothing (I8), so it is
not part of the run. A checkpoint is written whenever the engine reaches a state in
which a driver returns (terminal or ``AwaitingUser``).

Flush policy
------------
Every record is one ``write`` of one whole line. By default (``flush="event"``) the
file is flushed after every record, so after a crash of the process the journal
holds every event the engine had accepted, except at most a partially written last
line, which replay reports as the truncation it is. ``flush="checkpoint"`` flushes
only at checkpoints and on close (cheaper; a crash may lose the events since the last
checkpoint). ``fsync=True`` also asks the OS to put every flushed record on disk,
which survives a power loss at the cost of a disk sync per flush.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from typing import IO, Any, Literal

from statemachine.agent.events import (
    RunResult,
)
from statemachine.agent.run import (
    run_agent,
)
from statemachine.core.engine import Engine
from statemachine.core.events import Action, Event
from statemachine.core.table import State
from statemachine.core.wire import event_to_dict
from statemachine.errors import InvalidInputError
from statemachine.journal._digest import RunningDigest, checkpoint_of
from statemachine.journal._format import (
    HEADER_FIELDS,
    MAX_MODEL_CHARS,
    NOT_RECORDED,
    JournalHeader,
)

__all__ = ["FlushPolicy", "Journal", "JournalingEngine", "run_agent_journaled"]

FlushPolicy = Literal["event", "checkpoint", "close"]


class Journal:
    """Writes one run's journal; see the module docstring for the format and flushing.

    ``target`` is a path (created; an existing file is refused, so two runs never
    share a journal) or an open text stream (written to, never closed by us).
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[str],
        *,
        flush: FlushPolicy = "event",
        fsync: bool = False,
    ) -> None:
        if flush not in ("event", "checkpoint", "close"):
            raise InvalidInputError(
                f"flush must be 'event', 'checkpoint' or 'close', got {flush!r}"
            )
        self._flush_policy: FlushPolicy = flush
        self._fsync = fsync
        self._owned = False
        if isinstance(target, (str, os.PathLike)):
            try:
                self._stream: IO[str] = open(  # noqa: SIM115 - closed by close()
                    target, "x", encoding="utf-8", newline="\n"
                )
            except FileExistsError:
                raise InvalidInputError(
                    f"journal {os.fspath(target)!r} already exists: a journal holds one "
                    "run; choose a new path"
                ) from None
            self._owned = True
        else:
            self._stream = target
        self._seq = 0
        self._started = False
        self._digest = RunningDigest()
        self.closed = False

    @property
    def events_written(self) -> int:
        return self._seq

    def _write(self, record: Mapping[str, Any], *, flush: bool) -> None:
        if self.closed:
            raise InvalidInputError("the journal is closed")
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        try:
            self._stream.write(line + "\n")
        except UnicodeEncodeError:
            # A lone surrogate (a cut-off model stream can leave one) has no UTF-8
            # form; written as a \\u escape it reads back as the same string. The
            # stream encodes before it writes, so nothing of the failed line landed.
            line = json.dumps(record, ensure_ascii=True, separators=(",", ":"))
            self._stream.write(line + "\n")
        if flush:
            self._stream.flush()
            if self._fsync:
                os.fsync(self._stream.fileno())

    def begin(self, header: JournalHeader) -> None:
        """Write the header line; must come first, exactly once."""
        if self._started:
            raise InvalidInputError("the journal already has its header")
        self._started = True
        self._write(header.to_dict(), flush=self._flush_policy != "close")

    def record(self, event: Event, state_after: State) -> None:
        """Append one accepted event and the state it led to."""
        if not self._started:
            raise InvalidInputError("write the header (begin) before any event")
        self._seq += 1
        record = {"seq": self._seq, "event": event_to_dict(event), "after": state_after.value}
        self._write(record, flush=self._flush_policy == "event")

    def instructions(self, text: str | None, turn: int) -> None:
        """Append the instructions sent from the model call of ``turn`` on (written
        when they change: an entry per change, ``None`` once they stop)."""
        if not self._started:
            raise InvalidInputError("write the header (begin) before any instructions")
        self._write({"instructions": text, "turn": turn}, flush=self._flush_policy == "event")

    def model(self, name: str, turn: int) -> None:
        """Append the model that answered the call of ``turn``, as its provider named it
        (written when it changes: a fallback moving on, a handoff to another model)."""
        if not self._started:
            raise InvalidInputError("write the header (begin) before any model")
        self._write({"model": name, "turn": turn}, flush=self._flush_policy == "event")

    def checkpoint(self, engine: Engine) -> None:
        """Append a checkpoint of where the run stands (written at each return)."""
        checkpoint = checkpoint_of(engine, self._digest)
        self._write({"checkpoint": checkpoint}, flush=self._flush_policy != "close")

    def close(self) -> None:
        if self.closed:
            return
        self._stream.flush()
        if self._fsync and self._owned:
            os.fsync(self._stream.fileno())
        if self._owned:
            self._stream.close()
        self.closed = True

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JournalingEngine(Engine):
    """An ``Engine`` that writes its configuration and every event it accepts.

    A refused event (``ProtocolError``) is not written: it changed nothing. A
    checkpoint is written each time the engine reaches a state where a driver returns.
    The run's instructions are written as the driver tells them (``record_instructions``,
    at each model call): a line each time they change; so is the model that answered,
    as its provider named it (``record_model``, when the client reports one).
    """

    _instructions: str | None  # the last instructions written
    _model: str | None  # the last model written

    def __init__(self, *, journal: Journal, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.journal = journal
        self._instructions = None
        self._model = None
        options = {
            k: v for k, v in kwargs.items() if k not in HEADER_FIELDS and k not in NOT_RECORDED
        }
        journal.begin(JournalHeader.of(self, tuple(self.messages), **options))

    def record_instructions(self, text: str | None) -> None:
        """The instructions of the model call now starting (of turn ``turns``): written
        if they differ from the last written (none before the first)."""
        if text != self._instructions:
            self._instructions = text
            self.journal.instructions(text, self.turns)

    def record_model(self, name: str) -> None:
        """The model that answered the call of turn ``turns``, as the client reported it:
        written if it differs from the last written, cut to ``MAX_MODEL_CHARS``."""
        name = name[:MAX_MODEL_CHARS]
        if name and name != self._model:
            self._model = name
            self.journal.model(name, self.turns)

    def handle(self, event: Event) -> tuple[Action, ...]:
        before = self.state
        actions = super().handle(event)
        after = self.state
        self.journal.record(event, after)
        if after is not before and self.returns_to_caller:
            self.journal.checkpoint(self)
        return actions


async def run_agent_journaled(*, journal: Journal, **run_agent_kwargs: Any) -> RunResult:
    """``run_agent`` that writes ``journal`` as it goes (same arguments and result).

    It runs a ``JournalingEngine`` through ``run_agent``'s ``engine_factory``; it does
    not close the journal.
    """
    return await run_agent(
        engine_factory=functools.partial(JournalingEngine, journal=journal),
        **run_agent_kwargs,
    )
