"""A real process that holds something (a lock, a marker) from the moment it prints "held" until its stdin closes:
for tests about who holds what, by the kernel's record (flock), not by a fake."""
from __future__ import annotations

import subprocess
import sys


class HeldProcess:
    """`python -c script *args`, started and waited on until it says "held"; `end()` closes its stdin and waits."""

    def __init__(self, script: str, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"
        self.pid = self.proc.pid

    def end(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
