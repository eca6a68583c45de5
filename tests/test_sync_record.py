"""The sync's record of what it made on the remote (daemon/jobs/remote_made.py) is kept in run.dir, which a reboot
leaves: the half copy of a sync cut by a reboot is removed by the next sync; an older minilmd's record in scratch is
read once."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import checkpoint as ck
from minilmd.daemon.jobs import remote_made
from minilmd.daemon.jobs.sync import Syncer
from minilmd.tmpnames import host_tag, sync_tmp_name
from sync_helpers import EXPECTED, KILL_MID_SYNC, dirs, names, save, weights  # noqa: F401 - dirs, weights: fixtures

KILL_MID_SYNC_OF_A_RUN = KILL_MID_SYNC.replace("sync.Syncer(sys.argv[1], sys.argv[2])",
                                              "sync.Syncer(sys.argv[1], sys.argv[2], run_dir=Path(sys.argv[4]))"
                                              ).replace("import os,", "from pathlib import Path\nimport os,")


def reboot(local: Path) -> None:
    """What a reboot does to a scratch in /dev/shm: all of it gone (the checkpoints, and what beside them)."""
    shutil.rmtree(local.parent)


def synced_once(dirs, weights, tmp_path) -> tuple[Path, Path, Path, int]:
    """(scratch, remote, run.dir, a pid no process has now) with step 10 saved in scratch, not synced yet."""
    local, remote = dirs
    run_dir = tmp_path / "run-dir"
    run_dir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    save(local, 10, weights)
    return local, remote, run_dir, dead.pid


@pytest.mark.slow
def test_the_half_copy_of_a_sync_cut_by_a_reboot_is_removed_by_the_next_sync(dirs, weights, tmp_path):
    """The run's record of what its syncs made is in run.dir, which a reboot leaves. On main it was in scratch: the
    reboot took it, and the half copy stayed on the remote for good (a checkpoint's size), said at every sync."""
    local, remote = dirs
    run_dir = tmp_path / "run-dir"
    run_dir.mkdir()
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED, run_dir=run_dir).sync_newest()
    save(local, 20, weights)
    proc = subprocess.run([sys.executable, "-c", KILL_MID_SYNC_OF_A_RUN, str(local), str(remote), "3", str(run_dir)])
    assert proc.returncode == -9
    assert any(n.startswith(".tmp-step-00000020") for n in names(remote))
    reboot(local)
    save(local, 30, weights)  # the run goes on after the reboot
    logs: list[str] = []
    assert Syncer(local, str(remote), EXPECTED, log=logs.append, run_dir=run_dir).sync_newest().step == 30
    assert names(remote) == ["LATEST", "step-00000010", "step-00000030"]
    assert not [m for m in logs if "no record of making" in m], logs


def test_an_older_minilmds_record_in_scratch_is_read_once_into_run_dir(dirs, weights, tmp_path):
    """A run upgraded mid-run: the half copy its older sync recorded in scratch is still removed after a reboot
    (read into run.dir's record the first time that is read, then removed from scratch: written only in run.dir)."""
    local, remote, run_dir, dead = synced_once(dirs, weights, tmp_path)
    older = Syncer(local, str(remote), EXPECTED)  # an older minilmd's sync: its record in scratch
    older.sync_newest()
    before = remote / older.remote.make_tmp(sync_tmp_name("step-00000020", host_tag(), dead))
    assert remote_made.scratch_record(local).is_file()
    upgraded = Syncer(local, str(remote), EXPECTED, run_dir=run_dir)  # killed during its copy too
    after = remote / upgraded.remote.make_tmp(sync_tmp_name("step-00000030", host_tag(), dead))
    assert not remote_made.scratch_record(local).exists()
    assert remote_made.run_record(run_dir).is_file()
    for half in (before, after):
        (half / ck.MODEL_FILE).write_bytes(b"half")
    reboot(local)
    save(local, 40, weights)
    logs: list[str] = []
    assert Syncer(local, str(remote), EXPECTED, log=logs.append, run_dir=run_dir).sync_newest().step == 40
    assert names(remote) == ["LATEST", "step-00000010", "step-00000040"]
    assert not [m for m in logs if "no record of making" in m], logs


def test_the_supervisors_syncer_keeps_the_record_in_run_dir(tmp_path):
    """The Syncer of the sync job, the fetch and the last sync (Infra.syncer) is given run.dir, where the record
    outlives a reboot."""
    from minilmd.config import RunConfig
    from minilmd.daemon.infra import Infra

    cfg = RunConfig()
    cfg.run.dir, cfg.run.scratch, cfg.run.remote = str(tmp_path / "run"), str(tmp_path / "shm"), str(tmp_path / "nfs")
    syncer = Infra().syncer(cfg, None, lambda msg: None)
    assert syncer.remote.made.path == tmp_path / "run" / "remote-made.json"


def test_with_run_dir_full_the_record_goes_to_scratch_and_back_into_run_dir_once_there_is_room(tmp_path, small_tmpfs):
    """The last sync of a run whose run.dir had filled up failed for its record (ENOSPC writing remote-made.json
    there: its newest checkpoint never reached the remote, a flaky test under load). Now the record goes to
    scratch's place while run.dir is full, and is read back into run.dir at the first read once there is room."""
    run_dir = small_tmpfs("64k")
    local_root = tmp_path / "scratch" / "checkpoints"
    local_root.mkdir(parents=True)
    filler = run_dir / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):
        while os.write(fd, b"x" * 4096):
            pass
    os.close(fd)
    made = remote_made.record_of(local_root, run_dir)
    made.record(".tmp-step-00000040-h-1", (1, 40))  # raised ENOSPC before
    assert not remote_made.run_record(run_dir).exists() and remote_made.scratch_record(local_root).exists()
    assert made.proves(".tmp-step-00000040-h-1", (1, 40))
    filler.unlink()
    assert made.proves(".tmp-step-00000040-h-1", (1, 40))  # read back into run.dir, then scratch's copy removed
    assert remote_made.run_record(run_dir).exists() and not remote_made.scratch_record(local_root).exists()


def test_a_sync_killed_between_its_mkdir_and_its_record_leaves_nothing_the_next_one_keeps(dirs, weights, tmp_path):
    """The record holds the temporary directory's inode, so it is written after the mkdir: a supervisor SIGKILLed in
    between (seen under load in test_reliability_supervisor_kill) left an empty `.tmp-step-...` on the remote that
    no later sync removed ("no record of making"). Empty, or holding only this user's mark, it is removed; one that
    holds anything is still left: a copy's files are proof only through the record."""
    local, remote, run_dir, dead = synced_once(dirs, weights, tmp_path)
    cut = Syncer(local, str(remote), EXPECTED, run_dir=run_dir)
    cut.sync_newest()
    empty = sync_tmp_name("step-00000020", host_tag(), dead)
    held = sync_tmp_name("step-00000030", host_tag(), dead)
    for name in (empty, held):
        cut.remote.makedirs(name)  # made, the kill before its record
    (remote / held / "planted").write_bytes(b"not a sync's")
    save(local, 40, weights)
    logs: list[str] = []
    assert Syncer(local, str(remote), EXPECTED, log=logs.append, run_dir=run_dir).sync_newest().step == 40
    assert names(remote) == sorted(["LATEST", held, "step-00000010", "step-00000040"])
    assert (remote / held / "planted").read_bytes() == b"not a sync's"
    assert [m for m in logs if "no record of making" in m and held in m], logs
