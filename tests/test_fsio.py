"""minilmd/fsio.py: publishing a directory durably, the one file-table verifier."""
from __future__ import annotations

import hashlib
import os
import threading

import pytest

from minilmd import dirfd, fsio
from minilmd.untrusted import Unreadable, sha256_open, sha256_regular


def _entry(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _make(tmp_path, files: dict[str, bytes]):
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    return tmp_path


# --- publish_dir ------------------------------------------------------------------------------------------------

class FsyncSpy:
    """Records, in order, each fsync (by the whole path of its descriptor) and each rename dirfd does (renameat2,
    which every rename of a publication goes through; False: the file system does not do its flags)."""

    def __init__(self, monkeypatch, flags_done: bool = True):
        self.events: list[tuple[str, str]] = []
        real_fsync, real_renameat2 = os.fsync, dirfd.renameat2

        def spy_fsync(fd):
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            return real_fsync(fd)

        def spy_renameat2(src_fd, src, dst_fd, dst, flags):
            if not flags_done and flags:
                return False  # NFS: the caller falls back to plain renames, which go through os.rename
            self.events.append(("rename", f"{src} -> {dst}"))
            return real_renameat2(src_fd, src, dst_fd, dst, flags)

        real_rename = os.rename

        def spy_rename(src, dst, **kw):
            self.events.append(("rename", f"{src} -> {dst}"))
            return real_rename(src, dst, **kw)

        monkeypatch.setattr(fsio.os, "fsync", spy_fsync)
        monkeypatch.setattr(dirfd, "renameat2", spy_renameat2)
        monkeypatch.setattr(fsio.os, "rename", spy_rename)


def test_publish_dir_fsyncs_every_file_and_dir_before_the_rename_and_the_parent_after(tmp_path, monkeypatch):
    tmp = _make(tmp_path / ".tmp-out", {"a.bin": b"a", "sub/b.bin": b"b"})
    spy = FsyncSpy(monkeypatch)
    final = fsio.publish_dir(tmp, tmp_path / "out")
    assert final == tmp_path / "out" and (final / "sub" / "b.bin").read_bytes() == b"b" and not tmp.exists()
    rename = spy.events.index(("rename", ".tmp-out -> out"))
    before = {path for kind, path in spy.events[:rename] if kind == "fsync"}
    assert before >= {str(tmp / "a.bin"), str(tmp / "sub" / "b.bin"), str(tmp / "sub"), str(tmp)}
    assert spy.events[rename - 1] == ("fsync", str(tmp))  # the directory itself last, after its contents
    assert ("fsync", str(tmp_path)) in spy.events[rename + 1:]


def test_publish_dir_replaces_an_existing_directory_whole(tmp_path):
    _make(tmp_path / "out", {"old.bin": b"old", "deep/x": b"x"})
    tmp = _make(tmp_path / ".tmp-out", {"new.bin": b"new"})
    fsio.publish_dir(tmp, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old version moved aside, then removed


def test_publish_dir_moves_the_old_version_to_the_given_aside_name(tmp_path, monkeypatch):
    _make(tmp_path / "out", {"old.bin": b"old"})
    tmp = _make(tmp_path / ".tmp-out", {"new.bin": b"new"})
    spy = FsyncSpy(monkeypatch, flags_done=False)  # a file system that cannot swap (NFS): the aside
    fsio.publish_dir(tmp, tmp_path / "out", aside=tmp_path / ".out.aside")
    renames = [e for kind, e in spy.events if kind == "rename"]
    assert renames == ["out -> .out.aside", ".tmp-out -> out"], renames
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["new.bin"]


def test_publish_dir_replaces_only_the_directory_there_when_it_began(tmp_path, monkeypatch):
    """The one publication (dirpublish.publish): a directory moved in at `final` between the look and the swap is
    put back and kept, never deleted (before: fsio's own by-path publish removed whatever it swapped out)."""
    _make(tmp_path / "out", {"old.bin": b"old"})
    tmp = _make(tmp_path / ".tmp-out", {"new.bin": b"new"})
    real_exchange = dirfd.Dir.exchange

    def swapped_first(self, a, b):
        if not (tmp_path / "out.moved").exists():  # once, after the look at `out`: another directory moved in
            os.rename(tmp_path / "out", tmp_path / "out.moved")
            _make(tmp_path / "out", {"theirs.bin": b"theirs"})
        return real_exchange(self, a, b)

    monkeypatch.setattr(dirfd.Dir, "exchange", swapped_first)
    with pytest.raises(dirfd.Replaced):
        fsio.publish_dir(tmp, tmp_path / "out")
    assert (tmp_path / "out" / "theirs.bin").read_bytes() == b"theirs"  # put back, whole
    assert (tmp_path / "out.moved" / "old.bin").read_bytes() == b"old"


@pytest.mark.parametrize("planted", ["fifo", "link to a fifo outside"])
def test_publish_dir_flushes_without_opening_a_fifo_or_following_a_link(tmp_path, planted):
    """The tree flush goes through descriptors (dirtree.fsync_tree): before, fsio's own os.walk opened each name by
    path, O_RDONLY, following a link and blocking for good on a FIFO until someone wrote it."""
    tmp = _make(tmp_path / ".tmp-out", {"a.bin": b"a"})
    fifo = tmp / "pipe" if planted == "fifo" else tmp_path / "outside-pipe"
    os.mkfifo(fifo)
    if planted != "fifo":
        (tmp / "pipe").symlink_to(fifo)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (fsio.publish_dir(tmp, tmp_path / "out"), done.set()), daemon=True)
    worker.start()
    if not done.wait(60):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked open go, so the test ends
        worker.join(60)
    assert done.is_set(), "publish_dir blocked on the FIFO"
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"a"
    assert os.path.lexists(tmp_path / "out" / "pipe")  # published as it was, never opened


def test_atomic_write_leaves_no_temp_file(tmp_path):
    fsio.atomic_write_json(tmp_path / "s.json", {"b": 1, "a": [2]})
    assert (tmp_path / "s.json").read_text() == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


# --- the file-table verifier ------------------------------------------------------------------------------------

def test_table_problems_reports_every_missing_and_wrong_sized_file_before_hashing(tmp_path):
    root = _make(tmp_path, {"a": b"aaaa", "b": b"bb"})
    table = {"a": _entry(b"aaaa"), "b": _entry(b"bbb"), "c": _entry(b"c")}
    hashed = []
    problems = fsio.table_problems(table, lambda n: fsio.local_size(root / n),
                                   lambda n: hashed.append(n) or sha256_regular(root / n), listed_in="meta.json")
    assert problems == ["b: size 2 bytes, meta.json says 3 (truncated or changed)",
                        "c: missing (listed in meta.json)"]
    assert hashed == []  # sizes are cheap; nothing is read while any of them is wrong


def test_table_problems_then_checks_every_sha256(tmp_path):
    root = _make(tmp_path, {"a": b"aaaa", "b": b"bXb"})
    table = {"a": _entry(b"aaaa"), "b": _entry(b"bbb")}
    problems = fsio.dir_table_problems(root, table, listed_in="manifest.json")
    assert len(problems) == 1 and problems[0].startswith(f"{root / 'b'}: sha256 mismatch (manifest.json says ")
    assert fsio.dir_table_problems(root, table, full_hash=False) == []  # sizes only
    assert fsio.dir_table_problems(root, {"a": table["a"]}) == []


def test_a_listed_link_or_fifo_is_refused_not_followed_nor_waited_on(tmp_path, monkeypatch):
    """fsio hashed with a hasher of its own (open by path: links followed, a FIFO's open blocks) after an os.stat
    that followed links too: a link to a file with the listed bytes passed, and a FIFO put in after the look hung
    the check. It hashes as untrusted.sha256_regular reads now (no link followed, never blocked)."""
    root = tmp_path / "corpus"
    root.mkdir()
    outside = _make(tmp_path, {"secret": b"their bytes"}) / "secret"
    (root / "ln").symlink_to(outside)
    assert fsio.dir_table_problems(root, {"ln": _entry(b"their bytes")}) == [
        f"{root / 'ln'}: a symbolic link, not a regular file"]
    os.mkfifo(root / "fifo")
    assert fsio.dir_table_problems(root, {"fifo": _entry(b"")}) == [f"{root / 'fifo'}: a FIFO, not a regular file"]
    # the FIFO (and the link) put in after the look: the hash itself refuses them
    monkeypatch.setattr(fsio, "not_regular", lambda path: None)
    monkeypatch.setattr(fsio, "local_size", lambda path: 0 if path.name == "fifo" else len(b"their bytes"))
    unblock = threading.Timer(60, lambda: os.close(os.open(root / "fifo", os.O_WRONLY | os.O_NONBLOCK)))
    unblock.start()  # a reader stuck in open() would be let go after a minute, to fail here rather than hang
    try:
        problems = fsio.dir_table_problems(root, {"fifo": _entry(b"")})
    finally:
        unblock.cancel()
    assert problems == [f"{root / 'fifo'}: a FIFO, not a regular file of the listed size"]
    assert fsio.dir_table_problems(root, {"ln": _entry(b"their bytes")}) == [
        f"{root / 'ln'}: a symbolic link, not a regular file of the listed size"]


def test_sha256_open_hashes_the_open_file_and_leaves_its_offset(tmp_path):
    """The hash of a descriptor (format.py's open split files, the append's grown ones): of that very file, from its
    start, without moving the offset its reader reads from next; a FIFO's descriptor is refused, not read."""
    path = _make(tmp_path, {"a": b"0123456789"}) / "a"
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 4, os.SEEK_SET)
        assert sha256_open(fd, path, first=6) == hashlib.sha256(b"012345").hexdigest()
        assert sha256_open(fd, path) == hashlib.sha256(b"0123456789").hexdigest()
        assert os.lseek(fd, 0, os.SEEK_CUR) == 4
    finally:
        os.close(fd)
    os.mkfifo(tmp_path / "fifo")
    fd = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(Unreadable, match="a FIFO"):
            sha256_open(fd, tmp_path / "fifo")
    finally:
        os.close(fd)


def test_table_problems_lets_read_errors_through(tmp_path):
    def broken(name):
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError):
        fsio.table_problems({"a": _entry(b"a")}, lambda n: 1, broken)
