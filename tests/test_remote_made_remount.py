"""What proves a checkpoint's half copy this run's after its share was mounted again (remote_made.why_kept; fault
audit 11, F4; the FUSE remount itself: tests/test_remote_fuse_dead.py).

A FUSE mount numbers its inodes anew at each mount, so the record's (name, device, inode) of a half copy a dead sync
left names no directory after a remount: it was left for good, "renamed there by another user". On a root recorded as
a file system that renumbers (fuse, fuse.*), the recorded name proves it, when it is a checkpoint's copy of this
host whose sync is over (its pid dead) that holds no manifest of another step. Elsewhere the inode alone still does.
The remount is stood in for here by the directory copied to a new inode under its name, what a FUSE remount shows."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from minilmd import names, tmpnames
from minilmd.daemon.jobs import remote_made
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.proc_info import process_start_ticks


def _dead_pid() -> tuple[int, int]:
    """(pid, start ticks) of a sync that is over: a reaped process's pid with a start time no live process has (1:
    before any), so that a process given that pid since never passes for it."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid, 1


def _half_copy(tmp_path: Path, fstype: str, maker: tuple[int, int | None],
               manifest_step: int | None = None) -> tuple[LocalRemote, str]:
    """A remote whose record names a root of `fstype`, holding a checkpoint's copy by a sync of this host's `maker`,
    recorded as it was made, then given another inode under its name (a remount's numbering)."""
    root = tmp_path / "remote"
    remote = open_remote(str(root))
    assert isinstance(remote, LocalRemote)
    remote.made = remote_made.Made(tmp_path / "remote-made.json")
    remote.makedirs()
    remote.made.set_root({"url": str(root), "dev": 1, "ino": 1, "fstype": fstype, "source": "share", "point": str(root),
                          "under": "."})
    name = remote.make_tmp(tmpnames.sync_tmp_name(names.step_name(30), tmpnames.host_tag(), *maker))
    (root / name / "model.safetensors").write_bytes(b"half")
    if manifest_step is not None:
        (root / name / names.MANIFEST).write_text(json.dumps({"step": manifest_step, "files": {}}))
    renumbered = root / "renumbered"
    shutil.copytree(root / name, renumbered)
    shutil.rmtree(root / name)
    os.rename(renumbered, root / name)
    assert not remote.made.proves(name, _identity(root / name)) and remote.made.recorded(name)
    return remote, name


def _identity(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino


@pytest.mark.parametrize("fstype", ["fuse", "fuse.rclone"])
def test_a_recorded_half_copy_on_a_remounted_fuse_share_is_proven_by_its_name_and_removed(tmp_path, fstype):
    remote, name = _half_copy(tmp_path, fstype, _dead_pid())
    assert remote.rm(name) is None  # was: "a directory this run has no record of making there"
    assert not (tmp_path / "remote" / name).exists()
    assert not remote.made.recorded(name)  # every record of the name gone with it


def test_a_half_copy_of_a_fuse_share_cut_while_its_manifest_was_read_back_is_removed_too(tmp_path):
    remote, name = _half_copy(tmp_path, "fuse", _dead_pid(), manifest_step=30)
    assert remote.rm(name) is None
    assert not (tmp_path / "remote" / name).exists()


def test_elsewhere_the_inode_alone_proves_a_copy(tmp_path):
    remote, name = _half_copy(tmp_path, "nfs4", _dead_pid())  # an NFS remount keeps its inode numbers
    assert "no record of making" in (remote.rm(name) or "")
    assert (tmp_path / "remote" / name).is_dir()


def test_a_directory_whose_manifest_names_another_step_is_left(tmp_path):
    """Another user who may rename within the root moved this run's step 20 to the recorded copy's name."""
    remote, name = _half_copy(tmp_path, "fuse", _dead_pid(), manifest_step=20)
    why = remote.rm(name) or ""
    assert "says step 20, not 30" in why, why
    assert (tmp_path / "remote" / name / names.MANIFEST).is_file()


def test_the_copy_of_a_sync_still_running_is_left(tmp_path):
    with subprocess.Popen(["sleep", "60"]) as live:
        try:
            remote, name = _half_copy(tmp_path, "fuse", (live.pid, process_start_ticks(live.pid)))
            why = remote.rm(name) or ""
        finally:
            live.kill()
    assert "a sync of this host that is over" in why, why
    assert (tmp_path / "remote" / name).is_dir()
