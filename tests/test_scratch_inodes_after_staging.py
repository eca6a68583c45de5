"""Another user takes scratch's last inodes after staging (hostile9 F2): a start is waited for, never ended for good.

Before, with the scratch's tmpfs left without an inode once the corpus was staged, the trainer could not make its
`trainer.lock` and exited 2, which the supervisor recorded as "config error, final" with advice to move away a file
that did not exist; and a launch that could not make the compile caches in scratch was said to be a full run.dir
(exit 73, final, "free space in" the user's home). A teammate who leaves exactly the inodes staging takes ended an
unattended run for good. Now both are scratch full (fsio.is_disk_full, the one rule; inodes or bytes): the run
waits in `waiting_space`, its reason names what is used up and whose entries fill the file system, and once the
files are gone it trains to its end. Staging itself also wants the inodes the start after it needs
(scratch_room.START_INODES) free, and waits for them ("no room in scratch"), so a count that fits staging alone
waits there instead.

Real processes on a real tmpfs with nr_inodes set (tmpfs_helpers; skipped where mounting is refused); the teammate's
files chowned to a real uid (64123) by the test (root), made by a trainer command that runs before the trainer
(tests/inode_taker.py: the racing teammate, without the race).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from minilmd import names, trainer_lock
from minilmd.daemon.base.runstate import load_state
from supervisor_helpers import events, start_supervisor, wait_or_kill, write_config
from tmpfs_helpers import OTHER, fill_inodes

TAKER = Path(__file__).with_name("inode_taker.py")


def scratch_base(small_tmpfs, monkeypatch, inodes: int) -> Path:
    where = small_tmpfs("128m", f"nr_inodes={inodes},mode=1777")
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(where))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return where


def phase_of(run_dir: Path) -> dict:
    try:
        return load_state(run_dir)
    except Exception:  # noqa: BLE001 - not written yet
        return {}


def wait_for_phase(run_dir: Path, phase: str, proc, log: Path, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while phase_of(run_dir).get("phase") != phase and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    state = phase_of(run_dir)
    assert state.get("phase") == phase, log.read_text()[-4000:]
    return state


def taken(base: Path) -> list[Path]:
    return [p for p in base.iterdir() if p.lstat().st_uid == OTHER]


def run_until_freed(config: Path, base: Path, tmp_path: Path, phase: str, fake: bool, **env) -> tuple[dict, str]:
    """A real `minilmd run`: once its state.json says `phase`, the teammate's files are removed; it must then end
    0. (the state seen while it waited, the launch's output)"""
    run_dir = tmp_path / "s" / "run"
    log = tmp_path / "run.out"
    proc = start_supervisor(config, log, fake=fake, **env)
    try:
        seen = wait_for_phase(run_dir, phase, proc, log)
        files = taken(base)
        assert files, "the teammate's files"
        for path in files:  # he (or an admin) removes them
            path.unlink()
        assert wait_or_kill(proc, 300) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return seen, log.read_text()


def taker_env(tmp_path: Path, base: Path, mode: str, then: str) -> dict:
    return {names.TRAINER_CMD_ENV: f"{sys.executable} {TAKER}", "TAKER_MARKER": str(tmp_path / "taken"),
            "TAKER_BASE": str(base), "TAKER_UID": str(OTHER), "TAKER_MODE": mode, "TAKER_THEN": then}


def assert_waited_for_his_files(seen: dict, out: str, run_dir: Path) -> None:
    reason = seen["reason"]
    assert reason.startswith("scratch full: waiting for space") and "no inode left" in reason, reason
    assert f"uid {OTHER}" in reason, reason  # whose entries fill it
    done = load_state(run_dir)
    assert (done["phase"], done["outcome"]["ended"]) == ("done", "finished"), done
    said = "\n".join(json.dumps(e) for e in events(run_dir))
    assert "config error" not in said and "run.dir is full" not in said and "move it away" not in said, said
    assert any(e.get("transition") == "space_freed" for e in events(run_dir)), said


@pytest.mark.slow
def test_no_inode_for_the_trainer_lock_is_waited_for_then_the_run_finishes(small_tmpfs, tmp_path, corpus,
                                                                           monkeypatch):
    """The real trainer finds no inode for its trainer.lock (his files took the last ones after staging): exit 74,
    waiting_space naming the inodes and his uid; his files removed, it trains to its end. Before: exit 2, failed,
    "config error, final ... move it away"."""
    base = scratch_base(small_tmpfs, monkeypatch, 512)
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""},
                          train={"max_steps": 4, "checkpoint_every": 2})
    seen, out = run_until_freed(config, base, tmp_path, "waiting_space", fake=False,
                                **taker_env(tmp_path, base, "lock", "real"))
    run_dir = tmp_path / "s" / "run"
    assert_waited_for_his_files(seen, out, run_dir)
    exits = [(e["cause"], e["exit"]) for e in events(run_dir) if e["event"] == "child_exit"]
    assert exits == [("scratch_full", 74), ("done", 0)], exits
    first = next(e["message"] for e in events(run_dir) if e["event"] == "child_exit")
    assert "scratch full: trainer.lock cannot be made" in first and "no inode left" in first, first


@pytest.mark.slow
def test_no_inode_for_the_compile_caches_is_scratch_full_never_run_dir_full(small_tmpfs, tmp_path, corpus,
                                                                            monkeypatch):
    """The launch cannot make the run's compile caches in scratch (no inode left, his files): waiting_space, never
    "run.dir is full" (exit 73, final, advice to free space in run.dir's file system, which had room)."""
    base = scratch_base(small_tmpfs, monkeypatch, 512)
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    seen, out = run_until_freed(config, base, tmp_path, "waiting_space", fake=True,
                                **taker_env(tmp_path, base, "cache", "fake"))
    assert "cannot make its compile caches" in json.dumps(events(tmp_path / "s" / "run")), out[-3000:]
    assert_waited_for_his_files(seen, out, tmp_path / "s" / "run")


@pytest.mark.slow
def test_staging_waits_for_the_inodes_the_start_after_it_needs(small_tmpfs, tmp_path, corpus, monkeypatch):
    """His files leave the inodes staging takes and a few more, not those of the trainer's start: staging waits
    ("no room in scratch", naming the inodes and his uid) instead of a start that cannot make its files; removed,
    the run finishes. Before, staging went on, its own record found no inode, and that failure counted: failed,
    79 after restart.no_progress_limit tries (with an inode or two more, the launch's compile caches: 73)."""
    base = scratch_base(small_tmpfs, monkeypatch, 512)
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    files = fill_inodes(base)
    for path in files[:12]:  # the corpus's files, its directories, scratch's own records, and 2 more
        path.unlink()
    run_dir = tmp_path / "s" / "run"
    log = tmp_path / "run.out"
    proc = start_supervisor(config, log)
    try:
        deadline = time.monotonic() + 240
        while "no room in scratch" not in json.dumps(phase_of(run_dir)) and proc.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        seen = phase_of(run_dir)
        assert seen.get("phase") == "staging" and "no room in scratch" in json.dumps(seen), log.read_text()[-4000:]
        for path in taken(base):
            path.unlink()
        assert wait_or_kill(proc, 300) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = json.dumps(seen)
    assert "inodes" in said and "for the trainer's start" in said and f"uid {OTHER}" in said, said
    assert (load_state(run_dir)["outcome"]["ended"]) == "finished"


def test_the_lock_without_room_is_no_refusal(small_tmpfs, tmp_path):
    """trainer_lock.hold on a scratch whose file system has no inode left: TrainerLockNoRoom (exit 74, waited for),
    naming the inodes and whose entries fill it; never TrainerLockRefused (exit 2) with 'move it away'."""
    base = small_tmpfs("16m", "nr_inodes=16,mode=1777")
    scratch = base / "scratch"
    scratch.mkdir(mode=0o700)
    fill_inodes(base)
    with pytest.raises(trainer_lock.TrainerLockNoRoom) as raised:
        trainer_lock.hold(scratch, tmp_path / "run", supervised=True)
    said = str(raised.value)
    assert not isinstance(raised.value, trainer_lock.TrainerLockRefused)
    assert said.startswith("scratch full:") and "no inode left" in said and f"uid {OTHER}" in said, said
    assert "move it away" not in said and not os.path.lexists(scratch / names.TRAINER_LOCK)
    assert "No space left on device" in said
