"""systemd's sd_notify protocol in a few lines: datagrams like "READY=1" to the socket named by NOTIFY_SOCKET.

Used by the supervisor under `Type=notify` units: READY=1 once it owns the run, STATUS=<one line> on every phase
change (`phase`) and, while the trainer's step advances, the phase with its step and loss at most every
PROGRESS_EVERY_S (`progress`, from daemon/runfiles.py where the heartbeat and metrics are read), WATCHDOG=1 (at half
of WATCHDOG_USEC) from the main loop and from the waits outside it (the orphan hunt at start, stopping the trainer at
exit), and STOPPING=1 on stop. Without NOTIFY_SOCKET every call does nothing. No dependency. `own_unit` says which
unit this process runs as (state.json keeps it for `minilmd stop`).
"""
from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Mapping

_USER_MANAGER = re.compile(r"^user@\d+\.service$")
PROGRESS_EVERY_S = 30.0
"""How often at most STATUS says a newer step within one phase: `systemctl status` shows the latest line, and
systemd logs none of them, but a trainer logs a step a second or more, each a datagram to PID 1."""
STATUS_MAX_CHARS = 200


def own_unit(env: Mapping[str, str] | None = None, cgroup: str = "/proc/self/cgroup") -> tuple[str, bool] | None:
    """(the systemd service this process runs as, whether a user manager runs it), from its cgroup path
    (`0::/user.slice/user-1000.slice/user@1000.service/app.slice/minilmd@tiny.service`; cgroup v1's name=systemd
    line alike); None outside a service of ours or when unreadable. Ours: systemd set INVOCATION_ID (every service)
    and NOTIFY_SOCKET (deploy/minilmd@.service is Type=notify), so that a tmux server some other unit started does
    not pass that unit off as the run's."""
    env = os.environ if env is None else env
    if not env.get("INVOCATION_ID") or not env.get("NOTIFY_SOCKET"):
        return None
    try:
        with open(cgroup, encoding="utf-8", errors="replace") as f:
            lines = f.read(65536).splitlines()
    except OSError:
        return None
    paths = [line.split(":", 2)[2] for line in lines if line.count(":") >= 2 and
             (line.startswith("0::") or ":name=systemd:" in line)]
    for path in paths:
        parts = [p for p in path.split("/") if p]
        services = [i for i, p in enumerate(parts) if p.endswith(".service")]
        if services and not _USER_MANAGER.match(parts[services[-1]]):
            return parts[services[-1]], any(_USER_MANAGER.match(p) for p in parts[:services[-1]])
    return None


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
        self._head = ""  # "run: phase" of the last phase change: what a progress line repeats
        self._said_at = 0.0  # when STATUS was last sent
        self._step_said: tuple[int, str] | None = None  # (step, its note) the last STATUS stood for
        self._step_seen: tuple[int, str] | None = None  # the trainer's latest, as `progress` was last told
        self._dropped_said = False  # a send dropped for a socket no one reads, said once

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)  # a socket whose reader does not read (any user may bind "@name") would
                sock.connect(self.address)  # hang the supervisor's loop, its watchdog with it: dropped instead
                sock.send("\n".join(fields).encode())
            return True
        except BlockingIOError:
            if not self._dropped_said:
                self._dropped_said = True
                print(f"minilmd: the notify socket {self.address!r} is not read (its queue full): systemd "
                      f"notifications are dropped while it stays so", file=sys.stderr)
            return False
        except OSError:
            return False  # systemd gone or socket not ours: never let the notifier stop the supervisor

    def ready(self, status: str = "") -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def phase(self, run: str, phase: str, reason: str) -> None:
        """A phase change: STATUS at once, with its reason (`run: training (first heartbeat ...)`)."""
        self._head = f"{run}: {phase}"
        self._said_at, self._step_said = time.monotonic(), self._step_seen
        self.status(f"{self._head} ({reason})"[:STATUS_MAX_CHARS])

    def progress(self, step: object, total: object = None, loss: object = None, note: str = "") -> None:
        """Call every tick with the trainer's latest step (metrics.jsonl and its heartbeat, untrusted: anything but
        an int is no step) and what it does instead of steps, in words (`note`: a DPO run's reference pass, which
        comes before step 1 and may take hours: before, STATUS said `step 0` all along): STATUS `run: phase, step
        S/T, loss L`, or `run: phase, NOTE`, when what it stands for differs from the last STATUS's, at most every
        PROGRESS_EVERY_S. A phase where the trainer does not advance (backoff, waiting_gpu) keeps its line with the
        reason."""
        if not isinstance(step, int) or isinstance(step, bool):
            return
        self._step_seen = (step, note)
        if not self.address or not self._head or self._step_seen == self._step_said:
            return
        t = time.monotonic()
        if t - self._said_at < PROGRESS_EVERY_S:
            return
        self._said_at, self._step_said = t, self._step_seen
        if note:
            self.status(f"{self._head}, {note}"[:STATUS_MAX_CHARS])
            return
        of = f"/{total}" if isinstance(total, int) and not isinstance(total, bool) else ""
        lossy = f", loss {loss:.4g}" if isinstance(loss, float) else ""
        self.status(f"{self._head}, step {step}{of}{lossy}"[:STATUS_MAX_CHARS])

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
