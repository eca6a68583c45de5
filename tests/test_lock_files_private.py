"""A run's lock files are their owner's alone, whatever run.share says (hostile10 F1, F2).

Anyone who can open a lock file, even read-only, can flock it. Before, supervisor.lock (0644 less the umask),
scratch's owner.json and trainer.lock (the umask's mode: 0644 under run.share "all") and a hand-made run.scratch
(left 0755) let any user hold the run's locks with one `sleep`: every `minilmd run` was refused for good ("run already
owned by another supervisor: pid None") and the trainer looped on exit 69. Here a real process of another uid (4242,
no such user: the tests run as root and drop to it before exec) tries to open each lock file read-only and flock it:
the open is refused (EACCES) and the run's own lock is taken. And a lock file an older run left 0644, held by that
other uid's process, is replaced by a fresh 0600 file and taken, the holder named: its lock on the old inode holds
nothing of the run's.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from minilmd import names, run_owner, scratch, scratch_hold, trainer_lock
from minilmd.daemon.host.lock import RunLock, lock_holder
from stranger_helpers import NEEDS, PYTHON, STRANGER, as_stranger

TRY_LOCK = """import errno, fcntl, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
except OSError as e:
    print("refused", errno.errorcode[e.errno], flush=True)
    sys.exit(0)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
sys.stdin.read()
"""
"""Run as the stranger: open the file read-only and hold an flock on it until stdin closes."""


class Stranger:
    """The other user's process trying `path`: `said` is "held" (it holds the flock) or "refused EACCES"."""

    def __init__(self, path: Path):
        assert PYTHON is not None
        self.proc = subprocess.Popen([PYTHON, "-I", "-S", "-c", TRY_LOCK, str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=as_stranger)
        self.said = self.proc.stdout.readline().strip()

    def end(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


pytestmark = pytest.mark.skipif(PYTHON is None, reason=NEEDS)


@pytest.fixture
def shared_place() -> Iterator[Path]:
    """A directory the stranger can reach (not under pytest's 0700 one), under run.share "all"'s umask (022)."""
    old = os.umask(0o022)
    place = Path(tempfile.mkdtemp(prefix="minilmd-lockmode-", dir="/tmp"))
    os.chmod(place, 0o755)
    try:
        yield place
    finally:
        os.umask(old)
        trainer_lock.release_all()
        scratch_hold.let_go(place / "scratch")
        shutil.rmtree(place, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _run_dir(place: Path) -> Path:
    run_dir = place / "run"
    run_dir.mkdir(0o755)  # run.share "all"'s run.dir: others may list and enter it
    return run_dir


def _hand_made_scratch(place: Path) -> tuple[Path, Path]:
    """run.scratch made by hand (0755, never claimed) and run.dir, in the shared place."""
    scratch_dir, run_dir = place / "scratch", _run_dir(place)
    scratch_dir.mkdir(0o755)
    return scratch_dir, run_dir


def _wide_and_held(path: Path, body: bytes = b"") -> Stranger:
    """A lock file an older minilmd left readable by others (0644, as under run.share "all"), the stranger's process
    holding an flock on it; end() it when done."""
    path.write_bytes(body)
    os.chmod(path, 0o644)
    stranger = Stranger(path)
    assert stranger.said == "held"
    return stranger


def test_supervisor_lock_is_private_under_share_all_and_another_user_cannot_hold_it(shared_place):
    run_dir = _run_dir(shared_place)
    with RunLock(run_dir):
        pass
    stranger = Stranger(run_dir / names.LOCK)
    try:
        assert stranger.said == f"refused {errno.errorcode[errno.EACCES]}"  # before: "held"
        assert _mode(run_dir / names.LOCK) == 0o600
        with RunLock(run_dir) as lock:  # before: LockHeld, "pid None", for as long as the stranger lived
            assert lock.held
    finally:
        stranger.end()


def test_an_older_runs_wide_supervisor_lock_held_by_another_user_is_replaced_and_taken(shared_place, capsys):
    run_dir = _run_dir(shared_place)
    lock_path = run_dir / names.LOCK
    stranger = _wide_and_held(lock_path)
    old = os.lstat(lock_path)
    try:
        assert lock_holder(run_dir) is None  # no supervisor holds it: status and --check say so
        with RunLock(run_dir) as lock:
            assert lock.held
            new = os.lstat(lock_path)
            assert (new.st_ino, _mode(lock_path)) != (old.st_ino, 0o644) and _mode(lock_path) == 0o600
            assert lock_holder(run_dir) is not None and lock_holder(run_dir).pid == os.getpid()
        said = capsys.readouterr().err
        assert f"uid {STRANGER}'s process {stranger.proc.pid}, not a supervisor of yours" in said, said
        assert "your lock file was readable by others" in said
    finally:
        stranger.end()


def test_a_holder_of_ones_own_uid_still_refuses_the_run_lock(shared_place):
    run_dir = _run_dir(shared_place)
    with RunLock(run_dir):
        from minilmd.daemon.host.lock import LockHeld

        with pytest.raises(LockHeld, match=f"held by process {os.getpid()} of user root"):
            RunLock(run_dir).acquire()


def test_trainer_lock_is_private_in_a_hand_made_wide_scratch(shared_place):
    place, run_dir = _hand_made_scratch(shared_place)  # a by-hand trainer's
    trainer_lock.hold(place, run_dir, supervised=True)
    trainer_lock.release_all()
    stranger = Stranger(place / names.TRAINER_LOCK)
    try:
        assert stranger.said == f"refused {errno.errorcode[errno.EACCES]}"  # before: "held"
        assert _mode(place / names.TRAINER_LOCK) == 0o600
        trainer_lock.hold(place, run_dir, supervised=True)  # before: TrainerLockHeld, exit 69 for good
    finally:
        stranger.end()


def test_an_older_wide_trainer_lock_held_by_another_user_is_replaced_and_taken(shared_place, capsys):
    place, run_dir = _hand_made_scratch(shared_place)
    lock_path = place / names.TRAINER_LOCK
    stranger = _wide_and_held(lock_path)
    try:
        trainer_lock.hold(place, run_dir, supervised=True)
        assert _mode(lock_path) == 0o600
        dir_fd = os.open(place, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert trainer_lock.holder(dir_fd)["pid"] == os.getpid()
        finally:
            os.close(dir_fd)
        said = capsys.readouterr().err
        assert f"uid {STRANGER}'s process {stranger.proc.pid}, not a trainer of yours" in said, said
    finally:
        stranger.end()


def test_claim_makes_a_hand_made_scratch_private_and_its_marker_unopenable_by_others(shared_place):
    place, run_dir = _hand_made_scratch(shared_place)
    scratch.claim(place, run_dir, "s", is_default=False)
    stranger = Stranger(place / names.SCRATCH_OWNER)
    try:
        assert stranger.said == f"refused {errno.errorcode[errno.EACCES]}"  # before: "held"
        assert (_mode(place), _mode(place / names.SCRATCH_OWNER)) == (0o700, 0o600)
        scratch_hold.hold(place)  # before: ScratchInUse, "another supervisor of this run"
        assert scratch_hold.in_use(place) is None
    finally:
        stranger.end()


def test_an_older_wide_marker_held_by_another_user_is_replaced_with_its_words_and_held(shared_place, capsys):
    place, run_dir = _hand_made_scratch(shared_place)
    marker = place / names.SCRATCH_OWNER
    body = run_owner.encode(run_owner.record(run_dir.resolve(), "s"))
    stranger = _wide_and_held(marker, body)  # as an older minilmd wrote it, in a scratch made by hand
    try:
        assert scratch_hold.in_use(place) is None  # the launch takes it: --check refuses nothing
        scratch_hold.hold(place)
        assert marker.read_bytes() == body and _mode(marker) == 0o600
        said = capsys.readouterr().err
        assert f"uid {STRANGER}'s process {stranger.proc.pid}, not a supervisor of yours" in said, said
    finally:
        stranger.end()


def test_two_of_ours_replacing_a_lock_held_by_a_stranger_leave_one_holder(shared_place, monkeypatch):
    """review12c F1: A's whole take runs while B, having found only the stranger on the old file, is about to
    replace it; before, B renamed its fresh file over A's and both held "the" run lock. Now B finds the name moved
    and is refused, naming A's lock."""
    from minilmd import lockfile
    run_dir = _run_dir(shared_place)
    lock = run_dir / names.LOCK
    stranger = _wide_and_held(lock)  # an older run's lock
    real, taken_a, dirs = lockfile.strangers, [], [os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY) for _ in "ab"]

    def a_takes_meanwhile(fd: int) -> list:
        found = real(fd)
        if not taken_a:  # B has seen only the stranger on the old file; A takes the lock now
            monkeypatch.setattr(lockfile, "strangers", real)
            taken_a.append(lockfile.take(dirs[0], names.LOCK, b'{"pid": 1}'))
        return found

    monkeypatch.setattr(lockfile, "strangers", a_takes_meanwhile)
    try:
        with pytest.raises(lockfile.Held) as held:
            lockfile.take(dirs[1], names.LOCK, b'{"pid": 2}')
        assert held.value.body == {"pid": 1}
        assert os.fstat(taken_a[0].fd).st_ino == os.lstat(lock).st_ino
        assert [uid for _, uid in taken_a[0].strangers] == [STRANGER]
    finally:
        stranger.end()
        for fd in dirs + [taken.fd for taken in taken_a]:
            os.close(fd)


def test_two_supervisors_replacing_a_marker_held_by_a_stranger_leave_one_holder(shared_place, monkeypatch):
    """review12c F1 for scratch's marker: supervisor A's whole hold runs while B, having found only the stranger on
    the old marker, is about to replace it; before, B renamed its copy over A's and both held the scratch."""
    from minilmd import lockfile
    place, _ = _hand_made_scratch(shared_place)
    marker = place / names.SCRATCH_OWNER
    stranger = _wide_and_held(marker, b'{"run_dir": "/x"}')
    real, dir_fd = lockfile.strangers, os.open(place, os.O_RDONLY | os.O_DIRECTORY)

    def a_holds_meanwhile(fd: int) -> list:
        monkeypatch.setattr(lockfile, "strangers", real)
        found = real(fd)
        scratch_hold._hold(place, "A", dir_fd)
        return found

    monkeypatch.setattr(lockfile, "strangers", a_holds_meanwhile)
    monkeypatch.setattr(scratch_hold, "PROBE_WAIT_S", 0.2)
    try:
        with pytest.raises(scratch_hold.ScratchInUse):
            scratch_hold._hold(place, "B", dir_fd)
        assert scratch_hold._holds["A"][2] == os.lstat(marker).st_ino and "B" not in scratch_hold._holds
    finally:
        stranger.end()
        for key in ("A", "B"):
            if (held := scratch_hold._holds.pop(key, None)) is not None:
                os.close(held[0])
        os.close(dir_fd)


def test_a_marker_replaced_just_after_the_holds_open_is_opened_again_not_refused(shared_place, monkeypatch):
    """Another of ours put a fresh marker in place of the wide one a stranger holds just after this hold opened the
    old one: the old file has no link left, which lockfile.problem passes (no other file's body), so its stranger is
    found, its replacement finds it no longer named, and the hold opens the name again and takes the fresh marker.
    Before, a marker of no link was not judged (`st_nlink == 1`): the hold waited on the stranger's lock of a marker
    no longer there and refused, ScratchInUse, calling him a supervisor of this run."""
    from minilmd import lockfile
    place, _ = _hand_made_scratch(shared_place)
    marker, body = place / names.SCRATCH_OWNER, b'{"run_dir": "/x"}'
    stranger = _wide_and_held(marker, body)
    real = lockfile.private

    def replaced_after_the_open(where, name, fd, *args, **kwargs):
        monkeypatch.setattr(lockfile, "private", real)
        fresh = place / "fresh-marker"
        fresh.write_bytes(body)
        os.chmod(fresh, 0o600)
        os.rename(fresh, marker)  # another supervisor of ours, which has let it go since
        return real(where, name, fd, *args, **kwargs)

    monkeypatch.setattr(lockfile, "private", replaced_after_the_open)
    monkeypatch.setattr(scratch_hold, "PROBE_WAIT_S", 0.2)
    try:
        scratch_hold.hold(place)
        assert scratch_hold._holds[os.path.abspath(place)][2] == os.lstat(marker).st_ino
        assert marker.read_bytes() == body and _mode(marker) == 0o600
    finally:
        stranger.end()
