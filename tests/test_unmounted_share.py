"""Nothing is made or written on a directory a mount table names as a mount point while nothing is mounted on it
(minilmd/mount_places.py unmounted_point, path_checks.unmounted_share): /etc/fstab names /srv/data, its share is not
mounted (a boot before the mount, a failed mount), and run.remote = /srv/data/run1. Before, only a missing chain of
parents was refused: the first sync made run1 in the empty stub on the root disk, the copy hidden below the share once
it was mounted. Now `run --check` refuses it, and the sync fails, retried, until the share is mounted. Mounted means
listed in /proc/self/mountinfo (a fake of it: tests/mount_fakes.py; a real tmpfs as root); an autofs mount is the
automounter's, mounted on access, and not refused."""
from __future__ import annotations

import os
import threading
import types
from pathlib import Path

import pytest

from minilmd import bounded, mount_places
from minilmd.config import ConfigError
from minilmd.daemon import preflight
from minilmd.daemon.jobs import remotewait
from minilmd.daemon.jobs.remote_local import LocalRemote
from minilmd.daemon.jobs.stagingfetch import StagingFetch
from minilmd.mount_places import read_config
from minilmd.path_checks import remote_parents_refused
from mount_fakes import can_mount, mounted_on, tmpfs_on
from supervisor_helpers import write_config


def named(monkeypatch, tmp_path: Path, files: dict[str, str]) -> None:
    """This machine's mount tables are `files` (under a fake root, read as the real ones are: read_config)."""
    root = tmp_path / "tables"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    config = read_config(str(root), owner=os.geteuid())
    monkeypatch.setattr(mount_places, "snapshot", lambda: config)
    monkeypatch.setenv("HOME", "/nonexistent-home")  # tmp_path is no home directory here


def not_mounted(point: Path, table: str) -> str:
    return f"{point} is named as a mount point by {table} but nothing is mounted there"


@pytest.fixture
def stub(tmp_path, monkeypatch) -> Path:
    """/srv/data as fstab names it, its share not mounted: the empty stub directory on the local disk."""
    data = tmp_path / "srv" / "data"
    data.mkdir(parents=True)
    named(monkeypatch, tmp_path, {"etc/fstab": f"nas:/export/data {data} nfs4 defaults,_netdev 0 0\n"})
    return data


def test_a_remote_in_an_unmounted_mount_point_is_refused_and_the_sync_makes_nothing(stub, tmp_path, monkeypatch):
    """Before: "" (the parent is there), and the sync made run1 in the stub."""
    said = remote_parents_refused(str(stub / "run1"))
    assert not_mounted(stub, "/etc/fstab") in said and "mount it, or choose another run.remote" in said, said
    assert not_mounted(stub, "/etc/fstab") in remote_parents_refused(str(stub))  # the remote the mount point itself
    with pytest.raises(FileNotFoundError) as err:
        LocalRemote(str(stub / "run1")).makedirs()
    assert not_mounted(stub, "/etc/fstab") in str(err.value)
    assert list(stub.iterdir()) == []
    mounted_on(monkeypatch, tmp_path, stub)  # the share mounted (empty): the sync makes the remote in it
    assert remote_parents_refused(str(stub / "run1")) == ""
    LocalRemote(str(stub / "run1")).makedirs()
    assert (stub / "run1").is_dir()


def test_a_remote_left_in_the_stub_is_not_written_while_the_share_is_not_mounted(stub):
    """run1 made in the stub by an earlier sync while the share was not mounted: before, the root being there, the
    sync wrote on in it; now it fails, retried, as for a share gone."""
    from minilmd.daemon.jobs.sync import Syncer
    from minilmd.daemon.jobs.sync_errors import SyncError

    (stub / "run1").mkdir()
    with pytest.raises(FileNotFoundError):
        LocalRemote(str(stub / "run1")).make_tmp("step-1.tmp")
    assert sorted(os.listdir(stub / "run1")) == []
    scratch = stub.parent.parent / "scratch"
    scratch.mkdir()
    with pytest.raises(SyncError) as err:
        Syncer(scratch, str(stub / "run1")).sync_newest()
    assert f"sync to {stub / 'run1'} failed: " in str(err.value) and not_mounted(stub, "/etc/fstab") in str(err.value)
    assert sorted(os.listdir(stub / "run1")) == []


def test_the_table_that_names_the_mount_point_is_said(tmp_path, monkeypatch):
    net, srv = tmp_path / "net", tmp_path / "srv"
    (net / "host").mkdir(parents=True)
    for name in ("unit", "direct"):
        (srv / name).mkdir(parents=True)
    named(monkeypatch, tmp_path, {
        "etc/systemd/system/srv-unit.mount": f"[Mount]\nWhat=nas:/u\nWhere={srv}/unit\n",
        "etc/auto.master": f"{net} /etc/auto.net\n/- /etc/auto.direct\n",
        "etc/auto.direct": f"{srv}/direct nas:/d\n",
    })
    assert not_mounted(srv / "unit", "/etc/systemd/system/srv-unit.mount") in remote_parents_refused(
        str(srv / "unit" / "r"))
    assert not_mounted(srv / "direct", "/etc/auto.direct") in remote_parents_refused(str(srv / "direct" / "r"))
    said = remote_parents_refused(str(net / "host" / "r"))  # the automounter not running: /net a plain directory
    assert not_mounted(net / "host", f"/etc/auto.master (an entry of its autofs directory {net})") in said, said
    assert not_mounted(net / "other", f"/etc/auto.master (an entry of its autofs directory {net})") in \
        remote_parents_refused(str(net / "other"))  # not there: its stub's place, not made
    mounted_on(monkeypatch, tmp_path, net, srv / "direct", fstype="autofs")  # automount answers: mounts on access
    assert remote_parents_refused(str(net / "host" / "r")) == ""
    assert remote_parents_refused(str(srv / "direct" / "r")) == ""


def test_a_share_mounted_deeper_or_a_deeper_unmounted_one(stub, tmp_path, monkeypatch):
    """The nearest mount at or above the remote decides: a share mounted by hand below the named mount point holds
    the remote; a named mount point below a mounted share, itself not mounted, is refused."""
    (stub / "team").mkdir()
    mounted_on(monkeypatch, tmp_path, stub / "team")
    assert remote_parents_refused(str(stub / "team" / "run1")) == ""
    mounted_on(monkeypatch, tmp_path, stub)  # now only the share, not the one below it
    named(monkeypatch, tmp_path, {"etc/fstab": f"nas:/d {stub} nfs 0 0\nnas:/t {stub}/team nfs 0 0\n"})
    assert not_mounted(stub / "team", "/etc/fstab") in remote_parents_refused(str(stub / "team" / "run1"))


def test_run_check_refuses_a_first_launch_and_waits_at_a_restart(stub, tmp_path, corpus):
    remote = stub / "run1"
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    with pytest.raises(ConfigError) as err:
        preflight.check_with_waits(str(config))
    assert f"run.remote = '{remote}': {not_mounted(stub, '/etc/fstab')}" in str(err.value), err.value
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    (run_dir / "state.json").write_text("{}")  # it has started before: the share gone, waited for
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote), "dir": str(run_dir)})
    _, waits = preflight.check_with_waits(str(config))
    assert any(not_mounted(stub, "/etc/fstab") in w and "the sync fails, retried, until the share is there" in w
               for w in waits), waits
    assert list(stub.iterdir()) == []


@pytest.mark.skipif(not can_mount(), reason="mounts a tmpfs: root, with the right to mount")
def test_a_real_mount_point_mounted_and_not(stub):
    """The kernel's own mountinfo: the stub refused, a tmpfs mounted on it taken, refused again once unmounted (and
    what the sync made on the share is not on the stub below it)."""
    assert not_mounted(stub, "/etc/fstab") in remote_parents_refused(str(stub / "run1"))
    with tmpfs_on(stub):
        assert remote_parents_refused(str(stub / "run1")) == ""
        LocalRemote(str(stub / "run1")).makedirs()
        assert (stub / "run1").is_dir()
    assert not (stub / "run1").exists()
    with pytest.raises(FileNotFoundError):
        LocalRemote(str(stub / "run1")).makedirs()
    assert list(stub.iterdir()) == []


@pytest.mark.skipif(not can_mount(), reason="bind-mounts a directory: root, with the right to mount")
def test_a_bind_mount_of_the_same_file_system_is_a_mount_point(stub, tmp_path):
    """An fstab `bind` entry: the mount point has its parent's st_dev (os.path.ismount says no), mountinfo lists it."""
    import subprocess

    source = tmp_path / "export"
    source.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(stub)], check=True)
    try:
        assert os.stat(stub).st_dev == os.stat(stub.parent).st_dev  # what a st_dev comparison takes for no mount
        assert remote_parents_refused(str(stub / "run1")) == ""
    finally:
        subprocess.run(["umount", str(stub)], check=True)


def test_the_fetch_looks_at_the_first_sync_bounded(tmp_path, monkeypatch):
    """Before: the staging's fetch called made_by_first_sync unbounded, so a mount that stalls that look (no
    error, no answer) held the staging for ever; now it is bounded as `run --check` bounds it, and taken as no
    words of a first sync (a run that never synced starts from step 0, saying the remote is not there)."""
    stalled, done = threading.Event(), threading.Event()
    monkeypatch.setattr(remotewait, "made_by_first_sync", lambda url: stalled.wait() and "")
    monkeypatch.setattr(bounded, "SHARED_STORAGE_PROBE_S", 0.2)
    remote = tmp_path / "gone" / "r"
    fetch = StagingFetch()
    fetch.cfg = types.SimpleNamespace(run=types.SimpleNamespace(remote=str(remote)), run_dir=tmp_path)
    fetch.state = types.SimpleNamespace(remote_checkpoint=None, previous_unreadable="")
    fetch.records, fetch.fresh, fetch.from_step_0 = None, False, ""
    said: list = []
    threading.Thread(target=lambda: (said.append(fetch._nothing_fetched()), done.set()), daemon=True).start()
    try:
        assert done.wait(60), "the fetch's look at the remote blocked on the stalled mount"
    finally:
        stalled.set()
    assert said == [None] and fetch.from_step_0.startswith(f"{remote} is not there"), fetch.from_step_0
