"""A share unmounted between the claim of run.remote and the run's first completed sync (daemon/jobs/remote_root.py).

The first sync records what the remote's root is (device, inode, mount) when it claims it, before it copies anything.
A copy of that sync that fails (EIO) leaves no completed sync in the run's records: before, only a root recorded as
synced to was judged, so a share unmounted then had `remote/` made in its empty mount point on the local disk. The
record from the claim is the check now: a root that was on a mount, whose mount point nothing is mounted on now, is
"gone (...; an unmounted share?)", the root itself a mount point included; a run with nothing recorded makes it as
before. With the real FUSE file system (tests/faultfs.py) mounted and unmounted."""
from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest

from faults_fixtures import faultfs_dirs, mounted_faultfs
from minilmd import checkpoint_dirs
from minilmd.daemon.jobs import remote_claim, remote_made, remote_root
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import RemoteGone, SyncError
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture

NEVER_SYNCED = ""
"""What the run's records say while no sync of it completed (Claim.synced_before)."""


def _syncer(tmp_path: Path, remote: Path) -> Syncer:
    claim = remote_claim.Claim(tmp_path / "run", "r", lambda: NEVER_SYNCED)
    (tmp_path / "run").mkdir(exist_ok=True)
    return Syncer(tmp_path / "scratch" / "checkpoints", str(remote), EXPECTED, claim=claim, run_dir=tmp_path / "run")


@pytest.mark.fuse
@pytest.mark.parametrize("below", ["remote", "."], ids=["root-below-the-mount-point", "root-is-the-mount-point"])
def test_a_share_unmounted_after_the_claim_before_any_completed_sync_is_gone(tmp_path, weights, below):
    backing, mount_point = faultfs_dirs(tmp_path)
    remote = Path(os.path.normpath(mount_point / below))
    local = tmp_path / "scratch" / "checkpoints"
    save(local, 10, weights)
    with contextlib.ExitStack() as stack:
        share = stack.enter_context(mounted_faultfs(backing, mount_point))
        share.fail_writes("*.safetensors", errno.EIO)  # the claim is written, the checkpoint's copy fails
        with pytest.raises(SyncError):
            _syncer(tmp_path, remote).sync_newest()
        found = remote_root.recorded(str(remote), remote_made.Made(remote_made.run_record(tmp_path / "run")))
        assert found is not None and found.fstype.startswith("fuse") and found.point == str(mount_point)
        share.unmount()  # the mount point stays, an empty directory of the local disk
        assert os.listdir(mount_point) == []
        save(local, 20, weights)
        with pytest.raises(RemoteGone, match=rf"remote unavailable: run.remote {remote} is gone \(it was dev "
                                             rf"\d+:\d+ inode \d+ on fuse.*mounted at {mount_point}; its path is now "
                                             rf"on .*; an unmounted share\?\).*--claim-remote"):
            _syncer(tmp_path, remote).sync_newest()
        assert os.listdir(mount_point) == []  # nothing made nor written on the local disk there
        stack.enter_context(mounted_faultfs(backing, mount_point))  # the share mounted again: the syncs go on
        assert _syncer(tmp_path, remote).sync_newest().step == 20
    assert checkpoint_dirs.read_latest(backing / below) == "step-00000020"
    assert os.listdir(mount_point) == []

