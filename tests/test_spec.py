"""The executable specification: every scenario in specs/ passes, the catalog is
covered, and the runner fails (with a readable diff) when an expectation is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from statemachine.cli.spec import cli_spec
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.testing import AbortAt, AbortKind, OnAbort, Scenario, agent_loop
from statemachine.testing import run_scenario as run_record
from statemachine.testing.spec import (
    CATALOG,
    SpecError,
    compact,
    coverage,
    default_spec_dir,
    discover,
    load_scenario,
    run_scenario,
)

SPEC_DIR = Path(__file__).resolve().parent.parent / "specs"
SPEC_FILES = sorted(SPEC_DIR.glob("*.toml"))


def test_the_spec_directory_is_found() -> None:
    assert len(SPEC_FILES) >= 15
    assert default_spec_dir().resolve() == SPEC_DIR.resolve()


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_scenario(path: Path) -> None:
    outcome = run_scenario(load_scenario(path))
    assert outcome.passed, "\n".join(outcome.problems)


def test_every_acceptance_line_and_invariant_has_a_scenario() -> None:
    covered = coverage(load_scenario(p) for p in SPEC_FILES)
    assert {key for key, names in covered.items() if not names} == set()
    assert set(covered) == set(CATALOG)


# -- the runner can fail ------------------------------------------------------------------

WRONG = """
name = "deliberately wrong expectations"
checks = ["I1"]

[run]
messages = ["List the files."]

[[tools]]
name = "list_files"
description = "List files."
parameters = { type = "object", properties = {} }
returns = "README.md"

[[model]]
tool_calls = [{ id = "c1", name = "list_files", arguments = {} }]

[[model]]
text = "One file."

[expect]
state = "Failed"
turns = 3
states = ["Ready", "AwaitingModel", "Done"]
transcript = [
    "user: List the files.",
    "assistant(toolUse): call c1 list_files {}",
    "result c1 list_files: src/index.ts",
    "assistant(stop): One file.",
]
explanation_contains = ["exploded"]
finished = ["c2"]
requests = [{ turn = 5, tail = ["x"] }, { turn = 2, tail = ["user: something else"] }]
"""


def test_a_wrong_expectation_fails_with_a_readable_diff(tmp_path: Path) -> None:
    path = tmp_path / "wrong.toml"
    path.write_text(WRONG, encoding="utf-8")
    outcome = run_scenario(load_scenario(path))
    assert not outcome.passed
    text = "\n".join(outcome.problems)
    assert "final state: expected Failed, got Done" in text
    assert "turns: expected 3, got 2" in text
    assert '-"result c1 list_files: src/index.ts"' in text
    assert '+"result c1 list_files: README.md"' in text
    assert "--- expected states" in text
    assert '+"DispatchingTools"' in text
    assert "expected it to contain 'exploded'" in text
    assert '-"c2"' in text
    assert "there was no model call 5" in text
    assert '+"result c1 list_files: README.md"' in text.split("actual request 2 (last 1)")[1]


def test_cli_prints_pass_and_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = SPEC_DIR / "checkpoint_list_files.toml"
    assert cli_spec([str(good)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS  The checkpoint script")
    assert "1 passed, 0 failed; not covered:" in out
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(WRONG, encoding="utf-8")
    assert cli_spec([str(good), str(wrong)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  deliberately wrong expectations" in out
    assert "      final state: expected Failed, got Done" in out
    assert "1 passed, 1 failed" in out


def test_cli_reports_bad_paths_and_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_spec([str(tmp_path / "missing.toml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli_spec([str(tmp_path)]) == 2
    assert "no scenario files" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nchecks = ["I1"]\nfrobnicate = 1\n', encoding="utf-8")
    assert cli_spec([str(bad)]) == 2
    assert "unknown key(s) frobnicate" in capsys.readouterr().err


_STEP_HEAD = (
    'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[[steps]]\nname = "review"\n'
    'point = "after_final"\nanswers = ["ok"]\n'
)
_STEP_TAIL = '[expect]\nstate = "Done"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name = \n", "not valid TOML"),
        ('checks = ["I1"]\n', "every scenario needs a name"),
        ('name = "x"\n', "name at least one of"),
        ('name = "x"\nchecks = ["I9"]\n', "unknown: I9"),
        ('name = "x"\nchecks = ["I1"]\n', "give at least one message"),
        ('name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n', "expect.state"),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\nmax_turns = true\n'
            '[expect]\nstate = "Done"\n',
            "run.max_turns: expected a number, got a boolean",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[[model]]\n'
            'stop_reason = "finished"\n[expect]\nstate = "Done"\n',
            r"model\[0\].stop_reason: 'finished' is not one of",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[calls.c1]\n'
            'on_abort = "panic"\n[expect]\nstate = "Done"\n',
            "calls.c1.on_abort",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[[tools]]\nname = "bad name"\n'
            '[expect]\nstate = "Done"\n',
            r"tools\[0\]: tool name 'bad name' is invalid",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = [{ role = "robot" }]\n'
            '[expect]\nstate = "Done"\n',
            r"run.messages\[0\]",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[[inputs]]\n'
            'kind = "shout"\ntext = "x"\n[expect]\nstate = "Done"\n',
            r"inputs\[0\].kind",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[continue]\n'
            'after = 2\n[expect]\nstate = "Done"\n',
            "continue: unknown key",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[calls.c1]\n'
            'after = ["c9"]\n[expect]\nstate = "Done"\n',
            r"calls.c1.after: no model response calls 'c9'",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[abort]\n'
            'when_tool_starts = "c9"\n[expect]\nstate = "Done"\n',
            r"abort.when_tool_starts: no model response calls 'c9'",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[[model]]\nhang = true\n'
            '[expect]\nstate = "Done"\n',
            r"model\[0\].hang: needs \[abort\] during_model_call = 1",
        ),
        (
            'name = "x"\nchecks = ["I1"]\n[run]\nmessages = ["hi"]\n[abort]\n'
            'before_start = true\nduring_model_call = 1\n[expect]\nstate = "Done"\n',
            "abort: give at most one instant",
        ),
        (
            _STEP_HEAD + 'outcomes.ok = "onwards"\n' + _STEP_TAIL,
            r"steps\[0\].outcomes.ok: write \"go_on\"",
        ),
        (
            _STEP_HEAD + "outcomes.ok = { end = 3 }\n" + _STEP_TAIL,
            r"steps\[0\].outcomes.ok.end: expected str",
        ),
        (
            _STEP_HEAD.replace("after_final", "before_model")
            + 'outcomes.ok = "go_on"\noutcomes.again = { retry = 1 }\n'
            + 'outcomes.no = { end = "Stopped", explanation = "x" }\n'
            + _STEP_TAIL,
            r"steps\[0\]: .*retry",
        ),
        (
            _STEP_HEAD + 'outcomes.ok = "go_on"\noutcomes.no = { end = "Stopped" }\n' + _STEP_TAIL,
            r"steps\[0\]: step 'review': End\('Stopped'\) needs an explanation",
        ),
        (
            _STEP_HEAD
            + 'outcomes.ok = "go_on"\noutcomes.no = { end = "Stopped", explanation = "x" }\n'
            + '[expect]\nstate = "Stoped"\n',
            "expect.state: name the final state, one of .*, Stopped",
        ),
    ],
)
def test_bad_scenarios_are_refused_clearly(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match=message) as info:
        load_scenario(path)
    assert str(path) in str(info.value)


def test_a_step_asked_past_its_answers_takes_its_error_outcome(tmp_path: Path) -> None:
    path = tmp_path / "step.toml"
    path.write_text(
        _STEP_HEAD.replace("after_final", "before_model").replace('["ok"]', "[]")
        + 'outcomes.ok = "go_on"\noutcomes.no = { end = "Stopped", explanation = "x" }\n'
        + '[[model]]\ntext = "never asked"\n[expect]\nstate = "Done"\n',
        encoding="utf-8",
    )
    outcome = run_scenario(load_scenario(path))
    assert not outcome.passed
    assert "final state: expected Done, got Stopped" in outcome.problems[0]
    assert "the step review ran more often than its 0 answer(s)" in outcome.problems[0]


def test_a_model_script_that_runs_out_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "short.toml"
    path.write_text(
        'name = "short"\nchecks = ["I8"]\n[run]\nmessages = ["hi"]\n[expect]\nstate = "Done"\n',
        encoding="utf-8",
    )
    outcome = run_scenario(load_scenario(path))
    assert not outcome.passed
    assert "final state: expected Done, got Failed" in outcome.problems[0]
    assert "scripts 0 model response(s)" in outcome.problems[0]


def test_discover_finds_files_in_directories(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.toml").write_text("", encoding="utf-8")
    (tmp_path / "y.toml").write_text("", encoding="utf-8")
    (tmp_path / "notes.md").write_text("", encoding="utf-8")
    assert discover([tmp_path]) == [tmp_path / "a" / "x.toml", tmp_path / "y.toml"]


def test_compact_form() -> None:
    assert compact(UserMessage("hi")) == "user: hi"
    message = AssistantMessage(
        [ThinkingContent("hmm"), TextContent("ok"), ToolCall("c1", "f", {"b": 1, "a": "é"})],
        stop_reason=StopReason.LENGTH,
        error_message="cut",
    )
    assert compact(message) == (
        'assistant(length): thinking: hmm | ok | call c1 f {"a": "é", "b": 1} | error: cut'
    )
    assert compact(ToolResultMessage("c1", "f", "x\ny", is_error=True)) == "error c1 f: x\ny"
    assert compact(ToolResultMessage("c1", "f", "done")) == "result c1 f: done"


def test_a_spec_file_is_a_scenario_of_the_kit() -> None:
    spec = load_scenario(SPEC_DIR / "abort_while_tools_run.toml")
    scenario = spec.scenario
    assert isinstance(scenario, Scenario)
    assert [d.name for d in scenario.tools or ()] == ["job"]
    assert scenario.abort == AbortAt(AbortKind.TOOL_START, 1, 2, reason="the user pressed stop")
    calls = scenario.turns[0].calls
    assert [c.call_id for c in calls] == ["c1", "c2", "c3"]
    assert [c.behaviour.on_abort for c in calls] == [OnAbort.FINISH, OnAbort.RAISE, OnAbort.HANG]
    assert spec.ids == {"t1c0": "c1", "t1c1": "c2", "t1c2": "c3"}
    # The kit's runner runs it as it runs a generated scenario.
    record = run_record(agent_loop(grace_period=0.05), scenario, hang_limit=60)
    assert record.result is not None
    assert record.result.state.value == spec.expect.state == "Aborted"
    assert record.finish_order == ("t1c0", "t1c1", "t1c2")
