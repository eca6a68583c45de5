"""`minilmd run` inside a Slurm job: the allocation instead of NVML waiting, one torchrun per node through `srun`,
and preemption as a requeue.

Slurm already decided which node(s) and cards this job has, so nothing here waits or takes leases: `Allocation`
reads them from the SLURM_* environment (the node list through `scontrol show hostnames`), `check_gpus` only makes
sure the allocated cards answer NVML and reports them. With more than one node the trainer is launched as

    srun --nodes M --ntasks-per-node 1 --kill-on-bad-exit=1 python -m minilmd.daemon.slurm.node ... -- \\
        python -m minilmd.trainer.loop.rendezvous --nnodes M --nproc-per-node N --rdzv-backend minilmd-c10d \\
            --rdzv-endpoint <first node>:<port> --rdzv-id minilmd-<job>-<attempt> --max-restarts 0 \\
            -m minilmd.cli train ...

(torchrun with a rendezvous only this job can host, trainer/loop/rendezvous.py: the port is one the kernel gave
this supervisor on the first node just before the launch, never one derivable from the job id; the first node's
agent serves the store or fails, and every node checks the store's proof, an HMAC keyed by the attempt's secret,
which travels in the environment (srun --export=ALL), never on a command line)

one torchrun per node (daemon/slurm/node.py stages the corpus on each node first). torchrun's own restarts are off
and `--kill-on-bad-exit` ends every node's part when one rank dies, so the supervisor sees one death, classifies
it as on one node (the log holds every node's torchrun output) and relaunches the whole job from the last
checkpoint. c10d numbers the nodes by host name: the supervisor runs on the first node (the batch host), which
must sort first for rank 0, the one that writes checkpoints, to be on it (checked at start: `rank0_warning`).

Preemption (`SlurmJob`): the `--signal=B:USR1@300` warning or a SIGTERM makes the trainer save at its next step,
then the last sync runs; after it the job is requeued (`scontrol requeue`) unless the budget is done, Slurm is
already requeuing it (its restart count went up) or the job is being cancelled (scancel). The requeued job finds
its node scratch empty (it is removed once the remote holds the last checkpoint) and resumes from the remote.
Torch-free.
"""
from __future__ import annotations

import os
import secrets
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from minilmd import names, procs, pychild
from minilmd.daemon.host.gpu import Nvml
from minilmd.daemon.slurm import endwatch, jobend
from minilmd.protocol import ENDED_CANCELLED, ENDED_FAILED, ENDED_FINISHED, ENDED_REQUEUED, ENDED_STOPPED

JOB_ID_ENV = names.SLURM_JOB_ENV
RDZV_BACKEND = names.RDZV_BACKEND
RDZV_LAUNCHER = names.RDZV_LAUNCHER
SCONTROL_TIMEOUT_S = 10.0
SIGNAL_TIMEOUT_S = 3.0
"""`scancel --signal` from the loop: a slurmctld busy requeuing the job answers late, and the loop must go on."""

Runner = Callable[[list[str]], str]
"""Runs a Slurm command and returns its stdout; raises OSError or subprocess.SubprocessError (tests replace it)."""


TIME_FORMAT = {"SLURM_TIME_FORMAT": "%s"}
"""Slurm's times as epoch seconds (scontrol(1) ENVIRONMENT: a strftime format), not in whatever format the user set
(`relative`, a custom one): daemon/slurm/jobend.py reads EndTime."""


def run_command(args: list[str], timeout: float = SCONTROL_TIMEOUT_S) -> str:
    """A Slurm command's stdout; subprocess.TimeoutExpired past `timeout`, the command's whole process group killed
    (procs.run_bounded), or SubprocessError when it fails."""
    done = procs.run_bounded(args, timeout, text=True, env={**os.environ, **TIME_FORMAT})
    if done.returncode != 0:
        raise subprocess.SubprocessError(f"{' '.join(args)}: exit {done.returncode}: "
                                         f"{(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def _int_list(value: str) -> list[int]:
    """"0,1" or "0-3" or "" -> the card indices."""
    cards: list[int] = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            cards += list(range(int(first), int(last or first) + 1))
    return cards


@dataclass
class Allocation:
    """What Slurm gave this job, from its environment."""

    job_id: str
    nodes: list[str]
    """The allocated nodes in Slurm's order; the batch script (and so the supervisor) runs on the first."""
    gpus: list[int]
    """CUDA_VISIBLE_DEVICES as Slurm set it (the cards of this node, as this job sees them); [] without GPUs."""
    restart_count: int = 0
    """SLURM_RESTART_COUNT: how often this job was requeued before this start."""
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    def rendezvous_endpoint(self, port: int) -> str:
        return f"{self.nodes[0]}:{port}"

    def summary(self) -> str:
        cards = f"GPU(s) {self.gpus}" if self.gpus else "no GPU"
        return (f"Slurm job {self.job_id}: {self.nnodes} node(s) {','.join(self.nodes)}, {cards} per node"
                + (f", requeued {self.restart_count} time(s)" if self.restart_count else ""))


def detect(environ=None, runner: Runner = run_command) -> Allocation | None:
    """The allocation of the Slurm job this process runs in (None outside Slurm)."""
    env = os.environ if environ is None else environ
    job = env.get(JOB_ID_ENV, "")
    if not job:
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    try:
        nodes = runner(["scontrol", "show", "hostnames", nodelist]).split() if nodelist else []
    except (OSError, subprocess.SubprocessError):
        nodes = [] if "[" in nodelist else [n for n in nodelist.split(",") if n]  # a plain list needs no scontrol
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    gpus = _int_list(visible) if visible else _int_list(env.get("SLURM_JOB_GPUS", ""))
    restarts = env.get(names.SLURM_RESTART_COUNT_ENV, "0")
    alloc = Allocation(job, nodes or [socket.gethostname().split(".")[0]], gpus,
                       int(restarts) if restarts.isdigit() else 0)
    return alloc


def rank0_warning(alloc: Allocation) -> str | None:
    """c10d gives rank 0 to the node whose name sorts first; checkpoints are written there and the supervisor
    syncs them from its own node, the first of the allocation."""
    if alloc.nnodes > 1 and sorted(alloc.nodes)[0] != alloc.nodes[0]:
        return (f"the first node {alloc.nodes[0]} does not sort first among {alloc.nodes}: torchrun's c10d "
                f"rendezvous may put rank 0 (which writes checkpoints) on {sorted(alloc.nodes)[0]}, out of this "
                f"supervisor's reach; use node names that sort in allocation order (zero-padded numbers)")
    return None


# --- the cards ---------------------------------------------------------------------------------------------------

def check_gpus(alloc: Allocation, nvml: Nvml | str) -> tuple[str, list[str]]:
    """Whether the allocated cards answer NVML: (a report line, problems). `nvml` is daemon/host/gpu.py's backend or
    the sentence saying why there is none."""
    if not alloc.gpus:
        return "no GPU in this allocation: training on the CPU", []
    if isinstance(nvml, str):
        return "", [f"Slurm allocated GPU(s) {alloc.gpus}, but {nvml}"]
    lines, problems = [], []
    try:
        count = nvml.device_count()
    except Exception as e:  # noqa: BLE001 - any NVML failure is a card we cannot use
        return "", [f"NVML cannot count the allocated cards: {e}"]
    for visible in alloc.gpus:
        # with ConstrainDevices Slurm's cgroup hides the other cards and numbers ours from 0 for NVML and CUDA
        # alike; without it CUDA_VISIBLE_DEVICES holds the physical indices NVML uses
        if visible >= count:
            problems.append(f"allocated card {visible} is not visible to NVML ({count} visible)")
            continue
        try:
            listing = nvml.processes(visible).processes
            lines.append(f"card {visible}: {nvml.name(visible)}, {nvml.memory(visible).used_mib} MiB used, "
                         + (f"{len(listing)} process(es)" if listing is not None else "processes not listed"))
        except Exception as e:  # noqa: BLE001
            problems.append(f"allocated card {visible} does not answer NVML: {e}")
    return "; ".join(lines), problems


# --- the launch ----------------------------------------------------------------------------------------------------

def rendezvous_port() -> int:
    """A port free on this node (the first of the allocation, where the rendezvous store listens) now, as the
    kernel picks one: no other user can know it before the launch, as he could a port derived from the job id.
    One who takes it in the moment before the store listens makes the first node's agent fail (it never joins his
    listener) and the attempt restart on another port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rendezvous_env() -> dict[str, str]:
    """The attempt's rendezvous secret, for the environment of its srun (never its command line)."""
    return {names.RDZV_SECRET_ENV: secrets.token_hex(32)}


def rank_program() -> list[str]:
    """What torchrun starts in each rank: `-m minilmd.cli`, or the trainer command given in MINILMD_TRAINER_CMD (a
    test's trainer, e.g. one that holds itself at a step) as it is, through torchrun's --no-python."""
    custom = os.environ.get(names.TRAINER_CMD_ENV)
    return ["--no-python", *shlex.split(custom)] if custom else ["-m", "minilmd.cli"]


def launch_command(train_command: list[str], alloc: Allocation, nproc_per_node: int, attempt: int,
                   scratch: Path, source: str, run_dir: Path, run_name: str, default_scratch: bool,
                   port: int) -> list[str]:
    """`srun` + one torchrun per node around `train_command` (whose part from "train" on is kept); the rendezvous
    on the first node's `port` (rendezvous_port)."""
    tail = train_command[train_command.index("train"):]
    # minilmd/pychild.py: `-P` here; the ranks, and every step on the other nodes, are guarded by the PYTHONSAFEPATH=1
    # and the "/" that srun gets from launch() (--export=ALL; srun's default --chdir is its own working directory),
    # not by the sbatch submit directory that the job started in.
    torchrun = pychild.module_argv(RDZV_LAUNCHER, "--nnodes", str(alloc.nnodes),
                                   "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", RDZV_BACKEND,
                                   "--rdzv-endpoint", alloc.rendezvous_endpoint(port),
                                   "--rdzv-id", f"minilmd-{alloc.job_id}-{attempt}",
                                   "--max-restarts", "0", *rank_program(), *tail)
    node_step = pychild.module_argv("minilmd.daemon.slurm.node", "--scratch", str(scratch), "--source", source,
                                    "--run-dir", str(run_dir), "--run-name", run_name,
                                    *(["--default"] if default_scratch else []), "--")
    return ["srun", "--nodes", str(alloc.nnodes), "--ntasks", str(alloc.nnodes), "--ntasks-per-node", "1",
            "--kill-on-bad-exit=1", "--export=ALL", *node_step, *torchrun]


# --- preemption -----------------------------------------------------------------------------------------------------

def on_signal(job: SlurmJob | None, signals, emit) -> None:
    """The supervisor's signal record (`signals.usr1`, `signals.stop`) in a Slurm job: USR1 is a preemption that
    also asks the stop (the trainer saves, the last sync runs); so is the first SIGTERM. Outside Slurm USR1 does
    nothing. Each tick after a preemption (the stop stays asked) the job's end is looked at, so that it is said
    in supervisor.log as soon as Slurm answers, or its first try does not (daemon/slurm/endwatch.py)."""
    if job is not None and job.preempted_by:
        job.job_end()
    if signals.take_usr1():
        if job is None:
            emit("signal", "SIGUSR1 ignored: this supervisor is not in a Slurm job")
            return
        if job.preempt("USR1"):
            emit("slurm", "SIGUSR1 from Slurm (a preemption or the time limit is near): the trainer saves at its "
                          "next step, then the last sync, then the job is requeued unless the budget is done")
            signals.stop_as_first_signal()
        return
    if job is not None and signals.stopping and job.preempt(by := "SIGTERM" if signals.stop else "SIGUSR2"):
        emit("slurm", f"{by} in a Slurm job: the trainer saves at its next step, then the last sync, then the job is "
                      f"requeued unless the budget is done, the job is cancelled or `minilmd stop` asked the stop")


def for_supervisor(state, emit, environ=None, runner: Runner = run_command) -> SlurmJob | None:
    """The supervisor's SlurmJob when it runs in a Slurm job (None outside one); says what it was given."""
    alloc = detect(environ, runner)
    if alloc is None:
        return None
    job = SlurmJob(alloc, state, emit, runner)
    emit("slurm", alloc.summary(), job_id=alloc.job_id, nodes=alloc.nodes)
    if (warning := rank0_warning(alloc)) is not None:
        emit("slurm", warning)
    return job


def job_info(job_id: str, runner: Runner = run_command) -> dict[str, str]:
    """`scontrol show job -o`: its Key=Value pairs ({} when it cannot be asked)."""
    try:
        out = runner(["scontrol", "show", "job", "-o", job_id])
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(item.partition("=")[::2] for item in out.split() if "=" in item)


def cancelled(info: dict[str, str]) -> bool:
    """Whether the job is ending because someone cancelled it (scancel): terminating, and neither for its time
    limit nor for a preemption, nor requeued by Slurm. Then a SIGTERM means stop for good."""
    reason = info.get("Reason", "")
    return info.get("JobState") in ("CANCELLED", "COMPLETING") and reason != "TimeLimit" and "Preempt" not in reason


class Plan(NamedTuple):
    """What a preempted job does after its last sync (SlurmJob.plan)."""

    ended: str
    """How the run ends (protocol.ENDED_*): state.json's outcome.ended."""
    reason: str
    """The reason status shows."""
    problem: str | None = None
    """Why it cannot end so (the run fails, exit 1), or None."""
    requeue: bool = False
    """Whether to `scontrol requeue` the job."""
    unsynced: bool = False
    """A failed last sync in a job that would be requeued (no stop asked for, not cancelled): it is requeued as a
    last sync that could not finish within the job (daemon/slurm/unsynced_end.py plan: the checkpoint kept in
    run.dir, requeue_bound's bound), `reason` the preemption in words, `requeue` False when Slurm requeues it itself;
    `problem` is the failure's words, should run.dir take nothing."""


@dataclass
class SlurmJob:
    """The supervisor's Slurm side: the allocation, the preemption request, the requeue. `state` is the RunState
    (its "slurm" entry is written here); `emit(kind, message, **details)` logs an event."""

    alloc: Allocation
    state: Any  # the RunState, or a dict in tests
    emit: Callable[..., None]
    runner: Runner = run_command
    signal_runner: Runner = field(default=lambda args: run_command(args, SIGNAL_TIMEOUT_S))
    preempted_by: str = ""
    """"USR1", "SIGTERM" or "SIGUSR2" (`minilmd stop`'s) once a preemption was asked; the loop acts on it."""
    preempted_at: float = 0.0
    """When that signal came (epoch seconds)."""
    sync_cut: str = ""
    """Why the preemption's last sync was cut at the job's end, in words (daemon/slurm/lastsynccut.py); "" if not."""
    environ: Any = None
    """The job's environment (None: this process's), for SLURM_JOB_END_TIME."""
    end_retry_s: tuple[float, ...] = endwatch.RETRY_DELAYS_S
    """The waits between the tries at the job's end while scontrol does not answer (tests shorten them)."""
    end_watch: endwatch.EndWatch | None = field(default=None, init=False, repr=False)
    """The job's end, asked from the preemption's signal on (daemon/slurm/endwatch.py); None before it."""
    launch_env: dict[str, str] = field(default_factory=dict)
    """What the last command() needs in its environment: the rendezvous secret of an srun attempt ({} otherwise)."""
    requeue_answer: str | None = field(default=None, init=False)
    """`scontrol show job`'s Requeue, as `plan` was answered after a preemption's failed last sync ("1" without
    the field or an answer); None before. unsynced_end.requeueable reads it, not asking again (time near the end)."""

    def __post_init__(self) -> None:
        self.state["slurm"] = {"job_id": self.alloc.job_id, "nodes": self.alloc.nodes, "gpus": self.alloc.gpus,
                               "restart_count": self.alloc.restart_count,
                               "state": job_info(self.alloc.job_id, self.runner).get("JobState", "RUNNING"),
                               "preempted_at_step": None, "requeued": False}

    @property
    def nproc(self) -> int:
        return max(1, len(self.alloc.gpus))

    @property
    def devices_env(self) -> str:
        """CUDA_VISIBLE_DEVICES for the trainer: Slurm's, unchanged."""
        return ",".join(str(i) for i in self.alloc.gpus)

    def gpu_outcome(self, device: str, open_nvml):
        """The waiting_gpu phase under Slurm: no waiting, no lease (Slurm gave the cards to this job alone); the
        allocated cards are checked to answer NVML and reported. `open_nvml()` is Infra's NVML or its reason."""
        from minilmd.daemon.phases.gpuwait import GpuReady, GpuUnavailable

        if device == "cpu" or not self.alloc.gpus:
            if device == "cuda":
                return GpuUnavailable(f"train.device = cuda, but Slurm allocated no GPU to job {self.alloc.job_id}")
            self.alloc.gpus = []
            return GpuReady(f"Slurm job {self.alloc.job_id}: training on the CPU (no GPU in the allocation)", [])
        report, problems = check_gpus(self.alloc, open_nvml())
        if problems:
            return GpuUnavailable(f"Slurm job {self.alloc.job_id}: " + "; ".join(problems), 1)
        self.state["devices"] = list(self.alloc.gpus)
        return GpuReady(f"Slurm job {self.alloc.job_id}: allocated GPU(s) {self.alloc.gpus}: {report}",
                        list(self.alloc.gpus))

    def command(self, command: list[str], attempt: int, cfg, staged) -> list[str]:
        """The attempt's command: as on one server for one node, srun + torchrun per node for more (or always,
        with MINILMD_SLURM_SRUN=1: the multi-node script); `launch_env` then holds what its environment needs."""
        self.launch_env = {}
        if self.alloc.nnodes <= 1 and os.environ.get(names.SLURM_SRUN_ENV) != "1":
            return command
        self.launch_env = rendezvous_env()  # a new secret and a new port each attempt
        return launch_command(command, self.alloc, self.nproc, attempt, cfg.scratch_dir, cfg.data.prepared,
                              cfg.run_dir, cfg.run.name, cfg.scratch_is_default, rendezvous_port())

    def finishing(self, cfg, sync_problem: str) -> None:
        """The run ends in this job: the per-job default scratch goes once the remote holds the last checkpoint."""
        if cfg.scratch_is_default:
            kept = "there is no run.remote" if not cfg.run.remote else sync_problem
            self.remove_scratch(cfg.scratch_dir, cfg.run_dir, kept)

    def stop_step(self, command: list[str]) -> bool:
        """Ask a trainer launched through srun to save and stop: SIGTERM to the job's steps (`scancel --signal=TERM
        JOB`, the batch step left alone), since srun itself turns a SIGTERM into a SIGKILL of every task. False
        for a trainer launched directly (the caller signals its process group)."""
        if not command or command[0] != "srun":
            return False
        self.emit("slurm", f"scancel --signal=TERM {self.alloc.job_id}: the trainer's step saves and stops")
        try:
            why = procs.signal_own_slurm_job(self.alloc.job_id, "TERM", self.signal_runner)
            if why:  # never SIGTERM srun instead (no save): the trainer is killed after restart.hang_timeout
                self.emit("slurm", f"the trainer's step was not signalled: {why}")
        except (OSError, subprocess.SubprocessError) as e:
            # never SIGTERM srun (no save); after Slurm's own SIGTERM the tasks have it already, and a trainer
            # that does not end is killed after restart.hang_timeout as on one server
            self.emit("slurm", f"scancel --signal=TERM {self.alloc.job_id} did not answer ({e}); waiting for the "
                               f"trainer to end")
        return True

    def preempt(self, signal_name: str) -> bool:
        """A preemption signal arrived; True the first time (the loop then stops the trainer, which saves). The
        job's end is asked now, before the save, in the background: the loop goes on meanwhile."""
        first = not self.preempted_by
        if first:
            self.preempted_by, self.preempted_at = signal_name, time.time()
            self._watch_end()
        return first

    def _watch_end(self) -> endwatch.EndWatch:
        if self.end_watch is None:
            environ = os.environ if self.environ is None else self.environ
            self.end_watch = endwatch.EndWatch(lambda: job_info(self.alloc.job_id, self.signal_runner),
                                               self.signal_runner, environ, self.preempted_by or "USR1",
                                               self.preempted_at or time.time(), self.emit, self.end_retry_s)
        return self.end_watch

    def job_end(self, now: float | None = None) -> jobend.JobEnd:
        """When Slurm ends this preempted job, as far as it has answered by `now` (daemon/slurm/endwatch.py)."""
        return self._watch_end().current(now)

    def plan(self, budget_done: bool, step, sync_problem: str, stop_asked: str = "") -> Plan:
        """After a preemption's last sync: how the run ends, the reason status shows, a problem or None, whether to
        requeue. No requeue when the budget is done, Slurm already requeues the job, it is being cancelled, or the stop
        was `minilmd stop`'s (`stop_asked`: its request, in words, daemon/base/stoprequest.py; or its SIGUSR2). The
        caller writes state.json before `requeue()`: Slurm ends this job as soon as it requeues it. A failed or refused
        last sync (`sync_problem`) is judged first: a finished run whose last checkpoint is not on the remote is never
        `finished` (exit 0 would leave that checkpoint on a scratch the job's end may wipe): it ends failed after a stop
        asked for or a cancel, else its plan is `unsynced` (requeued with its checkpoint kept in run.dir). A last sync
        cut at the job's end (`sync_cut`) is no failed sync: the job is requeued as after a synced one, a finished run
        too (its next start syncs the last checkpoint), the reason saying where it resumes."""
        slurm = self.state["slurm"]
        slurm["preempted_at_step"] = step
        by, cut = self.preempted_by, f"; {self.sync_cut}" if self.sync_cut else ""
        stop_asked = stop_asked or ("minilmd stop" if by == "SIGUSR2" else "")  # its SIGUSR2 is a stop asked for
        if cut:  # not a failed sync: the remote keeps its previous checkpoint, and the next start syncs on
            slurm["last_sync_cut"] = self.sync_cut
        if sync_problem and not cut:  # before the budget: a last checkpoint not on the remote is never `finished`
            failed = Plan(ENDED_FAILED, "", f"preempted by Slurm ({by}) at step {step}, but {sync_problem}: not "
                                            f"requeued, the checkpoint stays on this node's scratch")
            # the job's end is near: asked once within SIGNAL_TIMEOUT_S, its Requeue kept for unsynced_end (before,
            # 10 s here and 3 s there, then the requeue's 10 s: more than jobend.REQUEUE_MARGIN_S counts)
            info = job_info(self.alloc.job_id, self.signal_runner)
            self.requeue_answer = info.get("Requeue", "1")
            itself = self._requeued_by_slurm(info)  # judged first, as below: Slurm's requeue ends this job anyway
            if not itself and (stop_asked or (by == "SIGTERM" and cancelled(info))):
                return failed
            return failed._replace(reason=f"preempted by {by}", unsynced=True, requeue=not itself)
        if budget_done and not cut:
            return Plan(ENDED_FINISHED, f"the run finished as Slurm preempted it ({by}): not requeued")
        # after a cut the job's end is REQUEUE_MARGIN_S away: asked within SIGNAL_TIMEOUT_S, the requeue's 10 s kept
        info = job_info(self.alloc.job_id, self.signal_runner if cut else self.runner)
        if self._requeued_by_slurm(info):
            slurm["requeued"], slurm["state"] = True, "REQUEUED"
            return Plan(ENDED_REQUEUED, f"requeued by Slurm (preempted at step {step}; Slurm requeued it "
                                        f"itself){cut}")
        if stop_asked:
            return Plan(ENDED_STOPPED, f"stopped on request ({stop_asked}) at step {step}: not requeued{cut}")
        if by == "SIGTERM" and cancelled(info):
            slurm["state"] = "CANCELLED"
            return Plan(ENDED_CANCELLED, f"the Slurm job was cancelled: stopped at step {step}, not requeued{cut}")
        slurm["requeued"], slurm["state"] = True, "REQUEUED"
        finished = " (the run finished: the requeued job syncs its last checkpoint)" if budget_done else ""
        return Plan(ENDED_REQUEUED, f"requeued by Slurm (preempted at step {step}){finished}{cut}", requeue=True)

    def _requeued_by_slurm(self, info: dict[str, str]) -> bool:
        """Whether Slurm requeues this job itself (its restart count went up since this start)."""
        restarts = info.get("Restarts", "0")
        return restarts.isdigit() and int(restarts) > self.alloc.restart_count

    def requeue(self) -> str | None:
        """`scontrol requeue` this job (None: done)."""
        self.emit("slurm", f"scontrol requeue {self.alloc.job_id}")
        try:
            self.runner(["scontrol", "requeue", self.alloc.job_id])
        except (OSError, subprocess.SubprocessError) as e:
            self.state["slurm"]["requeued"], self.state["slurm"]["state"] = False, "RUNNING"
            return f"scontrol requeue {self.alloc.job_id} failed: {e}"
        return None

    def remove_scratch(self, scratch: Path, run_dir: Path, kept: str) -> None:
        """Node-local scratch is the job's alone: once the remote holds the last checkpoint it goes, so that a
        requeued job (perhaps on another node) starts from the remote, and the node's RAM or disk is freed. `kept`:
        why the last sync cannot say so (no run.remote, its failure, its cut at the job's end); "" when it does."""
        if kept:
            self.emit("slurm", f"keeping {scratch}: the last sync did not put its newest checkpoint on the remote "
                               f"({kept})")
            return
        from minilmd import scratch as scratchmod

        problem = scratchmod.remove_own(scratch, run_dir)
        self.emit("slurm", f"removed this job's scratch {scratch}" if problem is None
                  else f"left {scratch} in place: {problem}")


def status_line(recorded: dict, runner: Runner = run_command) -> str:
    """`minilmd status`'s Slurm line: the job, its nodes and its state, asked of Slurm now where `scontrol`
    answers (on a login node too), else as the supervisor last recorded it."""
    job = str(recorded.get("job_id", "?"))
    live = job_info(job, runner).get("JobState")
    nodes = recorded.get("nodes") or []
    extra = f", requeued {recorded['restart_count']} time(s) before" if recorded.get("restart_count") else ""
    when = "now" if live else "last recorded"
    return (f"  Slurm job {job} on {len(nodes)} node(s) {','.join(nodes)}: {live or recorded.get('state', '?')} "
            f"({when}){extra}")
