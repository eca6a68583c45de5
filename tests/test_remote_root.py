"""A run's local remote is the directory its syncs wrote to (daemon/jobs/remote_root.py): a root gone is never made
again once the run synced there, and a root that is another directory (moved away and replaced, a share's mount
point on the local disk) is refused, nothing written or deleted there; `run --claim-remote` accepts the new one.

Observed before (fault audit 10, F1): run.remote on a share mounted by hand (no fstab entry) was unmounted mid-run;
the next sync made `remote/` again on the local disk in the empty mount point, claimed it, synced there "verified",
and the run ended done, exit 0, scratch given back, while the share held an older step."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from minilmd import checkpoint_dirs
from minilmd.daemon.jobs import remote_claim, remote_consent, remote_made, remote_root
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import RemoteGone
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture

SYNCED = "state.json records step 10 on it"
"""What the run's records say once it synced (Claim.synced_before, remotewait.records)."""


def _syncer(tmp_path: Path, remote: Path, synced: str = SYNCED) -> Syncer:
    claim = remote_claim.Claim(tmp_path / "run", "r", lambda: synced)
    (tmp_path / "run").mkdir(exist_ok=True)
    return Syncer(tmp_path / "scratch" / "checkpoints", str(remote), EXPECTED, claim=claim, run_dir=tmp_path / "run")


def _synced_once(tmp_path: Path, weights) -> tuple[Path, Path]:
    local, remote = tmp_path / "scratch" / "checkpoints", tmp_path / "share" / "remote"
    remote.mkdir(parents=True)
    save(local, 10, weights)
    assert _syncer(tmp_path, remote, synced="").sync_newest().step == 10
    return local, remote


def test_a_replaced_root_is_refused_saying_so_and_nothing_is_written_there(tmp_path, weights):
    local, remote = _synced_once(tmp_path, weights)
    remote.rename(tmp_path / "share" / "moved")  # the directory synced to moved away, another put at its path
    remote.mkdir()
    save(local, 20, weights)
    with pytest.raises(RemoteGone, match="not the directory this run synced to .*another directory of the same "
                                         "file system.*--claim-remote"):
        _syncer(tmp_path, remote).sync_newest()
    assert os.listdir(remote) == []  # no claim, no copy, no pointer
    assert checkpoint_dirs.read_latest(tmp_path / "share" / "moved") == "step-00000010"


def test_a_root_gone_is_not_made_again_once_the_run_synced_there(tmp_path, weights):
    local, remote = _synced_once(tmp_path, weights)
    (tmp_path / "share").rename(tmp_path / "share-away")  # its share unmounted: the path above it stays
    (tmp_path / "share").mkdir()
    save(local, 20, weights)
    with pytest.raises(RemoteGone, match=r"remote unavailable: run.remote .* is gone \(it was dev \d+:\d+ inode "
                                         r"\d+.*an unmounted share\?\)"):
        _syncer(tmp_path, remote).sync_newest()
    assert os.listdir(tmp_path / "share") == []
    (tmp_path / "share").rmdir()
    (tmp_path / "share-away").rename(tmp_path / "share")  # mounted again: the syncs go on
    assert _syncer(tmp_path, remote).sync_newest().step == 20


def test_a_root_gone_that_the_runs_records_say_it_synced_to_is_not_made_even_without_a_record(tmp_path, weights):
    remote = tmp_path / "share" / "remote"
    (tmp_path / "share").mkdir()
    save(tmp_path / "scratch" / "checkpoints", 10, weights)
    with pytest.raises(RemoteGone, match="is gone \\(state.json records step 10 on it; an unmounted share"):
        _syncer(tmp_path, remote).sync_newest()
    assert not remote.exists()
    assert _syncer(tmp_path, remote, synced="").sync_newest().step == 10  # a run that never synced there makes it


def test_a_fresh_lineage_whose_records_say_it_never_synced_there_makes_the_root_again_and_records_it(tmp_path,
                                                                                                   weights):
    local, remote = _synced_once(tmp_path, weights)
    remote.rename(tmp_path / "share" / "old-lineage")  # `run --fresh` with the old remote moved away
    save(local, 20, weights)
    assert _syncer(tmp_path, remote, synced="").sync_newest().step == 20
    made = remote_made.Made(remote_made.run_record(tmp_path / "run"))
    found = remote_root.recorded(str(remote), made)
    assert found is not None and found.ino == remote.stat().st_ino
    save(local, 30, weights)
    assert _syncer(tmp_path, remote).sync_newest().step == 30  # the new root is the run's from now on


def test_claim_remote_accepts_the_directory_there_now(tmp_path, weights):
    local, remote = _synced_once(tmp_path, weights)
    remote.rename(tmp_path / "share" / "moved")
    remote.mkdir()
    cfg = SimpleNamespace(run=SimpleNamespace(remote=str(remote), dir=str(tmp_path / "run"), name="r"),
                          run_dir=tmp_path / "run")
    assert remote_consent.take_over_at_launch(cfg, lambda *a, **k: None) == ""  # `minilmd run --claim-remote`
    save(local, 20, weights)
    assert _syncer(tmp_path, remote).sync_newest().step == 20
    recorded = remote_root.recorded(str(remote), remote_made.Made(remote_made.run_record(tmp_path / "run")))
    assert recorded is not None and not recorded.accept and recorded.ino == remote.stat().st_ino


def test_the_same_share_mounted_again_under_another_device_number_is_the_same_root(tmp_path):
    was = remote_root.RootRecord("/r", dev=os.makedev(0, 43), ino=2, fstype="nfs4", source="srv:/export")
    assert was.same_share(remote_root.RootRecord("/r", dev=os.makedev(0, 51), ino=2, fstype="nfs4",
                                                 source="srv:/export"))
    assert not was.same_share(remote_root.RootRecord("/r", dev=os.makedev(0, 51), ino=3, fstype="nfs4",
                                                     source="srv:/export"))
    assert not was.same_share(remote_root.RootRecord("/r", dev=os.makedev(252, 0), ino=2, fstype="ext4",
                                                     source="/dev/vda"))


def test_a_config_naming_another_remote_records_that_one(tmp_path, weights):
    local, remote = _synced_once(tmp_path, weights)
    other = tmp_path / "elsewhere" / "remote"
    other.parent.mkdir()
    save(local, 20, weights)
    assert _syncer(tmp_path, other, synced="").sync_newest().step == 20  # records are matched by URL
    made = remote_made.Made(remote_made.run_record(tmp_path / "run"))
    assert remote_root.recorded(str(other), made) is not None and remote_root.recorded(str(remote), made) is None
