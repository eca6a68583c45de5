"""minilmd/lockfile.py's one set of checks, where it changed what a lock did: a hard link at a lock's name is
refused by every lock (before, the trainer's and prepare's wrote their body into the other file), and a holder is
named from the kernel's record by device and inode, with real processes holding the locks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from minilmd import lockfile, names, trainer_lock
from minilmd.corpus.prepare.lock import CorpusLock
from minilmd.daemon.host import leases
from minilmd.dirfd import Dir
from minilmd.proc_info import flock_holders

PRECIOUS = b"the user's own notes\n"

HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a lease holder of another minilmd, or of anything else
    os.pwrite(fd, sys.argv[2].encode(), 0)
    print("locked", flush=True)
    sys.stdin.read()
""")


def hold_in_child(path, body: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), body], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def let_go(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)
    proc.stdout.close()


def test_the_trainer_lock_refuses_a_hard_link_and_writes_nothing_into_it(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    precious = tmp_path / "notes.txt"
    precious.write_bytes(PRECIOUS)
    os.link(precious, scratch / names.TRAINER_LOCK)
    try:
        with pytest.raises(trainer_lock.TrainerLockRefused, match="has 2 hard links"):
            trainer_lock.hold(scratch, tmp_path / "run", supervised=False)
    finally:
        trainer_lock.release_all()
    assert precious.read_bytes() == PRECIOUS


def test_prepares_lock_refuses_a_hard_link_to_an_empty_file_of_the_users(tmp_path):
    precious = tmp_path / "empty-but-mine"
    precious.write_bytes(b"")
    os.link(precious, tmp_path / "corpus.lock")
    with pytest.raises(ValueError, match="has 2 hard links"):
        with CorpusLock(tmp_path / "corpus", "prepare"):
            pass
    assert precious.read_bytes() == b"" and precious.stat().st_nlink == 2  # neither written nor removed


def test_a_lock_held_by_another_process_is_refused_with_its_body(tmp_path):
    proc = hold_in_child(tmp_path / "x.lock", json.dumps({"pid": 1234, "who": "the first"}))
    try:
        with Dir.open(tmp_path, "the test's directory") as where:
            with pytest.raises(lockfile.Held) as held:
                lockfile.take(where, "x.lock", b"{}", mode=0o600)
            assert held.value.body == {"pid": 1234, "who": "the first"}
            assert lockfile.holder(where, "x.lock") == held.value.body
    finally:
        let_go(proc)
    with Dir.open(tmp_path, "the test's directory") as where:
        taken = lockfile.take(where, "x.lock", b'{"pid": 1}', mode=0o600)  # its holder gone: free
        assert os.pread(taken.fd, 100, 0) == b'{"pid": 1}' and not taken.created
        os.close(taken.fd)


def test_a_lease_whose_body_lies_names_the_flocks_real_holder(tmp_path):
    """The body names pid 1 (anyone can write a body); the kernel's record (device and inode) names the holder."""
    proc = hold_in_child(tmp_path / "gpu-0.lock", json.dumps({"run": "liar", "pid": 1}))
    try:
        dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            lease = leases._open_in(dir_fd, tmp_path / "gpu-0.lock", "gpu-0.lock")
        finally:
            os.close(dir_fd)
        try:
            assert not leases.try_lock(lease, exclusive=False)
            words = leases.describe_holder(lease)
        finally:
            lease.close()
        assert words.startswith(f"pid {proc.pid} (") and "liar" not in words, words
    finally:
        let_go(proc)


def test_a_lock_on_another_device_with_the_same_inode_is_not_the_holder(tmp_path):
    st = os.stat(tmp_path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    record = (f"1: FLOCK  ADVISORY  WRITE 111 {major + 1:02x}:{minor:02x}:{st.st_ino} 0 EOF\n"
              f"2: FLOCK  ADVISORY  WRITE 222 {major:02x}:{minor:02x}:{st.st_ino} 0 EOF\n"
              f"2: -> FLOCK  ADVISORY  WRITE 333 {major:02x}:{minor:02x}:{st.st_ino} 0 EOF\n")
    assert flock_holders(st, read=lambda _: record) == [222]


def test_a_lock_file_removed_between_the_open_and_the_lock_is_opened_again_not_refused(tmp_path, monkeypatch):
    """Prepare's maker removes its lock file on the way out; a second prepare that had just opened it found 0 links
    and was refused ("has 0 hard links ... Remove it", exit 2, naming a file that was gone: review12b F3). A file
    with no name holds nobody's body: the still-named check after the flock sends the taker to the name again."""
    real_open = lockfile.open_lock
    removed = []

    def open_then_removed(where, name, **kw):
        fd, created = real_open(where, name, **kw)
        if not removed:  # the first open only: its maker ends and removes the file just after
            os.unlink(name, dir_fd=where.fd if isinstance(where, Dir) else where)
            removed.append(os.fstat(fd).st_ino)
        return fd, created

    monkeypatch.setattr(lockfile, "open_lock", open_then_removed)
    with CorpusLock(tmp_path / "corpus", "prepare") as lock:
        assert removed and lock.locked and os.fstat(lock.fd).st_nlink == 1
        assert os.fstat(lock.fd).st_ino == (tmp_path / "corpus.lock").stat().st_ino
    removed.clear()
    with Dir.open(tmp_path, "the test's directory") as d:
        taken = lockfile.take(d, "other.lock", b"{}")
        try:
            assert removed and lockfile.still_named(d, "other.lock", taken.fd)
        finally:
            os.close(taken.fd)


def test_whose_a_lock_file_may_be_is_one_argument_each_owner_judged(tmp_path):
    """`problem`'s owner: the user's own by default, a given uid's (a run directory's owner, whose lock a teammate
    looks at: daemon/base/seen.py lock_table) or anyone's (a lease, run.dir's reserve). A file of another uid than
    the one given was judged by no test before (seen.lock_table's refusal of it)."""
    path = tmp_path / "x.lock"
    path.write_bytes(b"")
    mine = os.lstat(path)
    other = mine.st_uid + 1
    theirs = os.stat_result((*mine[:4], other, *mine[5:10]))  # the same file as another uid's, no chown needed
    assert lockfile.problem(mine) is None and lockfile.problem(mine, owner=mine.st_uid) is None
    assert lockfile.problem(theirs) == f"belongs to uid {other}, not to you (uid {os.geteuid()})"
    assert lockfile.problem(theirs, owner=other) is None
    assert lockfile.problem(mine, owner=other) == f"belongs to uid {mine.st_uid}, not to uid {other}"
    assert lockfile.problem(theirs, owner=lockfile.Whose.ANYONE) is None
    os.link(path, tmp_path / "second-name")
    assert "has 2 hard links" in lockfile.problem(os.lstat(path), owner=lockfile.Whose.ANYONE)
