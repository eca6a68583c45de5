"""A real supervisor in a (fake) Slurm job, its remote on the FUSE fault filesystem slowed down: the last sync after
Slurm's warning is slower than the time left, is cut at the job's end and the job still requeues itself; the
requeued start on the same node cleans up the abandoned copy and goes on from scratch's step.

Before: the last sync was waited for while it moved, so under Slurm the job was SIGKILLed at its end before
`scontrol requeue` ran (daemon/slurm/lastsynccut.py). `scontrol` is a script on PATH that reads the job line, with
the EndTime the test sets just before the USR1, from a file, and records the requeue. No timing is asserted: the
remote is so slow (2 s an operation) that the copy of a checkpoint cannot end before the deadline, however loaded
the machine; a trainer slower to save than the deadline is cut before its sync begins, which the assertions allow.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names
from minilmd.config import load_config
from minilmd.daemon.slurm import jobend
from reliability_helpers import event_texts
from slurm_helpers import job_line, slurm_env
from supervisor_helpers import env_for, remote_step, start_supervisor, state, wait_for, wait_or_kill, write_config

DEADLINE_AFTER_S = 20.0
"""The last sync's deadline this long after the USR1: time for the fake trainer's save and the copy to begin."""


@pytest.mark.slow
@pytest.mark.fuse
def test_a_last_sync_slower_than_the_jobs_end_is_cut_and_the_job_still_requeues_itself(tmp_path, corpus, faultfs):
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(faultfs.root / "remote")},
                          train={"max_steps": 100_000, "checkpoint_every": 5})
    run_dir = load_config(config).run_dir
    remote = faultfs.backing / "remote"
    job_line(tmp_path, 0, time.time() + 3600)
    sup = start_supervisor(config, tmp_path / "first.out", **slurm_env(tmp_path, 0),
                           FAKE_SLURM_STATE=str(run_dir / "state.json"))
    try:
        wait_for(lambda: remote_step(run_dir) >= 10, 180, "step 10 synced")
        faultfs.stall("remote*", 2.0, op="*")  # every operation on the remote 2 s: a copy takes minutes
        job_line(tmp_path, 0, time.time() + jobend.REQUEUE_MARGIN_S + DEADLINE_AFTER_S)
        sup.send_signal(signal.SIGUSR1)
        assert wait_or_kill(sup, 300) == 0, (tmp_path / "first.out").read_text()[-3000:]
    finally:
        faultfs.clear()
        if sup.poll() is None:
            sup.kill()
    left = state(run_dir)
    kept = left["remote_checkpoint"]["step"]
    calls = tmp_path / "scontrol-calls"
    assert calls.exists() and calls.read_text().splitlines() == ["requeue 42"], (left, event_texts(run_dir))
    assert left["phase"] == "done" and left["outcome"]["ended"] == "requeued", left
    # state.json said so before `scontrol requeue`, which ends the job at once (before: its outcome came only at the
    # supervisor's exit, after the requeue, and a reader in between saw phase done with no outcome)
    at_requeue = json.loads((tmp_path / "scontrol-calls.state").read_text())
    assert at_requeue["outcome"]["ended"] == "requeued", at_requeue
    cut = f"last sync cut at the job's end: run.remote keeps step {kept}; the next start resumes from it, " \
          f"or from scratch's step "
    assert cut in left["reason"] and left["slurm"]["last_sync_cut"].startswith(cut), left["reason"]
    assert [m for m in event_texts(run_dir, "sync") if m.startswith(cut)], event_texts(run_dir, "sync")
    scratch_step = int(left["slurm"]["last_sync_cut"].split("scratch's step ")[1].split()[0])
    assert scratch_step > kept
    # the remote keeps its previous checkpoint, whole, and LATEST names it: nothing of the cut copy is in place
    assert checkpoint_dirs.read_latest(remote) == names.step_name(kept)
    assert max(checkpoint_dirs.list_checkpoints(remote), key=lambda p: p.name).name == names.step_name(kept)

    # the requeued job lands on this node: it goes on from scratch's step, and its first sync removes what the
    # cut copy left under a temporary name (its process is gone)
    cut_short = [p.name for p in remote.iterdir() if p.name.startswith(names.TMP_PREFIX)]  # the exit may beat it
    job_line(tmp_path, 1, time.time() + 3600)
    again = start_supervisor(config, tmp_path / "second.out", **slurm_env(tmp_path, 1))
    try:
        wait_for(lambda: remote_step(run_dir) >= scratch_step, 180, "scratch's step synced by the requeued job")
        again.send_signal(signal.SIGTERM)
        assert wait_or_kill(again, 300) == 0, (tmp_path / "second.out").read_text()[-3000:]
    finally:
        if again.poll() is None:
            again.kill()
    assert not [p.name for p in remote.iterdir() if p.name.startswith(names.TMP_PREFIX)], \
        (cut_short, sorted(os.listdir(remote)))
    assert state(run_dir)["outcome"]["ended"] == "requeued"


# --- a trainer still saving at the job's deadline (review9a): its save is cut, the job requeued -----------------------
# Before: the stopping phase waited up to restart.hang_timeout for the save; the cut came only after the trainer's
# exit, and Slurm's kill first: no requeue. The fake trainer holds its stop's save until a file that never comes
# (FAKE_STOP_HOLD) and restart.hang_timeout is an hour: only the job's deadline ends the wait.

@pytest.mark.slow
def test_a_save_still_running_at_the_jobs_end_is_cut_and_the_job_still_requeues_itself(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 100_000, "checkpoint_every": 5},
                          restart={"hang_timeout": "1h"})
    run_dir = load_config(config).run_dir
    job_line(tmp_path, 0, time.time() + 3600)
    env = slurm_env(tmp_path, 0)
    env["FAKE_STOP_HOLD"] = f"before:{tmp_path / 'never'}"
    sup = start_supervisor(config, tmp_path / "sup.out", **env, FAKE_SLURM_STATE=str(run_dir / "state.json"))
    try:
        wait_for(lambda: remote_step(run_dir) >= 5, 180, "a checkpoint synced")
        job_line(tmp_path, 0, time.time() + jobend.REQUEUE_MARGIN_S + 10)
        sup.send_signal(signal.SIGUSR1)
        assert wait_or_kill(sup, 300) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
    assert (tmp_path / "never.holding").exists(), "the save was never held"
    left = state(run_dir)
    assert (tmp_path / "scontrol-calls").read_text().splitlines() == ["requeue 42"], event_texts(run_dir)
    assert left["phase"] == "done" and left["outcome"]["ended"] == "requeued", left
    # state.json said so before `scontrol requeue`, which ends the job at once (before: its outcome came only at the
    # supervisor's exit, after the requeue, and a reader in between saw phase done with no outcome)
    at_requeue = json.loads((tmp_path / "scontrol-calls.state").read_text())
    assert at_requeue["outcome"]["ended"] == "requeued", at_requeue
    kept = left["remote_checkpoint"]["step"]
    assert "the trainer's save cut at the job's end" in left["reason"], left["reason"]
    assert f"run.remote keeps step {kept}" in left["reason"], left["reason"]
    assert [m for m in event_texts(run_dir, "stop") if "SIGKILL to trainer pid" in m], event_texts(run_dir, "stop")
    remote = load_config(config).run.remote
    assert checkpoint_dirs.read_latest(remote) == names.step_name(kept)


# --- the same on a real one-node Slurm (tests/slurm_cluster.py): its EndTime, its requeue ---------------------------

SBATCH = Path(__file__).resolve().parent.parent / "deploy" / "slurm" / "minilmd.sbatch"
LONG = 300
"""A bound on each wait, never reached unless something is broken (a loaded slurmctld answers late)."""
CUT_AFTER_S = 40
"""The time limit, once a checkpoint is synced, this long from now (Slurm rounds it up to a whole minute: 40 to 100 s):
the save and the copy's start fit before the deadline (REQUEUE_MARGIN_S before it: 20 s at least, as DEADLINE_AFTER_S
gives the fake Slurm's test), and the copy, 2 s an operation, does not end before it (a save still running then is cut
too: the assertions allow it)."""


def run_seconds(run_time: str) -> int:
    """scontrol's RunTime ("[D-]HH:MM:SS") in seconds."""
    days, _, clock = run_time.rpartition("-")
    hours, minutes, seconds = (int(p) for p in clock.split(":"))
    return (int(days or 0) * 24 + hours) * 3600 + minutes * 60 + seconds


@pytest.mark.slow
@pytest.mark.fuse
def test_on_a_real_slurm_the_cut_comes_before_the_time_limit_and_the_job_is_requeued(tmp_path, corpus, faultfs,
                                                                                     slurm):
    """A job of 10 minutes, however slowly it starts on a loaded machine: once a checkpoint is synced, the test
    slows the remote to 2 s an operation, brings the time limit to CUT_AFTER_S from now (`scontrol update
    TimeLimit`, which moves Slurm's EndTime) and sends the warning itself (`scancel --batch --signal=USR1`); the
    script's own warning is replaced by a harmless SIGHUP (a log reopen) 5 s before the end. The last sync cannot end
    before Slurm's EndTime; it is cut REQUEUE_MARGIN_S before it, and the job requeues itself: Slurm shows it
    requeued once, never killed at its time limit. Before, a 3-minute limit armed at submission could pass before
    the first checkpoint was synced on a loaded machine."""
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(faultfs.root / "remote"), "scratch": ""},
                          train={"max_steps": 100_000, "checkpoint_every": 5})
    run_dir = load_config(config).run_dir
    env = slurm.env(**{k: v for k, v in env_for(fake=True, FAKE_STEP_S="0.05").items() if not k.startswith("SLURM_")})
    env.pop("MINILMD_SCRATCH_BASE", None)
    env["TMPDIR"] = str(tmp_path / "node-tmp")
    env["MINILMD"] = str(Path(sys.executable).with_name("minilmd"))
    (tmp_path / "node-tmp").mkdir()
    out = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", f"--output={tmp_path / 'job.out'}",
                          "--time=10", "--signal=B:HUP@5", str(SBATCH), str(config)],
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    job = out.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: remote_step(run_dir) >= 5, LONG, "a checkpoint synced", interval=0.5)
        faultfs.stall("remote*", 2.0, op="*")
        limit = run_seconds(slurm.job_field(job, "RunTime")) + CUT_AFTER_S
        slurm.run("scontrol", "update", f"JobId={job}", f"TimeLimit={limit // 60}:{limit % 60:02d}")
        slurm.run("scancel", "--batch", "--signal=USR1", job)
        wait_for(lambda: slurm.job_field(job, "Restarts") == "1", LONG, "the job requeued", interval=2)
    finally:
        slurm.run("scancel", job, check=False)
        faultfs.clear()
    left = state(run_dir)
    assert left["outcome"]["ended"] == "requeued" and left["slurm"]["requeued"], left
    kept = left["remote_checkpoint"]["step"]
    assert f"last sync cut at the job's end: run.remote keeps step {kept}; " in left["reason"], left["reason"]
    said = [m for m in event_texts(run_dir, "slurm") if m.startswith("the job ends at ")]
    assert said and "(scontrol's EndTime)" in said[0], said
    assert checkpoint_dirs.read_latest(faultfs.backing / "remote") == names.step_name(kept)
