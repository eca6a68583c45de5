"""A teammate who may write a team directory used as run.remote (group-writable, not sticky) cannot delete the
victim's step directories, but he can rename them within the root. On main the victim's next sync then deleted one
by its new name alone: renamed to a temporary name of this host and a dead pid (`_clean_remote_tmp`: "a killed
sync's leftover", its owner the victim's), to a step name where the sync copies (`_clear_for_copy`: "a leftover
without a manifest"), another of the victim's directories renamed to a step name (retention: "a half copy"), a newer
step renamed to an older step's name (retention: "beyond sync.keep"). Nothing was said. Now what a sync removes is
proven this run's (daemon/jobs/remote_made.py): a temporary by the run's record of (name, device, inode), a step by
its manifest naming it; what fails is left, and said. Run by the victim (root) against `nobody` in the team's
group, with real renames done as `nobody`."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.names import QUARANTINE
from minilmd.tmpnames import host_tag, sync_tmp_name
from second_user import as_user, group_dir, teammate  # noqa: F401 - the fixture
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture


def mv_as_teammate(src: Path, dst: Path) -> None:
    """`mv src dst` run by the second user: a rename within the team directory, which his group may write."""
    done = subprocess.run(as_user(["mv", "-T", str(src), str(dst)]), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def dead_pid() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def synced(local: Path, remote: Path, weights, steps: tuple[int, ...], logs: list[str],
           run_dir: Path | None = None) -> Syncer:
    syncer = Syncer(local, str(remote), EXPECTED, keep=9, log=logs.append, run_dir=run_dir)
    for step in steps:
        save(local, step, weights)
        assert syncer.sync_newest().step == step
    return syncer


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_a_step_renamed_to_a_dead_syncs_temporary_name_is_not_deleted_but_a_killed_syncs_copy_is(teammate, tmp_path,
                                                                                                 weights):
    """The planted name is left, and said; the run's own half copy beside it (made by a sync of the run killed
    half-way, recorded before its copy started) still goes."""
    (_, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    logs: list[str] = []
    local = tmp_path / "scratch"
    synced(local, remote, weights, (10, 20), logs)
    kept = files(remote / "step-00000010")
    planted = remote / sync_tmp_name("step-00000010", host_tag(), dead_pid())
    mv_as_teammate(remote / "step-00000010", planted)
    killed = Syncer(local, str(remote), EXPECTED)  # another process of the run, killed during its copy
    half = remote / killed.remote.make_tmp(sync_tmp_name("step-00000030", host_tag(), dead_pid()))
    (half / ck.MODEL_FILE).write_bytes(b"half")

    Syncer(local, str(remote), EXPECTED, keep=9, log=logs.append).sync_newest()  # the next sync

    assert planted.is_dir() and files(planted) == kept  # on main: deleted, and nothing said
    assert any(planted.name in m and "no record of making" in m and "left as it is" in m for m in logs), logs
    assert not half.exists()


def test_after_a_reboot_a_planted_name_is_still_left_and_the_cut_syncs_copy_still_goes(teammate, tmp_path, weights):
    """The run's record is in run.dir now, which a reboot leaves: the half copy of the sync the reboot cut goes (on
    main the record was in the emptied scratch: left for good), and the teammate's planted name is still left."""
    (_, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    run_dir = tmp_path / "run-dir"
    run_dir.mkdir()
    logs: list[str] = []
    local = tmp_path / "shm" / "checkpoints"
    synced(local, remote, weights, (10, 20), logs, run_dir)
    kept = files(remote / "step-00000010")
    planted = remote / sync_tmp_name("step-00000010", host_tag(), dead_pid())
    mv_as_teammate(remote / "step-00000010", planted)
    cut = Syncer(local, str(remote), EXPECTED, run_dir=run_dir)  # the run's sync, cut by the reboot during its copy
    half = remote / cut.remote.make_tmp(sync_tmp_name("step-00000030", host_tag(), dead_pid()))
    (half / ck.MODEL_FILE).write_bytes(b"half")
    shutil.rmtree(local.parent)  # the reboot: scratch in /dev/shm is gone
    save(local, 30, weights)

    assert Syncer(local, str(remote), EXPECTED, keep=9, log=logs.append, run_dir=run_dir).sync_newest().step == 30

    assert planted.is_dir() and files(planted) == kept
    assert any(planted.name in m and "no record of making" in m and "left as it is" in m for m in logs), logs
    assert not half.exists()


def test_another_directory_renamed_to_a_step_name_is_not_pruned_as_a_half_copy(teammate, tmp_path, weights):
    (_, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    logs: list[str] = []
    syncer = synced(tmp_path / "scratch", remote, weights, (10, 20), logs)
    (remote / QUARANTINE).mkdir()  # the victim's: a damaged copy set aside there once
    (remote / QUARANTINE / "notes").write_text("the victim's\n")
    mv_as_teammate(remote / QUARANTINE, remote / "step-00000001")

    save(tmp_path / "scratch", 30, weights)
    assert syncer.sync_newest().step == 30  # retention runs

    assert (remote / "step-00000001" / "notes").read_text() == "the victim's\n"  # on main: deleted
    assert any("step-00000001" in m and "without a manifest.json" in m for m in logs), logs


def test_a_newer_step_renamed_to_an_older_steps_name_is_not_pruned(teammate, tmp_path, weights):
    (_, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    logs: list[str] = []
    local = tmp_path / "scratch"
    syncer = Syncer(local, str(remote), EXPECTED, keep=2, log=logs.append)
    for step in (10, 20):
        save(local, step, weights)
        syncer.sync_newest()
    kept = files(remote / "step-00000020")
    mv_as_teammate(remote / "step-00000020", remote / "step-00000005")

    save(local, 30, weights)
    assert syncer.sync_newest().step == 30  # copied; retention keeps 30 and 10, and would prune "step 5"

    assert files(remote / "step-00000005") == kept  # on main: deleted as the oldest
    assert any("step-00000005" in m and "says step 20" in m for m in logs), logs
    assert checkpoint_dirs.read_latest(remote) == "step-00000030"


def test_another_directory_renamed_where_the_sync_copies_is_not_deleted(teammate, tmp_path, weights):
    (_, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    logs: list[str] = []
    local = tmp_path / "scratch"
    syncer = synced(local, remote, weights, (10,), logs)
    (remote / QUARANTINE).mkdir()
    (remote / QUARANTINE / "notes").write_text("the victim's\n")
    mv_as_teammate(remote / QUARANTINE, remote / "step-00000020")

    save(local, 20, weights)
    with pytest.raises(SyncError, match="step-00000020 is a step directory without a manifest.json"):
        syncer.sync_newest()  # its verified copy has nowhere to go: the sync fails, is retried, says why

    assert (remote / "step-00000020" / "notes").read_text() == "the victim's\n"  # on main: deleted
    assert [n for n in os.listdir(remote) if n.startswith(".tmp-")] == []  # the sync's own copy removed
