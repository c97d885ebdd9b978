"""Old names kept for a while after a rename: reading one warns and gives the new object.

A module that renamed a public name defines::

    def __getattr__(name: str) -> Any:
        return renamed(__name__, name, {"OldName": "NewName"}, globals())

The old names stay out of ``__all__`` (a star import does not bring them).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any


def renamed(
    module: str, name: str, renames: Mapping[str, str], namespace: Mapping[str, Any]
) -> Any:
    """The object now called ``renames[name]`` in ``namespace``, with a
    ``DeprecationWarning`` naming the new name; ``AttributeError`` for any other name."""
    new = renames.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is deprecated; use {module}.{new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return namespace[new]
