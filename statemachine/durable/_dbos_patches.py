"""Patches on DBOS (``DBOSRunner(patches=...)``, ``_registry.patched``): DBOS's own
patching, ``DBOS.patch``, at the top of the run's workflow.

Before anything else of a run, its workflow asks DBOS for each of the worker's patches
in the order they were introduced. A new run records a marker for each, at the run's
first operations, and takes them all; a run started before a patch has another
operation at that place, so it does not take it, and never will (DBOS's replay sees the
same places every time; a run with operations recorded is asked only about the
patches it has markers for, ``apply``). A deprecated patch (``DBOS.deprecate_patch``) records no
marker for new runs but still reads the marker of a run that took it, so the places
of that run's operations stay where they were. A run that took a patch its worker does
not have (code rolled back, or a patch dropped while a run that took it waited) does
not fit the worker: ``markers_unknown`` names them and the workflow holds the run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dbos import DBOS

__all__ = ["MARKER", "apply", "markers_unknown"]

MARKER = "DBOS.patch-"  # how DBOS names a patch's marker among a run's operations


def markers_unknown(recorded: Sequence[Mapping[str, Any]], patches: Collection[str]) -> list[str]:
    """The patches the run took (its recorded markers) that are not in ``patches``."""
    names = [str(s["function_name"]) for s in recorded]
    return [
        n[len(MARKER) :] for n in names if n.startswith(MARKER) and n[len(MARKER) :] not in patches
    ]


async def apply(
    patches: Sequence[str], deprecated: Collection[str], recorded: Sequence[Mapping[str, Any]]
) -> frozenset[str]:
    """Ask DBOS for the patches in order (from the workflow, before any other operation
    of the run; ``recorded``: the run's operations so far); the patches the run took.
    A run with operations recorded took exactly the patches whose markers it has: DBOS
    is asked for those only, since the run may have reserved the place after them for
    an operation it has not recorded yet (where DBOS would put a marker). A deprecated
    patch's code is the only code left, so it counts as taken either way."""
    markers = {str(s["function_name"]) for s in recorded}
    taken = set()
    for name in patches:
        if name in deprecated:
            await DBOS.deprecate_patch_async(name)
            taken.add(name)
        elif (not recorded or MARKER + name in markers) and await DBOS.patch_async(name):
            taken.add(name)
    return frozenset(taken)
