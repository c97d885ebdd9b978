"""The library's default logger: silent unless the application asked for logs.

A library never configures logging and never prints unless the application asked
for it. structlog's *unconfigured* default renders every event to stdout, so the
library cannot simply call ``structlog.get_logger()``. Instead, each engine, driver
and provider adapter asks :func:`library_logger` when it is made:

- If the application configured structlog (``structlog.configure`` was called), its
  configuration is respected: the events go wherever it sends them, with their
  fields.
- Otherwise the events go through the standard ``logging`` module, to the logger
  named ``statemachine`` (children: ``statemachine.providers``...), rendered as one
  ``key=value`` line each. The package adds a ``NullHandler`` to that logger, so an
  application that configured nothing sees nothing, not even warnings through
  ``logging``'s last-resort handler. ``logging.basicConfig(level=logging.DEBUG)``
  (or a handler on ``statemachine``) shows every transition.

The level is read when the engine is made: the per-transition debug events of a run
whose logger drops debug cost nothing, not even building their arguments (the
engine asks ``is_enabled_for``/``isEnabledFor`` once; see ``statemachine.core.engine``).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

LOGGER_NAME = "statemachine"

# The library's stdlib logger, silent until the application adds a handler or
# configures the root logger (Python's advice for libraries).
logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())

_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,
    structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True),
]


def library_logger(name: str = LOGGER_NAME) -> Any:
    """A structlog logger for *name* that respects the application's configuration.

    structlog configured by the application → ``structlog.get_logger(name)``;
    otherwise a logger over ``logging.getLogger(name)`` (silent by default).
    """
    if structlog.is_configured():
        return structlog.get_logger(name)
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
    )
