"""Refuse to run beside python-statemachine, which installs the same import name.

The distribution ``python-statemachine`` (an unrelated, popular library) also
installs a top-level package called ``statemachine``. With both installed, their
files share one directory and one shadows the other, so ``import statemachine``
gives whichever was installed last, or a mix of both: errors far from their cause.
Importing this package therefore checks, once, whether that distribution is
installed too, and fails at once with what to do.
"""

from __future__ import annotations

import importlib.metadata

OTHER = "python-statemachine"


class ShadowedPackageError(ImportError):
    """Both this library and python-statemachine are installed in one environment."""


def refuse_shadowing() -> None:
    try:
        other = importlib.metadata.distribution(OTHER)
    except importlib.metadata.PackageNotFoundError:
        return
    raise ShadowedPackageError(
        f"both agent-statemachine and {OTHER} {other.version} are installed in this "
        "environment, and both install the import name 'statemachine', so one shadows "
        f"the other. Uninstall one (pip uninstall {OTHER}, then reinstall "
        "agent-statemachine so its files are whole again), or install them in "
        "separate virtual environments."
    )


refuse_shadowing()
