"""A Python-Markdown extension (MkDocs, Zensical): ``.. statemachine-agent:: pkg.mod:attr``.

Add ``statemachine.docs.markdown`` to ``markdown_extensions``; a line of its own (not
indented, not in a code block) ``.. statemachine-agent:: package.module:attr`` becomes
the agent's tools, limits and loop (``statemachine.docs.agent_html``). A line that
names no drawable agent stops the build with its ``DiagramError``.
"""

from __future__ import annotations

import re
from typing import Any, Final

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

from statemachine.docs import agent_html

__all__ = ["AgentExtension", "makeExtension"]

LINE: Final = re.compile(r"^\.\. statemachine-agent::[ \t]*(\S*)[ \t]*$")


class _AgentLines(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        for line in lines:
            found = LINE.match(line)
            if found is None:
                out.append(line)
                continue
            # Stashed raw HTML, a block of its own: Markdown leaves it as it is.
            out += ["", self.md.htmlStash.store(agent_html(found.group(1))), ""]
        return out


class AgentExtension(Extension):
    """Registers the ``.. statemachine-agent::`` line."""

    def extendMarkdown(self, md: Markdown) -> None:
        # After the fenced code blocks are stashed (priority 25): a line inside one is
        # code, not a directive.
        md.preprocessors.register(_AgentLines(md), "statemachine_agent", 20)


def makeExtension(**kwargs: Any) -> AgentExtension:
    """What Python-Markdown calls for ``statemachine.docs.markdown``."""
    return AgentExtension(**kwargs)
