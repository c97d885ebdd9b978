"""Which tests run which line: the map that lets ``bench/mutate.py`` run, for each
mutant, only the tests that execute the mutated line (as mutmut and cosmic-ray do).

A test selection runs once under coverage, with this module loaded as a pytest plugin
(``-p mutation_coverage``): each test's setup, call and teardown are recorded under its
own coverage context (its node id, so parametrised cases and fixtures count) and its
duration is written next to the data. ``build`` turns that into, for each measured
module, ``line -> tests`` plus ``line`` executed outside any test (at import, during
collection): a mutant there changes state every test may read, so it gets every test.

The map is cached in ``bench/.mutation/coverage-<key>.json``, the key a hash of the
selection, the text of its test files and the source of every measured module: any
change to one of them measures again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import attrs

# -- the plugin (runs inside the measured pytest) ----------------------------------------

_DURATIONS_ENV = "MUTATION_COVERAGE_DURATIONS"
_durations: dict[str, float] = {}


def _switch(context: str) -> None:
    import coverage

    current = coverage.Coverage.current()
    if current is not None:
        current.switch_context(context)


try:
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
        _switch(item.nodeid)
        yield
        _switch("")

    def pytest_runtest_logreport(report: Any) -> None:
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
        target = os.environ.get(_DURATIONS_ENV)
        if target:
            Path(target).write_text(json.dumps(_durations))

except ImportError:  # imported by bench/mutate.py, which does not need pytest itself
    pass


# -- the map -----------------------------------------------------------------------------


def split_selection(selection: str) -> tuple[list[str], list[str]]:
    """A selection string -> (its test paths, its other pytest options, e.g. ``-k``)."""
    paths: list[str] = []
    options: list[str] = []
    for token in shlex.split(selection):
        (paths if token.startswith("tests/") else options).append(token)
    return paths, options


def test_function(nodeid: str) -> str:
    """The node id without its parameters: every node id of a function selects it."""
    return nodeid.split("[", 1)[0]


@attrs.frozen
class CoverageMap:
    """For each module path: line -> the test functions that ran it; and the lines run
    outside any test. ``seconds`` is the measured time of each test function (under
    coverage, so on the slow side)."""

    lines: dict[str, dict[int, list[str]]]
    import_time: dict[str, list[int]]
    seconds: dict[str, float]

    def tests_for(self, path: str, first: int, last: int) -> list[str] | None:
        """The test functions that run any of lines first..last of ``path``, fastest
        first; ``None`` when one of them also ran outside a test (every test then)."""
        if any(first <= line <= last for line in self.import_time.get(path, ())):
            return None
        found: set[str] = set()
        by_line = self.lines.get(path, {})
        for line in range(first, last + 1):
            found.update(by_line.get(line, ()))
        return sorted(found, key=lambda test: (self.seconds.get(test, 0.0), test))

    def to_json(self) -> str:
        # Each test named once; the lines refer to it by its index.
        names = sorted(
            {t for by_line in self.lines.values() for tests in by_line.values() for t in tests}
        )
        index = {name: i for i, name in enumerate(names)}
        lines = {
            path: {line: [index[t] for t in tests] for line, tests in by_line.items()}
            for path, by_line in self.lines.items()
        }
        raw = {"tests": names, "lines": lines, "import_time": self.import_time}
        return json.dumps({**raw, "seconds": self.seconds})

    @classmethod
    def from_json(cls, text: str) -> CoverageMap:
        raw = json.loads(text)
        names = raw["tests"]
        lines = {
            path: {int(line): [names[i] for i in tests] for line, tests in by_line.items()}
            for path, by_line in raw["lines"].items()
        }
        return cls(lines, raw["import_time"], raw["seconds"])


def cache_key(root: Path, selection: str, module_paths: Iterable[str]) -> str:
    digest = hashlib.sha1(selection.encode(), usedforsecurity=False)
    paths, _ = split_selection(selection)
    for path in [*paths, "tests/conftest.py", *sorted(module_paths)]:
        digest.update(path.encode() + b"\0" + (root / path).read_bytes())
    return digest.hexdigest()[:16]


def measure(
    workdir: Path, selection: str, module_paths: list[str], out: Path, timeout: float
) -> CoverageMap:
    """Run ``selection`` once in ``workdir`` under coverage and build its map (cached)."""
    key = cache_key(workdir, selection, module_paths)
    cached = out / f"coverage-{key}.json"
    if cached.exists():
        return CoverageMap.from_json(cached.read_text())
    data_file = workdir / f".coverage-{key}"
    durations = workdir / f".durations-{key}.json"
    paths, options = split_selection(selection)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(workdir), str(workdir / "bench")]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "COVERAGE_CORE": "ctrace",  # per-context lines (sys.monitoring records a line once)
        _DURATIONS_ENV: str(durations),
    }
    command = [
        *("nice", "-n", "19", sys.executable, "-m", "coverage", "run"),
        f"--data-file={data_file}",
        f"--include={','.join(str(workdir / p) for p in module_paths)}",
        *("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "mutation_coverage"),
        *("-p", "no:timeout", "-o", "addopts=", *options, *paths),  # a hang: ``timeout``
    ]
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        print(done.stdout.decode(errors="replace")[-3000:], done.stderr.decode(errors="replace"))
        raise SystemExit(f"the tests {selection!r} fail without any mutant: fix that first")
    print(f"coverage of {selection!r}: {time.monotonic() - started:.0f}s", flush=True)
    result = _read(workdir, data_file, module_paths, json.loads(durations.read_text()))
    out.mkdir(parents=True, exist_ok=True)
    cached.write_text(result.to_json())
    return result


def _read(
    workdir: Path, data_file: Path, module_paths: list[str], durations: dict[str, float]
) -> CoverageMap:
    import coverage

    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    lines: dict[str, dict[int, list[str]]] = {}
    import_time: dict[str, list[int]] = {}
    for path in module_paths:
        by_context = data.contexts_by_lineno(str(workdir / path))
        lines[path] = {}
        import_time[path] = []
        for line, contexts in by_context.items():
            tests = sorted({test_function(c) for c in contexts if c})
            if tests:
                lines[path][line] = tests
            if "" in contexts:
                import_time[path].append(line)
    seconds: dict[str, float] = {}
    for nodeid, duration in durations.items():
        name = test_function(nodeid)
        seconds[name] = seconds.get(name, 0.0) + duration
    return CoverageMap(lines, import_time, seconds)
