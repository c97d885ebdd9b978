"""The checks of a caller's numeric arguments, written once.

Every limit the library takes (``max_turns``, a size in bytes, a timeout in seconds)
is refused the same way when it is not what it says: a ``bool`` is not a number here
(``True`` is an ``int`` to Python, and ``max_turns=True`` is a bug, not a one), NaN
and infinity are not numbers of seconds, and the message names the argument and the
value it got. Readers of stored data (snapshots, journals, the wire) check their own
fields and raise their own ``BadDataError``; these are for arguments only.
"""

from __future__ import annotations

import math
from typing import TypeGuard

from statemachine.errors import InvalidInputError

__all__ = ["non_negative_number", "positive_int", "positive_number"]


def positive_int(name: str, value: object, *, at_most: int | None = None) -> int:
    """``value`` if it is an ``int`` of at least 1 (and at most ``at_most``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r:.40}")
    if at_most is not None and value > at_most:
        raise InvalidInputError(f"{name} must be at most {at_most:,}, got {value!r}")
    return value


def positive_number(name: str, value: object) -> float:
    """``value`` if it is a finite ``int`` or ``float`` above 0 (seconds, for instance)."""
    if not _finite(value) or not value > 0:
        raise InvalidInputError(f"{name} must be a positive number, got {value!r:.40}")
    return float(value)


def non_negative_number(name: str, value: object) -> float:
    """``value`` if it is a finite ``int`` or ``float`` of at least 0."""
    if not _finite(value) or not value >= 0:
        raise InvalidInputError(f"{name} must be a number of at least 0, got {value!r:.40}")
    return float(value)


def _finite(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
