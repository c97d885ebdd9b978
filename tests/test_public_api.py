"""The public surface: what ``statemachine`` exports, where each name lives, and what
the layers may import.

The top level is what an application writes (run, tools, messages, hooks' decisions,
abort, run events, the errors to catch); each public module holds the whole of its
subject; ``core``, ``agent`` and ``cli`` are internal layers that docs never import.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import statemachine

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "statemachine"

TOP_LEVEL = {
    # an agent, run and resumed
    "Agent",
    "RunContext",
    "ModelSettings",
    "run_agent",
    "run_agent_sync",
    "resume_agent",
    "resume_agent_sync",
    "resume_run",
    "AgentRun",
    # the options they take, declared once
    "AgentOptions",
    "RunOptions",
    "NewRunOptions",
    "ResumeOptions",
    "RunResult",
    "RunStats",
    "TurnState",
    # tools and the model
    "tool",
    "Tool",
    "ToolDefinition",
    "ToolOutput",
    "current_tool_call",
    "report_progress",
    "ModelClient",
    # messages
    "Message",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    "ToolCall",
    "TextContent",
    "ImageContent",
    # decisions hooks return, and abort
    "Deny",
    "RequireApproval",
    "Stop",
    "AbortController",
    "AbortSignal",
    # what AgentRun.events() yields
    "RunEvent",
    "RunStarted",
    "TurnStarted",
    "MessageAdded",
    "StateChanged",
    "ToolStarted",
    "ToolProgress",
    "ToolLog",
    "ToolEnded",
    "TurnEnded",
    "RunReturned",
    "TextDelta",
    "ToolCallDelta",
    "EventsDropped",
    # the errors an application catches
    "StateMachineError",
    "UsageError",
    "InvalidInputError",
    "ModelFailedError",
    "AbortedError",
    "TurnLimitExceededError",
    # a tool or an output validator asks the model to try again
    "ModelRetry",
    # the run's budget
    "UsageLimits",
    "__version__",
}

PUBLIC_MODULES = (
    "statemachine.engine",
    "statemachine.messages",
    "statemachine.errors",
    "statemachine.hooks",
    "statemachine.steps",
    "statemachine.journal",
    "statemachine.testing",
    "statemachine.workspace",
    "statemachine.durable",
    "statemachine.docs",
    "statemachine.sessions",
)
"""Public modules importable with the core dependencies (``providers``, ``mcp``,
``otel`` and ``live`` need their extras and are checked by their own tests)."""

INTERNAL_LAYERS = ("core", "agent", "cli")


def test_the_top_level_exports_what_an_application_writes_and_no_more() -> None:
    assert set(statemachine.__all__) == TOP_LEVEL
    # The agent surface (Agent, RunContext, ModelSettings, resume_agent_sync, the two
    # delta events) raised the ceiling from 45, the bounded event stream's EventsDropped
    # and a tool's ToolLog to 53, ModelRetry (a tool's retry request) to 54, the four
    # TypedDicts of a run's options (what the signatures name: a reader finds each
    # option's doc there) to 58; keep it at tens of names.
    assert len(statemachine.__all__) <= 58
    assert len(statemachine.__all__) == len(set(statemachine.__all__))
    for name in statemachine.__all__:
        assert getattr(statemachine, name) is not None


def test_nothing_public_hides_outside_all() -> None:
    exported = {n for n in dir(statemachine) if not n.startswith("_")}
    submodules = {"core", "agent", "cli", "engine", "messages", "errors", "hooks", "journal"}
    submodules |= {"testing", "workspace", "providers", "mcp", "otel", "durable", "docs"}
    submodules |= {"live", "steps", "sessions"}
    assert exported - set(statemachine.__all__) <= submodules


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_name_a_public_module_exports_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__, module
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_every_top_level_name_also_lives_in_the_module_of_its_subject() -> None:
    """One rule for where a name is: its subject's module has all of the subject; the top
    level re-exports the part an application uses. So ``statemachine.Message`` is
    ``statemachine.messages.Message``, and so on."""
    subjects = ("engine", "messages", "errors", "hooks")
    homes = {
        name: f"statemachine.{module}"
        for module in subjects
        for name in importlib.import_module(f"statemachine.{module}").__all__
    }
    for name in TOP_LEVEL & set(homes):
        assert getattr(statemachine, name) is getattr(importlib.import_module(homes[name]), name)
    errors = importlib.import_module("statemachine.errors")
    for name in TOP_LEVEL:
        value = getattr(statemachine, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert name in errors.__all__, name


RENAMED = [
    ("statemachine.engine", "RunEnded", "ReturnToCaller"),
    ("statemachine.core.events", "RunEnded", "ReturnToCaller"),
    ("statemachine", "RunFinished", "RunReturned"),
    ("statemachine.agent.events", "RunFinished", "RunReturned"),
]
"""Public names renamed, kept as deprecated aliases: (module, old name, new name)."""


@pytest.mark.parametrize(("module", "old", "new"), RENAMED)
def test_a_renamed_name_still_imports_with_a_deprecation_warning(
    module: str, old: str, new: str
) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is deprecated; use .*\.{new}"):
        value = getattr(mod, old)
    assert value is getattr(mod, new)
    assert old not in mod.__all__
    assert new in mod.__all__
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = mod.NoSuchName


def _docs_and_readme() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


_IMPORT = re.compile(r"^\s*(?:from|import)\s+(statemachine[\w.]*)", re.M)


@pytest.mark.parametrize("page", _docs_and_readme(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_import_only_public_modules(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for module in _IMPORT.findall(text):
        parts = module.split(".")
        private = [p for p in parts[1:] if p.startswith("_")]
        assert not private, f"{page.name} imports the private {module}"
        assert len(parts) < 2 or parts[1] not in INTERNAL_LAYERS, (
            f"{page.name} imports the internal layer {module}"
        )


def _imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "core").glob("*.py")), ids=lambda p: p.name)
def test_the_core_is_sans_io_and_imports_nothing_above_it(path: Path) -> None:
    imports = _imports_of(path)
    io = {"asyncio", "socket", "subprocess", "os", "httpx", "httpx2"}  # threading: a lock
    assert not {m.partition(".")[0] for m in imports} & io, imports
    ours = {m for m in imports if m.startswith("statemachine.")}
    allowed = (
        "statemachine.core",
        "statemachine.errors",
        "statemachine._deprecated",
        "statemachine._log",
        "statemachine._version",
    )
    assert all(m.startswith(allowed) for m in ours), sorted(ours)


def test_the_error_module_is_the_floor_beneath_every_layer() -> None:
    # Every layer raises the errors of statemachine.errors, so that module imports
    # nothing of the library at run time (only a type, for the checker).
    tree = ast.parse((PACKAGE / "errors.py").read_text(encoding="utf-8"))
    runtime = [
        node
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
    ]
    assert [ast.unparse(node) for node in runtime] == ["from typing import TYPE_CHECKING"]


@pytest.mark.parametrize("path", sorted((PACKAGE / "agent").glob("*.py")), ids=lambda p: p.name)
def test_the_run_layer_imports_only_the_core_below_it(path: Path) -> None:
    ours = {m for m in _imports_of(path) if m.startswith("statemachine.")}
    allowed = (
        "statemachine.core",
        "statemachine.agent",
        "statemachine.errors",
        "statemachine._deprecated",
        "statemachine._log",
    )
    assert all(m.startswith(allowed) for m in ours), sorted(ours)


_SM_NAME = re.compile(r"\bsm\.([A-Za-z_]\w*)")


@pytest.mark.parametrize("page", _docs_and_readme(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sm_name_the_docs_use_exists(page: Path) -> None:
    """``sm.X`` in prose or code (``import statemachine as sm``) names a real top-level
    name or public module: the docs never send a reader to a name that is not there."""
    text = page.read_text(encoding="utf-8")
    public = {m.removeprefix("statemachine.") for m in PUBLIC_MODULES} | {
        "providers",
        "mcp",
        "otel",
    }
    missing = sorted(
        {n for n in _SM_NAME.findall(text) if not hasattr(statemachine, n) and n not in public}
    )
    assert not missing, f"{page.name} names sm.{', sm.'.join(missing)}"
