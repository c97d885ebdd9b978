"""``python -m statemachine spec [PATHS]``: run the executable specification.

The scenarios, their loader and the runner are ``statemachine.testing.spec``; this
command finds the files, runs each and prints one verdict per scenario, a diff under
each failure, and which catalog entries no scenario covers.
"""

from __future__ import annotations

from statemachine.cli.common import EXIT_FAILED, EXIT_OK, CommandParser, Progress, fail, parse
from statemachine.testing.spec import (
    SpecError,
    coverage,
    default_spec_dir,
    discover,
    load_scenario,
    run_scenario,
)

__all__ = ["cli_spec"]


def _parser() -> CommandParser:
    return CommandParser(
        "spec",
        description="Run the executable specification: scenario files (TOML) that script "
        "the model, tools, permission hook and abort, run them through the real loop and "
        "compare the run with what they expect. Prints one PASS/FAIL line per scenario, a "
        "diff under each failure, and which catalog entries no scenario covers.",
        failed="a scenario failed",
        epilog=f"default PATHS: the scenarios that ship with the library (here: "
        f"{default_spec_dir()})",
    )


def cli_spec(argv: list[str]) -> int:
    """``python -m statemachine spec [PATHS]``: run scenarios, print pass/fail."""
    parser = _parser()
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="scenario files or directories searched for *.toml (default: see below)",
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        files = discover(args.paths or [default_spec_dir()])
        scenarios = [load_scenario(f) for f in files]
    except SpecError as exc:
        return fail("spec", str(exc))
    if not scenarios:
        return fail("spec", "no scenario files found")
    failed = 0
    with Progress("spec", len(scenarios)) as progress:
        for scenario in scenarios:
            progress.step(scenario.name)
            outcome = run_scenario(scenario)
            verdict = "PASS" if outcome.passed else "FAIL"
            checks = ", ".join(scenario.checks)
            progress.write(f"{verdict}  {scenario.name}  [{checks}]  ({scenario.path})")
            if not outcome.passed:
                failed += 1
                for problem in outcome.problems:
                    progress.write("      " + problem.replace("\n", "\n      "))
    covered = coverage(scenarios)
    missing = [key for key, names in covered.items() if not names]
    print(
        f"{len(scenarios) - failed} passed, {failed} failed; "
        + (
            "every acceptance line and invariant is covered"
            if not missing
            else f"not covered: {', '.join(missing)}"
        )
    )
    return EXIT_FAILED if failed else EXIT_OK
