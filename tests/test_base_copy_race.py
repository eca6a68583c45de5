"""The LoRA base's push to a local remote (daemon/jobs/basecopy.py) against another machine that publishes its own
base's copy at `<remote>/init` after the push read the record there: that copy, maybe the only one of the weights
older checkpoints were trained on, is never replaced nor deleted (Remote.publish_unless_taken: Dir.rename_new and
Dir.exchange at the remote root's descriptor, minilmd/dirfd.py), with renameat2's flags and without them (NFS)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from base_copy_helpers import files_of, replace_whole, staged_pth
from minilmd import dirfd, fsio
from minilmd.daemon.jobs import basecopy
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.init_source import STAGED_PTH, STAGED_RECORD
from rename_flags import exchange_not_done


class AnotherMachine(LocalRemote):
    """A remote shared with another machine, which publishes its own base's copy (`theirs`) at `<remote>/init`,
    as a push of its own ends, right when this push copies its last file (the record): after this push read the
    remote's record, before it renames its copy into place."""

    def __init__(self, url: str, theirs: Path):
        super().__init__(url)
        self.theirs = theirs

    def put(self, local: Path, *names: str) -> int:
        if names[-1] == STAGED_RECORD:
            arriving = shutil.copytree(self.theirs, self.path(".tmp-init-other-host-7"))
            replace_whole(Path(arriving), Path(self.path(basecopy.REMOTE_BASE)))  # in place of whatever stands
        return super().put(local, *names)


class Renames:
    """How the remote renames in a test: with renameat2's flags (`flags_done`), or on a file system that does not
    do them (NFS: EINVAL); each renameat2 call that answered, with its flags and result, in `calls`."""

    def __init__(self, flags_done: bool):
        self.flags_done = flags_done
        self.calls: list[tuple[int, bool]] = []


@pytest.fixture(params=["renameat2", "plain rename (NFS)"])
def renames(request, monkeypatch, tmp_path) -> Renames:
    seen = Renames(request.param == "renameat2")
    if seen.flags_done and (why := exchange_not_done(tmp_path)):
        pytest.skip(why)  # the fallback is what runs here, and the other variant tests it
    real = dirfd.renameat2

    def spy(src_fd, src, dst_fd, dst, flags):
        if not seen.flags_done:
            return False  # as EINVAL: the flags not done here
        seen.calls.append((flags, ok := real(src_fd, src, dst_fd, dst, flags)))
        return ok

    monkeypatch.setattr(dirfd, "renameat2", spy)  # fsio's by-path renameat2 calls it too
    return seen


@pytest.mark.parametrize("stood", ["nothing", "a damaged copy of this base"])
def test_another_bases_copy_published_while_the_base_is_pushed_is_left_byte_for_byte(tmp_path, renames, stood):
    """On main the push renamed its copy over `<remote>/init` whatever stood there by then (publish_dir: the other
    machine's copy moved aside and deleted), as it stood at the record's read: nothing, or a damaged copy of this
    base, which is what it may replace."""
    staged = staged_pth(tmp_path, "ours")
    theirs = staged_pth(tmp_path, "theirs")
    renames.calls.clear()  # staging's own publications in scratch (fsio.publish_dir renames at a descriptor too)
    url = str(tmp_path / "remote")
    if stood != "nothing":
        assert basecopy.push(open_remote(url), staged, "h", 1) > 0
        (tmp_path / "remote" / basecopy.REMOTE_BASE / STAGED_PTH).write_bytes(b"cut short")
        renames.calls.clear()
    remote = AnotherMachine(url, theirs)
    copied = basecopy.push(remote, staged, "h", 1)
    assert files_of(tmp_path / "remote" / basecopy.REMOTE_BASE) == files_of(theirs)
    assert copied == 0  # nothing of this base's published: nothing said copied
    assert remote.names() == [basecopy.REMOTE_BASE]  # neither this push's copy nor anything moved aside left
    # what stood at `init` by then was swapped out, looked at, and swapped back
    assert renames.calls == ([(dirfd.RENAME_EXCHANGE, True)] * 2 if renames.flags_done else [])


def test_a_base_pushed_where_nothing_stands_is_renamed_into_a_name_never_taken(tmp_path, renames):
    """Nothing at `<remote>/init`: the copy goes there whole (RENAME_NOREPLACE), nothing left beside it."""
    staged = staged_pth(tmp_path, "ours")
    renames.calls.clear()  # staging's own publication in scratch
    remote = open_remote(str(tmp_path / "remote"))
    assert basecopy.push(remote, staged, "h", 1) > 0
    assert files_of(tmp_path / "remote" / basecopy.REMOTE_BASE) == files_of(staged)
    assert remote.names() == [basecopy.REMOTE_BASE] and basecopy.on_remote(remote, staged)
    assert renames.calls == ([(dirfd.RENAME_NOREPLACE, True)] if renames.flags_done else [])


@pytest.mark.parametrize("damage", ["a file cut short", "its record alone (a copy interrupted on a store without "
                                                        "rename)"])
def test_a_damaged_copy_of_this_base_is_still_replaced_whole(tmp_path, renames, damage):
    staged = staged_pth(tmp_path, "ours")
    remote = open_remote(str(tmp_path / "remote"))
    assert basecopy.push(remote, staged, "h", 1) > 0
    kept = tmp_path / "remote" / basecopy.REMOTE_BASE
    if damage == "a file cut short":
        (kept / STAGED_PTH).write_bytes(b"cut short")
    else:
        (kept / STAGED_PTH).unlink()
    assert not basecopy.on_remote(remote, staged)
    renames.calls.clear()
    assert basecopy.push(remote, staged, "h", 1) > 0
    assert files_of(kept) == files_of(staged) and basecopy.on_remote(remote, staged)
    assert renames.calls == ([(dirfd.RENAME_EXCHANGE, True)] if renames.flags_done else [])  # swapped in one step
    assert remote.names() == [basecopy.REMOTE_BASE]  # the damaged copy removed, not left beside it


def test_a_directory_without_a_record_is_replaced_but_never_one_with_another_record(tmp_path, renames):
    """A copy exists once its record does (written last): an `init` with none that this run made (its record of
    what its syncs made says so) is what a push replaces, as on main; one that holds another base's record by the
    time the push renames is not."""
    staged = staged_pth(tmp_path, "ours")
    remote = open_remote(str(tmp_path / "remote"))
    leftover = tmp_path / "remote" / basecopy.REMOTE_BASE
    (leftover / "checkpoint").mkdir(parents=True)
    (leftover / STAGED_PTH).write_bytes(b"half")
    remote.made.record(basecopy.REMOTE_BASE, identity(leftover))
    assert basecopy.push(remote, staged, "h", 1) > 0
    assert files_of(leftover) == files_of(staged) and remote.names() == [basecopy.REMOTE_BASE]


def test_a_directory_without_a_record_this_run_did_not_make_is_replaced_but_never_deleted(tmp_path, renames):
    """The same `init` with no record of this run's making it (another of this user's directories a teammate
    renamed there, a step of the run's): the copy takes its place, and it is left under a temporary name, never
    deleted (remote_made.why_kept)."""
    staged = staged_pth(tmp_path, "ours")
    remote = open_remote(str(tmp_path / "remote"))
    leftover = tmp_path / "remote" / basecopy.REMOTE_BASE
    (leftover / "checkpoint").mkdir(parents=True)
    (leftover / STAGED_PTH).write_bytes(b"half")
    assert basecopy.push(remote, staged, "h", 1) > 0
    assert files_of(leftover) == files_of(staged)
    left = [n for n in remote.names() if n != basecopy.REMOTE_BASE]
    assert len(left) == 1 and left[0].startswith(".tmp-init-h-1")
    assert (tmp_path / "remote" / left[0] / STAGED_PTH).read_bytes() == b"half"


def identity(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def test_exchange_swaps_two_directories_in_one_step(tmp_path, renames):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / d.name).write_text(d.name)
    assert fsio.exchange(a, b) == renames.flags_done
    assert (files_of(a), files_of(b)) == (({"b": b"b"}, {"a": b"a"}) if renames.flags_done else
                                      ({"a": b"a"}, {"b": b"b"}))


def test_what_stood_there_is_kept_when_a_third_writer_takes_the_name_while_it_is_looked_at(tmp_path, renames):
    """A writer that replaces whatever stands (as the push did on main) publishes a third copy at `init` while
    this push looks at what it moved out: neither that nor the third copy is deleted; the one that cannot go back
    to `init` is kept in quarantine/, and this push's own copy is the only thing removed."""
    root = tmp_path / "remote"
    remote = open_remote(str(root))
    for name, marker in (("src", "ours"), (basecopy.REMOTE_BASE, "first")):
        (root / name).mkdir(parents=True)
        (root / name / marker).write_text(marker)
    remote.made.record("src", identity(root / "src"))  # this push's copy: made by this run
    third = tmp_path / "third"
    third.mkdir()
    (third / "third").write_text("third")

    def replaceable(name: str) -> bool:  # as it is looked at, the third writer publishes
        replace_whole(third, root / basecopy.REMOTE_BASE)
        return False

    with pytest.raises(OSError, match="what stood there is kept at .*quarantine"):
        remote.publish_unless_taken("src", basecopy.REMOTE_BASE, replaceable,
                                    ours=lambda name: (root / name / "ours").is_file())
    kept = list((root / "quarantine").iterdir())
    assert len(kept) == 1 and sorted(remote.names()) == [basecopy.REMOTE_BASE, "quarantine"]
    copies = {frozenset(p.name for p in d.iterdir()) - {"reason.txt"} for d in (root / basecopy.REMOTE_BASE, kept[0])}
    assert copies == {frozenset({"first"}), frozenset({"third"})}
