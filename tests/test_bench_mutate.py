"""bench/mutate.py without running a mutant: the table ``--report`` prints from the
results cache, and the test selection of each mutated module."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@pytest.fixture
def mutate(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # it imports its siblings by their names
    spec = importlib.util.spec_from_file_location("bench_mutate", BENCH / "mutate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # attrs classes look it up there
    spec.loader.exec_module(module)
    return module


def _record(mutate: ModuleType, name: str, ident: str, verdict: str, source: str) -> str:
    return json.dumps(
        {
            "id": ident,
            "module": name,
            "source": source,
            "operator": ident.split(":")[2],
            "line": int(ident.split(":")[1]),
            "change": f"change of {ident}",
            "verdict": verdict,
            "tests": "1",
            "seconds": 1.0,
        }
    )


@pytest.mark.timeout(60)
def test_report_prints_the_table_of_the_current_sources_and_runs_nothing(
    mutate: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "driver-hooks"
    path = ROOT / mutate.MODULES[name][0]
    current = hashlib.sha1(path.read_text().encode(), usedforsecurity=False).hexdigest()
    mutants = [m.ident for m in mutate.mutants_of(name)]
    verdicts = ["killed", "killed (timeout)", "killed", "survived", "survived (not covered)"]
    lines = [
        _record(mutate, name, ident, verdict, current)
        for ident, verdict in zip(mutants, verdicts, strict=False)
    ]
    # decided for another source (before a change): not counted
    lines.append(_record(mutate, name, mutants[5], "survived", "0" * 40))
    # an id the current source no longer has: not counted
    lines.append(_record(mutate, name, f"{name}:9999:constant:00000000", "survived", current))
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")

    assert mutate.main(["--report", "--module", name, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = out.splitlines()
    assert table[0] == (
        "| module | decided | killed | survivors | of which not covered | raw score |"
    )
    assert table[2] == f"| {name} (`agent/hooks.py`) | 5 of {len(mutants)} | 3 | 2 | 1 | 60.0% |"
    assert "**all**" not in out  # one module: no total row
    assert f"- {mutants[3]} change of {mutants[3]}" in table
    assert f"- {mutants[4]} (not covered) change of {mutants[4]}" in table
    assert mutants[5] not in out
    assert "9999" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]  # nothing ran


@pytest.mark.timeout(60)
def test_report_totals_every_module_and_marks_the_undecided(
    mutate: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ROOT / mutate.MODULES["engine-inputs"][0]
    current = hashlib.sha1(path.read_text().encode(), usedforsecurity=False).hexdigest()
    [first, *_] = [m.ident for m in mutate.mutants_of("engine-inputs")]
    (tmp_path / "results.jsonl").write_text(
        _record(mutate, "engine-inputs", first, "killed", current) + "\n"
    )
    args = ["--report", "--module", "engine-inputs", "--module", "table", "--out", str(tmp_path)]
    assert mutate.main(args) == 0
    table = capsys.readouterr().out.splitlines()
    inputs = len(mutate.mutants_of("engine-inputs"))
    rows = len(mutate.mutants_of("table"))
    assert table[2] == f"| engine-inputs (`core/inputs.py`) | 1 of {inputs} | 1 | 0 | 0 | 100.0% |"
    assert table[3] == f"| table (`core/table.py`) | 0 of {rows} | 0 | 0 | 0 | - |"
    assert table[4] == f"| **all** | 1 of {inputs + rows} | 1 | 0 | 0 | 100.0% |"


@pytest.mark.timeout(60)
def test_each_module_is_tested_by_its_own_test_files(mutate: ModuleType) -> None:
    # A test file named after the module (or its module name) runs against its mutants:
    # without it a mutant the file would kill counts as a survivor.
    for name, (path, selection) in mutate.MODULES.items():
        stems = {Path(path).stem, name.replace("-", "_")}
        own = {
            f"tests/{found.name}"
            for stem in stems
            for pattern in (f"test_{stem}.py", f"test_{stem}_*.py")
            for found in (ROOT / "tests").glob(pattern)
        }
        assert own <= set(selection.split()), (name, own - set(selection.split()))
    engine_tests = set(mutate.MODULES["engine"][1].split())
    assert "tests/test_engine_snapshot.py" in engine_tests  # signed snapshots
    assert {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_mutation_gaps*.py")} <= {
        test for _, selection in mutate.MODULES.values() for test in selection.split()
    }
