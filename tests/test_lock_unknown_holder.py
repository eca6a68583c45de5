"""A run lock held by a process whose user cannot be read (minilmd/lockfile.py, daemon/host/lock.py).

- A start that narrowed an old wide (0644) lock file and died before replacing it left a 0600 file: its note that the
  file was wide (lockfile._found_wide) died with it, so such a holder refuses every later start as a real one. The
  refusal now names the way out (move the lock file away, if no process of the user's holds it); before, it said
  only `minilmd status` and `minilmd stop`, neither of which can prove or end that holder.
- A teammate's `status` under hidepid cannot read the user of the owner's own supervisor: lock_look no longer counts
  such a holder of an old wide lock file as a stranger (before: "nobody holds it", the supervisor not seen).
The holder is a real process; that its user cannot be read (hidepid, or a pid that ended, its lock kept by a child)
is the fake: lockfile's process_uids answers None.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import lockfile, names
from minilmd.daemon.host.lock import LockHeld, RunLock, lock_look

HOLD = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
sys.stdin.read()
"""


class Holder:
    """A real process holding an flock on `path` until stdin closes."""

    def __init__(self, path: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def end(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


def _lock(run_dir: Path, mode: int, body: dict | None = None) -> Path:
    run_dir.mkdir(0o755)
    path = run_dir / names.LOCK
    path.write_text(json.dumps(body or {}))
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("readable", [False, True])
def test_a_run_lock_whose_holders_user_cannot_be_read_names_the_way_out(tmp_path, monkeypatch, readable):
    path = _lock(tmp_path / "run", 0o600)  # narrowed by a start that died before replacing it
    holder = Holder(path)
    if not readable:
        monkeypatch.setattr(lockfile, "process_uids", lambda _pid: None)
    try:
        with pytest.raises(LockHeld) as refused:
            RunLock(tmp_path / "run").acquire()
    finally:
        holder.end()
    said = str(refused.value)
    if readable:  # a holder of the user's own, named: no more words
        assert "mv " not in said, said
    else:
        assert "if no process of yours holds it" in said and f"mv {path} {path}.stale" in said, said


def test_a_teammates_look_under_hidepid_sees_the_owners_supervisor_holding_an_old_wide_lock(tmp_path, monkeypatch):
    path = _lock(tmp_path / "run", 0o644, {"pid": 4321, "host": "h", "since": 1.0})  # an older minilmd's, held
    holder = Holder(path)
    monkeypatch.setattr(lockfile, "process_uids", lambda _pid: None)  # /proc mounted hidepid=2
    try:
        info, free = lock_look(tmp_path / "run")
    finally:
        holder.end()
    assert not free and info is not None and info.pid == 4321, info  # before: (None, False), "nobody holds it"
