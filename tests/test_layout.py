"""The tree stays readable: modules of at most 600 lines (the transition table, the
engine that interprets it and the engine's snapshots may be longer: each is one idea),
functions of at most 60, no module left at the top of the package that belongs in a
layer, and no module importing what another subpackage (or another library) keeps
private."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "statemachine"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# One idea each, read whole: the table, its interpreter, the snapshot of its state, and
# the one serialised form of every message, event and action (the wire).
LONG_BY_DESIGN = {PACKAGE / "core" / n for n in ("table.py", "engine.py", "snapshot.py", "wire.py")}


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_a_module_fits_on_a_few_screens(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    if path not in LONG_BY_DESIGN:
        assert lines <= MAX_MODULE_LINES, f"{_name(path)} has {lines} lines"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_a_function_fits_on_a_screen(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{_name(path)}: {long}"


def test_the_top_of_the_package_holds_only_the_public_modules_and_plumbing() -> None:
    top = {p.name for p in PACKAGE.glob("*.py")}
    public = {"__init__.py", "__main__.py", "engine.py", "messages.py", "errors.py"}
    public |= {"hooks.py", "mcp.py", "otel.py", "steps.py", "sessions.py"}
    plumbing = {"_deprecated.py", "_log.py", "_shadow.py", "_version.py"}
    # shared by the diagram commands, the docs' diagram, the viewer and tools/figures.py
    drawing = {"_render.py", "_figures.py", "_runs.py"}
    drawing.add("_page.py")  # what the viewer's page and the live server's page share
    assert top - public - plumbing - drawing == set(), "a module at the top that belongs in a layer"


# -- private names stay in their subpackage ------------------------------------------------

FOREIGN_PRIVATE_ALLOWED = {
    # DBOS counts a workflow's operations in its context and shows the count only inside
    # a step (``DBOS.step_id``) or by drawing a new id (``DBOS.reserve_step``, which
    # would shift every later step's id); the control lane must read it between steps.
    ("durable/_dbos_control.py", "dbos._context"),
}
"""Another library's private module the package may import: (importer, module)."""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(source: str, subpackage: str | None) -> tuple[list[str], list[str]]:
    """What a module of ``subpackage`` (``None`` at the top) imports that is private to
    another subpackage of ours, and what is private to another library."""
    ours: list[str] = []
    foreign: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported = [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in imported:
            parts = module.split(".")
            if parts[0] != "statemachine":
                if any(_is_private(p) for p in parts[1:]):
                    foreign.append(module)
                continue
            if len(parts) < 2 or parts[1] == subpackage or _is_private(parts[1]):
                continue  # its own subpackage, or the package's top-level plumbing
            if any(_is_private(p) for p in parts[2:]) or _is_private(name):
                ours.append(f"{module}.{name}" if name else module)
    return ours, foreign


def _subpackage(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_imports_what_another_subpackage_keeps_private(path: Path) -> None:
    ours, foreign = private_imports(path.read_text(encoding="utf-8"), _subpackage(path))
    assert ours == [], f"{_name(path)}: give these a public or internal name: {ours}"
    where = str(path.relative_to(PACKAGE))
    assert {(where, m) for m in foreign} <= FOREIGN_PRIVATE_ALLOWED, foreign


@pytest.mark.parametrize(
    ("source", "subpackage", "found"),
    [
        ("from statemachine.journal._replay import describe_event", "testing", 1),
        ("def f():\n    from statemachine.providers._errors import redact", "cli", 1),
        ("from statemachine.agent.events import _ERRORS", "durable", 1),
        ("from statemachine.journal import _digest", "cli", 1),
        ("import statemachine.durable._dbos_ops", "cli", 1),
        ("from statemachine.journal._replay import replay", "journal", 0),
        ("from statemachine.journal import describe_event", "testing", 0),
        ("from statemachine._log import library_logger", "core", 0),
        ("from statemachine import _shadow", None, 0),
    ],
)
def test_the_private_import_check_sees_each_form(
    source: str, subpackage: str | None, found: int
) -> None:
    assert len(private_imports(source, subpackage)[0]) == found


def test_the_private_import_check_sees_another_librarys_private_module() -> None:
    source = "from dbos._error import DBOSUnexpectedStepError\nfrom dbos import DBOS"
    assert private_imports(source, "durable") == ([], ["dbos._error"])
