"""A trainer command for the OOM test: join a cgroup v1 memory group, then run the fake trainer in this process.

    MINILMD_TRAINER_CMD="python tests/reliability_oom_wrapper.py CGROUP_DIR MARKER tests/fake_trainer.py"

The supervisor appends `train CONFIG --set ...`. Once per run (MARKER absent), once the supervisor has surely seen
this process in the group, a thread allocates memory until the kernel's OOM killer kills the process: a real
memory-cgroup OOM kill of the trainer, which the supervisor must classify as such from the group's counter (not as
a generic crash or SIGKILL, and not from the kernel log).

"Surely seen": each supervisor tick reads the child's cgroup, then the trainer's progress. A step in state.json that
this process wrote after joining the group may still have been read in a tick whose cgroup read came before the
join (a supervisor descheduled on a loaded machine), so the hog waits for state.json to show a step of at least 3,
then for a larger one: that one was read by a later tick, whose cgroup read came after the first read, which came
after the join.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path


def supervisor_step(run_dir: Path) -> int:
    try:
        return (json.loads((run_dir / "state.json").read_text()).get("progress") or {}).get("step") or 0
    except (FileNotFoundError, ValueError):
        return 0


def hog(run_dir: Path, marker: Path) -> None:
    while (seen := supervisor_step(run_dir)) < 3:
        time.sleep(0.05)
    while supervisor_step(run_dir) <= seen:
        time.sleep(0.05)
    marker.write_text(str(os.getpid()))
    chunks = []
    while True:  # ends with SIGKILL from the OOM killer
        chunks.append(bytearray(8 << 20))  # zero-filled: every page is touched


def main() -> None:
    cgroup, marker, script = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    (cgroup / "cgroup.procs").write_text("0\n")
    if not marker.exists():
        threading.Thread(target=hog, args=(Path(os.environ["MINILMD_RUN_DIR"]), marker), daemon=True).start()
    sys.argv = [script, *sys.argv[4:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
