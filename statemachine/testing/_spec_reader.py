"""Finding and reading spec files: where this copy's scenarios are, the size limit,
TOML, and typed access whose errors name the file and the key (``SpecError``)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from statemachine.core.limits import UsageLimits
from statemachine.core.messages import Message, Usage, UserMessage
from statemachine.core.output import OutputSpec
from statemachine.core.wire import message_from_dict
from statemachine.errors import InvalidInputError, SpecError, WireFormatError

__all__ = [
    "CHECKOUT_SPEC_DIR",
    "MAX_SCENARIO_BYTES",
    "PACKAGED_SPEC_DIR",
    "Reader",
    "SpecError",
    "default_spec_dir",
    "discover",
    "message",
    "read",
    "run_options",
    "usage",
    "usage_limits",
]


MAX_SCENARIO_BYTES = 1024 * 1024
"""A scenario file larger than this is refused unread (the largest shipped is ~2 KB)."""


class Reader:
    """Typed access to the parsed TOML, with errors that name the file and key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, problem: str) -> SpecError:
        return SpecError(f"{self.path}: {where}: {problem}")

    def table(self, data: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            raise self.fail(where, f"expected a table, got {type(data).__name__}")
        extra = sorted(set(data) - allowed)
        if extra:
            raise self.fail(
                where, f"unknown key(s) {', '.join(extra)} (known: {', '.join(sorted(allowed))})"
            )
        return data

    def get(self, data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str,
            default: Any = None) -> Any:  # fmt: skip
        if key not in data:
            return default
        value = data[key]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise self.fail(f"{where}.{key}", "expected a number, got a boolean")
        if not isinstance(value, kind):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise self.fail(f"{where}.{key}", f"expected {names}, got {type(value).__name__}")
        return value

    def strings(self, data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
        value = self.get(data, key, list, where, [])
        if not all(isinstance(v, str) for v in value):
            raise self.fail(f"{where}.{key}", "expected an array of strings")
        return tuple(value)


def read(path: Path) -> Any:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SCENARIO_BYTES + 1)
        if len(raw) > MAX_SCENARIO_BYTES:
            raise SpecError(f"{path}: larger than {MAX_SCENARIO_BYTES} bytes; not a scenario")
        return tomllib.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None


def message(reader: Reader, data: Any, where: str) -> Message:
    if isinstance(data, str):
        return UserMessage(data)
    try:
        return message_from_dict(data, path=where)
    except WireFormatError as exc:
        raise reader.fail(where, str(exc)) from None


_USAGE_LIMITS = {"requests", "input_tokens", "output_tokens", "total_tokens"}
_USAGE = {"input", "output", "cache_read", "cache_write", "total_tokens"}


def run_options(r: Reader, run: Mapping[str, Any]) -> dict[str, Any]:
    """The ``run_agent`` options of ``[run]`` beyond the history and the turn limit:
    ``usage_limits``, and ``output_schema`` (a JSON Schema: ``output_type``) with
    ``output_retries``."""
    options: dict[str, Any] = {}
    limits = usage_limits(r, run)
    if limits is not None:
        options["usage_limits"] = limits
    if "output_schema" in run:
        schema = run["output_schema"]
        try:
            OutputSpec.of(schema)  # refused here, naming the key, rather than when it runs
        except InvalidInputError as exc:
            raise r.fail("run.output_schema", str(exc)) from None
        options["output_type"] = dict(schema)
    if "output_retries" in run:
        options["output_retries"] = r.get(run, "output_retries", int, "run")
    return options


def usage_limits(r: Reader, run: Mapping[str, Any]) -> UsageLimits | None:
    """``[run.usage_limits]``: the ``UsageLimits`` of the run, if any."""
    if "usage_limits" not in run:
        return None
    table = r.table(run["usage_limits"], "run.usage_limits", _USAGE_LIMITS)
    values = {k: r.get(table, k, int, "run.usage_limits") for k in sorted(table)}
    try:
        return UsageLimits(**values)
    except InvalidInputError as exc:
        raise r.fail("run.usage_limits", str(exc)) from None


def usage(r: Reader, step: Mapping[str, Any], where: str) -> Usage | None:
    """A model step's ``usage``: the token counts the response reports."""
    if "usage" not in step:
        return None
    table = r.table(step["usage"], f"{where}.usage", _USAGE)
    values = {k: r.get(table, k, int, f"{where}.usage") for k in sorted(table)}
    if any(v < 0 for v in values.values()):
        raise r.fail(f"{where}.usage", "token counts are integers of at least 0")
    return Usage(**values)


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """The scenario files under ``paths`` (files as given, directories searched)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(path.rglob("*.toml"))
        elif path.exists():
            found.append(path)
        else:
            raise SpecError(f"{path}: no such file or directory")
    return found


PACKAGED_SPEC_DIR = Path(__file__).resolve().parents[1] / "_specs"
"""Where an installed wheel keeps the scenarios (``specs/``, shipped as package data)."""

CHECKOUT_SPEC_DIR = Path(__file__).resolve().parents[2] / "specs"
"""Where a source checkout keeps them: the one source the wheel's copy is built from."""


def default_spec_dir() -> Path:
    """The scenarios that belong to this copy of the library.

    The packaged copy when the library is installed from a wheel, else ``specs/`` of the
    checkout the package is imported from. Never the current directory's ``specs/``: a
    directory of that name elsewhere is not ours, and a path argument runs it anyway.
    """
    return PACKAGED_SPEC_DIR if PACKAGED_SPEC_DIR.is_dir() else CHECKOUT_SPEC_DIR
