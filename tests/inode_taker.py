"""A trainer command for the tests of a scratch whose inodes another user takes after staging
(tests/test_scratch_inodes_after_staging.py): the racing teammate of hostile9 F2, made deterministic.

    MINILMD_TRAINER_CMD="python tests/inode_taker.py"  (the supervisor appends `train CONFIG --set ...`)

At its first start only (TAKER_MARKER does not exist yet), before anything of the trainer runs, it makes empty files
in TAKER_BASE (the scratch's tmpfs) until no inode is left, each chowned to uid TAKER_UID (another user's; the test
runs as root), and writes TAKER_MARKER (outside the tmpfs). Then, with TAKER_MODE:
- "lock": it goes on as the real trainer (`python -m minilmd.cli train ...`), whose first file in scratch is its
  trainer.lock;
- "cache": it removes the run's compile caches (the launch's next attempt makes them again) and exits 1, a crash:
  the supervisor's next launch finds no room for them.
Every later start is the trainer TAKER_THEN names ("real", or "fake": tests/fake_trainer.py) at once.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from minilmd.names import COMPILE_CACHE


def take_every_inode(base: Path, uid: int) -> int:
    made = 0
    while True:
        path = base / f".taken{made}"
        try:
            path.touch()
        except OSError:
            return made
        os.chown(path, uid, uid)
        made += 1


def scratch_of(argv: list[str]) -> Path:
    for i, arg in enumerate(argv):
        if arg == "--set" and argv[i + 1].startswith("run.scratch="):
            return Path(argv[i + 1].split("=", 1)[1].strip("'\""))
    raise SystemExit("inode_taker: no run.scratch on the command line")


def main() -> None:
    argv = sys.argv[1:]
    marker = Path(os.environ["TAKER_MARKER"])
    mode = os.environ.get("TAKER_MODE", "lock")
    if not marker.exists():
        if mode == "cache":
            shutil.rmtree(scratch_of(argv) / COMPILE_CACHE)
        made = take_every_inode(Path(os.environ["TAKER_BASE"]), int(os.environ["TAKER_UID"]))
        marker.write_text(f"{made}\n")
        print(f"inode_taker: {made} files of uid {os.environ['TAKER_UID']} took every inode left", flush=True)
        if mode == "cache":
            sys.exit(1)
    if os.environ.get("TAKER_THEN", "real") == "fake":
        command = [sys.executable, str(Path(__file__).with_name("fake_trainer.py")), *argv]
    else:
        command = [sys.executable, "-m", "minilmd.cli", *argv]
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
