"""Shared test configuration: Hypothesis profiles, structlog quietness and the
providers' loopback server.

``HYPOTHESIS_PROFILE=thorough`` runs many more examples (minutes to hours); the
default profile keeps the whole suite to a few minutes on a 2-core machine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import HealthCheck, settings
from providers_server import LoopbackServer

settings.register_profile(
    "default",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The library never configures structlog; the test *application* does, so that debug
# transition events do not flood the output. capture_logs() still sees everything.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    """A loopback HTTP server for the provider adapters (a module may define its own)."""
    with LoopbackServer() as running:
        yield running
