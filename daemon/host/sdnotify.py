"""systemd's sd_notify protocol in a few lines: datagrams like "READY=1" to the socket named by NOTIFY_SOCKET.

Used by the supervisor under `Type=notify` units: READY=1 once it owns the run, STATUS=<one line> on every phase
change, WATCHDOG=1 (at half of WATCHDOG_USEC) from the main loop and from the waits outside it (the orphan hunt at
start, stopping the trainer at exit), and STOPPING=1 on stop. Without NOTIFY_SOCKET every call does nothing. No
dependency.
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # abstract namespace
            address = "\0" + address[1:]
        self.address = address or None
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_interval = int(usec) / 1e6 / 2 if usec.isdigit() and int(usec) > 0 else None
        self._last_watchdog = 0.0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self.address)
                sock.sendall("\n".join(fields).encode())
            return True
        except OSError:
            return False  # systemd gone or socket not ours: never let the notifier stop the supervisor

    def ready(self, status: str = "") -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def watchdog(self) -> None:
        """Call every tick; sends WATCHDOG=1 only as often as systemd asked for."""
        if self.watchdog_interval is None:
            return
        t = time.monotonic()
        if t - self._last_watchdog >= self.watchdog_interval:
            self._last_watchdog = t
            self.send("WATCHDOG=1")
