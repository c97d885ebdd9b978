"""What DBOS keeps of a run, read as the library's ``RunStatus``: the workflow's name
runs are found by, the run's attributes (held, ended by an operator, code notes), the
published pending approvals and questions, and the state a worker of a given application version
sees. Reading only: the runner, the handle and the held-run operations write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dbos import DBOSClient

from statemachine.agent.events import ToolQuestion
from statemachine.core.messages import ToolCall
from statemachine.durable import RunStatus, UnknownRunError
from statemachine.durable._inputs import MAX_MESSAGE_CHARS
from statemachine.durable._questions import questions_from_published
from statemachine.durable._wire import call_from_dict

__all__ = [
    "DONE",
    "ENDED",
    "ENDED_BY",
    "HELD",
    "NOTES",
    "PENDING",
    "QUESTIONS",
    "STATES",
    "WORKFLOW",
    "attributes",
    "described",
    "find",
    "newest_version",
    "pending_calls",
    "pending_questions",
    "status_of",
]

WORKFLOW = "statemachine.run"  # the name the run's workflow is registered under
PENDING = "pending"  # the event holding the calls waiting for a decision
QUESTIONS = "statemachine.questions"  # the attribute holding the pending questions
DONE = "statemachine.done"  # the event a run sets last, on PostgreSQL (it notifies)

# The run's attributes (kept by DBOS with its status, written outside its steps).
HELD = "statemachine.held"  # why a worker holds the run
ENDED_BY = "statemachine.ended"  # the explanation of an operator who ended it
NOTES = "statemachine.notes"  # changes of code the run went on through

ENDED = ("finished", "failed", "cancelled")
STATES = {
    "PENDING": "running",
    "ENQUEUED": "queued",
    "DELAYED": "queued",
    "SUCCESS": "finished",
    "ERROR": "failed",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "failed",
    "CANCELLED": "cancelled",
}


async def find(client: DBOSClient, run_id: str, load_input: bool = False) -> Any:
    """The run's DBOS status; ``UnknownRunError`` if there is no such run."""
    found = await client.list_workflows_async(
        workflow_ids=[run_id], name=WORKFLOW, load_input=load_input, load_output=False
    )
    if not found:
        raise UnknownRunError(f"no durable run has the id {run_id!r}")
    return found[0]


def attributes(found: Any) -> Mapping[str, Any]:
    kept = getattr(found, "attributes", None)
    return kept if isinstance(kept, Mapping) else {}


def status_of(found: Any, viewer: str = "", newest: bool = False) -> RunStatus:
    """The state of a run from its DBOS status (approvals aside), as a worker of the
    application version ``viewer`` sees it (``""``: any); ``newest``: ``viewer`` is
    the newest version registered in the database (``newest_version``), as a process
    that is not a worker sees it."""
    kept = attributes(found)
    notes = tuple(str(n) for n in kept.get(NOTES) or ())
    version = found.app_version or ""
    run_id = found.workflow_id
    if found.status == "CANCELLED" and kept.get(ENDED_BY):
        return RunStatus(run_id, "failed", (), version, explanation=kept[ENDED_BY], notes=notes)
    if found.status == "CANCELLED" and kept.get(HELD):
        return RunStatus(run_id, "held", (), version, held=kept[HELD], notes=notes)
    mapped = STATES.get(found.status, found.status.lower())
    if mapped in ("running", "queued") and viewer and version and version != viewer:
        which = "the newest version is" if newest else "this worker runs"
        held = f"waits for a worker of application version {version!r} ({which} {viewer!r})"
        return RunStatus(run_id, "held", (), version, held=held, notes=notes)
    explanation = ""
    if mapped == "failed":
        explanation = f"the backend gave up on the run: {described(found.error)}"
    return RunStatus(run_id, mapped, (), version, explanation=explanation, notes=notes)


async def newest_version(client: DBOSClient) -> str:
    """The application version a worker launched on the database most recently
    registered (``""`` if none did): what new runs are given to, so a run of another
    version waits for a worker of its own."""
    versions = await client.list_application_versions_async()
    return versions[0]["version_name"] if versions else ""


def described(error: object) -> str:
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {error}"
    else:
        text = str(error or "no error recorded")
    return text[:MAX_MESSAGE_CHARS]


async def pending_calls(client: DBOSClient, run_id: str) -> tuple[ToolCall, ...]:
    """The calls the run published as waiting for a decision; ``UnknownRunError`` if
    there is no such run."""
    published = await client.get_event_async(run_id, PENDING, timeout_seconds=0)
    if published is None:
        await find(client, run_id)
    return tuple(call_from_dict(c) for c in published or ())


def pending_questions(found: Any) -> tuple[ToolQuestion, ...]:
    """The questions the run (its DBOS status ``found``) published as pending; none
    once it has ended."""
    if status_of(found).state in ENDED:
        return ()
    return questions_from_published(attributes(found).get(QUESTIONS))
