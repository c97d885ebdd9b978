"""The one workload every contender runs, its clock, and the check of its result.

A run of size N is N model calls: calls 0..N-2 each ask for one ``echo`` tool call
whose argument is ``"ping <i>"``; call N-1 answers ``"done"`` without a tool call.
The scripted model of each contender takes its timestamp through ``Script.next_turn``
at the start of every model call, so the turn intervals are measured by the same
code, at the same point of the loop, for everyone.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

FINAL_TEXT = "done"
TOOL_NAME = "echo"


def argument(turn: int) -> str:
    """The text the scripted model asks ``echo`` to return on ``turn``."""
    return f"ping {turn}"


def call_id(turn: int) -> str:
    """The tool-call id of ``turn``: unique in the run, as every peer requires."""
    return f"call_{turn}"


@dataclass
class Script:
    """The plan and the clock of one run of ``n`` model calls."""

    n: int
    # perf_counter_ns only (about 50 ns): a CPU-time stamp per turn costs about 0.7 µs,
    # a fifth of the dict loop's whole turn, and would flatter every ratio against it.
    stamps: list[int] = field(default_factory=list)

    def next_turn(self) -> int:
        """Record the start of a model call; return its index (0-based)."""
        turn = len(self.stamps)
        self.stamps.append(time.perf_counter_ns())
        return turn

    def wants_tool(self, turn: int) -> bool:
        return turn < self.n - 1


@dataclass(frozen=True)
class Outcome:
    """What a contender's own result object says happened, read after the run."""

    model_calls: int
    tool_results: tuple[str, ...]
    final_text: str


def problems(outcome: Outcome, script: Script) -> list[str]:
    """Every way the run differs from the workload; empty when it is correct."""
    n = script.n
    found: list[str] = []
    if len(script.stamps) != n:
        found.append(f"the scripted model was called {len(script.stamps)} times, expected {n}")
    if outcome.model_calls != n:
        found.append(f"the result holds {outcome.model_calls} model responses, expected {n}")
    expected = tuple(argument(i) for i in range(n - 1))
    if outcome.tool_results != expected:
        got = len(outcome.tool_results)
        first_bad = next(
            (
                i
                for i, (a, b) in enumerate(zip(outcome.tool_results, expected, strict=False))
                if a != b
            ),
            min(got, len(expected)),
        )
        found.append(
            f"tool results differ: {got} results, expected {n - 1}; first difference at "
            f"index {first_bad}"
        )
    if outcome.final_text != FINAL_TEXT:
        found.append(f"final text is {outcome.final_text!r}, expected {FINAL_TEXT!r}")
    return found


def intervals_ns(script: Script) -> list[int]:
    """The time between consecutive model calls: one tool round trip of the loop each."""
    stamps = script.stamps
    return [b - a for a, b in itertools.pairwise(stamps)]
