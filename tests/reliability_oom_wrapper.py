"""A trainer command for the OOM test: join a cgroup v1 memory group, then run the fake trainer in this process.

    MINILMD_TRAINER_CMD="python tests/reliability_oom_wrapper.py CGROUP_DIR MARKER tests/fake_trainer.py"

The supervisor appends `train CONFIG --set ...`. Once per run (MARKER absent), when the supervisor's state.json
shows step 3, a thread allocates memory until the kernel's OOM killer kills the process: a real memory-cgroup OOM
kill of the trainer, which the supervisor must classify as such (not as a generic crash or SIGKILL). The supervisor
reads the child's cgroup on each tick before it reads the trainer's progress, so once state.json shows step 3 it
knows this group (the trainer's own heartbeat alone can run ahead of a supervisor slowed by a loaded machine, and
the kill is then classified from the kernel log instead).
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
    while supervisor_step(run_dir) < 3:
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
