"""Run the conformance kit against the seven peers; write ``results.md``.

    python examples/conformance/conformance.py [--examples N] [--seed S] [--peer NAME ...]
        [--property I1 ...] [--max-failures K]

(``run.sh`` runs it with the peers' venv and installs pi-agent-core first.) For each
peer and each property I1–I8 it searches separately (``run_conformance(loop,
properties=[P], per_property=True)``), so that every property gets its own verdict
and every distinct failure of it (up to ``--max-failures``) its own shrunk
counterexample, instead of the first failure hiding the rest. Runs an adapter sets
aside (``NotExpressibleError``: what the peer cannot express) are counted with their
reason. ``results.md`` holds the raw verdicts and counterexamples; ``REPORT.md`` is the
hand-checked reading of them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from python_peers import LOOPS  # noqa: E402

from statemachine.testing import PROPERTY_TITLES, run_conformance  # noqa: E402
from statemachine.testing.bridge import bridge_loop  # noqa: E402


def pi_loop() -> Any:
    """pi-agent-core's ``agentLoop`` in Node.js, through the bridge (pi/adapter.mjs)."""
    adapter = HERE / "pi" / "adapter.mjs"
    if not (HERE / "pi" / "node_modules" / "@mariozechner" / "pi-agent-core").is_dir():
        raise SystemExit("pi-agent-core is not installed: run examples/conformance/install-pi.sh")
    # Each run starts a Node process that imports pi-ai before it says anything: half a
    # second on an idle machine, past the bridge's default 5 s of silence on a loaded
    # one, which would be reported as the peer's failure.
    return bridge_loop(["node", str(adapter)], silence_timeout=SILENCE_TIMEOUT)


SILENCE_TIMEOUT = 30.0
"""Seconds a bridged peer may stay silent (its start-up included)."""

RUN_TIMEOUT = 60.0
"""Seconds one run may take; no scenario needs more than a few on a loaded machine."""

PEERS: dict[str, Callable[[], Any]] = {**LOOPS, "pi-agent-core": pi_loop}

VACUOUS = {
    "I4": "vacuous: the peers return a history, not a RunResult with a state to judge",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100, help="scenarios per property")
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--peer", action="append", choices=sorted(PEERS), help="default: all")
    parser.add_argument(
        "--property", action="append", choices=list(PROPERTY_TITLES), help="default: all"
    )
    parser.add_argument(
        "--max-failures", type=int, default=8, help="distinct failures per property"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results.md")
    args = parser.parse_args()
    names = args.peer or list(PEERS)
    lines = [
        "# Conformance results (generated)",
        "",
        f"`python examples/conformance/conformance.py --examples {args.examples} "
        f"--seed {args.seed}`: one search per peer and property, up to "
        f"{args.examples} generated scenarios a round, each distinct failure (up to "
        f"{args.max_failures}) shrunk; a FAIL cell counts them. Read `REPORT.md` "
        "for what each failure means.",
        "",
    ]
    table = ["| peer | " + " | ".join(PROPERTY_TITLES) + " |", "| --- |" + " --- |" * 8]
    details: list[str] = []
    for name in names:
        loop = PEERS[name]()
        row = [name]
        for prop in PROPERTY_TITLES:
            if args.property and prop not in args.property:
                row.append("not run")
                continue
            start = time.monotonic()
            report = run_conformance(
                loop,
                max_examples=args.examples,
                seed=args.seed,
                properties=[prop],
                timeout=RUN_TIMEOUT,
                per_property=True,
                max_failures_per_property=args.max_failures,
            )
            took = time.monotonic() - start
            verdict = "pass" if report.passed else f"**FAIL** ({len(report.failures)})"
            row.append(verdict + (" (vacuous)" if prop in VACUOUS and report.passed else ""))
            print(
                f"{name} {prop}: {verdict} ({report.examples_run} runs, {took:.1f} s)", flush=True
            )
            if not report.passed or report.not_expressible:
                details += [f"## {name}: {prop} {PROPERTY_TITLES[prop]}", "", "```"]
                details += [report.summary(), "```", ""]
        table.append("| " + " | ".join(row) + " |")
    notes = [f"- {p}: {why}" for p, why in VACUOUS.items()]
    args.out.write_text("\n".join(lines + table + [""] + notes + [""] + details) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
