"""The document both of the package's pages are laid out in (``statemachine._page``):
one inline script, named by its hash in the Content-Security-Policy, and text that
stays text."""

from __future__ import annotations

import base64
import hashlib
import html
import re

import pytest

from statemachine._page import SCRIPT, STYLE, document


def _policy(page: str) -> str:
    found = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page)
    assert found is not None
    return html.unescape(found[1])


def _scripts(page: str) -> list[str]:
    return re.findall(r"<script>(.*?)</script>", page, flags=re.DOTALL)


def _hash(script: str) -> str:
    return base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")


def test_a_page_names_its_one_script_by_the_hash_of_that_script() -> None:
    page = document(title="t", style="p { margin: 0; }", body="<p>x</p>", script="go();")
    scripts = _scripts(page)
    assert scripts == [SCRIPT + "go();"]
    assert f"script-src 'sha256-{_hash(scripts[0])}'" in _policy(page)
    assert f"<style>{STYLE}p {{ margin: 0; }}</style>" in page


def test_a_page_lets_nothing_load_but_its_own_style_images_and_script() -> None:
    policy = _policy(document(title="t", style="", body="", script=""))
    assert policy.startswith("default-src 'none'; style-src 'unsafe-inline'; img-src data:; ")
    assert "connect-src" not in policy


def test_a_page_adds_the_directives_it_is_given() -> None:
    policy = _policy(document(title="t", style="", body="", script="", policy="connect-src 'self'"))
    assert policy.endswith("; connect-src 'self'")


def test_a_page_title_is_text() -> None:
    page = document(title='<img src=x onerror="pwned()">', style="", body="", script="")
    assert "<img" not in page
    assert "<title>&lt;img src=x onerror=&quot;pwned()&quot;&gt;</title>" in page


@pytest.mark.timeout(60)
def test_the_live_page_names_its_script_and_talks_only_to_its_own_server() -> None:
    from statemachine.live._page import page_html

    page = page_html()
    (script,) = _scripts(page)
    policy = _policy(page)
    assert f"script-src 'sha256-{_hash(script)}'" in policy
    assert "connect-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
