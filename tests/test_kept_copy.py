"""The copy of a Slurm job's unsynced newest checkpoint in run.dir (daemon/jobs/keptcopy.py): one at most, fetched
back only when newer than scratch's and valid, removed once run.remote has its step; and whether Slurm requeues the
job (daemon/slurm/unsynced_end.py). The real supervisor's case: tests/test_slurm_unsynced_kept.py."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

from minilmd.daemon.jobs import keptcopy
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
