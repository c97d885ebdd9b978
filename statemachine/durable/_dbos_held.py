"""Held runs on DBOS: a worker holds a run its code does not fit (the run's
attributes say why, its DBOS status is cancelled, so no worker takes it), and an
operator lets it go on, on code that fits it, or ends it as failed with an
explanation. ``_dbos_status.status_of`` reads what these write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from dbos import DBOSClient

from statemachine.durable import RunHeldError
from statemachine.durable._dbos_errors import DBOSWorkflowCancelledError
from statemachine.durable._dbos_status import ENDED_BY, HELD, attributes, find, status_of
from statemachine.errors import UsageError

__all__ = ["Fit", "end_held", "hold", "resume_held"]

Fit = Callable[[Mapping[str, Any]], tuple[list[str], list[str]]]
"""How a worker's code differs from a run's input: the blocking changes and the notes."""


async def hold(client: DBOSClient, run_id: str, executor_id: str, reasons: list[str]) -> NoReturn:
    """Hold the run (its attributes name why, its DBOS status is cancelled, which
    ``resume_held`` undoes) and stop this execution of it."""
    held = f"held by worker {executor_id!r}: " + "; ".join(reasons)
    await client.update_workflow_attributes_async(run_id, {HELD: held}, merge=True)
    await client.cancel_workflow_async(run_id)
    # DBOS's own way for a workflow to stop once it has been cancelled.
    raise DBOSWorkflowCancelledError(f"run {run_id} is held: {held}")


async def resume_held(client: DBOSClient, run_id: str, fit: Fit) -> None:
    """Let a held run go on, if ``fit`` finds no blocking change for it
    (``DBOSRunner.resume_held``)."""
    found = await find(client, run_id, load_input=True)
    if found.status != "CANCELLED" or not attributes(found).get(HELD):
        raise UsageError(f"run {run_id!r} is not held by a worker")
    blocking, _ = fit(found.input["args"][1])
    if blocking:
        raise RunHeldError(
            f"run {run_id!r} does not fit this worker's code either: " + "; ".join(blocking)
        )
    await client.update_workflow_attributes_async(run_id, {HELD: ""}, merge=True)
    await client.resume_workflow_async(run_id)


async def end_held(client: DBOSClient, run_id: str, text: str, viewer: str) -> None:
    """End a run held as a worker of the application version ``viewer`` sees it, as
    failed with the explanation ``text``, checked already (``DBOSRunner.end_held``)."""
    status = status_of(await find(client, run_id), viewer)
    if status.state != "held":
        raise UsageError(f"run {run_id!r} is {status.state}, not held")
    ended = f"ended by an operator: {text}" + (f" ({status.held})" if status.held else "")
    await client.update_workflow_attributes_async(run_id, {ENDED_BY: ended}, merge=True)
    await client.cancel_workflow_async(run_id)
