"""Importing the package beside python-statemachine fails with what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import statemachine
from statemachine.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _import_with(path: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
        "import statemachine"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(90)
def test_import_fails_clearly_when_python_statemachine_is_installed(tmp_path: Path) -> None:
    info = tmp_path / "python_statemachine-2.5.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: python-statemachine\nVersion: 2.5.0\n", encoding="utf-8"
    )
    proc = _import_with(tmp_path)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("statemachine._shadow.ShadowedPackageError: ")
    assert "python-statemachine 2.5.0" in last
    assert "pip uninstall python-statemachine" in last


@pytest.mark.timeout(90)
def test_import_succeeds_without_python_statemachine(tmp_path: Path) -> None:
    proc = _import_with(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_the_shadow_error_is_an_import_error() -> None:
    from statemachine._shadow import ShadowedPackageError

    assert issubclass(ShadowedPackageError, ImportError)


def test_version_names_the_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"agent-statemachine {statemachine.__version__}\n"


def test_the_version_is_kept_in_one_place() -> None:
    import tomllib
    from importlib.metadata import version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "statemachine._version.__version__"
    assert version("agent-statemachine") == statemachine.__version__
