"""A trainer command for the OOM test: join a cgroup v1 memory group, then run the fake trainer in this process.

    MINILMD_TRAINER_CMD="python tests/reliability_oom_wrapper.py CGROUP_DIR MARKER tests/fake_trainer.py"

The supervisor appends `train CONFIG --set ...`. Once per run (MARKER absent), when the trainer's heartbeat shows
step 3, a thread allocates memory until the kernel's OOM killer kills the process: a real memory-cgroup OOM kill of
the trainer, which the supervisor must classify as such (not as a generic crash or SIGKILL).
"""
from __future__ import annotations

import os
import runpy
import sys
import threading
import time
from pathlib import Path


def hog(run_dir: Path, marker: Path) -> None:
    while True:
        try:
            if int((run_dir / "heartbeat").read_text() or 0) >= 3:
                break
        except (FileNotFoundError, ValueError):
            pass
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
