"""A trainer.lock left in a scratch without an owner marker (a trainer launched by hand into it, which made the
scratch and its lock but no owner.json) is no stranger's file to a later claim of that scratch: a regular file of
this user's that no process holds now (its trainer gone: the kernel let the flock go) is passed over by the
adoption rule (minilmd/scratch.py, trainer_lock.left_unheld); one still held, or another user's, is still refused.
Real processes hold and let go of the lock."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

from minilmd import lockfile, names, trainer_lock
from minilmd.scratch import ScratchRefused, claim, read_owner


def hand_trainer(scratch, run_dir) -> subprocess.Popen:
    """A process that takes the trainer lock as a trainer launched without a claim does (hold() makes the scratch),
    holding it until its stdin closes; returns once it holds it."""
    code = ("import sys; from pathlib import Path; from minilmd import trainer_lock; "
            f"trainer_lock.hold(Path({str(scratch)!r}), Path({str(run_dir)!r}), False); "
            "print('held', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_lock_left_by_an_ended_hand_trainer_does_not_block_a_later_claim(tmp_path):
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    trainer = hand_trainer(scratch, run_dir)
    trainer.stdin.close()
    assert trainer.wait(60) == 0
    assert sorted(os.listdir(scratch)) == [names.TRAINER_LOCK]  # no owner marker: the trainer claimed nothing
    claim(scratch, run_dir, "run", is_default=False)  # before: "already holds files (trainer.lock)"
    assert read_owner(scratch)["run_dir"] == str(run_dir.resolve())
    assert (scratch / names.TRAINER_LOCK).exists()  # left where it was: not the claim's to delete
    trainer_lock.hold(scratch, run_dir, supervised=False)  # and usable as the run's lock
    trainer_lock.release_all()


def test_a_lock_held_by_a_live_trainer_still_refuses_the_claim(tmp_path):
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    trainer = hand_trainer(scratch, run_dir)
    try:
        with pytest.raises(ScratchRefused, match=f"already holds files \\({names.TRAINER_LOCK}\\)"):
            claim(scratch, run_dir, "run", is_default=False)
    finally:
        trainer.stdin.close()
        trainer.wait(60)
    assert read_owner(scratch) is None


def test_a_lock_of_another_user_still_refuses_the_claim(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user takes root")
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    trainer = hand_trainer(scratch, run_dir)
    trainer.stdin.close()
    assert trainer.wait(60) == 0
    os.chown(scratch / names.TRAINER_LOCK, 64123, 64123)  # no holder, but not this user's
    with pytest.raises(ScratchRefused, match=f"already holds files \\({names.TRAINER_LOCK}\\)"):
        claim(scratch, run_dir, "run", is_default=False)
    assert read_owner(scratch) is None


def test_a_link_named_trainer_lock_still_refuses_the_claim(tmp_path):
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    scratch.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    os.symlink(victim, scratch / names.TRAINER_LOCK)
    with pytest.raises(ScratchRefused, match="already holds files"):
        claim(scratch, run_dir, "run", is_default=False)
    assert victim.read_text() == "mine\n"


def test_an_unheld_lock_beside_other_files_is_not_named_as_theirs(tmp_path):
    """Adoption is still of an empty scratch only: a left lock is passed over, the rest refuses it as before."""
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    trainer = hand_trainer(scratch, run_dir)
    trainer.stdin.close()
    trainer.wait(60)
    (scratch / "corpus").mkdir()
    with pytest.raises(ScratchRefused, match="already holds files \\(corpus\\) and no owner.json"):
        claim(scratch, run_dir, "run", is_default=False)


def test_a_trainer_meeting_the_unheld_probe_tries_again_and_is_not_refused(tmp_path, monkeypatch):
    """review11a F3: left_unheld's shared probe, taken in the instant a trainer outside torchrun tries the lock,
    made it refuse for good (exit 2) naming the ended trainer's dead pid. A lock held by nobody alive is tried again."""
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    trainer = hand_trainer(scratch, run_dir)
    trainer.stdin.close()
    assert trainer.wait(60) == 0  # its body names its pid, dead now
    probe = os.open(scratch / names.TRAINER_LOCK, os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH)  # the probe's instant
    read_holder = trainer_lock.holder

    def holder_then_probe_ends(dir_fd):  # the trainer's first try has met the probe: the probe lets go now
        os.close(probe) if not probe_closed else None
        probe_closed.append(True)
        return read_holder(dir_fd)

    probe_closed: list[bool] = []
    monkeypatch.setattr(trainer_lock, "holder", holder_then_probe_ends)
    try:
        trainer_lock.hold(scratch, run_dir, supervised=False)  # before: TrainerLockHeld, retried=False
        assert probe_closed and len(trainer_lock._held) == 1
    finally:
        trainer_lock.release_all()
        if not probe_closed:
            os.close(probe)


def test_a_waiting_rank_0_whose_flock_fails_holds_nothing_and_leaves_the_holders_words(tmp_path, monkeypatch):
    """review11c F2: a blocked flock that ends in an error (ENOLCK on a network file system) was taken as granted:
    the descriptor recorded as held with no lock, the real holder's words in trainer.lock overwritten."""
    import errno

    lock = tmp_path / "trainer.lock"
    lock.write_bytes(b'{"pid": 1234}')
    fd = os.open(lock, os.O_RDWR)
    waiter = trainer_lock._Waiter(fd)
    with trainer_lock._waiting_lock:
        trainer_lock._waiting.append(waiter)

    def no_lock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lockfile.fcntl, "flock", no_lock)  # the one caller of flock (minilmd/lockfile.py)
    waiter.take(b'{"pid": 99}')
    assert fd not in trainer_lock._held and waiter not in trainer_lock._waiting
    assert lock.read_bytes() == b'{"pid": 1234}'
    with pytest.raises(OSError):
        os.fstat(fd)  # closed, not kept
