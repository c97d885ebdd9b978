"""Mutation testing of the engine, the table and the driver: how many deliberate bugs
the tests catch.

    python bench/mutate.py                       # every module below, 1 job, niced
    python bench/mutate.py --module table --module engine --jobs 2
    python bench/mutate.py --module driver --list  # the mutants, without running them
    python bench/mutate.py --module driver-loop --rerun-survivors   # after adding tests
    python bench/mutate.py --report              # the table of what is decided, run nothing

Each mutant is one small edit of one module (an operator flipped, a condition negated,
a statement removed, a table row deleted, redirected, unguarded or swapped with its
neighbour; the full list is ``OPERATORS`` in ``bench/mutants.py``). The module is
rewritten in a scratch copy of the project and tests run against it with ``-x``: a
failure (or a timeout, or a crash on import) kills the mutant; a green run means it
survived, and every survivor is either an equivalent mutant (no test could tell it
apart) or a gap in the tests. Text is not mutated (messages, docstrings, log calls):
their wording is checked where it matters by the tests that read it, and mutating it
would mostly measure that.

Which tests: each module has a selection (``MODULES``), run once under coverage with a
context per test (``bench/mutation_coverage.py``); a mutant then runs only the test
functions that execute its lines, fastest first, within a budget scaled from their
measured time. A mutant that runs at import (module or class level) gets the whole
selection; one whose lines no test executes survives at once, "not covered".
``--all-tests`` runs the whole selection against every mutant instead.

Results go to ``bench/.mutation/results.jsonl`` as they come (a re-run skips mutants
already decided for the same source). That file is committed, so a run stopped part way
is taken up on another machine; the coverage maps beside it are a cache. The summary,
with every survivor, goes to ``bench/.mutation/summary.md``; ``bench/mutation.md`` holds
the classified findings.
Not a CI gate.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import hashlib
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import mutation_coverage
from mutants import Mutant, find_mutants

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / ".mutation"

_CHECKER_FAST = (
    "tests/test_checker.py -k 'not default_bound and not cli_check_passes and not strategies'"
)
_ENGINE_TESTS = (
    "tests/test_batch.py tests/test_queue.py tests/test_inputs.py tests/test_snapshot.py "
    "tests/test_table.py tests/test_engine_rows.py tests/test_engine_logging.py "
    "tests/test_explanations.py tests/test_engine_hooks_and_batches.py "
    "tests/test_engine.py tests/test_engine_state.py tests/test_trace.py "
    "tests/test_engine_footprint.py tests/test_end_strategy.py "
    f"tests/test_engine_snapshot.py tests/test_checker_mutants.py {_CHECKER_FAST}"
)
_DRIVER_TESTS = (
    "tests/test_loop.py tests/test_executor.py tests/test_stream.py tests/test_hook_calls.py "
    "tests/test_resume.py tests/test_run_agent_sync.py tests/test_driver.py "
    "tests/test_driver_abort.py tests/test_driver_hooks_and_batches.py tests/test_abort.py "
    "tests/test_driver_faults.py tests/test_run_footprint.py tests/test_run_options.py "
    "tests/test_questions.py"
)
MODULES: dict[str, tuple[str, str]] = {
    # name: (path, the tests that run against its mutants, fastest first)
    "table": (
        "statemachine/core/table.py",
        "tests/test_engine_rows.py tests/test_table.py tests/test_engine_hooks_and_batches.py "
        "tests/test_checker_mutants.py "
        f"tests/test_engine.py {_CHECKER_FAST}",
    ),
    # the engine, module by module (core/)
    "engine": ("statemachine/core/engine.py", _ENGINE_TESTS),
    "engine-batch": ("statemachine/core/batch.py", _ENGINE_TESTS),
    "engine-queue": ("statemachine/core/queue.py", _ENGINE_TESTS),
    "engine-explanations": ("statemachine/core/explanations.py", _ENGINE_TESTS),
    "engine-inputs": ("statemachine/core/inputs.py", _ENGINE_TESTS),
    "engine-snapshot": ("statemachine/core/snapshot.py", _ENGINE_TESTS),
    "engine-state": ("statemachine/core/state.py", _ENGINE_TESTS),
    "engine-trace": ("statemachine/core/trace.py", _ENGINE_TESTS),
    # the driver, module by module (agent/)
    "driver": ("statemachine/agent/run.py", _DRIVER_TESTS),
    "driver-loop": ("statemachine/agent/loop.py", _DRIVER_TESTS),
    "driver-executor": ("statemachine/agent/executor.py", _DRIVER_TESTS),
    "driver-resume": (
        "statemachine/agent/resume.py",
        _DRIVER_TESTS + " tests/test_engine_snapshot.py",
    ),
    "driver-hooks": ("statemachine/agent/hooks.py", _DRIVER_TESTS),
    "driver-hook-calls": ("statemachine/agent/hook_calls.py", _DRIVER_TESTS),
    "driver-calls": ("statemachine/agent/calls.py", _DRIVER_TESTS),
    "driver-stream": ("statemachine/agent/stream.py", _DRIVER_TESTS),
    "driver-questions": ("statemachine/agent/questions.py", _DRIVER_TESTS),
}


def mutants_of(name: str) -> list[Mutant]:
    return find_mutants(name, (ROOT / MODULES[name][0]).read_text())


# -- running them ---------------------------------------------------------------------------

# A mutant's budget: this many seconds, plus this many times the measured time of its
# tests (measured under coverage, so already on the slow side). A run over budget is
# tried once more with three times the budget before the mutant counts as killed by a
# hang: the machine is shared, and a slow neighbour is not a hang.
_BUDGET_FIXED = 20.0
_BUDGET_FACTOR = 4.0


def _scratch_copy(target: Path) -> None:
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", ".mutation", ".hypothesis", "*.pyc", "mutants"
    )
    for entry in ("statemachine", "tests", "specs", "examples", "diagrams", "bench"):
        if (ROOT / entry).exists():
            shutil.copytree(ROOT / entry, target / entry, ignore=ignore, dirs_exist_ok=True)
    for entry in ("pyproject.toml", "README.md", "run.sh"):
        if (ROOT / entry).exists():
            shutil.copy2(ROOT / entry, target / entry)


def _run_tests(workdir: Path, args: list[str], timeout: float) -> tuple[str, float, str]:
    env = {**os.environ, "PYTHONPATH": str(workdir), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [
        *("nice", "-n", "19", sys.executable, "-m", "pytest", "-x", "-q"),
        # No pytest-timeout: a test's own limit is not meant for a loaded machine; a
        # hang is caught by the budget.
        *("-p", "no:cacheprovider", "-p", "no:timeout", "-o", "addopts=", *args),
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.monotonic() - started, ""
    elapsed = time.monotonic() - started
    output = done.stdout.decode(errors="replace")[-3000:]
    if done.returncode == 0:
        return "survived", elapsed, output
    if done.returncode == 1:
        return "killed", elapsed, output
    return f"killed (pytest exit {done.returncode})", elapsed, output


def _worker_dirs(jobs: int) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="statemachine-mutation-"))
    for i in range(jobs):
        target = base / f"w{i}"
        target.mkdir()
        _scratch_copy(target)
        yield target


def _load_results(
    source_hash: dict[str, str], *, rerun_survivors: bool
) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    path = OUT / "results.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if source_hash.get(str(record["module"])) != record["source"]:
                continue
            if rerun_survivors and str(record["verdict"]).startswith("survived"):
                results.pop(str(record["id"]), None)
                continue
            results[str(record["id"])] = record
    return results


@attrs.frozen
class _Plan:
    """What runs against one mutant: pytest arguments and a budget in seconds; or no
    test at all (``args`` empty: no test executes the mutated lines)."""

    args: list[str]
    budget: float
    tests: str  # "all", or how many test functions


def _plan(mutant: Mutant, coverage: mutation_coverage.CoverageMap | None, limit: float) -> _Plan:
    path, selection = MODULES[mutant.module]
    paths, options = mutation_coverage.split_selection(selection)
    chosen = None
    if coverage is not None and mutant.in_function:
        chosen = coverage.tests_for(path, mutant.start[0], mutant.end[0])
    if chosen is None:
        seconds = sum(coverage.seconds.values()) if coverage is not None else limit
        budget = min(limit, _BUDGET_FIXED + _BUDGET_FACTOR * seconds)
        return _Plan([*options, *paths], budget, "all")
    assert coverage is not None
    if not chosen:
        return _Plan([], 0.0, "0")  # no test runs these lines: a survivor, not covered
    seconds = sum(coverage.seconds.get(test, 0.0) for test in chosen)
    budget = min(limit, _BUDGET_FIXED + _BUDGET_FACTOR * seconds)
    return _Plan([*options, *chosen], budget, str(len(chosen)))


def _start_measuring(
    names: list[str], jobs: int, timeout: float
) -> dict[str, concurrent.futures.Future[mutation_coverage.CoverageMap]]:
    """Start measuring the coverage map of every selection the modules use, each in a
    scratch copy of its own; the map of each module, as a future."""
    selections = list(dict.fromkeys(MODULES[name][1] for name in names))
    # Every module of a selection is measured, not only those asked for: one map then
    # serves them all, and the cache key does not depend on the command line.
    measured = {
        selection: sorted({path for path, s in MODULES.values() if s == selection})
        for selection in selections
    }
    pool = concurrent.futures.ThreadPoolExecutor(jobs)
    futures = {
        selection: pool.submit(
            mutation_coverage.measure, workdir, selection, measured[selection], OUT, timeout
        )
        for selection, workdir in zip(selections, _worker_dirs(len(selections)), strict=True)
    }
    pool.shutdown(wait=False)
    return {name: futures[MODULES[name][1]] for name in names}


def _next_ready(
    todo: collections.deque[Mutant],
    maps: dict[str, concurrent.futures.Future[mutation_coverage.CoverageMap]],
) -> Mutant | None:
    """The first mutant whose module's map is ready (its tests can be chosen)."""
    for mutant in todo:
        future = maps.get(mutant.module)
        if future is None or future.done():
            if future is not None and future.exception() is not None:
                raise SystemExit(str(future.exception()))
            todo.remove(mutant)
            return mutant
    return None


def _todo(names: list[str], results: dict[str, dict[str, object]]) -> list[Mutant]:
    queues: list[list[Mutant]] = []
    for name in names:
        pending = [m for m in mutants_of(name) if m.ident not in results]
        # A fixed shuffle: a run stopped part way has decided an unbiased sample of
        # the module, not just its first functions.
        random.Random(name).shuffle(pending)
        queues.append(pending)
    # The modules taken in turn: a run stopped part way has a sample of each of them.
    return [m for group in itertools.zip_longest(*queues) for m in group if m is not None]


def _check_baseline(names: list[str], workdir: Path, timeout: float) -> None:
    """Without coverage maps: the selections must pass without any mutant."""
    for selection in {MODULES[name][1] for name in names}:
        paths, options = mutation_coverage.split_selection(selection)
        verdict, _, output = _run_tests(workdir, [*options, *paths], timeout)
        if verdict != "survived":
            print(output)
            raise SystemExit(f"the tests {selection!r} fail without any mutant: fix that first")


_Maps = dict[str, concurrent.futures.Future[mutation_coverage.CoverageMap]]


@attrs.define
class _Runner:
    """Runs one mutant at a time in each free scratch copy."""

    sources: dict[str, str]
    source_hash: dict[str, str]
    maps: _Maps
    free: list[Path]
    limit: float

    def one(self, mutant: Mutant) -> dict[str, object]:
        future = self.maps.get(mutant.module)
        plan = _plan(mutant, None if future is None else future.result(), self.limit)
        verdict, seconds = "survived (not covered)", 0.0
        if plan.args:
            verdict, seconds = self._try(mutant, plan)
        return {
            "id": mutant.ident,
            "module": mutant.module,
            "source": self.source_hash[mutant.module],
            "operator": mutant.operator,
            "line": mutant.line,
            "change": mutant.describe(),
            "verdict": verdict,
            "tests": plan.tests,
            "seconds": round(seconds, 1),
        }

    def _try(self, mutant: Mutant, plan: _Plan) -> tuple[str, float]:
        workdir = self.free.pop()
        path, source = MODULES[mutant.module][0], self.sources[mutant.module]
        try:
            (workdir / path).write_text(mutant.apply(source))
            verdict, seconds, _ = _run_tests(workdir, plan.args, plan.budget)
            if verdict == "killed (timeout)" and plan.budget < self.limit:
                budget = min(self.limit, 3 * plan.budget)
                verdict, more, _ = _run_tests(workdir, plan.args, budget)
                seconds += more
        finally:
            (workdir / path).write_text(source)
            self.free.append(workdir)
        return verdict, seconds


def run(
    names: list[str],
    jobs: int,
    timeout: float,
    *,
    use_coverage: bool = True,
    rerun_survivors: bool = False,
) -> dict[str, dict[str, object]]:
    OUT.mkdir(parents=True, exist_ok=True)
    sources = {n: (ROOT / MODULES[n][0]).read_text() for n in names}
    source_hash = _source_hashes(names)
    results = _load_results(source_hash, rerun_survivors=rerun_survivors)
    todo = collections.deque(_todo(names, results))
    print(f"{len(todo)} mutants to run ({len(results)} already decided)", flush=True)
    if not todo:
        return results
    # The measured run is also the check that the tests pass without any mutant; the
    # mutants of a module start as soon as its map is ready.
    maps = _start_measuring(names, jobs, timeout) if use_coverage else {}
    free = list(_worker_dirs(jobs))
    if not use_coverage:
        _check_baseline(names, free[0], timeout)
    runner = _Runner(sources, source_hash, maps, free, timeout)
    with (OUT / "results.jsonl").open("a") as log:
        for record in _schedule(runner, todo, jobs):
            results[str(record["id"])] = record
            log.write(json.dumps(record) + "\n")
            log.flush()
    return results


def _schedule(
    runner: _Runner, todo: collections.deque[Mutant], jobs: int
) -> Iterator[dict[str, object]]:
    """Run the mutants, ``jobs`` at a time, each once its map is ready; yield each record."""
    started, total, count = time.monotonic(), len(todo), 0
    running: set[concurrent.futures.Future[dict[str, object]]] = set()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        while todo or running:
            while len(running) < jobs and (mutant := _next_ready(todo, runner.maps)) is not None:
                running.add(pool.submit(runner.one, mutant))
            waiting = running | {f for f in runner.maps.values() if not f.done()}
            finished, _ = concurrent.futures.wait(waiting, return_when="FIRST_COMPLETED")
            for future in finished & running:
                running.discard(future)
                record = future.result()
                count += 1
                rate = 60 * count / (time.monotonic() - started)
                print(
                    f"[{count}/{total} {rate:.1f}/min] {record['verdict']:<10} "
                    f"({record['tests']} tests) {record['id']} {record['change']}",
                    flush=True,
                )
                yield record


def _source_hashes(names: list[str]) -> dict[str, str]:
    """Each module's current source, hashed: the key its results are cached under."""
    return {
        n: hashlib.sha1(
            (ROOT / MODULES[n][0]).read_text().encode(), usedforsecurity=False
        ).hexdigest()
        for n in names
    }


def table(names: list[str], results: dict[str, dict[str, object]]) -> list[str]:
    """The per-module table of ``bench/mutation.md``: for each module, its mutants
    decided (of all it has now), killed, survivors, survivors no test ran, raw score."""
    lines = [
        "| module | decided | killed | survivors | of which not covered | raw score |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    sums = [0, 0, 0, 0, 0]
    for name in names:
        idents = {m.ident for m in mutants_of(name)}
        records = [r for r in results.values() if r["module"] == name and r["id"] in idents]
        alive = [r for r in records if str(r["verdict"]).startswith("survived")]
        bare = [r for r in alive if r["verdict"] == "survived (not covered)"]
        row = [len(records), len(idents), len(records) - len(alive), len(alive), len(bare)]
        sums = [a + b for a, b in zip(sums, row, strict=True)]
        shown = MODULES[name][0].removeprefix("statemachine/")
        lines.append(_row(f"{name} (`{shown}`)", *row))
    if len(names) > 1:
        lines.append(_row("**all**", *sums))
    return lines


def _row(label: str, decided: int, total: int, killed: int, alive: int, bare: int) -> str:
    score = f"{100 * killed / decided:.1f}%" if decided else "-"
    return f"| {label} | {decided} of {total} | {killed} | {alive} | {bare} | {score} |"


def summary(names: list[str], results: dict[str, dict[str, object]]) -> str:
    """The table, then every survivor of the current sources."""
    lines = [*table(names, results), "", "Survivors:", ""]
    idents = {m.ident for name in names for m in mutants_of(name)}
    survivors = [
        r
        for r in results.values()
        if r["id"] in idents and str(r["verdict"]).startswith("survived")
    ]
    for r in sorted(survivors, key=lambda r: (str(r["module"]), int(str(r["line"])))):
        bare = " (not covered)" if r["verdict"] == "survived (not covered)" else ""
        lines.append(f"- {r['id']}{bare} {r['change']}")
    return "\n".join(lines) + "\n"


def report(names: list[str]) -> str:
    """The summary of what the cache holds for the modules' current sources; runs nothing."""
    return summary(names, _load_results(_source_hashes(names), rerun_survivors=False))


def main(argv: list[str] | None = None) -> int:
    global OUT  # --out: the functions above read it
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", choices=sorted(MODULES))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0, help="most seconds per mutant")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument(
        "--report",
        action="store_true",
        help="print the table and survivors cached for the current sources, run nothing",
    )
    parser.add_argument(
        "--out", type=Path, default=OUT, help="where results and maps are kept (a fresh run)"
    )
    parser.add_argument(
        "--all-tests",
        action="store_true",
        help="run the module's whole selection against every mutant (no coverage map)",
    )
    parser.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="decide the survivors again (after adding tests)",
    )
    args = parser.parse_args(argv)
    names = args.module or list(MODULES)
    OUT = args.out.resolve()
    if args.list:
        for name in names:
            for mutant in mutants_of(name):
                print(mutant.ident, mutant.describe())
        return 0
    if args.report:
        print(report(names), end="")
        return 0
    results = run(
        names,
        max(1, args.jobs),
        args.timeout,
        use_coverage=not args.all_tests,
        rerun_survivors=args.rerun_survivors,
    )
    text = summary(names, results)
    (OUT / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
