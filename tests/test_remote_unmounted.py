"""run.remote on a share mounted by hand (no fstab entry, no autofs map, no systemd unit: nothing tells its mount
point from a directory the user made) unmounted while the run trains (daemon/jobs/remote_root.py).

Observed before (fault audit 10, F1): the next sync made `remote/` again on the local disk in the empty mount point,
claimed it, synced there "verified", and the run ended done, exit 0, scratch given back, while the share held an
older step. Now the sync fails, "remote unavailable: run.remote R is gone (...; an unmounted share?)": nothing is
written in the mount point, training goes on, the last sync waits (status says why), and once the share is mounted
again the run ends finished with its last checkpoint on it."""
from __future__ import annotations

import contextlib
import os

import pytest

from faults_fixtures import faultfs_dirs, mounted_faultfs
from minilmd import checkpoint_dirs, names
from supervisor_helpers import (
    cli,
    remote_step,
    start_supervisor,
    state,
    wait_for,
    wait_for_synced,
    wait_or_kill,
    write_config,
)

WAITING = "final sync waiting: "



@pytest.mark.slow
@pytest.mark.fuse
def test_a_share_unmounted_mid_run_is_waited_for_never_made_again_on_the_local_disk(tmp_path, corpus):
    backing, mount_point = faultfs_dirs(tmp_path)
    remote = mount_point / "remote"
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    run_dir, release = tmp_path / "s" / "run", tmp_path / "release"
    with contextlib.ExitStack() as stack:
        share = stack.enter_context(mounted_faultfs(backing, mount_point))
        proc = start_supervisor(config, tmp_path / "supervisor.out", FAKE_HOLD=f"15:{release}")
        stack.callback(lambda: proc.poll() is None and (proc.kill(), proc.wait(60)))
        stack.callback(release.touch)
        wait_for_synced(run_dir, 10, proc, tmp_path / "supervisor.out")
        share.unmount()  # the mount point stays, an empty directory of the local disk
        assert os.listdir(mount_point) == []
        release.touch()  # steps 20 and 30 saved, their syncs fail
        wait_for(lambda: (state(run_dir).get("reason") or "").startswith(WAITING) or proc.poll() is not None,
                 timeout=240, what="the last sync to wait")
        assert proc.poll() is None, f"the run ended (exit {proc.poll()}): {state(run_dir).get('reason')}"
        reason = state(run_dir)["reason"]
        assert f"run.remote {remote} is gone" in reason and "an unmounted share?" in reason, reason
        assert os.listdir(mount_point) == []  # nothing made nor written on the local disk there
        assert remote_step(run_dir) == 10
        shown = cli("status", str(config)).stdout
        assert "stopping" in shown and "is gone" in shown, shown
        stack.enter_context(mounted_faultfs(backing, mount_point))  # the share mounted again
        rc = wait_or_kill(proc, timeout=300)
        out = (tmp_path / "supervisor.out").read_text()[-3000:]
        assert rc == 0, out
        st = state(run_dir)
        assert st["phase"] == "done" and st["remote_checkpoint"]["step"] == 30, out
        assert checkpoint_dirs.read_latest(backing / "remote") == names.step_name(30)
    assert os.listdir(mount_point) == []  # unmounted at the end: the local disk's directory still holds nothing
