"""The trainer as a child process: how it is launched, watched and stopped (what its end means is
daemon/child/death.py).

The child runs in its own process group (so that a torchrun group is stopped as a whole and a terminal's ^C reaches
only the supervisor), writes to logs/attempt-NNNN.log, and carries MINILMD_RUN_DIR and a random MINILMD_LAUNCH_ID
in its environment. `launch()` records the trainer in <run dir>/trainer.json (pid, start time, uid, host, launch
id) before anything else can happen to the supervisor; daemon/child/orphans.py uses that record to tell an orphan of
this run from any other process. A hung child's stacks are daemon/child/stackdump.py.

Nothing here waits for a child without a bound: a trainer in uninterruptible I/O on a stalled mount may take long
to die even after SIGKILL, and the supervisor's loop must go on meanwhile. Torch-free.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from minilmd import compile_cache as compile_cache_env
from minilmd import names, procs, pychild, threads
from minilmd.daemon.base.runstate import Heartbeat, process_start_ticks
from minilmd.daemon.child.oomevidence import (
    HIERARCHY_ROOTS,
    RANK_SCAN_S,
    Rank,
    expected_ranks,
    oom_counter_file,
    ranks_among,
    read_oom_kills,
)
from minilmd.daemon.child.orphans import REAP_S, record_launch
from minilmd.jsonlines import open_log
from minilmd.supervisor_gone import pid_namespace

RUN_DIR_ENV = names.RUN_DIR_ENV
"""Set on every child: the absolute run directory. How an orphaned trainer is recognised after a supervisor crash."""
LAUNCH_ID_ENV = names.LAUNCH_ID_ENV
"""Set on every child: a random token per launch, also in trainer.json; its processes inherit it."""
TRAINER_CMD_ENV = names.TRAINER_CMD_ENV
"""Replaces `python -m minilmd.cli` in the child's command line (tests use a fake trainer through it)."""

TORCHRUN_MODULES = ("torch.distributed.run", names.TORCHRUN_LAUNCHER, names.RDZV_LAUNCHER)
"""The modules a command runs torchrun as: torch's own (a hand-made command), minilmd's on one host, and torchrun
with a Slurm job's own rendezvous."""


def is_torchrun(command: list[str]) -> bool:
    """Whether the command runs torchrun (its workers' deaths read from its log, one OpenMP thread per rank)."""
    return any(module in command for module in TORCHRUN_MODULES)


SUPERVISOR_LINE = "# "
"""How the lines the supervisor itself writes into an attempt log begin (the header, a stack dump's header)."""

def attempt_log_path(run_dir: Path, attempt: int) -> Path:
    return run_dir / names.ATTEMPT_LOGS / names.attempt_log_name(attempt)


def trainer_prefix() -> list[str]:
    custom = os.environ.get(TRAINER_CMD_ENV)
    if custom:
        return shlex.split(custom)
    return pychild.module_argv("minilmd.cli")


def build_command(config_copy: Path, overrides: dict[str, object], nproc: int = 1) -> list[str]:
    """`minilmd train RUN.TOML --set K=V ...`, under torchrun (its own restarts off: the supervisor restarts the
    whole group) when more than one GPU is used."""
    sets: list[str] = []
    for key, value in overrides.items():
        sets += ["--set", f"{key}={_toml_literal(value)}"]
    if nproc > 1:
        # torch.distributed.run (torchrun without depending on the script being on PATH) with its stdout and stderr
        # escaped (its failure summary in the attempt log quotes a rank's error) and, where torch's says 1, the exit
        # status every failed rank gave, whichever it is (73, 75, 2, 65, 76 ...: classified as one trainer's), also
        # after its own stop signal (trainer/loop/torchrun.py).
        # Its ranks run `sys.executable -u -m minilmd.cli`: launch()'s PYTHONSAFEPATH and "/" guard them
        # (minilmd/pychild.py).
        prefix = pychild.module_argv(names.TORCHRUN_LAUNCHER, "--standalone", "--nproc_per_node", str(nproc),
                                     "--max-restarts", "0", "-m", "minilmd.cli")
    else:
        prefix = trainer_prefix()
    return [*prefix, "train", str(config_copy), *sets]


def _toml_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class Child:
    """A launched trainer. `pid` is also its process group id."""

    popen: subprocess.Popen
    attempt: int
    log_path: Path
    command: list[str]
    started: float
    start_ticks: int | None
    newest_at_launch: int = -1  # the newest local checkpoint step at launch: a newer one is progress
    step0_at_launch: tuple[int, int] | None = None  # (0, inode) of step 0 when it was the newest at launch
    cgroup_oom: dict[Path, int] = field(default_factory=dict)  # each oom counter file seen: its value then
    counter_of: dict[Path, str] = field(default_factory=dict)  # whose a counter is when a rank's alone ("rank 0 ...")
    ranks: list[Rank] = field(default_factory=list)  # torchrun's workers seen alive (after their death, gone)
    rank_scan_at: float = 0.0  # time.monotonic() of the next look for ranks not yet seen
    killed_for_hang: bool = False
    hang_detail: str = ""
    own_beat_seen: Heartbeat | None = None  # the newest heartbeat of this attempt's seen (silence, kill_if_hung)
    stop_sent: float | None = None
    stop_mark: tuple[int, int] | None = None  # the newest checkpoint (step, inode) when stop_sent was: a save since
    killed_at: float | None = None  # when kill() sent SIGKILL; the loop then only polls until it is reaped
    killed_by: str = ""  # who sent that SIGKILL, the supervisor ("by the supervisor on ..."): its death says so
    reap_reported: bool = False  # the loop said once that the kernel has not let it go yet
    run_dir: Path | None = None
    launch_id: str = ""  # MINILMD_LAUNCH_ID: every process of this launch carries it, in the group or not

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        """`sig` to the trainer's process group, while the trainer is our child not yet reaped (minilmd/procs.py):
        once reaped, its pid may name another's group."""
        procs.signal_child_group(self.pid, sig)

    def track_cgroup(self) -> None:
        """Remember the OOM-kill counter of the child's memory cgroup, and of each cgroup it moves to, so that a kill
        can be attributed to the OOM killer afterwards. Earlier ones are kept: under cgroup v1 a process that the
        OOM killer has taken shows the root cgroup while it exits, and the kill was counted in the group it left.
        Under torchrun the ranks' too, and the ranks (pid, start time): the OOM killer takes a rank, not the agent."""
        self._track_counter(self.pid, "", None)
        if not is_torchrun(self.command):
            return
        want = expected_ranks(self.command)
        if (want is None or len(self.ranks) < want) and time.monotonic() >= self.rank_scan_at:
            self.rank_scan_at = time.monotonic() + RANK_SCAN_S
            self.ranks += ranks_among(self.pid, self.launch_pids(), {rank.pid for rank in self.ranks})
        for rank in self.ranks:
            self._track_counter(rank.pid, f"{rank.name} (pid {rank.pid})", rank.ticks)

    def _track_counter(self, pid: int, who: str, ticks: int | None) -> None:
        counter = oom_counter_file(pid)
        if ticks is not None and process_start_ticks(pid) != ticks:
            return  # gone, or its pid another process's now: not the rank's cgroup
        if counter and self.cgroup_oom and counter.parent in HIERARCHY_ROOTS:
            return  # the root a dying v1 process shows: it counts the kills of every group below (another run's)
        if counter and counter not in self.cgroup_oom:
            value = read_oom_kills(counter)
            if value is not None:
                self.cgroup_oom[counter] = value
                self.counter_of[counter] = who

    def beats(self, beat: Heartbeat | None) -> bool:
        """Whether the heartbeat file (one `runstate.read_heartbeat`) was written by this attempt."""
        return beat is not None and beat.mtime >= self.started - 1

    def seen(self, beat: Heartbeat | None) -> Heartbeat | None:
        """Records `beat` when it is this attempt's own and the newest yet; the beat to judge: `beat`, or, where
        the tick's reading failed (None), the newest own one seen before (its phase, a compile's, kept too)."""
        if beat is not None and self.beats(beat) and (self.own_beat_seen is None
                                                      or beat.mtime >= self.own_beat_seen.mtime):
            self.own_beat_seen = beat
        return beat if beat is not None else self.own_beat_seen

    def silence(self, beat: Heartbeat | None, hang_timeout: float, startup_grace: float) -> str:
        """Why the trainer counts as hung, or "": no heartbeat of its own for hang_timeout; before its first one
        (imports, corpus open and checkpoint load come first) for max(hang_timeout, startup_grace). The newest own
        beat seen is kept (`own_beat_seen`): a tick whose one reading failed (None) does not bring the start-up rule
        back, which measured the silence from the trainer's start (a DPO reference pass beating every 0.25 s was
        killed so, 37 s after its start)."""
        self.seen(beat)
        own_beat = self.own_beat_seen.mtime if self.own_beat_seen is not None else None
        limit = hang_timeout if own_beat is not None else max(hang_timeout, startup_grace)
        silent = time.time() - max(self.started, own_beat if own_beat is not None else 0.0)
        if silent <= limit:
            return ""
        if limit > hang_timeout:  # the grace, not the config's value: name both
            return (f"no heartbeat for {silent:.0f}s since it started (none yet: {limit:.0f}s start-up grace; "
                    f"restart.hang_timeout {hang_timeout:.0f}s)")
        return f"no heartbeat for {silent:.0f}s (restart.hang_timeout {limit:.0f}s)"

    def kill(self, launch: list[tuple[int, int]] | None = None, why: str = "by the supervisor") -> None:
        """SIGKILL to the whole group and to the rest of the launch (`launch`: launch_pids' answer when the caller
        has it); the caller polls for the end (it may come late: uninterruptible I/O). `why` is said in its death
        ("killed by the supervisor on a second stop signal"): not a SIGKILL from outside."""
        if self.killed_at is None:
            self.killed_at = time.time()
            self.killed_by = why
        self.signal_group(signal.SIGKILL)
        self.kill_rest(launch)

    def launch_pids(self) -> list[tuple[int, int]]:
        """(pid, start ticks) of each live process of this launch (ours, its run dir and launch id), whatever its
        group: torchrun starts each worker in a session of its own (torch.distributed.elastic's
        SubprocessHandler), out of reach of a signal to the trainer's group."""
        launch = self.launch()
        return launch.processes() if launch is not None else []

    def launch(self) -> procs.Launch | None:
        """This launch as minilmd/procs.py proves its processes: the run directory, the launch id, the trainer."""
        if self.run_dir is None or not self.launch_id:
            return None
        scope = procs.scope_or_none(self.run_dir)  # None: not ours (nor root), or a link on it now (said once)
        return procs.Launch(scope, self.launch_id, self.pid, self.start_ticks) if scope is not None else None

    def kill_rest(self, launch: list[tuple[int, int]] | None = None) -> list[int]:
        """SIGKILL each process of this launch that is still alive (a torchrun worker whose agent was killed, or
        whose agent ended without it): through a pidfd checked against its start time, never a recycled pid.
        The pids signalled."""
        return [pid for pid, _ in self._kill_rest(launch)]

    def _kill_rest(self, launch: list[tuple[int, int]] | None) -> list[tuple[int, int]]:
        proof = self.launch()
        if proof is None:
            return []
        launch = proof.processes() if launch is None else launch
        return [(pid, ticks) for pid, ticks in launch if proof.signal(pid, ticks, signal.SIGKILL)]

    def kill_rest_and_wait(self, reap_s: float = REAP_S, while_waiting=None) -> tuple[list[int], list[int]]:
        """kill_rest, then up to reap_s for what it signalled to be gone: a SIGKILLed rank 0 stuck in the kernel
        still holds the run's trainer.lock, and the next attempt's would be refused. (signalled, still alive)."""
        killed = self._kill_rest(None)
        return [pid for pid, _ in killed], procs.wait_gone(killed, reap_s, while_waiting)

    def kill_group(self, grace: float = 0.0, reap_s: float = REAP_S, while_waiting=None) -> int | None:
        """SIGTERM (if grace > 0) and up to grace for the group to exit, then SIGKILL and up to reap_s for the kernel
        to release it. The exit status, or None if it is still not reaped (the kernel holds it in uninterruptible
        I/O): never a wait without a bound. `while_waiting()` is called every few tens of milliseconds (the
        systemd watchdog)."""
        if grace > 0:
            self.signal_group(signal.SIGTERM)
            rc = wait_bounded(self.popen, grace, while_waiting)
            if rc is not None:
                return rc
        self.kill(why=f"by the supervisor, {grace:.0f}s after its SIGTERM" if grace > 0 else "by the supervisor")
        return wait_bounded(self.popen, reap_s, while_waiting)


def wait_bounded(popen, seconds: float, while_waiting=None, interval: float = 0.05) -> int | None:
    """The exit status of popen once it ends within `seconds`, else None; polls, never a blocking wait."""
    deadline = time.monotonic() + seconds
    while True:
        rc = popen.poll()
        if rc is not None or time.monotonic() >= deadline:
            return rc
        if while_waiting is not None:
            while_waiting()
        time.sleep(interval)


def trainer_threads(command: list[str], devices: str, environ, cores: int | None = None,
                    load: float | None = None) -> tuple[str, str]:
    """OMP_NUM_THREADS for a trainer, and why (minilmd/threads.py, the rule the benches use too): a value set for
    the supervisor kept, 1 for a torchrun rank and a GPU trainer, the idle cores at launch for a single CPU
    trainer."""
    one_thread = threads.one_thread_reason(gpu=bool(devices) and not is_torchrun(command), ranks=is_torchrun(command))
    return threads.trainer_threads(environ, "the supervisor", one_thread, cores, load)


def supervisor_identity() -> str:
    """names.SUPERVISOR_PROCESS_ENV's value: this supervisor's pid, start time, host and pid namespace, by which its
    trainer (every rank on this host) notices that it is gone and stops (minilmd/supervisor_gone.py)."""
    return f"{os.getpid()} {process_start_ticks(os.getpid())} {socket.gethostname()} {pid_namespace()}"


def launch(command: list[str], run_dir: Path, attempt: int, devices: str, extra_env: dict | None = None,
           compile_cache: Path | None = None) -> Child:
    """Start the trainer in its own session, output appended to its attempt log, in "/" with PYTHONSAFEPATH=1 (no
    planted module of the supervisor's working directory imported: minilmd/pychild.py). `compile_cache`: the run's own
    torch.compile caches (and the TMPDIR inductor also caches in) go under it (minilmd/compile_cache.py), unless set
    for the supervisor to a directory of the user's alone."""
    log_path = attempt_log_path(run_dir, attempt)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = pychild.child_env()  # PYTHONSAFEPATH=1: neither it nor a torchrun rank imports from a planted directory
    env.update(extra_env or {})
    env[RUN_DIR_ENV] = str(run_dir.resolve())
    env.setdefault("TORCH_COMPILE_DEBUG_DIR", env[RUN_DIR_ENV])  # TORCH_COMPILE_DEBUG's output: not under "/" (cwd)
    env[LAUNCH_ID_ENV] = record_launch(run_dir, attempt)
    env[names.SUPERVISOR_PROCESS_ENV] = supervisor_identity()  # the trainer stops once we are gone
    env["CUDA_VISIBLE_DEVICES"] = devices
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"], threads_why = trainer_threads(command, devices, env)
    caches = compile_cache_env.settle(compile_cache, env, "the supervisor", "the run's own, under scratch") \
        if compile_cache is not None else {}
    env.update({var: choice.value for var, choice in caches.items()})
    # A heartbeat the previous attempt wrote in its last second would pass for this one's (beats() allows the clock
    # a second) and cut its start-up grace to hang_timeout: every heartbeat from here on is this attempt's.
    (run_dir / names.HEARTBEAT).unlink(missing_ok=True)
    with os.fdopen(open_log(log_path), "ab") as log:  # a link or a FIFO at its name: NotALog, never written through
        log.write(f"# attempt {attempt}: {shlex.join(command)}\n# CUDA_VISIBLE_DEVICES={devices!r}\n"
                  f"# OMP_NUM_THREADS={env['OMP_NUM_THREADS']} ({threads_why})\n".encode())
        log.write("".join(f"# {var}={c.value} ({c.why})\n" for var, c in caches.items()).encode())
        log.flush()
        popen = pychild.popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, close_fds=True)
    child = Child(popen=popen, attempt=attempt, log_path=log_path, command=command, started=time.time(),
                  start_ticks=process_start_ticks(popen.pid), run_dir=run_dir, launch_id=env[LAUNCH_ID_ENV])
    record_launch(run_dir, attempt, env[LAUNCH_ID_ENV], child.pid, child.start_ticks)
    child.track_cgroup()
    return child
