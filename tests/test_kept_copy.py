"""The copy of a Slurm job's unsynced newest checkpoint in run.dir (daemon/jobs/keptcopy.py): one at most, fetched
back only when newer than scratch's and valid, removed once run.remote has its step; and whether Slurm requeues the
job (daemon/slurm/unsynced_end.py). The real supervisor's case: tests/test_slurm_unsynced_kept.py."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from minilmd.daemon.jobs import keptcopy, remote_made
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.daemon.slurm import unsynced_end
from minilmd.daemon.slurm.job import Allocation, SlurmJob
from minilmd.names import step_name
from sync_helpers import EXPECTED, corrupt, save, weights  # noqa: F401 - the fixture


def _cfg(tmp_path):
    (tmp_path / "run").mkdir(mode=0o700)
    return SimpleNamespace(checkpoint_dir=tmp_path / "scratch" / "checkpoints", run_dir=tmp_path / "run")


def _kept(cfg) -> list[str]:
    return sorted(p.name for p in keptcopy.place(cfg).iterdir() if p.name.startswith("step-"))


def test_one_copy_at_most_and_only_what_the_remote_lacks(tmp_path, weights):
    cfg = _cfg(tmp_path)
    save(cfg.checkpoint_dir, 10, weights)
    assert keptcopy.keep(cfg, EXPECTED, 10).step is None  # the remote has it: nothing copied
    assert not keptcopy.place(cfg).exists()
    assert keptcopy.keep(cfg, EXPECTED, None).step == 10
    save(cfg.checkpoint_dir, 20, weights)
    kept = keptcopy.keep(cfg, EXPECTED, 10)
    assert kept.step == 20 and kept.where == keptcopy.place(cfg) / step_name(20)
    assert _kept(cfg) == [step_name(20)]  # the older copy removed: one at most
    assert keptcopy.drop_if_synced(cfg, 10) == "" and _kept(cfg) == [step_name(20)]  # the remote is behind it
    assert "removed step 20" in keptcopy.drop_if_synced(cfg, 20)
    assert not keptcopy.place(cfg).exists() and keptcopy.kept_step(cfg) is None  # its empty directory with it


def test_the_directory_of_the_copy_stays_when_anything_else_is_in_it(tmp_path, weights):
    cfg = _cfg(tmp_path)
    save(cfg.checkpoint_dir, 20, weights)
    assert keptcopy.keep(cfg, EXPECTED, None).step == 20
    (keptcopy.place(cfg) / "notes.txt").write_text("the user's\n")
    said = keptcopy.drop_if_synced(cfg, 20)
    assert "removed step 20" in said and "empty" not in said
    assert _kept(cfg) == [] and (keptcopy.place(cfg) / "notes.txt").read_text() == "the user's\n"


def test_brought_back_only_when_newer_than_scratch_and_valid(tmp_path, weights):
    cfg = _cfg(tmp_path)
    save(cfg.checkpoint_dir, 20, weights)
    assert keptcopy.keep(cfg, EXPECTED, None).step == 20
    assert keptcopy.bring_back(cfg, EXPECTED) == ""  # scratch has it (the same node)
    shutil.rmtree(cfg.checkpoint_dir)  # another node: an empty scratch
    assert "resuming from step 20" in keptcopy.bring_back(cfg, EXPECTED)
    assert (cfg.checkpoint_dir / step_name(20) / "manifest.json").is_file()
    shutil.rmtree(cfg.checkpoint_dir)
    victim = next(p for p in (keptcopy.place(cfg) / step_name(20)).iterdir() if p.suffix == ".safetensors")
    corrupt(victim)
    assert "did not verify" in keptcopy.bring_back(cfg, EXPECTED)  # never resumed from
    assert not (cfg.checkpoint_dir / step_name(20)).exists()


def test_a_job_slurm_will_not_requeue_is_told_apart():
    def job(line):
        return SlurmJob(Allocation("42", ["n1"], [0]), {}, lambda *a, **k: None, runner=lambda args: line)

    assert not unsynced_end.requeueable(job("JobId=42 JobState=RUNNING Requeue=0 Restarts=0"))
    assert unsynced_end.requeueable(job("JobId=42 JobState=RUNNING Requeue=1 Restarts=0"))
    assert unsynced_end.requeueable(job(""))  # no answer: asked anyway, a refusal is said then


def test_the_kept_copys_record_is_its_own_and_run_remotes_entries_stay(tmp_path, weights):
    """review12b F1: both Syncers kept one record, `<run.dir>/remote-made.json`, and each sync's clean-up keeps
    only the entries naming what is on its own root: the kept copy's dropped the half copy a stalled last sync left
    on run.remote (never removable then), and run.remote's sync the kept copy's."""
    cfg = _cfg(tmp_path)
    save(cfg.checkpoint_dir, 10, weights)
    main = remote_made.record_of(cfg.checkpoint_dir, cfg.run_dir)  # run.remote's Syncer's record
    main.record(".tmp-step-00000020-otherhost-123", (1, 2))  # its copy in flight on run.remote, cut
    assert keptcopy.keep(cfg, EXPECTED, None).step == 10
    assert main.proves(".tmp-step-00000020-otherhost-123", (1, 2))  # still this run's to remove
    kept = remote_made.kept_record(cfg.run_dir)
    kept.record(".tmp-step-00000020-thishost-456", (3, 4))  # a kept copy cut at the job's end
    main.keep_only(set())  # a sync of run.remote, where no such name is
    assert kept.proves(".tmp-step-00000020-thishost-456", (3, 4))
    assert remote_made.run_record(cfg.run_dir).is_file()  # run.remote's record where it was: older ones read so


def test_a_removed_run_dir_is_never_made_again_by_the_copy(tmp_path, weights):
    """review12b F2: the copy's Syncer made the missing run.dir again (a local remote makes its root with the
    directories above it), and the job was requeued into it, against the removed-run.dir rule (exit 73, final)."""
    cfg = _cfg(tmp_path)
    save(cfg.checkpoint_dir, 10, weights)
    shutil.rmtree(cfg.run_dir)
    kept = keptcopy.keep(cfg, EXPECTED, None)
    assert kept.step is None and f"run.dir {cfg.run_dir} is not there" in kept.why_not, kept
    assert not cfg.run_dir.exists()
    cfg.run_dir.mkdir(mode=0o700)  # and one removed while the copy runs, after keep's own look
    copier = keptcopy._syncer(cfg, EXPECTED)
    shutil.rmtree(cfg.run_dir)
    with pytest.raises(SyncError, match="is not there"):
        copier.sync_newest()
    assert not cfg.run_dir.exists()
    assert (cfg.checkpoint_dir / step_name(10) / "manifest.json").is_file()  # scratch left as it is
