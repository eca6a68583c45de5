"""Which processes are this run's: the trainer record (<run dir>/trainer.json: pid, start time, boot, uid, host, launch
id) and the orphan hunt. A restarted supervisor and `minilmd stop` signal only processes of the run directory's owner on
this host that carry this run's directory and launch id and started no earlier than the recorded trainer, one by one,
and only for the owner or root (minilmd/procs.py `Launch`: the one way to signal). Anyone can put MINILMD_RUN_DIR in an
environment; no other user's process is ever signalled, even by root. Torch-free."""
from __future__ import annotations

import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from minilmd import names, procs, pychild
from minilmd.fsio import atomic_write_json
from minilmd.perms import signal_uid
from minilmd.proc_info import boot_id, of_another_boot, recorded_boot
from minilmd.procs import process_alive
from minilmd.untrusted import Unreadable, read_json

Run = Path | procs.RunScope
"""A run directory by its path, or the scope of one a view judged and holds open (procs.scope_at: its trainer
record read through its descriptor)."""
REAP_S = 10.0
"""After SIGKILL, how long kill_group waits for the kernel to let the process go before it gives up on reaping it."""


# --- which processes are this run's -------------------------------------------------------------------------

def record_launch(run_dir: Path, attempt: int, launch_id: str | None = None, pid: int | None = None,
                  start_ticks: int | None = None) -> str:
    """Write trainer.json: written once before the launch (a supervisor killed during Popen still leaves the launch
    id, uid and host) and again with the trainer's pid and start time. Returns the launch id. It records this boot
    (proc_info.boot_id): after a restart of the machine it names no process of the new boot."""
    launch_id = launch_id or secrets.token_hex(16)
    atomic_write_json(run_dir / names.TRAINER_RECORD,
                      {"launch_id": launch_id, "uid": signal_uid(), "host": socket.gethostname(), "attempt": attempt,
                       "pid": pid, "start_ticks": start_ticks, "boot": boot_id(), "time": time.time()})
    return launch_id


def _read_record(scope: procs.RunScope) -> dict | None:
    """trainer.json if it names a trainer the run directory's owner launched on this host in this boot (a record
    without a boot id, an older minilmd's, is taken as this boot's), else None: a record of another boot names no
    process that runs now, whatever has its pid and start time (a service started at boot gets much the same)."""
    try:  # a regular file of the owner's only (minilmd/untrusted.py): never a FIFO or a link to /dev/zero read whole
        record = read_json(scope.run_dir / names.TRAINER_RECORD if scope.dir_fd is None else names.TRAINER_RECORD,
                           max_bytes=names.TRAINER_RECORD_MAX_BYTES, owner=scope.owner, dir_fd=scope.dir_fd)
    except Unreadable:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("launch_id"), str) or not record["launch_id"]:
        return None
    if record.get("uid") != scope.owner or record.get("host") != socket.gethostname():  # as record_launch wrote it
        return None
    if of_another_boot(recorded_boot(record.get("boot"))):
        return None
    return record


def recorded_launch(run_dir: Run) -> procs.Launch | None:
    """The trainer launch trainer.json records, when the caller may signal this run's processes (its own run, or
    root); None otherwise."""
    # None: not ours (nor root), or a link on it now (said once)
    scope = run_dir if isinstance(run_dir, procs.RunScope) else procs.scope_or_none(run_dir)
    if scope is None:
        return None
    record = _read_record(scope)
    if record is None:
        return None
    leader, ticks = record.get("pid"), record.get("start_ticks")
    return procs.Launch(scope, record["launch_id"], leader if isinstance(leader, int) else None,
                        ticks if isinstance(ticks, int) else None)


def launched_at(run_dir: Path) -> float | None:
    """When the trainer trainer.json records was launched (its record's time: written again once it runs), for
    saying what stopping it loses; None when the record is not one this caller may act on."""
    scope = procs.scope_or_none(run_dir)
    record = _read_record(scope) if scope is not None else None
    when = record.get("time") if record is not None else None
    return float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None


def _orphans(run_dir: Run) -> tuple[procs.Launch | None, list[tuple[int, int]]]:
    """The recorded launch and (pid, start ticks) of each of its live processes: the owner's, carrying this run's
    directory and the recorded launch id, started no earlier than the trainer."""
    launch = recorded_launch(run_dir)
    return launch, launch.processes() if launch is not None else []


def find_orphans(run_dir: Run) -> list[int]:
    """Pids of live processes of the trainer this run launched last (trainer.json), other than us: the trainer and
    what it started. Never another user's process, nor one that merely carries MINILMD_RUN_DIR=<run dir>."""
    return [pid for pid, _ in _orphans(run_dir)[1]]


def terminate_orphans(run_dir: Run, grace: float, while_waiting=None) -> list[int]:
    """SIGTERM each process of find_orphans(run_dir) (the trainer saves and exits), then SIGKILL what is left after
    grace, and whatever of the trainer's appeared meanwhile. They are not our children (their parent died), so we
    poll /proc instead of waiting. Each process is signalled by itself, through a pidfd opened and checked against
    its start time first: never a recycled pid, never a whole group that may hold another user's process. The grace
    can outlast systemd's WatchdogSec: `while_waiting()` is called at every poll (the supervisor pings the watchdog
    there). Returns the pids that were alive."""
    launch, alive = sigterm_orphans(run_dir)
    if launch is None:
        return []
    procs.wait_gone(alive, grace, while_waiting, interval=0.1)
    _kill_what_is_left(launch, alive, while_waiting)
    return [pid for pid, _ in alive]


def sigterm_orphans(run_dir: Run) -> tuple[procs.Launch | None, list[tuple[int, int]]]:
    """terminate_orphans' first half, for `minilmd stop --timeout` (which may not wait the whole grace): SIGTERM
    each orphan; the recorded launch and (pid, start ticks) of each."""
    launch, alive = _orphans(run_dir)
    if launch is None:
        return None, []
    for pid, ticks in alive:
        launch.signal(pid, ticks, signal.SIGTERM)
    return launch, alive


def kill_orphans_after(run_dir: Path, launch_id: str, seconds: float) -> None:
    """terminate_orphans' second half, in the helper `minilmd stop --timeout` leaves behind (`main`): SIGKILL what
    is left of launch `launch_id` after `seconds`. Nothing when trainer.json records another launch by then (a
    start by hand has launched a trainer of its own, and its orphan hunt deals with the old one): never the new
    one."""
    launch, alive = _orphans(run_dir)
    if launch is None or launch.launch_id != launch_id:
        return
    procs.wait_gone(alive, seconds, interval=0.5)
    _kill_what_is_left(launch, alive, None)


def _kill_what_is_left(launch: procs.Launch, alive: list[tuple[int, int]], while_waiting) -> None:
    late = [p for p in launch.processes() if p not in alive]
    for pid, ticks in [*alive, *late]:
        if process_alive(pid, ticks):
            launch.signal(pid, ticks, signal.SIGKILL)
    procs.wait_gone([*alive, *late], REAP_S, while_waiting)


def hand_over_kill(launch: procs.Launch, seconds: float) -> int:
    """Start the detached helper that SIGKILLs what is left of that launch after `seconds` (kill_orphans_after):
    a session of its own, no terminal, so `stop` may exit before the grace ends and a closed terminal does not end
    the helper. It gets the run directory as the launch's scope resolved it (absolute: it runs in "/"). Its pid."""
    argv = [str(launch.scope.run_dir), launch.launch_id, f"{seconds:.1f}"]
    helper = pychild.popen(pychild.module_argv(__name__, *argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    return helper.pid


def main(argv: list[str]) -> int:
    """`python -m minilmd.daemon.child.orphans RUN_DIR LAUNCH_ID SECONDS`: hand_over_kill's helper."""
    run_dir, launch_id, seconds = argv
    kill_orphans_after(Path(run_dir), launch_id, float(seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
