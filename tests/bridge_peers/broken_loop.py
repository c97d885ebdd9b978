"""``conforming_loop.py`` with the classic defect: it stops on the stop reason.

A response whose ``stopReason`` is not ``toolUse`` ends the run, even when it holds
tool calls, which are then left without results (I1) and never run (I3).
"""

from __future__ import annotations

from typing import Any

import conforming_loop


def stops(message: dict[str, Any], calls: list[dict[str, Any]]) -> bool:
    return bool(message["stopReason"] != "toolUse")


if __name__ == "__main__":
    conforming_loop.stops = stops
    conforming_loop.main()
