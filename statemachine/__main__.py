"""``python -m statemachine``: the command line (see ``statemachine.cli``)."""

from __future__ import annotations

import sys

try:
    from statemachine.cli import main
except KeyboardInterrupt:  # Ctrl-C while the library is still being imported
    print("statemachine: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
