"""A trainer held still by tests/pausing_trainer.py (pause@N, hold@N), read from /proc: whether it is stopped,
whether a signal waits for it, and where it is when the supervisor does not know its pid (a rank under srun and
torchrun, in another process tree)."""
from __future__ import annotations

import os
from pathlib import Path

from minilmd.names import FAULTS_FIRED, RUN_CONFIG_COPY

PAUSING_TRAINER = Path(__file__).with_name("pausing_trainer.py")


def proc_state(pid: int) -> str:
    """R, S, T (stopped), Z, ...; "" for a process that is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def pending(pid: int, sig: int) -> bool:
    """Whether signal `sig` waits to be delivered to the (stopped) process: in its own or its group's pending set."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    masks = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask >> (sig - 1) & 1 for mask in masks)


def fired(run_dir: Path, fault: str) -> bool:
    """Whether the run's trainer has fired `fault` (kind@step): trainer/loop/faults.py records it first."""
    try:
        return fault in (run_dir / FAULTS_FIRED).read_text().split()
    except FileNotFoundError:
        return False


def held_trainer(run_dir: Path) -> int | None:
    """The pid of the pausing trainer of `run_dir` that is stopped now, wherever it was started (its command line:
    pausing_trainer.py itself, then `train` and the run's copy of its config); None when there is none."""
    config = str(run_dir / RUN_CONFIG_COPY)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv[1:2] == [str(PAUSING_TRAINER)] and config in argv and proc_state(int(entry)) == "T":
            return int(entry)
    return None


def held_at(run_dir: Path, fault: str, timeout: float = 300) -> int:
    """Wait until the run's trainer, the one its supervisor's state.json names, has stopped itself at `fault`
    (pausing_trainer.py's pause@N); its pid."""
    from supervisor_helpers import state, wait_for

    def stopped() -> int | None:
        pid = (state(run_dir).get("child") or {}).get("pid")
        return pid if fired(run_dir, fault) and pid and proc_state(pid) == "T" else None
    return wait_for(stopped, timeout, f"the trainer held at {fault}")
