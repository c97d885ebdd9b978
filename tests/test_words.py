"""One word, one meaning: the phrases the glossary retired stay out of the docs and of
the library's source (docstrings, comments, messages, CLI help), and a word with a narrow
meaning stays where it means that. The glossary is ``docs/architecture.md``, "Words"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "statemachine"

RETIRED = {
    "input event": "engine event",
    "journal event": "journal line, or the engine event it holds",
    "journal entry": "journal line",
    "journal entries": "journal lines",
}
"""Retired phrase: the term to write instead."""

RETIRED_NAMES = re.compile(r"\b(RunEnded|RunFinished)\b(?!Error)")
"""Deprecated aliases a page must not teach (``ReturnToCaller``, ``RunReturned``)."""

DBOS_EVENT = "dbos event"


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _text(path: Path) -> str:
    """The file's text, lower case, with every run of white space one space (a phrase
    broken across lines still matches), without the glossary, which names what it
    retires."""
    return re.sub(r"\s+", " ", _without_glossary(path)).lower()


def _without_glossary(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return re.sub(r"^## Words\n.*?(?=^## )", "", text, flags=re.M | re.S)


def retired_phrases_in(text: str) -> list[str]:
    return [f"{old!r} (write {new!r})" for old, new in RETIRED.items() if old in text]


@pytest.mark.parametrize("path", [*_pages(), *_modules()], ids=_name)
def test_no_retired_phrase_comes_back(path: Path) -> None:
    assert not retired_phrases_in(_text(path)), _name(path)


@pytest.mark.parametrize("page", _pages(), ids=_name)
def test_no_page_teaches_a_deprecated_name(page: Path) -> None:
    assert not RETIRED_NAMES.findall(_without_glossary(page)), _name(page)


def test_dbos_events_are_named_only_where_dbos_is_used() -> None:
    outside = [
        _name(path)
        for path in [*_pages(), *_modules()]
        if DBOS_EVENT in _text(path) and "dbos" not in path.name and path.name != "durable.md"
    ]
    assert outside == []


def test_the_glossary_names_every_term_and_what_it_retires() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    glossary = page.partition("\n## Words\n")[2].partition("\n## ")[0]
    glossary = re.sub(r"\s+", " ", glossary)
    for term in ("engine event", "action", "run event", "journal line", "DBOS event"):
        assert f"| {term} |" in glossary, term
    for old in (*RETIRED, "RunEnded", "RunFinished"):
        assert old in glossary, old


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("the input\n    events of a run", ["'input event' (write 'engine event')"]),
        ("one engine event per journal line", []),
        ("a journal entry", ["'journal entry' (write 'journal line')"]),
    ],
)
def test_the_phrase_check_sees_a_phrase_broken_across_lines(text: str, found: list[str]) -> None:
    assert retired_phrases_in(re.sub(r"\s+", " ", text).lower()) == found
