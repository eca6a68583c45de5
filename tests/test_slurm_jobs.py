"""minilmd as a Slurm job, on a real one-node Slurm started for the session (tests/slurm_cluster.py), each run
ending with the same weights, bit for bit, as conftest's undisturbed run of the same config:
- submitted with `sbatch deploy/slurm/minilmd.sbatch`, preempted mid-training twice, the first time with the
  time-limit warning (`scancel --batch --signal=USR1`, what `#SBATCH --signal=B:USR1@300` sends), the second time
  by an admin's `scontrol requeue`; it resumes each time from the remote (the job's node scratch is removed when
  it is requeued);
- submitted with `sbatch --nodes=1 deploy/slurm/minilmd-multinode.sbatch`: every attempt is an srun step (the node
  step stages the corpus, then one torchrun with the c10d rendezvous on the first node); a rank SIGKILLed in it
  ends the step, the supervisor classifies the death through srun as on one server and relaunches the step.
The tiny steps take milliseconds and the machine may be loaded: every preemption comes while the trainer is held
still at a known step (tests/pausing_trainer.py, run by torchrun in the srun step), never at a moment hoped for.

Where this machine cannot run Slurm (not root, slurm-wlm or munge missing), the tests skip and say why.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from held import PAUSING_TRAINER, fired, held_trainer, pending, proc_state
from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.names import FAULT_ENV, TRAINER_CMD_ENV
from supervisor_helpers import (
    FAKE_TRAINER,
    cli,
    env_for,
    events,
    model_sha,
    state,
    step_of_state,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.slow
SBATCH = Path(__file__).resolve().parent.parent / "deploy" / "slurm" / "minilmd.sbatch"
MULTINODE_SBATCH = SBATCH.with_name("minilmd-multinode.sbatch")
FAULTS = "pause@6,hold@10,sigkill@15"
"""One fault a start: the first start's trainer stops at step 6 until the test releases it (after the time-limit
warning's SIGTERM reached it: it saves at step 7); the second's stops at step 10 for good (the admin's requeue
comes while it is held: it never passes step 10); the third's is SIGKILLed at step 15."""
LONG = 300
"""A bound on each wait, never reached unless something is broken (a loaded slurmctld answers late)."""



def submit(slurm, script: Path, config: Path, tmp: Path, *options: str, **extra_env: str) -> str:
    env = slurm.env(**{k: v for k, v in env_for(fake=False, **extra_env).items() if not k.startswith("SLURM_")})
    env.pop("MINILMD_SCRATCH_BASE", None)
    env["TMPDIR"] = str(tmp / "node-tmp")  # the node's local scratch, as a cluster's prolog would set it
    env["MINILMD"] = str(Path(sys.executable).with_name("minilmd"))
    (tmp / "node-tmp").mkdir()
    out = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp}", f"--output={tmp / 'job.out'}", *options,
                          str(script), str(config)], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().split(";")[0]


def held(run_dir: Path, fault: str, meanwhile=lambda: False) -> int:
    """Wait until the run's trainer has stopped itself at `fault` (pause@N, hold@N); its pid. `meanwhile()` is
    called at each poll (a nudge)."""
    return wait_for(lambda: (fired(run_dir, fault) and held_trainer(run_dir)) or meanwhile(), LONG,
                    f"the trainer held at {fault}", interval=1)  # held until the test acts: no hurry


def wait_requeued(slurm, job: str, restarts: int) -> None:
    """Until Slurm holds the job pending after its requeue (`release` then starts it)."""
    wait_for(lambda: slurm.job_field(job, "JobState") == "PENDING" and slurm.job_field(job, "Restarts") ==
             str(restarts), LONG, f"job {job} pending after requeue {restarts}")


def nudge(slurm, job: str) -> bool:
    """StartTime=now for the job while Slurm holds it PENDING: Slurm delays a requeued job by two minutes. It sets
    that delay when the requeue has finished (the old batch step ended), which on a loaded machine can come after
    the job already shows PENDING and overwrite a StartTime=now given then, so waits give it again. False, for
    wait_for predicates."""
    if slurm.job_field(job, "JobState") == "PENDING":
        slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now", check=False)  # a refusal: asked again
    return False


def release(slurm, job: str, restarts: int) -> None:
    """Start the requeued job now (nudge), until Slurm shows it in another state than PENDING; an empty state is
    a `scontrol show job` that did not answer (a loaded slurmctld), not a start."""
    wait_for(lambda: slurm.job_field(job, "JobState") not in ("PENDING", "") or nudge(slurm, job), LONG,
             f"job {job} started again after requeue {restarts}", interval=3)


def test_slurm_job_scripts_are_accepted_by_sbatch(slurm, tmp_path):
    # the multi-node script asks for 2 nodes, which this 1-node cluster cannot give: --nodes=1 as the test below
    for script, options in ((SBATCH, []), (MULTINODE_SBATCH, ["--nodes=1"])):
        out = subprocess.run(["sbatch", "--test-only", f"--chdir={tmp_path}", *options, str(script), "run.toml"],
                             capture_output=True, text=True, env=slurm.env(), timeout=30)
        assert out.returncode == 0 and "to start at" in out.stdout + out.stderr, out.stdout + out.stderr
    for name in (SBATCH, MULTINODE_SBATCH):
        text = name.read_text()
        for directive in ("--signal=B:USR1@300", "--requeue", "--open-mode=append"):
            assert f"#SBATCH {directive}" in text, (name, directive)
        assert 'exec "${MINILMD:-minilmd}" run "$config"' in text


def test_a_slurm_job_preempted_twice_and_a_rank_killed_resumes_with_identical_weights(tmp_path, undisturbed, slurm):
    straight = undisturbed()
    # restart.hang_timeout: a held trainer is held, never taken for hung
    config = straight.config_like(tmp_path, "sl", remote=True, run={"scratch": ""}, restart={"hang_timeout": "10m"})
    cfg = load_config(config)
    # the multi-node script on one node: every attempt an srun step
    job = submit(slurm, MULTINODE_SBATCH, config, tmp_path, "--nodes=1",
                 **{FAULT_ENV: FAULTS, TRAINER_CMD_ENV: f"{sys.executable} {PAUSING_TRAINER}"})
    try:
        # 1. the time-limit warning while the trainer is held at step 6: the supervisor asks its step to save
        # (scancel --signal=TERM); released once that SIGTERM waits for it, it saves, the last sync runs, the job
        # requeues itself
        trainer = held(cfg.run_dir, "pause@6")
        slurm.run("scancel", "--batch", "--signal=USR1", job)
        wait_for(lambda: pending(trainer, signal.SIGTERM) or proc_state(trainer) != "T", LONG,
                 "the step's SIGTERM at the held trainer")
        if held_trainer(cfg.run_dir) == trainer:
            os.kill(trainer, signal.SIGCONT)
        wait_for(lambda: state(cfg.run_dir).get("outcome") and state(cfg.run_dir)["phase"] == "done", LONG,
                 "the first start's end")
        first = state(cfg.run_dir)
        preempted_at = first["slurm"]["preempted_at_step"]
        assert first["reason"] == f"requeued by Slurm (preempted at step {preempted_at})"
        assert 0 < preempted_at < 10 and first["slurm"]["requeued"] and first["outcome"]["exit"] == 0
        wait_requeued(slurm, job, 1)
        status = cli("status", str(cfg.run_dir), SLURM_CONF=str(slurm.conf))  # as on a login node
        print(status.stdout)
        assert f"why: requeued by Slurm (preempted at step {preempted_at})" in status.stdout, status.stdout
        # the live state from Slurm: the job waits for its release
        live = re.search(rf"Slurm job {job} on 1 node\(s\) {slurm.node}: (\w+) \(now\)", status.stdout)
        assert live and live[1] == "PENDING", status.stdout
        release(slurm, job, 1)
        # 2. an admin requeues the running job, its trainer held at step 10: Slurm's SIGTERM; the job is not
        # requeued a second time by itself
        held(cfg.run_dir, "hold@10", lambda: nudge(slurm, job))
        slurm.run("scontrol", "requeue", job)
        wait_requeued(slurm, job, 2)
        second = state(cfg.run_dir)
        # the held trainer never saves (it holds through the SIGTERM until a SIGKILL: its torchrun's after the run's
        # grace, 10 min here, or the first that Slurm's KillWait, tests/slurm_cluster.py, or the supervisor's cut at
        # the job's end brings): the job resumes from the last synced step, at most the one before 10
        assert preempted_at <= second["slurm"]["preempted_at_step"] < 10, second["slurm"]
        assert "requeued by Slurm" in second["reason"] and second["restarts"] == []
        release(slurm, job, 2)
        # 3. the third start: a rank SIGKILLed at step 15 ends the srun step; relaunched, it ends the budget
        wait_for(lambda: slurm.job_field(job, "JobState") == "COMPLETED" or nudge(slurm, job), LONG,
                 "the job's completion", interval=1)
    finally:
        slurm.run("scancel", job, check=False)
        print((tmp_path / "job.out").read_text(errors="replace")[-3000:] if (tmp_path / "job.out").exists() else "")
    final = state(cfg.run_dir)
    assert final["phase"] == "done" and final["outcome"]["exit"] == 0, final["reason"]
    assert final["slurm"]["restart_count"] == 2 and not final["slurm"]["requeued"]
    # the SIGKILL seen through srun and torchrun, classified as on one server, and the step relaunched
    assert [(r["cause"], r["action"]) for r in final["restarts"]] == [("killed", "restart")], final["restarts"]
    logs = sorted((cfg.run_dir / "logs").iterdir())
    header = logs[0].read_text().splitlines()[0]
    assert header.startswith("# attempt 1: srun --nodes 1") and "--rdzv-backend minilmd-c10d" in header, header
    assert f"--rdzv-endpoint {slurm.node}:" in header and "--kill-on-bad-exit=1" in header, header
    assert f"minilmd node {slurm.node}: corpus at" in logs[0].read_text()
    assert "resumed from" in logs[-1].read_text()
    starts = [line for line in (tmp_path / "job.out").read_text().splitlines() if line.startswith("minilmd-")]
    assert len(starts) == 3, starts
    # each start found its node scratch empty and fetched the newest checkpoint from the remote; but where the
    # admin's requeue found slurmctld too busy to say the job's end (scontrol within 3 s), the supervisor took
    # KillWait's default 30 s, cut the held trainer's save at the deadline and kept the node scratch (the cut last
    # sync counts as unsynced: daemon/slurm/job.py remove_scratch), which the third start, on this node, resumed from
    cut = any("cut at the job's end" in e.get("message", "") for e in events(cfg.run_dir) if e.get("event") == "stop")
    fetched = [e["message"] for e in events(cfg.run_dir) if e.get("event") == "fetch" and "fetched" in e["message"]]
    assert len(fetched) == (1 if cut else 2), [e.get("message") for e in events(cfg.run_dir)
                                               if e.get("event") in ("fetch", "stop")]
    node_scratch = tmp_path / "node-tmp" / f"minilmd-{os.geteuid()}" / f"sl-slurm{job}"
    assert any(str(node_scratch) in m for m in fetched), fetched
    assert not node_scratch.exists()  # removed at the end, the remote holding the last checkpoint
    remote = Path(cfg.run.remote)
    assert checkpoint_dirs.read_latest(remote) == "step-00000016"
    assert model_sha(remote / "step-00000016") == model_sha(straight.checkpoint)



def test_minilmd_stop_of_a_running_job_ends_it_without_a_requeue(tmp_path, corpus, slurm):
    """`minilmd stop` on the node of a running job: its SIGUSR2 comes after its stop request (daemon/base/
    stoprequest.py), so the supervisor stops the run for good, exit 0, and does not requeue the job (before: it took
    that SIGTERM for a preemption and requeued the job, which then trained on)."""
    config = write_config(tmp_path, corpus, name="st", run={"scratch": ""},
                          train={"max_steps": 100000, "checkpoint_every": 5})
    run_dir = load_config(config).run_dir
    job = submit(slurm, SBATCH, config, tmp_path, **{TRAINER_CMD_ENV: f"{sys.executable} {FAKE_TRAINER}",
                                                     "FAKE_STEP_S": "0.05"})
    try:
        wait_for(lambda: step_of_state(run_dir) >= 6, LONG, "the job's trainer to train", interval=0.5)
        stopped = cli("stop", str(run_dir), timeout=LONG)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        wait_for(lambda: slurm.job_field(job, "JobState") not in ("RUNNING", "COMPLETING", ""), LONG,
                 "the job's end", interval=1)
        assert slurm.job_field(job, "JobState") == "COMPLETED" and slurm.job_field(job, "Restarts") == "0", \
            (slurm.job_field(job, "JobState"), slurm.job_field(job, "Restarts"))
    finally:
        slurm.run("scancel", job, check=False)
    final = state(run_dir)
    assert final["outcome"]["exit"] == 0 and "not requeued" in final["reason"], final["reason"]
    assert final["reason"].startswith("stopped on request (minilmd stop at "), final["reason"]
    assert not final["slurm"]["requeued"], final["slurm"]
