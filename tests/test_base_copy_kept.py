"""What stood at `<remote>/init` and a push of the LoRA base (daemon/jobs/basecopy.py) could not put back there
(Remote.publish_unless_taken: a third writer took `init` while it was looked at, or the put-back failed) is another
machine's base copy, maybe the only one of the weights older checkpoints were trained on: it is never deleted, not
by a later push of the same process (whose temporary names it may sit under), nor by the sync's clean-up, even
where quarantine/ cannot be used (another user's entry or a link there)."""
from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import pytest

from base_copy_helpers import files_of, staged_pth
from minilmd import dirfd, tmpnames
from minilmd.daemon.jobs import basecopy
from minilmd.daemon.jobs.remote import LeftAside
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.fsio import publish_dir
from minilmd.init_source import STAGED_RECORD
from minilmd.names import QUARANTINE, REASON_FILE
from minilmd.tmpnames import sync_tmp_name
from rename_flags import exchange_not_done


def _kept_at(message: str) -> Path:
    """The path a LeftAside message says what stood at `init` is kept at."""
    m = re.search(r"is kept at (\S+) \(", message)
    assert m, message
    return Path(m.group(1))


def _no_quarantine(root: Path, tmp_path: Path) -> None:
    """`<remote>/quarantine` planted as a link (set_aside refuses it: nothing is moved through a link)."""
    (tmp_path / "elsewhere").mkdir()
    root.mkdir(parents=True, exist_ok=True)
    (root / QUARANTINE).symlink_to(tmp_path / "elsewhere")


class TwoOtherWriters(LocalRemote):
    """A remote shared with two other machines: one publishes its base's copy (`theirs`) at `init` right when this
    push copies its record (after this push read the remote's record), the other (`third`) takes `init` (a
    publish_dir, replacing whatever stands there) while this push looks at what it moved out of `init`."""

    def __init__(self, url: str, theirs: Path, third: Path):
        super().__init__(url)
        self.theirs, self.third, self.writers = theirs, third, 2

    def put(self, local: Path, *names: str) -> int:
        if names[-1] == STAGED_RECORD and self.writers == 2:
            self.writers -= 1
            publish_dir(shutil.copytree(self.theirs, self.path(".tmp-init-theirhost-7")),
                        self.path(basecopy.REMOTE_BASE))
        return super().put(local, *names)

    def cat(self, path: str, max_bytes: int) -> bytes:
        if "/.tmp-init-" in path and self.writers == 1:
            self.writers -= 1
            publish_dir(shutil.copytree(self.third, self.path(".tmp-init-thirdhost-9")),
                        self.path(basecopy.REMOTE_BASE))
        return super().cat(path, max_bytes)


def test_what_cannot_be_put_back_nor_quarantined_survives_the_next_push_and_the_clean_up(tmp_path):
    """On main, with quarantine/ a link, what could not go back to `init` was left under the push's own temporary
    name (`.tmp-init-HOST-PID`), and the next push of the same process removed that name first (make_tmp): the
    third machine's copy was deleted."""
    if why := exchange_not_done(tmp_path):
        pytest.skip(why)  # the NFS path: test_a_put_back_that_fails_leaves_what_stood_there_kept
    ours, theirs, third = (staged_pth(tmp_path, name) for name in ("ours", "theirs", "third"))
    root = tmp_path / "remote"
    _no_quarantine(root, tmp_path)
    remote = TwoOtherWriters(str(root), theirs, third)
    with pytest.raises(LeftAside) as left:
        basecopy.push(remote, ours, tmpnames.host_tag(), os.getpid())
    kept = _kept_at(str(left.value))
    assert files_of(kept) == files_of(third) and files_of(root / basecopy.REMOTE_BASE) == files_of(theirs)
    # the machine of `theirs` moves its copy elsewhere: this run's next sync pushes its base again, in this process
    shutil.move(root / basecopy.REMOTE_BASE, tmp_path / "theirs-moved")
    logs: list[str] = []
    for _ in range(2):
        Syncer(tmp_path / "checkpoints", str(root), log=logs.append, base=ours).sync_newest()
    assert files_of(kept) == files_of(third), logs
    assert files_of(root / basecopy.REMOTE_BASE) == files_of(ours)


def test_a_copy_left_under_the_push_temporary_name_is_not_removed_by_the_next_push(tmp_path):
    """Where neither quarantine/ nor another name could take it, what stood at `init` stays under the push's
    temporary name: the next push of that process copies under a fresh name instead of removing it (on main
    make_tmp removed it first)."""
    ours, theirs = staged_pth(tmp_path, "ours"), staged_pth(tmp_path, "theirs")
    root = tmp_path / "remote"
    left = root / sync_tmp_name(basecopy.REMOTE_BASE, "h", 1)
    shutil.copytree(theirs, left)
    taken: list[tuple[str, str]] = []
    remote = open_remote(str(root))
    assert basecopy.push(remote, ours, "h", 1, taken=lambda found, fresh: taken.append((found, fresh))) > 0
    assert files_of(left) == files_of(theirs)
    assert files_of(root / basecopy.REMOTE_BASE) == files_of(ours)
    assert len(taken) == 1 and "another" in taken[0][0]


class PublishesAtTheRecord(LocalRemote):
    """A remote shared with another machine, which publishes its base's copy at `init` when this push copies its
    record (after this push read the remote's record)."""

    def __init__(self, url: str, theirs: Path):
        super().__init__(url)
        self.theirs = theirs

    def put(self, local: Path, *names: str) -> int:
        if names[-1] == STAGED_RECORD:
            publish_dir(shutil.copytree(self.theirs, self.path(".tmp-init-theirhost-7")),
                        self.path(basecopy.REMOTE_BASE))
        return super().put(local, *names)


@pytest.mark.parametrize("quarantine", ["usable", "a link"])
def test_a_put_back_that_fails_leaves_what_stood_there_kept(tmp_path, monkeypatch, quarantine):
    """On main the put-back's OSError escaped the push as it was (no LeftAside) with the other base's copy left at
    `<tmp>-replaced`, and the retry, finding `init` taken again, removed that name first: the copy was deleted."""
    monkeypatch.setattr(dirfd, "renameat2", lambda *args: False)  # NFS: EINVAL
    real_rename_new = dirfd.Dir.rename_new

    def rename_new(self, name, to_name):
        if name.endswith("-replaced") and to_name == basecopy.REMOTE_BASE:
            raise OSError(errno.EIO, os.strerror(errno.EIO), name)
        return real_rename_new(self, name, to_name)

    monkeypatch.setattr(dirfd.Dir, "rename_new", rename_new)
    ours = staged_pth(tmp_path, "ours")
    theirs = [staged_pth(tmp_path, f"theirs{n}") for n in (1, 2)]
    root = tmp_path / "remote"
    if quarantine == "a link":
        _no_quarantine(root, tmp_path)
    kept = []
    for copy in theirs:  # the retry: another copy published at `init` meanwhile again
        with pytest.raises(LeftAside) as left:
            basecopy.push(PublishesAtTheRecord(str(root), copy), ours, "h", 1)
        kept.append(_kept_at(str(left.value)))
    for at, copy in zip(kept, theirs, strict=True):
        assert {k: v for k, v in files_of(at).items() if k != REASON_FILE} == files_of(copy)
    assert not (root / basecopy.REMOTE_BASE).exists()  # what stood there could not go back: nothing is there


def test_an_earlier_tries_aside_holding_another_base_is_not_removed(tmp_path, monkeypatch):
    """On NFS an earlier try's `<tmp>-replaced` may hold another base's copy that could not go back (nor be set
    aside): on main the next try removed that name first, before renaming what stood at `init` there."""
    monkeypatch.setattr(dirfd, "renameat2", lambda *args: False)  # NFS: EINVAL
    ours, theirs, earlier = (staged_pth(tmp_path, name) for name in ("ours", "theirs", "earlier"))
    root = tmp_path / "remote"
    aside = root / f"{sync_tmp_name(basecopy.REMOTE_BASE, 'h', 1)}-replaced"
    shutil.copytree(earlier, aside)
    assert basecopy.push(PublishesAtTheRecord(str(root), theirs), ours, "h", 1) == 0
    assert files_of(aside) == files_of(earlier)
    assert files_of(root / basecopy.REMOTE_BASE) == files_of(theirs)


def test_what_quarantine_took_before_its_reason_failed_is_said_to_be_there(tmp_path, monkeypatch):
    """quarantine/ takes what stood at `init`, then writing its reason.txt fails (ENOSPC): the LeftAside says to
    look in quarantine/, where it is (before: it named the push's temporary name, where nothing was any more)."""
    if why := exchange_not_done(tmp_path):
        pytest.skip(why)
    from minilmd.daemon.jobs import remote_write

    ours, theirs, third = (staged_pth(tmp_path, name) for name in ("ours", "theirs", "third"))
    root = tmp_path / "remote"

    real_open_new = remote_write.open_new

    def full_disk_for_the_reason(root, names, show, *args, **kwargs):
        if names[-1] == REASON_FILE:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open_new(root, names, show, *args, **kwargs)

    monkeypatch.setattr(remote_write, "open_new", full_disk_for_the_reason)
    with pytest.raises(LeftAside) as left:
        basecopy.push(TwoOtherWriters(str(root), theirs, third), ours, tmpnames.host_tag(), os.getpid())
    assert f"{root / QUARANTINE}/ or " in str(left.value) and "No space left" in str(left.value)
    (kept,) = (root / QUARANTINE).iterdir()
    assert files_of(kept) == files_of(third)
