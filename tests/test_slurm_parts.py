"""The parts of daemon/slurm/job.py and daemon/slurm/node.py without a cluster: the allocation read from a job's
environment, the srun + torchrun launch, the preemption's decision against what `scontrol show job` says, the
allocated cards checked through a fake NVML, the per-job node scratch, status's Slurm line, and a node's step as a
real process. `scontrol` is a fake runner that records what it was asked (the real one: tests/test_slurm_jobs.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fakes_nvml import FREE, FakeNvml
from minilmd import pychild, scratch
from minilmd.daemon.child.process import is_torchrun
from minilmd.daemon.phases.gpuwait import GpuReady, GpuUnavailable
from minilmd.daemon.slurm import job as slurm
from slurm_helpers import launch_cfg


class FakeScontrol:
    """Answers `scontrol show hostnames` and `scontrol show job -o` from a table; records every call."""

    def __init__(self, job: str = "JobState=RUNNING Reason=None Restarts=0", fail_requeue: bool = False):
        self.job, self.fail_requeue, self.calls = job, fail_requeue, []

    def __call__(self, args: list[str]) -> str:
        self.calls.append(args)
        if args[:3] == ["scontrol", "show", "hostnames"]:
            return "gpu01\ngpu02\n"
        if args[:3] == ["scontrol", "show", "job"]:
            return f"JobId={args[-1]} {self.job}\n"
        if args[:2] == ["scontrol", "requeue"] and self.fail_requeue:
            raise subprocess.SubprocessError("scontrol requeue: Access/permission denied")
        return ""


class Events(list):
    def __call__(self, kind, message, **details):
        self.append((kind, message))


JOB_ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-02]", "CUDA_VISIBLE_DEVICES": "0,1",
           "SLURM_RESTART_COUNT": "1"}


def job_for(runner: FakeScontrol, env: dict | None = None) -> slurm.SlurmJob:
    alloc = slurm.detect(env or JOB_ENV, runner)
    assert alloc is not None
    # the job's end and a preemption's plan after a failed last sync ask within SIGNAL_TIMEOUT_S: the same answers,
    # recorded apart (the end's background watch would otherwise add to `runner.calls` at any time)
    return slurm.SlurmJob(alloc, {}, Events(), runner, signal_runner=FakeScontrol(runner.job))


def test_slurm_allocation_comes_from_the_job_environment():
    runner = FakeScontrol()
    alloc = slurm.detect(JOB_ENV, runner)
    assert alloc is not None
    assert runner.calls == [["scontrol", "show", "hostnames", "gpu[01-02]"]]
    assert (alloc.job_id, alloc.nodes, alloc.gpus, alloc.restart_count) == ("42", ["gpu01", "gpu02"], [0, 1], 1)
    assert alloc.rendezvous_endpoint(31234) == "gpu01:31234"
    assert slurm.rank0_warning(alloc) is None
    assert slurm.detect({}, runner) is None  # outside Slurm
    plain = slurm.detect({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "a,b", "SLURM_JOB_GPUS": "2-3"},
                         lambda args: (_ for _ in ()).throw(FileNotFoundError("scontrol")))
    assert plain is not None and (plain.nodes, plain.gpus) == (["a", "b"], [2, 3])
    unsorted = slurm.Allocation("9", ["node9", "node10"], [])
    assert "node10" in (slurm.rank0_warning(unsorted) or "")


def test_slurm_multinode_launch_is_srun_with_one_c10d_torchrun_per_node(tmp_path, monkeypatch):
    monkeypatch.delenv("MINILMD_SLURM_SRUN", raising=False)
    job = job_for(FakeScontrol())
    assert job.state["slurm"]["state"] == "RUNNING" and job.nproc == 2 and job.devices_env == "0,1"
    train = [sys.executable, "-m", "minilmd.cli", "train", "/r/run.toml", "--set", "data.prepared=\"/s/corpus\""]

    cfg = launch_cfg(tmp_path)
    command = job.command(train, 3, cfg, None)
    srun = command[:command.index(sys.executable)]
    assert srun == ["srun", "--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1",
                    "--export=ALL"]
    assert command[len(srun):command.index("minilmd.daemon.slurm.node") + 1] == pychild.module_argv(
        "minilmd.daemon.slurm.node")
    node = command[command.index("minilmd.daemon.slurm.node") + 1:command.index("--")]
    assert node == ["--scratch", str(tmp_path / "s"), "--source", "/nfs/corpus", "--run-dir", str(tmp_path / "r"),
                    "--run-name", "r", "--default"]
    torchrun = command[command.index("--") + 1:]
    rendezvous = pychild.module_argv("minilmd.trainer.loop.rendezvous")
    assert torchrun[:len(rendezvous)] == rendezvous  # torchrun, own rendezvous; -P where Python has it
    assert is_torchrun(command)  # child.classify and the thread count look for it
    endpoint = torchrun[torchrun.index("--rdzv-endpoint") + 1]
    assert endpoint.startswith("gpu01:") and int(endpoint.partition(":")[2]) > 0  # a port the kernel gave, now
    options = torchrun[len(rendezvous):len(rendezvous) + 12]
    assert " ".join(options) == (f"--nnodes 2 --nproc-per-node 2 --rdzv-backend minilmd-c10d --rdzv-endpoint "
                                 f"{endpoint} --rdzv-id minilmd-42-3 --max-restarts 0")
    secret = job.launch_env["MINILMD_RDZV_SECRET"]
    assert len(secret) == 64 and secret not in " ".join(command)  # in the environment only: cmdline is public
    assert job.command(train, 4, cfg, None)[:3] == ["srun", "--nodes", "2"]
    assert job.launch_env["MINILMD_RDZV_SECRET"] != secret  # a new secret each attempt
    assert torchrun[-4:] == train[3:] and torchrun[-6:-4] == ["-m", "minilmd.cli"]
    one = job_for(FakeScontrol(), {**JOB_ENV, "SLURM_JOB_NODELIST": "gpu01"})
    one.alloc.nodes = ["gpu01"]
    assert one.command(train, 1, cfg, None) == train  # one node: as on one server
    assert one.launch_env == {}
    monkeypatch.setenv("MINILMD_SLURM_SRUN", "1")  # the multi-node script: srun on one node too
    assert one.command(train, 1, cfg, None)[:3] == ["srun", "--nodes", "1"]


def test_slurm_srun_launch_runs_the_trainer_command_given_in_the_environment_in_each_rank(tmp_path, monkeypatch):
    # MINILMD_TRAINER_CMD (a test's trainer, tests/pausing_trainer.py) is what torchrun starts, as on one server
    monkeypatch.setenv("MINILMD_SLURM_SRUN", "1")
    monkeypatch.setenv("MINILMD_TRAINER_CMD", "/usr/bin/python3 /t/pausing_trainer.py")
    train = ["/usr/bin/python3", "/t/pausing_trainer.py", "train", "/r/run.toml"]
    cfg = launch_cfg(tmp_path, scratch_is_default=False)
    command = job_for(FakeScontrol()).command(train, 1, cfg, None)
    assert command[command.index("--max-restarts") + 2:] == ["--no-python", *train]
    monkeypatch.delenv("MINILMD_TRAINER_CMD")
    command = job_for(FakeScontrol()).command(train, 1, cfg, None)
    assert command[command.index("--max-restarts") + 2:] == ["-m", "minilmd.cli", "train", "/r/run.toml"]


@pytest.mark.parametrize("by, job_line, budget_done, expect_requeue, ended, reason", [
    ("USR1", "JobState=RUNNING Reason=None Restarts=1", False, True, "requeued",
     "requeued by Slurm (preempted at step 7)"),
    ("SIGTERM", "JobState=COMPLETING Reason=TimeLimit Restarts=1", False, True, "requeued",
     "requeued by Slurm (preempted"),
    ("SIGTERM", "JobState=COMPLETING Reason=None Restarts=2", False, False, "requeued", "Slurm requeued it itself"),
    ("SIGTERM", "JobState=COMPLETING Reason=None Restarts=1", False, False, "cancelled",
     "the Slurm job was cancelled"),
    ("USR1", "JobState=RUNNING Reason=None Restarts=1", True, False, "finished",
     "the run finished as Slurm preempted it"),
    # `minilmd stop`'s SIGUSR2 is a stop asked for, its request read or not (run.dir full): never requeued, also when
    # the job is cancelled after it
    ("SIGUSR2", "JobState=RUNNING Reason=None Restarts=1", False, False, "stopped",
     "stopped on request (minilmd stop) at step 7: not requeued"),
    ("SIGUSR2", "JobState=COMPLETING Reason=None Restarts=1", False, False, "stopped", "stopped on request"),
])
def test_slurm_preemption_requeues_unless_done_cancelled_or_already_requeued(by, job_line, budget_done,
                                                                             expect_requeue, ended, reason):
    runner = FakeScontrol(job_line)
    job = job_for(runner)
    assert job.preempt(by) and not job.preempt("SIGTERM")  # the first signal names the preemption
    plan = job.plan(budget_done, 7, "")
    assert plan.problem is None and plan.requeue == expect_requeue and reason in plan.reason
    assert plan.ended == ended  # state.json's outcome.ended: a stage after this run knows it without the words
    assert job.state["slurm"]["preempted_at_step"] == 7
    if plan.requeue:
        assert job.requeue() is None and runner.calls[-1] == ["scontrol", "requeue", "42"]
        assert job.state["slurm"]["requeued"] and job.state["slurm"]["state"] == "REQUEUED"


@pytest.mark.parametrize("by, job_line, stop_asked, unsynced, ask", [
    ("USR1", "JobState=RUNNING Reason=None Restarts=1", "", True, True),
    ("SIGTERM", "JobState=COMPLETING Reason=TimeLimit Restarts=1", "", True, True),
    ("SIGTERM", "JobState=COMPLETING Reason=None Restarts=2", "", True, False),  # Slurm requeues it itself
    ("SIGTERM", "JobState=COMPLETING Reason=None Restarts=1", "", False, False),  # scancel: not requeued
    ("SIGTERM", "JobState=RUNNING Reason=None Restarts=1", "minilmd stop at 12:00", False, False),
])
def test_slurm_preemption_whose_last_sync_failed_is_requeued_unsynced_unless_stopped_or_cancelled(
        by, job_line, stop_asked, unsynced, ask):
    """A failed last sync is requeued as one that could not finish within the job (daemon/slurm/unsynced_end.py:
    the checkpoint kept in run.dir, requeue_bound's bound); before, every such preemption ended failed, exit 1, not
    requeued. Never `finished`; a stop asked for or a cancel is not requeued."""
    job = job_for(FakeScontrol(job_line))
    job.preempt(by)
    plan = job.plan(True, 5, "the last sync failed: remote unreachable", stop_asked)
    assert plan.ended == "failed" and "remote unreachable" in (plan.problem or ""), plan  # words if nothing is kept
    assert plan.unsynced == unsynced and plan.requeue == ask, plan
    assert not job.state["slurm"]["requeued"]  # unsynced_end.plan decides, and records it
    if unsynced:
        assert plan.reason == f"preempted by {by}", plan
    else:
        assert "not requeued" in (plan.problem or ""), plan


def test_slurm_requeue_that_fails_is_said():
    failing = job_for(FakeScontrol(fail_requeue=True))
    assert "permission denied" in (failing.requeue() or "") and not failing.state["slurm"]["requeued"]


def test_slurm_allocated_cards_are_checked_not_waited_for():
    job = job_for(FakeScontrol())
    ready = job.gpu_outcome("auto", lambda: FakeNvml([[FREE], [FREE]]))
    assert isinstance(ready, GpuReady) and ready.devices == [0, 1] and "Fake GPU 1" in ready.reason
    assert isinstance(job.gpu_outcome("auto", lambda: FakeNvml([[FREE]])), GpuUnavailable)  # card 1 missing
    no_nvml = job.gpu_outcome("auto", lambda: "the NVIDIA driver is not loaded")
    assert isinstance(no_nvml, GpuUnavailable) and "driver" in no_nvml.error
    cpu = job_for(FakeScontrol(), {k: v for k, v in JOB_ENV.items() if k != "CUDA_VISIBLE_DEVICES"})
    assert isinstance(cpu.gpu_outcome("cuda", lambda: "unused"), GpuUnavailable)
    on_cpu = cpu.gpu_outcome("auto", lambda: "unused")
    assert isinstance(on_cpu, GpuReady) and on_cpu.devices == [] and cpu.nproc == 1 and cpu.devices_env == ""


def test_slurm_signals_usr1_and_sigterm_are_a_preemption_and_usr1_alone_is_ignored_outside(monkeypatch):
    from minilmd.daemon.supervisor import Signals

    events = Events()
    outside = Signals(usr1=True)
    slurm.on_signal(None, outside, events)
    assert outside.stop == 0 and not outside.usr1 and "ignored" in events[-1][1]
    job = job_for(FakeScontrol())
    warned = Signals(usr1=True)
    slurm.on_signal(job, warned, events)
    assert warned.stop == 1 and job.preempted_by == "USR1"
    job = job_for(FakeScontrol())
    slurm.on_signal(job, Signals(stop=1), events)
    assert job.preempted_by == "SIGTERM"


def test_slurm_scratch_is_per_job_on_the_nodes_tmpdir(monkeypatch, tmp_path):
    monkeypatch.delenv("MINILMD_SCRATCH_BASE", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import os

    assert scratch.default_path("r") == tmp_path / f"minilmd-{os.geteuid()}" / "r-slurm77"
    monkeypatch.delenv("TMPDIR")
    assert scratch.default_path("r") == Path(f"/dev/shm/minilmd-{os.geteuid()}/r-slurm77")
    monkeypatch.delenv("SLURM_JOB_ID")
    assert scratch.default_path("r") == Path(f"/dev/shm/minilmd-{os.geteuid()}/r")


def test_slurm_status_line_names_the_job_its_nodes_and_state():
    recorded = {"job_id": "42", "nodes": ["gpu01", "gpu02"], "state": "REQUEUED", "restart_count": 1}
    live = slurm.status_line(recorded, FakeScontrol("JobState=PENDING Reason=BeginTime Restarts=2"))
    assert live == "  Slurm job 42 on 2 node(s) gpu01,gpu02: PENDING (now), requeued 1 time(s) before"
    unreachable = slurm.status_line(recorded, lambda args: (_ for _ in ()).throw(FileNotFoundError("scontrol")))
    assert "REQUEUED (last recorded)" in unreachable


def test_slurm_node_step_stages_the_corpus_then_becomes_the_command(tmp_path, corpus):
    node_scratch, run_dir = tmp_path / "node" / "scratch", tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "minilmd.daemon.slurm.node", "--scratch", str(node_scratch),
                          "--source", str(corpus[0]), "--run-dir", str(run_dir), "--run-name", "n", "--",
                          sys.executable, "-c", "import os; print('exec', os.getpid())"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (node_scratch / "corpus" / "meta.json").is_file()
    assert json.loads((node_scratch / "owner.json").read_text())["run_dir"] == str(run_dir.resolve())
    assert "exec" in out.stdout.splitlines()[-1]
    refused = subprocess.run([sys.executable, "-m", "minilmd.daemon.slurm.node", "--scratch", str(node_scratch),
                              "--source", str(corpus[0]), "--run-dir", str(tmp_path / "other"), "--run-name", "n",
                              "--", "true"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "belongs to another run" in refused.stderr


def test_slurm_trainer_step_is_stopped_through_scancel_never_by_signalling_srun(monkeypatch):
    runner = FakeScontrol()
    alloc = slurm.detect(JOB_ENV, runner)
    assert alloc is not None
    events = Events()
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # another job of this user's: never scancelled
    other = slurm.SlurmJob(alloc, {}, events, runner, signal_runner=runner)
    calls = len(runner.calls)
    assert other.stop_step(["srun", "python"]) and len(runner.calls) == calls
    assert "not the job this process runs in (41)" in events[-1][1]
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # the job this process runs in (JOB_ENV's)
    job = slurm.SlurmJob(alloc, {}, events, runner, signal_runner=runner)
    assert not job.stop_step([sys.executable, "-m", "minilmd.cli", "train", "x.toml"])  # its group is signalled
    assert job.stop_step(["srun", "--nodes", "2", "python"]) and runner.calls[-1] == ["scancel", "--signal=TERM", "42"]

    def silent(args):
        raise subprocess.TimeoutExpired(args, 3)

    busy = slurm.SlurmJob(alloc, {}, events, runner, signal_runner=silent)
    assert busy.stop_step(["srun", "python"]) and "did not answer" in events[-1][1]
