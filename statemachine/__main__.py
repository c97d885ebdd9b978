"""``python -m statemachine``: the command line (see ``statemachine.cli``)."""

from __future__ import annotations

import sys

from statemachine.cli import main

if __name__ == "__main__":
    sys.exit(main())
