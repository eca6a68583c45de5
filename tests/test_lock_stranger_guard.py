"""An older run's wide (0644) lock file held by another user's process is replaced and taken, whatever else that user
holds (hostile11 F1, F4; minilmd/lockfile.py `replace`, `guarded`, `strangers`).

Before: (a) the replacement's guard was an flock on the lock's directory itself, which anyone who can open the
directory can hold: the stranger holding it and the old file refused the run for good ("run already owned by another
supervisor: pid None ..."); (b) a holder whose uid cannot be read was "a real holder": the stranger flocked the file,
forked a child keeping the descriptor and exited, /proc/locks named the dead pid and the run was refused for good,
the stranger never named; (F4) prepare's `OUT.lock` was made 0644 and never narrowed, so one left by a killed prepare
and flocked by the stranger refused every prepare to that --out. Here the stranger is a real process of uid 4242
(no such user: the tests run as root and drop to it before exec); skipped otherwise. A holder of one's own uid still
refuses, as before.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from minilmd import lockfile, names, tmpnames, trainer_lock
from minilmd.corpus.prepare.lock import CorpusLock
from minilmd.daemon.host.lock import LockHeld, RunLock
from minilmd.proc_info import process_uids
from stranger_helpers import NEEDS, PYTHON, STRANGER, as_stranger

HOLD = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
if sys.argv[2] == "dir":  # the directory too: what `replace` guarded itself with
    d = os.open(os.path.dirname(sys.argv[1]), os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(d, fcntl.LOCK_EX | fcntl.LOCK_NB)
if sys.argv[2] == "fork":  # a child keeps the locked descriptor; this process, the one /proc/locks names, ends
    if os.fork() == 0:
        sys.stdin.read()
        os._exit(0)
    print("held", flush=True)
    os._exit(0)
print("held", flush=True)
sys.stdin.read()
"""
"""Run as the stranger (or as us, `ours`): open the file read-only, flock it (and its directory with "dir"; with
"fork", hand the lock to a child and exit), keep it until stdin closes."""


needs_stranger = pytest.mark.skipif(PYTHON is None, reason=NEEDS)


class Holder:
    """A process holding an flock on `path` (HOLD's `how`): the stranger's, or with `ours` one of our own uid."""

    def __init__(self, path: Path, how: str = "", ours: bool = False):
        assert PYTHON is not None
        self.how = how
        self.proc = subprocess.Popen([PYTHON, "-I", "-S", "-c", HOLD, str(path), how], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, preexec_fn=None if ours else as_stranger)
        assert self.proc.stdout.readline().strip() == "held"
        if how == "fork":
            self.proc.wait(timeout=60)  # gone and reaped: its pid, the one /proc/locks names, is no process's

    def reused(self) -> bool:
        """Whether the reaped pid of a "fork" holder is some process's again (a busy machine hands it on): then
        /proc/locks names a process whose user can be read, root's perhaps, and the case is not the one staged."""
        return self.how == "fork" and process_uids(self.proc.pid) is not None

    def end(self) -> None:
        self.proc.stdin.close()  # the child of "fork" shares it: its read ends too
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


@contextlib.contextmanager
def staged(holder: Holder) -> Iterator[None]:
    """The body's failure is a skip, not a flake, when the "fork" holder's reaped pid was reused meanwhile
    (`Holder.reused`: looked at before the body and after a failure; the case asked for was not there)."""
    if holder.reused():
        pytest.skip(f"pid {holder.proc.pid} of the exited holder was reused before the lock was taken")
    try:
        yield
    except BaseException:  # an assertion, or pytest.raises' "did not raise"
        if holder.reused():
            pytest.skip(f"pid {holder.proc.pid} of the exited holder was reused while the lock was taken")
        raise


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory the stranger can reach (not under pytest's 0700 one), under run.share "all"'s umask (022)."""
    old = os.umask(0o022)
    made = Path(tempfile.mkdtemp(prefix="minilmd-lockguard-", dir="/tmp"))
    os.chmod(made, 0o755)
    try:
        yield made
    finally:
        os.umask(old)
        trainer_lock.release_all()
        shutil.rmtree(made, ignore_errors=True)


def _wide_lock(directory: Path, name: str, body: bytes = b"") -> Path:
    directory.mkdir(0o755, exist_ok=True)
    path = directory / name
    path.write_bytes(body)
    os.chmod(path, 0o644)  # as an older minilmd left it
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@needs_stranger
@pytest.mark.parametrize("how", ["dir", "fork"])
def test_a_wide_run_lock_held_by_a_stranger_who_holds_its_directory_or_has_exited_is_replaced(place, capsys, how):
    lock = _wide_lock(place / "run", names.LOCK)
    old = os.lstat(lock).st_ino
    stranger = Holder(lock, how)
    try:
        with staged(stranger):
            with RunLock(place / "run") as taken:  # before: LockHeld "pid None ...", for as long as the stranger held
                assert taken.held
                assert os.lstat(lock).st_ino != old and _mode(lock) == 0o600
            said = capsys.readouterr().err
            assert "not a supervisor of yours: your lock file was readable by others" in said, said
            if how == "dir":
                assert f"uid {STRANGER}'s process {stranger.proc.pid}," in said, said
            else:
                assert f"process {stranger.proc.pid} (its user cannot be read" in said, said
        assert not (place / "run" / tmpnames.lock_guard_name(names.LOCK)).exists()  # its maker removed it
    finally:
        stranger.end()


@needs_stranger
def test_a_wide_trainer_lock_whose_stranger_holder_has_exited_is_replaced(place, capsys):
    lock = _wide_lock(place / "scratch", names.TRAINER_LOCK)
    stranger = Holder(lock, "fork")
    try:
        with staged(stranger):
            trainer_lock.hold(place / "scratch", place / "run", supervised=True)  # before: TrainerLockHeld, exit 69
        dir_fd = os.open(place / "scratch", os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert trainer_lock.holder(dir_fd)["pid"] == os.getpid() and _mode(lock) == 0o600
        finally:
            os.close(dir_fd)
        assert "not a trainer of yours" in capsys.readouterr().err
    finally:
        stranger.end()


@needs_stranger
@pytest.mark.parametrize("how", ["", "fork"])
def test_a_wide_run_lock_held_by_a_process_of_ones_own_still_refuses(place, how):
    """A holder proven ours is a supervisor of this run: refused as before, the file left where it is. Ours after a
    fork and exit cannot be told from the stranger's (its uid is gone with it): taken only when not wide."""
    lock = _wide_lock(place / "run", names.LOCK)
    old = os.lstat(lock).st_ino
    ours = Holder(lock, how, ours=True)
    try:
        if how:
            os.chmod(lock, 0o600)  # a lock file of today's: a holder whose uid cannot be read is a real holder
        with staged(ours):
            with pytest.raises(LockHeld, match="run already owned by another supervisor") as refused:
                RunLock(place / "run").acquire()
            assert ("move the lock file away" in str(refused.value)) == bool(how), refused.value  # its user unread
        assert os.lstat(lock).st_ino == old
    finally:
        ours.end()


@needs_stranger
@pytest.mark.parametrize("how", ["", "fork"])
def test_a_stale_prepare_lock_flocked_by_a_stranger_no_longer_refuses_every_prepare(place, capsys, how):
    """F4: a prepare SIGKILLed left `OUT.lock` (0644, its holder line naming a dead pid); another user flocks it.
    Before, every later prepare to that --out was refused, exit 2, "another prepare is writing it (pid <dead>)"."""
    line = {"pid": 2 ** 22 + 7, "host": "h", "command": "prepare", "since": "2026-01-01T00:00:00+0000"}
    lock = _wide_lock(place, "corpus.lock", (json.dumps(line) + "\n").encode())
    stranger = Holder(lock, how)
    try:
        with staged(stranger), CorpusLock(place / "corpus", "prepare") as taken:
            assert taken.locked and _mode(lock) == 0o600
            assert json.loads(lock.read_text())["pid"] == os.getpid()
        said = capsys.readouterr().err
        assert "not a prepare of yours: your lock file was readable by others" in said, said
    finally:
        stranger.end()


def _dir_fd(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def test_a_wide_lock_is_replaced_though_another_open_file_holds_its_directorys_flock(tmp_path, monkeypatch):
    """F1a without a second user: the directory's flock, held by any open of it, no longer keeps the replacement
    off (before: GuardBusy, and the wide file was kept, narrowed, its old openers' descriptors alive)."""
    monkeypatch.setattr(lockfile, "GUARD_WAIT_S", 0.2)
    lock = _wide_lock(tmp_path / "run", names.LOCK)
    old = os.lstat(lock).st_ino
    held_dir, where = _dir_fd(tmp_path / "run"), _dir_fd(tmp_path / "run")
    try:
        assert lockfile.try_flock(held_dir)
        taken = lockfile.take(where, names.LOCK, b'{"pid": 1}')
        os.close(taken.fd)
        assert os.lstat(lock).st_ino != old and _mode(lock) == 0o600
    finally:
        os.close(held_dir)
        os.close(where)


def test_a_guard_left_by_a_killed_maker_is_used_and_left(tmp_path):
    lock = _wide_lock(tmp_path / "run", names.LOCK)
    guard = tmp_path / "run" / tmpnames.lock_guard_name(names.LOCK)
    guard.touch(0o600)
    where = _dir_fd(tmp_path / "run")
    try:
        old = os.lstat(lock).st_ino
        os.close(lockfile.take(where, names.LOCK, b'{"pid": 1}').fd)
        assert os.lstat(lock).st_ino != old and guard.is_file()  # not made by this take: not its to remove
    finally:
        os.close(where)


def test_a_prepare_lock_is_its_owners_alone(tmp_path):
    """F4: made 0600 whatever the umask (before: published_file_mode(), 0644 under umask 022)."""
    old = os.umask(0o022)
    try:
        with CorpusLock(tmp_path / "corpus", "prepare") as taken:
            assert taken.created and _mode(tmp_path / "corpus.lock") == 0o600
    finally:
        os.umask(old)
    assert not (tmp_path / "corpus.lock").exists()


def test_a_wide_file_of_ones_own_at_the_prepare_locks_name_is_left_as_it_was(tmp_path):
    """Not a lock (no holder line, nobody holds it): refused before take would narrow it and put a copy in its
    place."""
    mine = _wide_lock(tmp_path, "corpus.lock", b"my notes on locks\n")
    before = os.lstat(mine)
    with pytest.raises(ValueError, match="not a lock file of minilmd's"):
        CorpusLock(tmp_path / "corpus", "prepare").__enter__()
    after = os.lstat(mine)
    assert (after.st_ino, after.st_mode, mine.read_bytes()) == (before.st_ino, before.st_mode, b"my notes on locks\n")
