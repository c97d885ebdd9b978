"""The tree stays readable: modules of at most 600 lines (the transition table, the
engine that interprets it and the engine's snapshots may be longer: each is one idea),
functions of at most 60, and no module left at the top of the package that belongs in
a layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "statemachine"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
LONG_BY_DESIGN = {PACKAGE / "core" / n for n in ("table.py", "engine.py", "snapshot.py")}


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
    public |= {"hooks.py", "mcp.py", "otel.py"}
    plumbing = {"_deprecated.py", "_log.py", "_shadow.py", "_version.py"}
    drawing = {"_render.py", "_runs.py"}  # shared by the diagram commands and tools/figures.py
    assert top - public - plumbing - drawing == set(), "a module at the top that belongs in a layer"
