"""A local remote's root as its mount knows it (daemon/jobs/remote_root.py), with /proc/self/mountinfo faked.

Review 12c F4: a FUSE share (rclone, sshfs, gcsfuse) remounted gives its root a new inode, a btrfs subvolume's
device is in no mountinfo line (its type and source were recorded as nothing), and an NFS share may come back as
nfs4 where it was nfs: each was refused as another directory until `--claim-remote`. F5: after `run --fresh` the
record was not looked at, so an unmounted share's empty mount point was taken and remote/ made on the local disk."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from minilmd import mounts
from minilmd.daemon.jobs import remote_made, remote_root
from minilmd.dirfd import Dir

SYNCED = "state.json records step 10 on it"
DISK = mounts.Mount("/", "ext4", os.makedev(252, 0), source="/dev/vda")


def _held(path: Path) -> Dir:
    return Dir(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)


def _made(tmp_path: Path) -> remote_made.Made:
    (tmp_path / "run").mkdir(exist_ok=True)
    return remote_made.Made(remote_made.run_record(tmp_path / "run"))


def _mountinfo(monkeypatch, *listed: mounts.Mount) -> None:
    monkeypatch.setattr(mounts, "read_mounts", lambda *a, **k: list(listed))


def test_a_fuse_share_mounted_again_is_its_root_whatever_its_inode():
    was = remote_root.RootRecord("/m/r", dev=os.makedev(0, 43), ino=7, fstype="fuse.rclone", source="gdrive:",
                                 point="/m", under="r")
    again = dataclasses.replace(was, dev=os.makedev(0, 51), ino=12)  # rclone numbers its inodes anew at each mount
    assert was.same_share(again)
    assert was.same_share(dataclasses.replace(again, dev=was.dev))
    assert not was.same_share(dataclasses.replace(again, under="other/r"))
    assert not was.same_share(dataclasses.replace(again, source="s3:"))
    on_disk = remote_root.RootRecord("/d/r", dev=os.makedev(252, 0), ino=7, fstype="ext4", source="/dev/vda",
                                     point="/", under="d/r")
    assert not on_disk.same_share(dataclasses.replace(on_disk, ino=8))  # a directory replaced: still another one


def test_an_nfs_share_mounted_again_as_nfs4_is_the_same_share():
    was = remote_root.RootRecord("/r", dev=os.makedev(0, 43), ino=2, fstype="nfs", source="srv:/export")
    assert was.same_share(dataclasses.replace(was, dev=os.makedev(0, 51), fstype="nfs4"))
    assert not was.same_share(dataclasses.replace(was, dev=os.makedev(0, 51), fstype="cifs"))


def test_a_root_whose_device_no_mount_lists_is_recorded_by_its_path_and_known_after_a_device_change(tmp_path,
                                                                                                    monkeypatch):
    remote = tmp_path / "remote"
    remote.mkdir()
    subvolume = mounts.Mount("/", "btrfs", os.makedev(0, 30), source="/dev/nvme0n1p2")  # not the root's st_dev
    _mountinfo(monkeypatch, subvolume)
    made = _made(tmp_path)
    with _held(remote) as held:
        remote_root.remember(str(remote), held, made)
        found = remote_root.recorded(str(remote), made)
        assert found is not None and (found.fstype, found.source, found.point) == ("btrfs", "/dev/nvme0n1p2", "/")
        made.set_root(dataclasses.asdict(dataclasses.replace(found, dev=found.dev + 1)))  # a reboot renumbered it
        remote_root.judge_opened(str(remote), held, made, lambda: SYNCED)  # the same root: not refused
    found = remote_root.recorded(str(remote), made)
    assert found is not None and found.dev == remote.stat().st_dev  # the record takes the device now


def _recorded_on_a_share(tmp_path: Path, monkeypatch, point: Path) -> tuple[Path, remote_made.Made]:
    remote = tmp_path / "share" / "remote"
    remote.mkdir(parents=True)
    _mountinfo(monkeypatch, DISK, mounts.Mount(str(point), "nfs4", remote.stat().st_dev, source="srv:/export"))
    made = _made(tmp_path)
    with _held(remote) as held:
        remote_root.remember(str(remote), held, made)
    return remote, made


def test_after_fresh_an_unmounted_shares_mount_point_is_not_where_the_root_is_made(tmp_path, monkeypatch):
    remote, made = _recorded_on_a_share(tmp_path, monkeypatch, tmp_path / "share")
    remote.rmdir()
    _mountinfo(monkeypatch, DISK)  # unmounted: its mount point an empty directory of the local disk
    with pytest.raises(remote_root.NotTheRoot, match=r"is gone \(it was dev .* on nfs4 srv:/export mounted at .*"
                                                     r"its path is now on ext4 /dev/vda mounted at /; an unmounted "
                                                     r"share\?\)"):
        remote_root.judge_missing(str(remote), made, lambda: "")  # `run --fresh`: no sync since
    _mountinfo(monkeypatch, DISK, mounts.Mount(str(tmp_path / "share"), "nfs4", 99, source="srv:/export"))
    remote_root.judge_missing(str(remote), made, lambda: "")  # mounted again, old remote moved away: made there


def test_after_fresh_a_share_mounted_at_the_root_itself_and_unmounted_is_refused(tmp_path, monkeypatch):
    remote, made = _recorded_on_a_share(tmp_path, monkeypatch, tmp_path / "share" / "remote")
    remote.rename(tmp_path / "share" / "mounted")
    remote.mkdir()  # the mount point left on the local disk (another inode, as another device would give)
    _mountinfo(monkeypatch, DISK)
    with _held(remote) as held, pytest.raises(remote_root.NotTheRoot, match=r"is gone \(it was dev .* on nfs4 "
                                                                            r"srv:/export mounted at .*; its path is "
                                                                            r"now on ext4 /dev/vda mounted at /; an "
                                                                            r"unmounted share\?\)"):
        remote_root.judge_opened(str(remote), held, made, lambda: "")  # its mount point is mounted by nothing
    assert remote_root.recorded(str(remote), made).point == str(remote)  # the record kept


def test_the_replaced_words_beside_a_refusal_follow_the_same_root_rule(tmp_path):
    """remote_claim.replaced's words ("was replaced since this run claimed it") come from remote_root's rule: a FUSE
    share mounted again, its inode numbers new, is no replacement; a directory replaced on a disk is."""
    made = _made(tmp_path)
    fuse = remote_root.RootRecord("/m/r", dev=os.makedev(0, 43), ino=7, fstype="fuse.rclone", source="gdrive:",
                                  point="/m", under="r")
    made.set_root(dataclasses.asdict(fuse))
    assert remote_root.replaced_words("/m/r", made, (os.makedev(0, 51), 12)) == ""
    disk = remote_root.RootRecord("/d/r", dev=os.makedev(252, 0), ino=7, fstype="ext4", source="/dev/vda", point="/",
                                  under="d/r")
    made.set_root(dataclasses.asdict(disk))
    assert remote_root.replaced_words("/d/r", made, (os.makedev(252, 0), 7)) == ""
    assert remote_root.replaced_words("/d/r", made, (os.makedev(252, 0), 8)) == f"was {disk.words()}; inode 8 now"
    assert remote_root.replaced_words("/d/r", made, None) == ""  # nothing stands there


def test_check_words_judge_by_the_syncs_rule_and_record_nothing(tmp_path, monkeypatch):
    """`run --check`'s look (remote_root.check_words): the same share mounted again under another device number is
    the run's root, said nothing of and left for the sync to record; another share mounted at the recorded mount
    point is another directory, not a share gone; nothing mounted there any more is gone."""
    remote, made = _recorded_on_a_share(tmp_path, monkeypatch, tmp_path / "share")
    was = remote_root.recorded(str(remote), made)
    assert was is not None
    made.set_root(dataclasses.asdict(dataclasses.replace(was, dev=was.dev + 1)))  # the share's device renumbered
    assert remote_root.check_words(str(remote), made, lambda: SYNCED) == ""
    assert remote_root.recorded(str(remote), made).dev == was.dev + 1  # read only: the sync records it
    _mountinfo(monkeypatch, DISK, mounts.Mount(str(tmp_path / "share"), "cifs", remote.stat().st_dev,
                                               source="//other/share"))  # another share at the recorded point
    assert "is not the directory this run synced to" in remote_root.check_words(str(remote), made, lambda: SYNCED)
    _mountinfo(monkeypatch, DISK)
    assert "is gone (it was dev" in remote_root.check_words(str(remote), made, lambda: "")


def _by_name_then(tmp_path: Path, monkeypatch) -> tuple[Path, remote_made.Made, int]:
    """A root recorded on an NFS share mounted by its server's name, and the device number it had then."""
    remote = tmp_path / "share" / "remote"
    remote.mkdir(parents=True)
    dev = remote.stat().st_dev
    _mountinfo(monkeypatch, DISK, mounts.Mount(str(tmp_path / "share"), "nfs4", dev, source="nfs.example:/export",
                                               options="rw,vers=4.2,clientaddr=10.0.0.2,addr=10.0.0.5"))
    made = _made(tmp_path)
    with _held(remote) as held:
        remote_root.remember(str(remote), held, made)
    found = remote_root.recorded(str(remote), made)
    assert found is not None and found.server == "10.0.0.5"
    made.set_root(dataclasses.asdict(dataclasses.replace(found, dev=dev + 1)))  # another device number then
    return remote, made, dev


@pytest.mark.parametrize(("source", "addr", "same"), [("10.0.0.5:/export", "10.0.0.5", True),
                                                      ("10.0.0.6:/export", "10.0.0.6", False),
                                                      ("10.0.0.5:/other", "10.0.0.5", False)])
def test_an_nfs_share_mounted_again_by_its_servers_address_is_the_same_share(tmp_path, monkeypatch, source, addr,
                                                                             same):
    """nfs.example:/export mounted again as 10.0.0.5:/export: the kernel shows the address it talks to (addr=) for
    both, so the same export path on the same address (and the same root inode) is the same share, recorded so;
    another address or another export is not (before: refused until `--claim-remote`, the sources differing)."""
    remote, made, dev = _by_name_then(tmp_path, monkeypatch)
    _mountinfo(monkeypatch, DISK, mounts.Mount(str(tmp_path / "share"), "nfs", dev, source=source,
                                               options=f"rw,vers=3,addr={addr}"))
    remote.rename(tmp_path / "share" / "away")  # a `--fresh` lineage, the old remote moved away: made again only
    if same:                                     # on the share recorded
        remote_root.judge_missing(str(remote), made, lambda: "")
    else:
        with pytest.raises(remote_root.NotTheRoot, match="is gone"):
            remote_root.judge_missing(str(remote), made, lambda: "")
    (tmp_path / "share" / "away").rename(remote)
    with _held(remote) as held:
        if same:
            remote_root.judge_opened(str(remote), held, made, lambda: SYNCED)
            assert remote_root.recorded(str(remote), made).source == source  # known by its new source from now on
        else:
            with pytest.raises(remote_root.NotTheRoot, match="not the directory this run synced to"):
                remote_root.judge_opened(str(remote), held, made, lambda: SYNCED)

def test_a_record_without_the_servers_address_needs_the_same_source(tmp_path, monkeypatch):
    """A record an older minilmd wrote (no address) keeps the rule it had: another source is another share."""
    remote, made, dev = _by_name_then(tmp_path, monkeypatch)
    made.set_root(dataclasses.asdict(dataclasses.replace(remote_root.recorded(str(remote), made), server="")))
    _mountinfo(monkeypatch, DISK, mounts.Mount(str(tmp_path / "share"), "nfs4", dev, source="10.0.0.5:/export",
                                               options="rw,addr=10.0.0.5"))
    with _held(remote) as held, pytest.raises(remote_root.NotTheRoot, match="not the directory this run synced to"):
        remote_root.judge_opened(str(remote), held, made, lambda: SYNCED)
