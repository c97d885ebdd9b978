"""What a new engine is given (``core/inputs.py``): tools and histories that are not
sequences of them are refused with a sentence that names the problem."""

from __future__ import annotations

import pytest
from engine_support import ECHO

from statemachine.core.engine import Engine
from statemachine.core.messages import (
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.errors import (
    InvalidInputError,
)

S = TurnState


@pytest.mark.timeout(30)
def test_the_engine_refuses_tools_and_histories_that_are_not_sequences_of_them() -> None:
    for tools in ("echo", b"echo", 42, (d for d in [ECHO])):
        with pytest.raises(InvalidInputError, match="tools must be a sequence"):
            Engine(tools=tools, messages=[UserMessage("go")])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="duplicate tool name 'echo'"):
        Engine(tools=[ECHO, ECHO], messages=[UserMessage("go")])
    for messages in ("go", b"go", 42):
        with pytest.raises(InvalidInputError, match="messages must be a sequence"):
            Engine(tools=[ECHO], messages=messages)  # type: ignore[arg-type]
