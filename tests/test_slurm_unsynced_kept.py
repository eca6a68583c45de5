"""A real supervisor in a (fake) Slurm job on its default node-local scratch, run.remote on the FUSE fault filesystem
full (ENOSPC) once step 10 is synced: the finished run's last sync waits for room for MINILMD_FINAL_SYNC_WAIT (2 s
here, 15 min by default) and fails. Its newest checkpoint, step 30, is copied into run.dir/unsynced and the job is
requeued (state.json's outcome first, then `scontrol requeue`); the requeued job, on another node (the first node's
scratch wiped), resumes from that copy, not from the remote's step 10, syncs it and removes the copy and its
directory; the requeue counted in state.json's slurm section, the count gone once the sync put step 30 there.

Before (daemon/slurm/unsynced_end.py): the run ended `failed`, exit 1, not requeued, step 30 only in the node's
scratch, which the job's end wipes; the next start trained steps 11-30 again from the remote's step 10. And a job
that Slurm will not requeue (Requeue=0) ends failed with its reason saying where the copy is and what to do. No
timing is asserted; scontrol is a script on PATH that records its calls."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.jobs import keptcopy
from minilmd.daemon.slurm import requeue_bound
from reliability_helpers import event_texts
from slurm_helpers import job_line, slurm_env
from supervisor_helpers import (
    READS_THE_SAME,
    cli,
    remote_step,
    start_supervisor,
    state,
    wait_for,
    wait_or_kill,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.fuse]


def _first_job(tmp_path, corpus, faultfs, requeue: str = "1"):
    """The first job, its remote filled up after step 10's sync: (config, run_dir, its exit status)."""
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(faultfs.root / "remote"), "scratch": ""})
    run_dir = load_config(config).run_dir
    release = tmp_path / "release"
    job_line(tmp_path, 0, time.time() + 3600, f"Requeue={requeue}")
    env = slurm_env(tmp_path, 0)
    sup = start_supervisor(config, tmp_path / "first.out", **env, FAKE_HOLD=f"15:{release}",
                           FAKE_SLURM_STATE=str(run_dir / "state.json"), MINILMD_FINAL_SYNC_WAIT="2s")
    try:
        wait_for(lambda: remote_step(run_dir) >= 10, 180, "step 10 synced")
        faultfs.enospc("remote*")  # the share fills up: steps 20 and 30 cannot go there
        release.touch()
        rc = wait_or_kill(sup, 300)
    finally:
        faultfs.clear()
        if sup.poll() is None:
            sup.kill()
    return config, run_dir, rc


def test_a_last_sync_that_cannot_finish_in_the_job_keeps_the_checkpoint_in_run_dir_and_requeues(
        tmp_path, corpus, faultfs):
    config, run_dir, rc = _first_job(tmp_path, corpus, faultfs)
    left = state(run_dir)
    kept = run_dir / keptcopy.KEPT_DIR / names.step_name(30)
    calls = tmp_path / "scontrol-calls"
    assert rc == 0, ((tmp_path / "first.out").read_text()[-3000:], left)
    assert calls.exists() and calls.read_text().splitlines() == ["requeue 42"], (left, event_texts(run_dir))
    assert left["phase"] == "done" and left["outcome"]["ended"] == "requeued", left
    assert str(kept.parent) in left["reason"] and "step 30" in left["reason"], left["reason"]
    assert kept.is_dir() and (kept / names.MANIFEST).is_file()
    assert remote_step(run_dir) == 10
    assert left["slurm"][requeue_bound.KEY]["count"] == 1, left["slurm"]  # bounded: tests/test_slurm_requeue_bound.py
    at_requeue = json.loads((tmp_path / "scontrol-calls.state").read_text())  # said before the requeue ends the job
    assert at_requeue["outcome"]["ended"] == "requeued", at_requeue
    shown = cli("status", str(config)).stdout
    assert str(kept.parent) in shown, shown

    # the requeued job lands on another node: the first one's scratch is gone with its job
    shutil.rmtree(tmp_path / "node-tmp")
    job_line(tmp_path, 1, time.time() + 3600)
    check = cli("run", "--check", str(config), timeout=120, **slurm_env(tmp_path, 1))
    assert f"step 30 is kept in {kept.parent}" in check.stdout, (check.stdout, check.stderr)
    again = start_supervisor(config, tmp_path / "second.out", **slurm_env(tmp_path, 1))
    assert wait_or_kill(again, 300) == 0, (tmp_path / "second.out").read_text()[-3000:]
    final = state(run_dir)
    assert final["outcome"]["ended"] == "finished" and remote_step(run_dir) == 30, final
    fetched = [m for m in event_texts(run_dir, "fetch") if "resuming from step 30" in m]
    assert fetched, event_texts(run_dir, "fetch")  # from the kept copy, not the remote's step 10
    assert not kept.parent.exists(), sorted(p.name for p in kept.parent.iterdir())  # the remote has it: it goes
    assert requeue_bound.KEY not in final["slurm"], final["slurm"]  # a sync: the count begins again


def test_a_job_slurm_will_not_requeue_ends_failed_saying_where_the_kept_checkpoint_is(tmp_path, corpus, faultfs):
    config, run_dir, rc = _first_job(tmp_path, corpus, faultfs, requeue="0")
    left = state(run_dir)
    kept = run_dir / keptcopy.KEPT_DIR
    assert rc == 1, ((tmp_path / "first.out").read_text()[-3000:], left)
    assert not (tmp_path / "scontrol-calls").exists()  # never asked to requeue
    assert left["phase"] == "failed", left
    assert str(kept) in left["reason"] and "resubmit" in left["reason"] and "Requeue=0" in left["reason"], left
    assert (kept / names.step_name(30)).is_dir()
    shown = cli("status", str(config)).stdout
    assert str(kept) in shown and "resubmit" in shown, shown


def test_a_damaged_kept_copy_is_not_resumed_from_said_where_it_is_set_aside_and_gone_at_the_runs_end(
        tmp_path, corpus, faultfs):
    """Real-fault audit F5: the copy was set aside silently into unsynced/quarantine/ and stayed in run.dir, with
    unsynced/'s LATEST, after the run finished (tests/test_kept_quarantine.py: the rules one by one)."""
    config, run_dir, rc = _first_job(tmp_path, corpus, faultfs)
    kept = run_dir / keptcopy.KEPT_DIR / names.step_name(30)
    assert rc == 0 and kept.is_dir(), (tmp_path / "first.out").read_text()[-3000:]
    damaged = kept / "model.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-100] ^= 1  # one bit on the share
    damaged.write_bytes(bytes(data))
    shutil.rmtree(tmp_path / "node-tmp")
    job_line(tmp_path, 1, time.time() + 3600)
    again = start_supervisor(config, tmp_path / "second.out", quick=READS_THE_SAME, **slurm_env(tmp_path, 1))
    assert wait_or_kill(again, 300) == 0, (tmp_path / "second.out").read_text()[-3000:]
    assert state(run_dir)["outcome"]["ended"] == "finished" and remote_step(run_dir) == 30
    [said] = [m for m in event_texts(run_dir, "fetch") if "did not verify: not resumed from" in m]
    assert f"set aside in {kept.parent / names.QUARANTINE}/{names.step_name(30)}-" in said and "sha256" in said, said
    removed = [m for m in event_texts(run_dir, "sync") if "removed the damaged copy set aside" in m]
    assert removed, event_texts(run_dir, "sync")
    assert not kept.parent.exists(), sorted(p.name for p in kept.parent.rglob("*"))  # nothing left in run.dir
