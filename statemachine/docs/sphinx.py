"""A Sphinx extension: the directive ``.. statemachine-agent:: package.module:attr``.

Add ``statemachine.docs.sphinx`` to ``extensions`` in ``conf.py``; the directive
becomes the agent's tools, limits and loop (``statemachine.docs.agent_html``) in HTML
builds. An agent that cannot be imported or drawn stops the build (an
``ExtensionError`` carrying the ``DiagramError``).
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

from statemachine._version import __version__
from statemachine.docs import agent_html
from statemachine.errors import DiagramError

__all__ = ["AgentDirective", "setup"]


class AgentDirective(Directive):
    """``.. statemachine-agent:: package.module:attr``"""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        try:
            page = agent_html(self.arguments[0])
        except DiagramError as exc:
            raise ExtensionError(str(exc)) from exc
        return [nodes.raw("", page, format="html")]


def setup(app: Sphinx) -> dict[str, Any]:
    """What Sphinx calls for ``statemachine.docs.sphinx``."""
    app.add_directive("statemachine-agent", AgentDirective)
    return {"version": __version__, "parallel_read_safe": True, "parallel_write_safe": True}
