"""Peers that misbehave at the transport level, for the bridge's "never a hang" tests.

``python misbehaving.py MODE PIDFILE``; each mode says hello, then:

- ``endless-line``: writes ``x`` forever, never a newline.
- ``grandchild-result``: starts a grandchild that inherits stdout and stderr and
  sleeps, answers ``start`` with a ``result`` at once, and exits; the grandchild keeps
  the pipes open.
- ``grandchild-silent``: starts such a grandchild and exits without a ``result``.
- ``stubborn``: starts such a grandchild, ignores SIGTERM and the end of its stdin,
  and sleeps.

The grandchild's pid is written to PIDFILE, so a test can check it is gone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def start_grandchild(pidfile: str) -> None:
    # Inherits stdout and stderr: as long as it lives, the kit sees no end of file.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(pidfile, "w") as f:
        f.write(str(child.pid))


def main(mode: str, pidfile: str) -> None:
    send({"type": "hello", "protocol": 1, "peer": f"misbehaving {mode}"})
    if mode == "endless-line":
        chunk = "x" * 4096
        while True:
            sys.stdout.write(chunk)
            sys.stdout.flush()
    start_grandchild(pidfile)
    if mode == "grandchild-result":
        start = json.loads(sys.stdin.readline())
        send({"type": "result", "messages": start["messages"]})
    elif mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.stdin.readline()
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
