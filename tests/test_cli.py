"""The command line as a whole: one style across commands, and every command working
from an installed wheel, run from a directory outside the checkout."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest

from statemachine import _runs
from statemachine.cli import COMMANDS, main, usage
from statemachine.cli.common import Progress, exit_codes
from statemachine.testing import _spec_reader
from statemachine.testing import spec as _spec

ROOT = Path(__file__).resolve().parent.parent
OURS = (
    *("demo", "spec", "check", "replay", "diagram", "trace", "run", "transcript"),
    *("view", "mcp-example"),
)
"""The commands that follow the shared convention in full (``_command.CommandParser``)."""

HISTORY_WORDS = re.compile(r"\bseed\b|\bissue \d|\bproduction loop\b|\bphase\b", re.IGNORECASE)


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# -- help ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", OURS)
def test_every_command_has_help_with_its_exit_codes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _main([command, "--help"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"usage: python -m statemachine {command} ")
    flat = " ".join(out.split())
    assert re.search(r"exit status: 0 ok, (1 .+, )?2 bad arguments or unreadable input$", flat)
    assert not HISTORY_WORDS.search(out), HISTORY_WORDS.search(out)
    assert _main(["help", command], capsys) == (0, out, "")


def test_the_top_level_help_names_every_command_and_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _main(["--help"], capsys)
    assert (code, err) == (0, "")
    assert out == usage() + "\n"
    for name in COMMANDS:
        assert re.search(rf"^  {name} +\S", out, re.MULTILINE), name
    assert "0 ok, 1 the thing the command checks or runs failed" in out
    assert not HISTORY_WORDS.search(out)
    assert _main(["help"], capsys) == (0, out, "")
    # No command at all is a usage error: the usage goes to stderr.
    assert _main([], capsys) == (2, "", out)


def test_the_history_word_pattern_catches_what_it_is_for() -> None:
    for text in ("the Seed's checkpoint", "see issue 17", "the production loop", "phase 2"):
        assert HISTORY_WORDS.search(text), text
    assert not HISTORY_WORDS.search("seeded random; the issuer; productions")


def test_exit_codes_text_says_what_one_means_or_leaves_it_out() -> None:
    assert (
        exit_codes("x failed")
        == "exit status: 0 ok, 1 x failed, 2 bad arguments or unreadable input"
    )
    assert exit_codes(None) == "exit status: 0 ok, 2 bad arguments or unreadable input"


# -- errors: one line on stderr, prefixed by the command, exit 2 -------------------------------


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    (tmp / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    (tmp / "big.toml").write_bytes(b"#" * (_spec.MAX_SCENARIO_BYTES + 1))
    (tmp / "file.txt").write_text("x", encoding="utf-8")
    missing = str(tmp / "missing")
    return [
        (["spec", "--bogus"], "spec: unrecognized arguments: --bogus (see --help)"),
        (["spec", missing], f"spec: {missing}: no such file or directory"),
        (["spec", str(tmp / "latin1.toml")], "spec: "),
        (["spec", str(tmp / "big.toml")], f"larger than {_spec.MAX_SCENARIO_BYTES} bytes"),
        (["spec", str(tmp / "file.txt")], "spec: "),
        (["demo", missing], f"demo: directory '{missing}' does not exist"),
        (["demo", str(tmp), "--max-turns", "x"], "demo: argument --max-turns: invalid int"),
        (["diagram", "--format", "jpeg"], "diagram: argument --format: invalid choice"),
        (["diagram", "--out", str(tmp / "no" / "dir" / "m.mmd")], "diagram: "),
        (["diagram", "--dir", str(tmp)], "diagram: unrecognized arguments: --dir"),
        (["trace", missing], f"trace: cannot read {missing}"),
        (["trace", str(tmp / "file.txt")], "trace: "),
        (["trace"], "trace: the following arguments are required: RUN"),
        (["transcript", missing], f"transcript: {missing}: "),
        (["transcript", "--max-bytes", "0", missing], "transcript: --max-bytes must be positive"),
        (["run", "--provider", "openai", "hi"], "run: the following arguments are required"),
        (["run", "--provider", "openai", "--model", "m", "--dir", missing, "hi"], "run: "),
        (["nope"], "statemachine: unknown command 'nope' (see --help)"),
    ]


def test_expected_errors_are_one_line_prefixed_by_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    for argv, expected in _bad_inputs(tmp_path):
        code, out, err = _main(argv, capsys)
        prefix = "statemachine" if argv[0] == "nope" else argv[0]
        assert code == 2, (argv, err)
        assert out == "", argv
        assert err.count("\n") == 1, (argv, err)
        assert err.endswith("\n"), (argv, err)
        assert err.startswith(f"{prefix}: "), (argv, err)
        assert expected in err, (argv, err)
        assert "Traceback" not in err


def test_a_run_file_over_the_size_limit_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _runs.MAX_RUN_FILE_BYTES == 64 * 1024 * 1024
    monkeypatch.setattr(_runs, "MAX_RUN_FILE_BYTES", 10)
    run = tmp_path / "run.json"
    run.write_text("{" + " " * 10 + "}", encoding="utf-8")
    code, _, err = _main(["trace", str(run)], capsys)
    assert code == 2
    assert err == f"trace: {run} is larger than 10 bytes\n"


def test_diagram_writes_no_file_of_the_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    # Installed, the package's parent is site-packages: the command must never write
    # there. Regenerating the committed figures is tools/figures.py's job.
    code, out, err = _main(["diagram", "--all"], capsys)
    assert (code, out) == (2, "")
    assert err == "diagram: unrecognized arguments: --all (see --help)\n"
    code, out, _ = _main(["diagram", "--help"], capsys)
    assert code == 0
    assert "python tools/figures.py" in " ".join(out.split())


# -- check and replay ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "replay"])
def test_check_and_replay_refuse_bad_options_in_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _main([command, "--bogus"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"{command}: ")
    assert err.endswith(" (see --help)\n")
    assert err.count("\n") == 1


def test_check_refuses_bad_bounds_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["check", "--turns", "0"], capsys) == (
        2,
        "",
        "check: --turns must be >= 1 and --calls >= 0 (see --help)\n",
    )


def test_replay_of_a_missing_file_is_unreadable_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _main(["replay", str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2
    assert err.startswith("replay: ")
    assert err.count("\n") == 1
    assert "cannot read journal" in err
    assert "Traceback" not in err


def test_replay_of_a_bad_journal_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "bad.jsonl"
    journal.write_text('{"not": "a journal"}\n', encoding="utf-8")
    code, _, err = _main(["replay", str(journal)], capsys)
    # Not a journal at all: unreadable input (2), as from 'view' and 'trace'.
    assert code == 2
    assert err.startswith("replay: journal line 1")
    assert err.count("\n") == 1


@pytest.mark.timeout(60)
def test_a_command_whose_optional_dependency_is_missing_says_which_extra() -> None:
    code = (
        "import sys; sys.modules['openai'] = None\n"
        "from statemachine.cli import main\n"
        "sys.exit(main(['run', '--provider', 'openai', '--model', 'm', 'hi']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "sk-test"},
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "run: the 'openai' SDK is not installed; the openai adapter needs it: "
        "pip install 'agent-statemachine[openai]'\n"
    )


@pytest.mark.timeout(60)
def test_transcript_works_without_the_test_extra(tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    log.write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "from statemachine.cli import main\n"
        f"sys.exit(main(['transcript', {str(log)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# -- progress -----------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    piped, out = io.StringIO(), io.StringIO()
    with Progress("spec", 2, piped) as progress:
        progress.step("first")
        progress.write("PASS first", out)
    assert piped.getvalue() == ""
    assert out.getvalue() == "PASS first\n"
    assert progress.done == 1

    tty, out = _Terminal(), io.StringIO()
    with Progress("spec", 2, tty, interval=0) as progress:
        progress.step("first")
        assert tty.getvalue() == "\r\x1b[Kspec [1/2] first"
        progress.write("PASS first", out)
        assert tty.getvalue().endswith("first\r\x1b[K")
        progress.step("second")
    assert tty.getvalue() == "\r\x1b[Kspec [1/2] first\r\x1b[K\r\x1b[Kspec [2/2] second\r\x1b[K"
    assert out.getvalue() == "PASS first\n"

    monkeypatch.setenv("TERM", "dumb")
    dumb = _Terminal()
    with Progress("spec", 1, dumb) as progress:
        progress.step("x")
    assert dumb.getvalue() == ""


def test_progress_without_a_total_counts_up() -> None:
    tty = _Terminal()
    progress = Progress("check", None, tty, enabled=True, interval=0)
    progress.step("depth 1")
    progress.step("depth 2")
    assert tty.getvalue() == "\r\x1b[Kcheck [1] depth 1\r\x1b[Kcheck [2] depth 2"


def test_progress_redraws_at_most_once_per_interval() -> None:
    tty = _Terminal()
    progress = Progress("check", None, tty, enabled=True, interval=3600)
    for i in range(1000):
        progress.step(f"state {i}")
    assert tty.getvalue() == "\r\x1b[Kcheck [1] state 0"
    assert progress.done == 1000


def test_progress_is_cut_to_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    tty = _Terminal()
    Progress("spec", 1, tty, enabled=True).step("a" * 50)
    assert tty.getvalue() == "\r\x1b[K" + ("spec [1/1] " + "a" * 50)[:19]


def _two_scenarios(tmp: Path) -> list[str]:
    names = ["checkpoint_list_files.toml", "turn_limit.toml"]
    for name in names:
        shutil.copy(ROOT / "specs" / name, tmp / name)
    return [str(tmp / name) for name in names]


def test_spec_shows_progress_on_a_terminal_and_nothing_extra_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _two_scenarios(tmp_path)
    code, plain, err = _main(["spec", *paths], capsys)
    assert (code, err) == (0, "")
    assert "\r" not in plain
    assert "\x1b" not in plain
    assert plain.count("\n") == 3  # two verdicts and the summary

    monkeypatch.setenv("TERM", "xterm")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["spec", *paths]) == 0
    assert capsys.readouterr().out == plain  # stdout is the same either way
    shown = terminal.getvalue()
    assert "spec [1/2] The checkpoint script" in shown
    assert shown.count("spec [") <= 2  # at most one redraw per scenario
    assert shown.endswith("\r\x1b[K")  # cleared at the end


# -- where spec finds its scenarios -------------------------------------------------------------


def test_spec_defaults_to_the_scenarios_of_this_copy_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "other.toml").write_text("not = 'ours'\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert _spec.default_spec_dir() == _spec_reader.CHECKOUT_SPEC_DIR == ROOT / "specs"
    packaged = tmp_path / "_specs"
    packaged.mkdir()
    monkeypatch.setattr(_spec_reader, "PACKAGED_SPEC_DIR", packaged)
    assert _spec.default_spec_dir() == packaged


def test_the_wheel_configuration_ships_specs_and_every_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "statemachine").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert set(setuptools["packages"]) == on_disk | {"statemachine._specs"}
    assert setuptools["package-dir"] == {"statemachine._specs": "specs"}
    assert setuptools["package-data"]["statemachine._specs"] == ["*.toml", "*.md"]
    assert config["project"]["scripts"] == {"statemachine": "statemachine.cli:main"}


# -- an installed wheel, run from elsewhere -----------------------------------------------------

FROM_INDEX = os.environ.get("STATEMACHINE_TEST_INDEX") == "1"
"""Build with an isolated build environment and install the dependencies from the
package index (network); by default the test stays offline (see ``_install``)."""


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _copy_source(dest: Path) -> Path:
    # A copy, so that the build's build/ and egg-info never land in the checkout.
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "statemachine", dest / "statemachine", ignore=ignore)
    shutil.copytree(ROOT / "specs", dest / "specs", ignore=ignore)
    return dest


def _install(tmp: Path, env: dict[str, str]) -> Path:
    """Build the wheel and install it into a new virtual environment; its bin/ directory.

    Offline (the default): the build uses this interpreter's setuptools, and the new
    environment finds the dependencies in this interpreter's site-packages through a
    ``.pth`` file, so only the wheel's own files come from the build. With
    ``STATEMACHINE_TEST_INDEX=1``: an isolated build and ``pip install`` from the index.
    """
    (tmp / "src").mkdir()
    source = _copy_source(tmp / "src")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    offline = [] if FROM_INDEX else ["--no-build-isolation", "--no-index"]
    built = _run(
        [*pip, "wheel", "--no-deps", *offline, "-w", str(tmp / "dist"), str(source)], tmp, env
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("agent_statemachine-*.whl")
    venv = tmp / "venv"
    bin_ = venv / "bin"
    if FROM_INDEX:
        assert _run([sys.executable, "-m", "venv", str(venv)], tmp, env).returncode == 0
        done = _run([str(bin_ / "python"), "-m", "pip", "install", "--quiet", str(wheel)], tmp, env)
    else:
        _offline_venv(venv, env)
        into = ["--python", str(bin_ / "python"), "install", "--no-deps", "--no-index"]
        done = _run([*pip, *into, str(wheel)], tmp, env)
    assert done.returncode == 0, done.stderr
    return bin_


def _offline_venv(venv: Path, env: dict[str, str]) -> None:
    """A new virtual environment without pip that finds the dependencies (and pip,
    setuptools, mypy) in this interpreter's site-packages through a ``.pth`` file: a
    path entry, whose own ``.pth`` files (this checkout's editable install) are not read."""
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent, env)
    assert made.returncode == 0, made.stderr
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = _run([str(venv / "bin" / "python"), "-c", where], venv.parent, env)
    Path(purelib.stdout.strip(), "deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8"
    )


@pytest.mark.timeout(600)  # mypy reads the whole package, uncached, under load
def test_mypy_finds_the_package_after_an_editable_install(tmp_path: Path) -> None:
    """``pip install -e .`` puts the package on ``sys.path`` by a static ``.pth`` path,
    which mypy reads (an import hook, setuptools' default for this layout, it cannot)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    (tmp_path / "src").mkdir()
    source = _copy_source(tmp_path / "src")
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _offline_venv(venv, env)
    python = str(venv / "bin" / "python")
    before = _run([python, "-c", "import statemachine"], elsewhere, env)
    assert before.returncode != 0, "the new environment sees another copy already"
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--quiet", "install"]
    offline = ["--no-deps", "--no-index", "--no-build-isolation"]
    done = _run([*pip, *offline, "-e", str(source)], tmp_path, env)
    assert done.returncode == 0, done.stderr
    where = _run(
        [python, "-c", "import statemachine; print(statemachine.__file__)"], elsewhere, env
    )
    assert where.returncode == 0, where.stderr
    (elsewhere / "app.py").write_text(
        "import statemachine as sm\n\n"
        "def answer(result: sm.RunResult[int]) -> int | None:\n"
        "    return result.output\n\n"
        "sm.Agent('test', max_turns='8')\n",
        encoding="utf-8",
    )
    mypy = [python, "-m", "mypy", "--strict", "--no-incremental", "--config-file", ""]
    checked = _run([*mypy, "app.py"], elsewhere, env)
    assert "import-not-found" not in checked.stdout, checked.stdout
    # The package's types are read: the one mistake in app.py is found, naming the option.
    assert checked.stdout.count("error:") == 1, checked.stdout
    assert 'app.py:6: error: Argument "max_turns" to "Agent" has incompatible type' in (
        checked.stdout
    ), checked.stdout


def _trace_and_transcript_work_installed(
    python: str, script: str, elsewhere: Path, env: dict[str, str]
) -> None:
    """A run saved as a run file draws with ``trace``; a log checks with ``transcript``."""
    run_file = elsewhere / "run.json"
    make_run = (
        "import json, sys, statemachine as sm; from statemachine.cli.demo import demo_model; "
        "from statemachine.cli.trace import run_result_to_dict; "
        "r = sm.run_agent_sync(model=demo_model(), messages=[sm.UserMessage('hi')]); "
        "open(sys.argv[1], 'w').write(json.dumps(run_result_to_dict(r)))"
    )
    assert _run([python, "-c", make_run, str(run_file)], elsewhere, env).returncode == 0
    trace = _run([script, "trace", str(run_file), "--format", "sequence"], elsewhere, env)
    assert trace.returncode == 0, trace.stderr
    assert trace.stdout.startswith("sequenceDiagram")

    log = elsewhere / "log.json"
    log.write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    transcript = _run([script, "transcript", str(log)], elsewhere, env)
    assert transcript.returncode == 0, transcript.stderr
    assert transcript.stdout.startswith(f"{log}: ok")


@pytest.mark.timeout(300)
def test_every_command_works_from_an_installed_wheel(tmp_path: Path) -> None:
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    bin_ = _install(tmp_path, env)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "ws").mkdir(parents=True)
    (elsewhere / "ws" / "README.md").write_text("# Installed\n", encoding="utf-8")
    python, script = str(bin_ / "python"), str(bin_ / "statemachine")

    where = _run(
        [python, "-c", "import statemachine; print(statemachine.__file__)"], elsewhere, env
    )
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where

    top = _run([script, "--help"], elsewhere, env)
    assert top.returncode == 0
    # The same help, naming the program as it was called.
    module = _run([python, "-m", "statemachine", "--help"], elsewhere, env).stdout
    assert module.startswith("usage: python -m statemachine ")
    assert top.stdout == module.replace("python -m statemachine", "statemachine")
    # A core install (the index variant) has no Hypothesis: every command still works
    # (statemachine.testing imports Hypothesis only for its searches).
    for command in COMMANDS:
        shown = _run([script, "help", command], elsewhere, env)
        assert shown.returncode == 0, (command, shown.stderr)
        assert shown.stdout.startswith(f"usage: statemachine {command} "), command

    spec = _run([script, "spec"], elsewhere, env)
    assert spec.returncode == 0, spec.stdout + spec.stderr
    assert spec.stderr == ""
    scenarios = len(list((ROOT / "specs").glob("*.toml")))  # every one the wheel ships
    assert re.search(rf"^{scenarios} passed, 0 failed; every acceptance line", spec.stdout, re.M)
    assert f"{os.sep}statemachine{os.sep}_specs{os.sep}turn_limit.toml" in spec.stdout

    demo = _run([python, "-m", "statemachine", "demo", "ws"], elsewhere, env)
    assert demo.returncode == 0, demo.stderr
    assert "final state: Done" in demo.stdout
    assert 'README.md begins with: "# Installed"' in " ".join(demo.stdout.split())

    diagram = _run([script, "diagram"], elsewhere, env)
    assert diagram.returncode == 0, diagram.stderr
    assert "stateDiagram" in diagram.stdout
    refused = _run([script, "diagram", "--all"], elsewhere, env)
    assert (refused.returncode, refused.stderr.count("\n")) == (2, 1), refused.stderr

    _trace_and_transcript_work_installed(python, script, elsewhere, env)
    # The built-in table's drawings ship in the wheel: the docs and 'view' need them.
    check = (
        "from statemachine._figures import PACKAGED, packaged_svg as p; print(*map(p, PACKAGED))"
    )
    shipped = _run([python, "-c", check], elsewhere, env)
    assert shipped.returncode == 0, shipped.stderr
    assert shipped.stdout.count("<svg ") == 2

    missing = _run([script, "spec", "nope.toml"], elsewhere, env)
    assert (missing.returncode, missing.stderr) == (
        2,
        "spec: nope.toml: no such file or directory\n",
    )
    # Measured for the record (the default suite keeps this test only while it is quick).
    print(f"installed-wheel test: {time.monotonic() - started:.1f} s")


# -- rough edges: names, formats, interrupts, quiet output -----------------------------------


def test_a_mistyped_command_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["replya"], capsys) == (
        2,
        "",
        "statemachine: unknown command 'replya'; did you mean 'replay'? (see --help)\n",
    )
    assert _main(["zzz"], capsys) == (2, "", "statemachine: unknown command 'zzz' (see --help)\n")


def test_usage_names_the_program_as_it_was_called(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/statemachine", "--help"])
    assert usage().startswith("usage: statemachine [--version] COMMAND")
    code, out, _ = _main(["view", "--help"], capsys)
    assert code == 0
    assert out.startswith("usage: statemachine view ")
    monkeypatch.setattr(sys, "argv", ["/x/statemachine/__main__.py"])
    assert usage().startswith("usage: python -m statemachine [--version] COMMAND")


def test_ctrl_c_ends_a_command_with_one_line_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import statemachine.cli as cli

    def interrupted(name: str, rest: list[str]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_dispatch", interrupted)
    assert _main(["demo"], capsys) == (130, "", "statemachine: interrupted\n")


def test_diagram_refuses_an_extension_that_names_no_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _main(["diagram", "--out", str(tmp_path / "x.gif")], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("diagram: cannot tell the format from 'x.gif': name the file .mmd")
    assert not (tmp_path / "x.gif").exists()
    code, _, err = _main(["diagram", "--out", str(tmp_path / "x.md")], capsys)
    assert code == 2
    assert "draws mermaid, dot, svg, png, not markdown" in err
    assert _main(["diagram", "--format", "dot", "--out", str(tmp_path / "x.gif")], capsys)[0] == 0
    assert (tmp_path / "x.gif").read_text(encoding="utf-8").startswith("digraph")


def _journal_file(directory: Path) -> Path:
    import asyncio

    import statemachine as sm
    from statemachine.journal import Journal, run_agent_journaled

    class Model:
        async def complete(self, messages: object, tools: object, signal: object) -> object:
            return sm.AssistantMessage("hi")

    path = directory / "run.jsonl"
    journal = Journal(path)
    try:
        asyncio.run(
            run_agent_journaled(
                journal=journal, model=Model(), messages=[sm.UserMessage("hi")], run_id="r1"
            )
        )
    finally:
        journal.close()
    return path


def test_replay_quiet_prints_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _journal_file(tmp_path)
    assert _main(["replay", "--quiet", str(path)], capsys) == (
        0,
        "OK: the replay matches the journal (run r1: Done after 2 event(s), 1 checkpoint(s))\n",
        "",
    )
    path.write_text(path.read_text(encoding="utf-8")[:-30], encoding="utf-8")
    code, out, err = _main(["replay", "--quiet", str(path)], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("replay: FAILED: journal line")
    assert err.count("\n") == 1


def test_replay_help_says_what_a_file_that_is_not_a_journal_gets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _main(["replay", "--help"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert "1 the journal does not replay as recorded" in flat
    assert "2 bad arguments or unreadable input" in flat
    (tmp_path / "notes.txt").write_text("hello\n", encoding="utf-8")
    assert _main(["replay", str(tmp_path / "notes.txt")], capsys)[0] == 2


def test_check_shows_which_configuration_it_explores_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from statemachine.cli.common import Progress
    from statemachine.testing.checker import DEFAULT_CONFIGS, Bounds, check_engine

    drawn: list[str] = []
    monkeypatch.setattr(Progress, "step", lambda self, item: drawn.append(item))
    code, out, _ = _main(["check", "--turns", "2", "--calls", "2"], capsys)
    assert code == 0
    assert drawn == [c.describe() for c in DEFAULT_CONFIGS]
    # One configuration at a time, the same report as one call.
    whole = check_engine(Bounds(turns=2, calls=2))
    assert f"explored {whole.states} states and {whole.transitions} transitions" in out
    assert f"table rows taken: {len(whole.rows_taken)}/{len(whole.table)}" in out


def test_the_console_printer_reads_each_kind_of_event() -> None:
    import statemachine as sm
    from statemachine.cli.common import describe_run_event

    async def go() -> list[str]:
        @sm.tool
        def add(a: int, b: int) -> int:
            """Add."""
            return a + b

        class Model:
            async def complete(
                self, messages: Sequence[sm.Message], tools: object, signal: object
            ) -> sm.AssistantMessage:
                if isinstance(messages[-1], sm.ToolResultMessage):
                    return sm.AssistantMessage("It is 42.")
                return sm.AssistantMessage([sm.ToolCall("c1", "add", {"a": 40, "b": 2})])

        run = sm.AgentRun(model=Model(), tools=[add], messages=[sm.UserMessage("40 + 2?")])
        stream = run.events()
        task = asyncio.ensure_future(run.run())
        lines = [describe_run_event(event) async for event in stream]
        await task
        return lines

    import asyncio

    lines = asyncio.run(go())
    text = "\n".join(lines)
    assert "Record" not in text
    assert "TransitionRecord" not in text
    assert lines[0].startswith("run ")
    assert lines[0].endswith(" started")
    assert "turn 1 started" in lines
    assert "Ready --start--> AwaitingModel" in lines
    assert 'tool add (c1) started: {"a": 40, "b": 2}' in lines
    assert any(
        line.startswith("tool add (c1) returned after ") and line.endswith(": 42") for line in lines
    )
    assert "message 3 (assistant): It is 42." in lines
    assert lines[-1].startswith("run returned: Done: ")


def test_run_loads_the_users_tools_and_prints_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from providers_server import LoopbackServer, sse

    (tmp_path / "my_cli_tools.py").write_text(
        "import statemachine as sm\n\n"
        "def read_file(path: str) -> str:\n"
        '    """Read a file (the user\'s own)."""\n'
        '    return f"my own read_file of {path}"\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "my_cli_tools", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789")
    with LoopbackServer() as server:
        server.add(sse("openai/single_tool_call.sse"), sse("openai/text_stream.sse"))
        code, out, err = _main(
            [
                "run", "--provider", "openai", "--base-url", server.url + "/v1",
                "--model", "m", "--no-workspace-tools", "--tool", "my_cli_tools:read_file",
                "--events", "read it",
            ],
            capsys,
        )  # fmt: skip
    assert code == 0, err
    assert "  tools: read_file" in out
    assert "  result (read_file): my own read_file of README.md" in out
    assert "  event: Ready --start--> AwaitingModel" in err
    assert "  event: tool read_file (" in err
    assert "sk-test-0123456789" not in out + err


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "write MODULE:NAME"),
        ("no_such_module_here:x", "cannot import no_such_module_here"),
        ("json:nothing", "json has no nothing"),
        ("json:__version__", "str is not a Tool, a function or a list of them"),
    ],
)
def test_run_refuses_tools_it_cannot_load_in_one_line(
    spec: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    argv = ["run", "--provider", "openai", "--model", "m", "--tool", spec, "hi"]
    code, out, err = _main(argv, capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"run: --tool {spec!r}: ")
    assert message in err
    assert err.count("\n") == 1


def test_check_redraws_the_running_configuration_while_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from statemachine.cli import check
    from statemachine.testing.checker import Bounds, CheckReport
    from statemachine.testing.checker import check_engine as real

    class Terminal(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.ticked = threading.Event()

        def write(self, text: str) -> int:
            if " s)" in text:
                self.ticked.set()
            return super().write(text)

    terminal = Terminal()
    # Wide enough for the longest configuration's line (the display is cut to the width).
    monkeypatch.setenv("COLUMNS", "200")

    def slow_check(bounds: Bounds, strategy: Literal["snapshot", "replay"]) -> CheckReport:
        # Until the display has shown a running time: a check that takes a while.
        assert terminal.ticked.wait(30)
        terminal.ticked.clear()
        return real(bounds, strategy=strategy)

    monkeypatch.setattr(check, "check_engine", slow_check)
    bounds = Bounds(turns=1, calls=1)
    with Progress("check", len(bounds.configs), terminal, enabled=True, interval=0) as progress:
        report = check.check_with_progress(bounds, "snapshot", progress, every=0.01)
    drawn = terminal.getvalue()
    for config in bounds.configs:
        assert re.search(rf"check \[\d/\d\] {re.escape(config.describe())} \(\d+ s\)", drawn)
    assert report.states > 0
    assert all(t.name != "check-progress" for t in threading.enumerate())


@pytest.mark.timeout(120)
def test_the_example_mcp_server_runs_as_a_module(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("CI") != "true":
        pytest.importorskip("mcp")  # under CI the extra is installed: fail, never skip
    import asyncio

    import statemachine as sm
    from statemachine.mcp import MCPServer

    monkeypatch.setenv("PYTHONPATH", str(ROOT))

    class AddThenAnswer:
        async def complete(
            self, messages: Sequence[sm.Message], tools: object, signal: object
        ) -> sm.AssistantMessage:
            last = messages[-1]
            if isinstance(last, sm.ToolResultMessage):
                return sm.AssistantMessage(f"It is {last.text}.")
            return sm.AssistantMessage([sm.ToolCall("c1", "calc_add", {"a": 40, "b": 2})])

    async def main_() -> tuple[list[str], sm.RunResult]:
        server = MCPServer.stdio(
            sys.executable, ["-m", "statemachine", "mcp-example"], prefix="calc_"
        )
        async with server:
            names = [t.name for t in server.tools]
            result = await sm.run_agent(
                model=AddThenAnswer(), tools=server.tools, messages=[sm.UserMessage("40 + 2?")]
            )
            return names, result

    names, result = asyncio.run(main_())
    assert names == [
        "calc_add",
        "calc_echo",
        "calc_word_count",
        "calc_touch",
        "calc_roots",
        "calc_summarize",
        "calc_greet",
    ]
    assert result.final_text == "It is 42."


@pytest.mark.timeout(60)
def test_the_example_mcp_server_without_the_extra_says_which(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "from statemachine.cli import main\n"
        "sys.exit(main(['mcp-example']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "mcp-example: needs the Python package 'mcp', which is not installed: "
        "pip install 'agent-statemachine[mcp]'\n"
    )
