"""Which processes are this run's: the trainer record (<run dir>/trainer.json: pid, start time, uid, host, launch
id) and the orphan hunt. A restarted supervisor and `minilmd stop` signal only processes of our uid on this host that
carry this run's directory and launch id and started no earlier than the recorded trainer, one by one. Anyone can put
MINILMD_RUN_DIR in an environment; nobody else's process is ever signalled, even by root. Torch-free."""
from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from pathlib import Path

from minilmd import names
from minilmd.daemon.runstate import process_alive, process_environ, process_start_ticks
from minilmd.fsio import atomic_write_json
from minilmd.perms import own_uid
from minilmd.untrusted import Unreadable, read_json

REAP_S = 10.0
TRAINER_RECORD_MAX_BYTES = 64 << 10
"""trainer.json is a few hundred bytes."""
"""After SIGKILL, how long kill_group waits for the kernel to let the process go before it gives up on reaping it."""


# --- which processes are this run's -------------------------------------------------------------------------

def record_launch(run_dir: Path, attempt: int, launch_id: str | None = None, pid: int | None = None,
                  start_ticks: int | None = None) -> str:
    """Write trainer.json: written once before the launch (a supervisor killed during Popen still leaves the launch
    id, uid and host) and again with the trainer's pid and start time. Returns the launch id."""
    launch_id = launch_id or secrets.token_hex(16)
    atomic_write_json(run_dir / names.TRAINER_RECORD,
                      {"launch_id": launch_id, "uid": os.getuid(), "host": socket.gethostname(), "attempt": attempt,
                       "pid": pid, "start_ticks": start_ticks, "time": time.time()})
    return launch_id


def _read_record(run_dir: Path) -> dict | None:
    """trainer.json if it names a trainer that this user launched on this host, else None."""
    try:  # a regular file of ours only (minilmd/untrusted.py): never a FIFO or a link to /dev/zero read whole
        record = read_json(run_dir / names.TRAINER_RECORD, max_bytes=TRAINER_RECORD_MAX_BYTES, owner=own_uid())
    except Unreadable:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("launch_id"), str) or not record["launch_id"]:
        return None
    if record.get("uid") != os.getuid() or record.get("host") != socket.gethostname():  # as record_launch wrote it
        return None
    return record


def process_uids(pid: int) -> tuple[int, ...] | None:
    """(real, effective, saved, filesystem) uids of a process, from /proc/PID/status; None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return tuple(int(u) for u in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


def is_ours(pid: int) -> bool:
    """Whether every uid of the process is ours: a process of another user is never signalled, even by root."""
    # The real uid, not perms.own_uid() (the effective one, which owns what we create): a process belongs to the
    # user it acts for, its real uid, and kill(2) compares with the target's real and saved uids. The two are one
    # where minilmd runs; where they differ, no process we started has every uid equal to the real one, so none is
    # signalled: the safe side.
    uids = process_uids(pid)
    return uids is not None and set(uids) == {os.getuid()}


def _orphans(run_dir: Path) -> list[tuple[int, int]]:
    """(pid, start ticks) of each live process of the recorded trainer: ours, carrying this run's directory and the
    recorded launch id, started no earlier than the trainer (the trainer itself: its pid and start time)."""
    record = _read_record(run_dir)
    if record is None:
        return []
    return launch_processes(run_dir, record["launch_id"], record.get("pid"), record.get("start_ticks"))


def launch_processes(run_dir: Path, launch_id: str, leader: object = None,
                     leader_ticks: object = None) -> list[tuple[int, int]]:
    """(pid, start ticks) of each live process of ours that carries this run's directory and `launch_id`, started
    no earlier than the trainer (`leader`, started at `leader_ticks`, when known)."""
    target = str(run_dir.resolve())
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        ticks = process_start_ticks(pid)
        if ticks is None or not is_ours(pid):
            continue
        if isinstance(leader_ticks, int) and (ticks < leader_ticks or (pid == leader and ticks != leader_ticks)):
            continue
        env = process_environ(pid)
        if env.get(names.RUN_DIR_ENV) != target or env.get(names.LAUNCH_ID_ENV) != launch_id:
            continue
        if process_start_ticks(pid) == ticks:  # still the process all of the above was read from
            found.append((pid, ticks))
    return sorted(found)


def find_orphans(run_dir: Path) -> list[int]:
    """Pids of live processes of the trainer this run launched last (trainer.json), other than us: the trainer and
    what it started. Never another user's process, nor one that merely carries MINILMD_RUN_DIR=<run dir>."""
    return [pid for pid, _ in _orphans(run_dir)]


def terminate_orphans(run_dir: Path, grace: float = 30.0, while_waiting=None) -> list[int]:
    """SIGTERM each process of find_orphans(run_dir) (the trainer saves and exits), then SIGKILL what is left after
    grace, and whatever of the trainer's appeared meanwhile. They are not our children (their parent died), so we
    poll /proc instead of waiting. Each process is signalled by itself, through a pidfd opened and checked against
    its start time first: never a recycled pid, never a whole group that may hold another user's process. The grace
    can outlast systemd's WatchdogSec: `while_waiting()` is called at every poll (the supervisor pings the watchdog
    there). Returns the pids that were alive."""
    alive = _orphans(run_dir)
    for pid, ticks in alive:
        signal_process(pid, ticks, signal.SIGTERM)
    _poll_until_gone(alive, grace, 0.1, while_waiting)
    late = [p for p in _orphans(run_dir) if p not in alive]
    for pid, ticks in [*alive, *late]:
        if process_alive(pid, ticks):
            signal_process(pid, ticks, signal.SIGKILL)
    _poll_until_gone([*alive, *late], REAP_S, 0.05, while_waiting)
    return [pid for pid, _ in alive]


def _poll_until_gone(alive: list[tuple[int, int]], seconds: float, interval: float, while_waiting) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(process_alive(p, t) for p, t in alive):
        if while_waiting is not None:
            while_waiting()
        time.sleep(interval)


def signal_process(pid: int, ticks: int | None, sig: int) -> bool:
    """Signal the process `pid` that started at `ticks` (None: whichever has that pid now), if it is still that one
    and ours: through a pidfd opened before the check, so that a pid recycled in between is never hit. Whether the
    signal was sent."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        fd = None  # no pidfd here (a kernel before 5.3): a check and a kill, with the tiny window that leaves
    try:
        if (ticks is not None and process_start_ticks(pid) != ticks) or not is_ours(pid):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)
