"""The error hierarchy: misuse, bad output and run endings stay distinguishable."""

from __future__ import annotations

import asyncio

import pytest

import statemachine as sm
import statemachine.errors
import statemachine.messages
from statemachine.testing import FunctionModel


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (sm.UsageError, (sm.StateMachineError,)),
        (sm.errors.ProtocolError, (sm.UsageError,)),
        (sm.InvalidInputError, (sm.UsageError, ValueError)),
        (sm.errors.DiagramError, (sm.UsageError,)),
        (sm.errors.UnknownRunError, (sm.UsageError,)),
        (sm.errors.NotPendingError, (sm.UsageError,)),
        (sm.errors.BadDataError, (sm.StateMachineError, ValueError)),
        (sm.errors.WireFormatError, (sm.errors.BadDataError,)),
        (sm.errors.SnapshotError, (sm.errors.WireFormatError,)),
        (sm.errors.SnapshotSignatureError, (sm.errors.SnapshotError,)),
        (sm.errors.JournalError, (sm.errors.BadDataError,)),
        (sm.errors.ExportError, (sm.errors.BadDataError,)),
        (sm.errors.SpecError, (sm.errors.BadDataError,)),
        (sm.errors.ModelOutputError, (sm.errors.BadDataError,)),
        (sm.errors.ToolOutputError, (sm.errors.BadDataError,)),
        (sm.errors.CompactionError, (sm.errors.BadDataError,)),
        (sm.errors.ServiceError, (sm.StateMachineError,)),
        (sm.errors.ProviderError, (sm.errors.ServiceError,)),
        (sm.errors.ProviderAuthError, (sm.errors.ProviderError,)),
        (sm.errors.ProviderUnavailableError, (sm.errors.ProviderError,)),
        (sm.errors.ContextOverflowError, (sm.errors.ProviderError,)),
        (sm.errors.ProviderRequestError, (sm.errors.ProviderError,)),
        (sm.errors.ProviderResponseError, (sm.errors.ProviderError,)),
        (sm.errors.ProviderLimitError, (sm.errors.ProviderError,)),
        (sm.errors.MCPError, (sm.errors.ServiceError,)),
        (sm.errors.StoreUnavailableError, (sm.errors.ServiceError,)),
        (sm.errors.BridgeError, (sm.errors.ServiceError, RuntimeError)),
        (sm.errors.BridgeProtocolError, (sm.errors.BridgeError,)),
        (sm.errors.BridgeTimeoutError, (sm.errors.BridgeError,)),
        (sm.errors.RunNotDoneError, (sm.StateMachineError,)),
        (sm.AbortedError, (sm.errors.RunNotDoneError,)),
        (sm.TurnLimitExceededError, (sm.errors.RunNotDoneError,)),
        (sm.ModelFailedError, (sm.errors.RunNotDoneError,)),
        (sm.errors.AwaitingUserError, (sm.errors.RunNotDoneError,)),
        (sm.errors.EngineInvariantError, (sm.StateMachineError,)),
    ],
)
def test_hierarchy(error: type[Exception], bases: tuple[type[Exception], ...]) -> None:
    for base in bases:
        assert issubclass(error, base)


_FAMILIES = (
    sm.UsageError,
    sm.errors.BadDataError,
    sm.errors.ServiceError,
    sm.errors.RunNotDoneError,
    sm.errors.EngineInvariantError,
    sm.errors.ModelRetry,
)


def test_the_families_do_not_overlap() -> None:
    for i, a in enumerate(_FAMILIES):
        for b in _FAMILIES[i + 1 :]:
            assert not issubclass(a, b)
            assert not issubclass(b, a)


# Raised for code outside the library (an adapter, a scripted tool, a user's hook),
# so deliberately not StateMachineError; the module's docstring lists them apart.
_FOR_OUTSIDE_CODE = (
    sm.errors.NotExpressibleError,
    sm.errors.ScriptedToolError,
    sm.errors.StrayCancelledError,
)


def test_every_public_error_is_defined_in_the_one_module_and_in_one_family() -> None:
    # The tree in the module's docstring is the whole hierarchy: every exception the
    # library exports lives in statemachine.errors, under exactly one family (or in
    # the short list of exceptions raised for code outside the library).
    exported = [getattr(sm.errors, name) for name in sm.errors.__all__]
    for error in exported:
        assert error.__module__ == "statemachine.errors", error
        if error is sm.StateMachineError or error in _FAMILIES:
            continue
        if error in _FOR_OUTSIDE_CODE:
            assert not issubclass(error, sm.StateMachineError), error
            assert error.__name__ in (sm.errors.__doc__ or ""), error
            continue
        families = [f for f in _FAMILIES if issubclass(error, f)]
        assert len(families) == 1, (error, families)
        assert error.__name__ in (sm.errors.__doc__ or ""), error


def test_a_protocol_error_is_not_a_value_error() -> None:
    # Only input refused before a run is a ValueError; a refused event is misuse of
    # a running engine, and catching ValueError must not hide it.
    assert not issubclass(sm.errors.ProtocolError, ValueError)


def test_a_tampered_document_is_not_the_callers_misuse() -> None:
    # A snapshot, journal or wire document from outside is bad data, not a bug in the
    # calling code: an application retries with other data, it does not fix its code.
    for error in (
        sm.errors.SnapshotError,
        sm.errors.JournalError,
        sm.errors.WireFormatError,
        sm.errors.ModelOutputError,
    ):
        assert not issubclass(error, sm.UsageError), error


def _run(message: sm.AssistantMessage, max_turns: int = 1) -> sm.RunResult:
    async def noop() -> str:
        return "ok"

    return asyncio.run(
        sm.run_agent(
            model=FunctionModel(lambda messages, tools: message),
            tools=[sm.tool(noop)],
            messages=[sm.UserMessage("go")],
            max_turns=max_turns,
        )
    )


def test_raise_for_state_returns_the_result_when_done() -> None:
    result = _run(sm.AssistantMessage("done"))
    assert result.error is None
    assert result.raise_for_state() is result


@pytest.mark.parametrize(
    ("message", "state", "error"),
    [
        (
            sm.AssistantMessage((sm.ToolCall("c1", "noop", {}),)),
            sm.TurnState.TURN_LIMIT_EXCEEDED,
            sm.TurnLimitExceededError,
        ),
        (
            sm.AssistantMessage(
                "x", stop_reason=sm.messages.StopReason.ERROR, error_message="overloaded"
            ),
            sm.TurnState.FAILED,
            sm.ModelFailedError,
        ),
        (
            sm.AssistantMessage("x", stop_reason=sm.messages.StopReason.ABORTED),
            sm.TurnState.ABORTED,
            sm.AbortedError,
        ),
    ],
)
def test_each_ending_carries_its_error_and_raise_for_state_raises_it(
    message: sm.AssistantMessage, state: sm.TurnState, error: type[sm.errors.RunNotDoneError]
) -> None:
    result = _run(message)
    assert result.state is state
    assert type(result.error) is error
    assert str(result.error) == result.explanation
    assert result.explanation
    with pytest.raises(error) as caught:
        result.raise_for_state()
    assert caught.value is result.error


def test_no_other_module_exports_an_exception_of_its_own() -> None:
    # One error module: no public module of the package offers (in its ``__all__``)
    # an exception class it defines itself. Read from the source, so a module nobody
    # imports is covered too; a module's private exceptions for its own control flow
    # stay where they are used.
    import ast
    from pathlib import Path

    package = Path(sm.__file__).parent
    bases_of_errors = set(sm.errors.__all__) | {"Exception", "BaseException"}
    bases_of_errors |= {"RuntimeError", "ValueError", "TypeError", "KeyError", "OSError"}
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        private = any(p.startswith("_") and p != "__init__" for p in parts)
        if path == package / "errors.py" or private:
            continue  # a private module's exceptions are its package's own business
        tree = ast.parse(path.read_text(encoding="utf-8"))
        exported: set[str] = set()
        for statement in tree.body:
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets
            ):
                exported = set(ast.literal_eval(statement.value))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in exported:
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                bases |= {b.attr for b in node.bases if isinstance(b, ast.Attribute)}
                if bases & bases_of_errors:
                    found.append(f"{path.relative_to(package)}: {node.name}")
    assert found == []
