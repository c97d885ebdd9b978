"""``statemachine durable demo``: a run survives kill -9 of its worker, nothing lost.

The demo runs real worker processes on SQLite (a few seconds); its own check of the
side-effect log is shown able to fail on logs of a broken backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from statemachine.cli import main
from statemachine.cli.durable import _broken_promises, run_demo


@pytest.mark.timeout(180)
def test_the_demo_run_survives_kill_9_with_nothing_lost(tmp_path: Path) -> None:
    said: list[str] = []
    assert run_demo(str(tmp_path), said.append), "\n".join(said)
    text = "\n".join(said)
    assert "kill -9 worker 1 in the middle of ship_parcel(2)" in text
    key = "idempotency key parcels:call-2"
    assert f"worker 1: ship_parcel(2) started, {key}" in text
    assert f"worker 2: ship_parcel(2) started, {key}" in text
    assert "worker 2: model call, turn 2" not in text  # recorded: not called again
    assert "final state: Done" in text
    assert "Parcels 1 to 3 are shipped." in text
    assert "statemachine replay verifies it: state Done" in text
    assert text.endswith("nothing was lost.")
    assert (tmp_path / "runs.sqlite").exists()  # --dir keeps the demo's files
    assert main(["durable", "demo", "--dir", str(tmp_path)]) == 2  # not twice in one


def _log(*records: tuple[int, str, int]) -> list[dict[str, Any]]:
    out = []
    for pid, what, n in records:
        if what == "model":
            out.append({"pid": pid, "what": what, "turn": n})
        else:
            out.append({"pid": pid, "what": what, "parcel": n, "key": f"parcels:call-{n}"})
    return out


GOOD = [
    (1, "model", 1),
    (1, "start", 1),
    (1, "end", 1),
    (1, "model", 2),
    (1, "start", 2),
    (2, "start", 2),
    (2, "end", 2),
    (2, "model", 3),
    (2, "start", 3),
    (2, "end", 3),
    (2, "model", 4),
]


def test_the_demo_check_passes_a_good_log_and_fails_broken_ones() -> None:
    assert _broken_promises(_log(*GOOD), [1, 2]) == []
    rerun_model = [*GOOD[:5], (2, "model", 2), *GOOD[5:]]
    assert _broken_promises(_log(*rerun_model), [1, 2]) == [
        "model calls for turns [1, 2, 2, 3, 4], not one per turn"
    ]
    rerun_tool = [*GOOD[:5], (2, "start", 1), (2, "end", 1), *GOOD[5:]]
    assert _broken_promises(_log(*rerun_tool), [1, 2]) == ["ship_parcel(1): 2 start(s), 2 end(s)"]
    lost = [r for r in GOOD if r != (2, "start", 2)]
    assert _broken_promises(_log(*lost), [1, 2]) == ["ship_parcel(2): 1 start(s), 1 end(s)"]
    other_key = _log(*GOOD)
    other_key[5]["key"] = "parcels:other"
    assert _broken_promises(other_key, [1, 2]) == ["ship_parcel(2) ran under different keys"]
    assert _broken_promises(_log(*GOOD), [1]) == ["a process that is not a worker wrote to the log"]


def test_the_demo_refuses_a_directory_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["durable", "demo", "--dir", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("durable: --dir")
