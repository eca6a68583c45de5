"""A FUSE share whose daemon dies during a sync, then mounted again (fault audit 11, F3 and F4), with the real FUSE
file system (tests/faultfs.py), its daemon SIGKILLed mid-copy.

F3: every access to a dead FUSE mount answers ENOTCONN ("Transport endpoint is not connected"); the sync took it for
a plain failure, so the last sync gave up after its 3 tries in some 3 s: the run ended failed, exit 1, the only copy
of its last step in scratch (in /dev/shm by default: lost at a reboot). Now a root that answers ENOTCONN (or ESTALE,
mounts.DEAD_MOUNT_ERRNOS) is a share gone: the sync raises ShareDead (a RemoteGone), waited for with no try counted,
saying "the share's FUSE daemon is gone (...): mount it again", and once it is mounted again the sync goes on.

F4: a FUSE mount numbers its inodes anew: the half copy the cut sync left, recorded by this run with its inode then,
was "a directory this run has no record of making there ... renamed there by another user" after the remount, and
left for good (a whole checkpoint each time). Now, on a root recorded as FUSE, a recorded checkpoint copy of this
host whose sync is over is proven by its recorded name (tests/test_remote_made_remount.py holds the rule's edges).
"""
from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path

import pytest

from faults_fixtures import faultfs_dirs, mounted_faultfs, unmount
from minilmd import checkpoint_dirs
from minilmd.daemon.jobs import remote_claim
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import RemoteGone, ShareDead
from supervisor_helpers import (
    cli,
    start_supervisor,
    state,
    wait_for,
    wait_for_synced,
    wait_or_kill,
    write_config,
)
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture
from waiting import wait_until


def _syncer(tmp_path: Path, remote: Path, said: list[str]) -> Syncer:
    claim = remote_claim.Claim(tmp_path / "run", "r", lambda: "")
    (tmp_path / "run").mkdir(exist_ok=True)
    return Syncer(tmp_path / "scratch" / "checkpoints", str(remote), EXPECTED, claim=claim, run_dir=tmp_path / "run",
                  log=said.append)


def _sync_in_thread(syncer: Syncer) -> tuple[threading.Thread, dict]:
    ended: dict = {}

    def sync() -> None:
        try:
            ended["result"] = syncer.sync_newest()
        except BaseException as e:  # noqa: BLE001 - what the sync raised, for the test to judge
            ended["error"] = e

    thread = threading.Thread(target=sync, daemon=True)
    thread.start()
    return thread, ended


@pytest.mark.slow
@pytest.mark.fuse
def test_a_fuse_daemon_killed_mid_copy_is_a_share_gone_waited_for_and_its_half_copy_goes_after_a_remount(
        tmp_path, weights):
    backing, mount_point = faultfs_dirs(tmp_path)
    remote, local, said = mount_point / "remote", tmp_path / "scratch" / "checkpoints", list[str]()
    gone = (rf"remote unavailable: run.remote {remote}: the share's FUSE daemon is gone \(Transport endpoint is not "
            rf"connected\): mount it again")
    save(local, 10, weights)
    with contextlib.ExitStack() as stack:
        share = stack.enter_context(mounted_faultfs(backing, mount_point))
        syncer = _syncer(tmp_path, remote, said)
        assert syncer.sync_newest().step == 10
        save(local, 20, weights)
        share.stall("remote/.tmp-step-00000020-*/*", seconds=300, op="write")
        thread, ended = _sync_in_thread(syncer)
        wait_until(lambda: share.hits("stall"), 60, "the copy of step 20 to stall")
        share.proc.kill()  # the FUSE daemon dies: the stalled write, and every access after it, answer ENOTCONN
        share.proc.wait()
        thread.join(60)
        assert not thread.is_alive()
        assert isinstance(ended.get("error"), ShareDead), ended  # was a plain SyncError: a try counted
        assert isinstance(ended["error"], RemoteGone)  # waited for, no try counted (SyncWorker.final_sync)
        with pytest.raises(ShareDead, match=gone):  # the next try: at the root, before anything
            syncer.sync_newest()
        unmount(mount_point)
        half = [n for n in os.listdir(backing / "remote") if n.startswith(".tmp-step-00000020-")]
        assert half, os.listdir(backing / "remote")  # the cut copy's half, left on the share
        stack.enter_context(mounted_faultfs(backing, mount_point))  # mounted again: inodes numbered anew
        assert syncer.sync_newest().step == 20
    left = [n for n in os.listdir(backing / "remote") if n.startswith(".tmp-")]
    assert left == [], (left, said)  # the half copy, proven this run's by its recorded name, removed
    assert not [line for line in said if "no record of making" in line], said
    assert checkpoint_dirs.read_latest(backing / "remote") == "step-00000020"


@pytest.mark.fuse
def test_a_root_that_answers_a_stale_handle_is_waited_for_in_its_own_words(tmp_path, weights):
    """ESTALE at the root (an NFS mount's handle of it that its server no longer knows, stood in for by the FUSE
    file system answering it) is no access a retry gets past either: waited for, said as the error it is."""
    backing, mount_point = faultfs_dirs(tmp_path)
    remote, local, said = mount_point / "remote", tmp_path / "scratch" / "checkpoints", list[str]()
    save(local, 10, weights)
    with mounted_faultfs(backing, mount_point) as share:
        syncer = _syncer(tmp_path, remote, said)
        assert syncer.sync_newest().step == 10
        save(local, 20, weights)
        rule = share.add_rule("*", "remote", "error", errno=errno.ESTALE)
        with pytest.raises(ShareDead, match=rf"run.remote {remote}: the share's mount holds a stale handle of it, the "
                                            rf"directory or its export replaced on the server \(Stale file handle\): "
                                            rf"mount it again"):
            syncer.sync_newest()
        share.remove(rule)
        assert syncer.sync_newest().step == 20
    assert checkpoint_dirs.read_latest(backing / "remote") == "step-00000020"


@pytest.mark.slow
@pytest.mark.fuse
def test_a_finished_run_whose_fuse_daemon_died_waits_for_the_share_and_ends_done_once_it_is_mounted_again(
        tmp_path, corpus):
    """The supervisor and its trainer: the FUSE daemon killed while the run trains, the run finishes, its last sync
    waits (before: failed after 3 tries, exit 1), and once the share is mounted again the run ends done."""
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
        share.proc.kill()  # the FUSE daemon dies: its mount answers ENOTCONN to everything
        share.proc.wait()
        release.touch()  # steps 20 and 30 saved, the run finishes, its last sync meets the dead share
        wait_for(lambda: "FUSE daemon is gone" in (state(run_dir).get("reason") or "") or proc.poll() is not None,
                 timeout=240, what="the last sync to wait for the share")
        assert proc.poll() is None, f"the run ended (exit {proc.poll()}): {state(run_dir).get('reason')}"
        assert state(run_dir)["reason"].startswith("final sync waiting: remote unavailable: "), state(run_dir)
        shown = cli("status", str(config)).stdout
        assert "stopping" in shown and "the share's FUSE daemon is gone" in shown, shown
        unmount(mount_point)
        stack.enter_context(mounted_faultfs(backing, mount_point))  # the share mounted again
        rc = wait_or_kill(proc, timeout=300)
        out = (tmp_path / "supervisor.out").read_text()[-3000:]
        assert rc == 0, out
        st = state(run_dir)
        assert st["phase"] == "done" and st["remote_checkpoint"]["step"] == 30, out
        assert checkpoint_dirs.read_latest(backing / "remote") == "step-00000030"

