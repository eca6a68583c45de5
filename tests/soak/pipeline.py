"""The pipeline soak: pretrain -> SFT -> LoRA (tests/soak/pipeline_stages.py) as three real `minilmd run`
supervisors started at once, under random real faults for --minutes, beside the same pipeline undisturbed; then the
checks. Not part of the default test run (tests/soak/conftest.py). Needs root and /dev/fuse (and a cgroup v1 memory
controller for the OOM kill; without one that kind is left out and said so).

    python tests/soak/pipeline.py --minutes 30 [--seed N] [--workdir DIR] [--steps N] [--kinds a,b]

Faults (tests/soak/schedule.py says when each can happen), one outstanding per stage:
  trainer_sigkill / trainer_sigbus   the signal to a stage's trainer
  trainer_hang                       SIGSTOP to the trainer (its heartbeat stops: killed after restart.hang_timeout)
  trainer_oom_kill                   the trainer moved into a memory cgroup with a 2 MiB limit: the kernel kills it
  supervisor_sigkill                 SIGKILL to a stage's supervisor, restarted 0.2-1.5 s later (as systemd would)
  predecessor_sigkill                the same to a stage whose successor waits for it, dead for 1-10 s
  init_source_unreachable            the predecessor's remote (the init.from source) EIO on FUSE or renamed away
                                     for 5-15 s, and the stage's trainer SIGKILLed so that its restart meets it
  probe_unreachable                  the same for the stage's eval.probe corpus
  remote_eio / remote_stall          the stage's own remote fails / stalls for 2-10 s
  slow_exit                          a trainer whose heartbeat says `exiting` SIGSTOPped for hang_timeout + 3 s
  planned_*                          MINILMD_FAULT (hang, oom, exception, sigbus, sigkill) fired inside the trainer
A supervisor that ends with a final exit while its run is not done is a stage failure: recorded with the faults
that preceded it, and the supervisor started again (at most 3 times a stage, as an operator would) so that the soak
goes on. Checks at the end: every stage done with exit 0 (no stage failure on the way), each stage's final
checkpoint (remote LATEST) has the same step and the same tensors bit for bit as the undisturbed pipeline's, every
stage's scratch is gone, every fault recovered. Prints the summary as JSON and as a table; exit 0 when all hold.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the helper modules in tests/

from pipeline_report import compare_final, report
from pipeline_stages import (
    BEFORE,
    CORPUS_OF,
    HANG_TIMEOUT_S,
    PROBE_OF,
    STAGES,
    calibrate,
    make_corpora,
    write_pipeline,
)
from schedule import INJECTED, StageView, pick

from faults_fixtures import CGROUP_MEMORY_ROOT, MemoryCgroup, mounted_faultfs, unavailable_memory_cgroup
from minilmd import checkpoint, checkpoint_dirs
from minilmd.config import load_config
from minilmd.names import FAULTS_FIRED, HEARTBEAT
from supervisor_helpers import env_for, state

FINAL_EXITS = (0, 2, 65, 73, 79)
PLANNED_KINDS = ("hang", "oom", "exception", "sigbus", "sigkill")
RECOVERY_TIMEOUT_S = 240.0
MAX_REVIVES = 3


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def send(pid: int | None, sig: int) -> bool:
    try:
        os.kill(pid or 0, sig) if pid else None
        return bool(pid)
    except ProcessLookupError:
        return False


class Stage:
    def __init__(self, name: str, config: Path, work: Path, tag: str):
        self.name, self.config, self.cfg = name, config, load_config(config)
        self.out = work / f"{tag}-{name}.out"
        self.sup: subprocess.Popen | None = None
        self.starts = 0
        self.revives = 0
        self.restart_at: float | None = None  # a killed supervisor's restart (systemd's RestartSec)
        self.ended = False  # its supervisor exited 0 with the run done

    def start(self, fault_plan: str = "") -> None:
        self.starts += 1
        self.restart_at = None
        self.sup = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", str(self.config)],
                                    stdout=open(self.out, "ab"), stderr=subprocess.STDOUT,
                                    env=env_for(fake=False, MINILMD_FAULT=fault_plan))

    def state(self) -> dict:
        return state(self.cfg.run_dir)

    def trainer_pid(self) -> int | None:
        pid = (self.state().get("child") or {}).get("pid")
        return pid if alive(pid) else None

    def step(self) -> int:
        saved = [checkpoint.step_of(p) for p in checkpoint_dirs.list_checkpoints(self.cfg.checkpoint_dir)]
        return max(saved + [(self.state().get("local_checkpoint") or {}).get("step") or 0])

    def attempt(self) -> int:
        return (self.state().get("child") or {}).get("attempt") or 0


class PipelineSoak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.kinds = args.kinds.split(",") if args.kinds else list(INJECTED) + ["slow_exit", "planned"]
        # without --workdir a new private directory (mkdtemp: 0700, never a name another user made first)
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="minilmd-pipeline-soak-")).resolve()
        self.faults: list[dict] = []
        self.failures: list[dict] = []  # stage failures: a final exit before the run was done
        self.lifts: list[tuple[float, object]] = []  # (when, how to lift) of the outages in force
        self.planned_seen: set[tuple[str, str]] = set()
        self.slowed: set[int] = set()
        self.lock = threading.Lock()
        self.cgroup_n = 0
        self.injecting = True
        self.notes: list[str] = []

    # --- set-up -------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        corpora = self.work / "corpora"
        vocab = make_corpora(corpora)
        steps = self.args.steps or calibrate(self.work, corpora, vocab, self.args.minutes)
        log(f"{steps} steps over the three stages")
        self.backing, self.mnt = self.work / "nfs-backing", self.work / "nfs"
        for name in CORPUS_OF.values():
            shutil.copytree(corpora / name, self.backing / name)
        self.mnt.mkdir(exist_ok=True)
        faulted = write_pipeline(self.work / "faulted", self.mnt, self.mnt, vocab, steps)
        reference = write_pipeline(self.work / "reference", corpora, self.work / "reference", vocab, steps)
        self.stages = [Stage(n, faulted[n], self.work, "faulted") for n in STAGES]
        self.refs = [Stage(n, reference[n], self.work, "reference") for n in STAGES]
        reason = unavailable_memory_cgroup()
        if reason and "trainer_oom_kill" in self.kinds:
            self.kinds.remove("trainer_oom_kill")
            self.notes.append(f"trainer_oom_kill left out: {reason}")

    def plan(self, stage: Stage) -> str:
        if "planned" not in self.kinds or not self.injecting:
            return ""
        at = stage.step()
        return ",".join(f"{self.rng.choice(PLANNED_KINDS)}@{at + self.rng.randint(10, 160)}" for _ in range(2))

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    # --- faults ---------------------------------------------------------------------------------------------------
    def record(self, kind: str, stage: Stage, step: int | None = None, **extra) -> dict:
        """A fault's record; `attempt` is the trainer attempt it hit (recovery needs a later one's checkpoint)."""
        with self.lock:
            rec = {"kind": kind, "stage": stage.name, "time": time.monotonic(),
                   "step": stage.step() if step is None else step, "recovered_at": None, "lifted": True,
                   "sup_start": stage.starts, "attempt": None, **extra}
            self.faults.append(rec)
            log(f"fault {len(self.faults)}: {kind} on {stage.name} at step {rec['step']}"
                + (f" ({extra['variant']})" if "variant" in extra else ""))
        return rec

    def outage(self, rec: dict, rel: str) -> None:
        """Make backing/<rel> unreachable through the mount for a while: EIO on every operation, or renamed away."""
        variant = self.rng.choice(["eio", "renamed"])
        rec["variant"], rec["lifted"] = f"{variant} {rel}", False
        log(f"  {rec['kind']}: {rec['variant']}")
        if variant == "eio":
            rule = self.fs.add_rule("*", f"{rel}*", "error", errno=5)

            def lift():
                self.fs.remove(rule)
        else:
            away = self.backing / f"{rel}.away"
            (self.backing / rel).rename(away)

            def lift():
                away.rename(self.backing / rel)
        self.lifts.append((time.monotonic() + self.rng.uniform(5, 15), (rec, lift)))

    def oom_kill(self, stage: Stage, pid: int, rec: dict) -> None:
        """Into a memory cgroup whose 2 MiB limit its next few allocations exceed (charges do not move with it)."""
        self.cgroup_n += 1
        path = CGROUP_MEMORY_ROOT / f"minilmd-soak-{os.getpid()}-{self.cgroup_n}"
        path.mkdir()
        group = MemoryCgroup(path, 2 << 20)
        group._write("memory.limit_in_bytes", 2 << 20)
        for name in ("memory.memsw.limit_in_bytes",):
            if (path / name).exists():
                try:
                    group._write(name, 2 << 20)
                except OSError:
                    pass
        group.add(pid)

        def watch():
            deadline = time.monotonic() + 30
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            rec["oom_kills"], rec["failcnt"] = group.oom_kills(), group.failcnt()
            if alive(pid):
                rec["variant"] = "not killed in 30 s: moved out and SIGKILLed"
                send(pid, signal.SIGKILL)
            group.remove()

        threading.Thread(target=watch, daemon=True).start()

    def inject(self, kind: str, stage: Stage) -> None:
        pid = stage.trainer_pid()
        if kind in ("trainer_sigkill", "trainer_sigbus", "trainer_hang", "trainer_oom_kill"):
            rec = self.record(kind, stage, attempt=stage.attempt())
            if kind == "trainer_oom_kill":
                self.oom_kill(stage, pid, rec)
            else:
                send(pid, {"trainer_sigkill": signal.SIGKILL, "trainer_sigbus": signal.SIGBUS,
                           "trainer_hang": signal.SIGSTOP}[kind])
        elif kind in ("supervisor_sigkill", "predecessor_sigkill"):
            rec = self.record(kind, stage, waiting=stage.state().get("phase") == "waiting_init")
            stage.sup.send_signal(signal.SIGKILL)
            stage.sup.wait()
            stage.restart_at = time.monotonic() + (self.rng.uniform(0.2, 1.5) if kind == "supervisor_sigkill"
                                                   else self.rng.uniform(1, 10))
        elif kind in ("init_source_unreachable", "probe_unreachable"):
            rel = f"remote-{BEFORE[stage.name]}" if kind == "init_source_unreachable" else PROBE_OF[stage.name]
            rec = self.record(kind, stage, attempt=stage.attempt())
            self.outage(rec, rel)
            send(pid, signal.SIGKILL)
        elif kind in ("remote_eio", "remote_stall"):
            rec = self.record(kind, stage)
            glob = f"remote-{stage.name}*"
            rule = self.fs.stall(glob, 600, op="*") if kind == "remote_stall" else \
                self.fs.add_rule("*", glob, "error", errno=5)
            rec["lifted"] = False
            self.lifts.append((time.monotonic() + self.rng.uniform(2, 10), (rec, lambda r=rule: self.fs.remove(r))))

    def lift_due(self, everything: bool = False) -> None:
        for item in list(self.lifts):
            when, (rec, lift) = item
            if everything or time.monotonic() >= when:
                lift()
                rec["lifted"] = True
                self.lifts.remove(item)

    def watch_exits(self) -> None:
        """slow_exit: a trainer whose heartbeat says `exiting` is SIGSTOPped for longer than restart.hang_timeout."""
        while not self.finished_all:
            for stage in self.stages:
                if not self.injecting or "slow_exit" not in self.kinds:
                    continue
                try:
                    body = (stage.cfg.run_dir / HEARTBEAT).read_text()
                except OSError:
                    continue
                if body.split()[1:] != ["exiting"]:
                    continue
                pid = stage.trainer_pid()
                if pid and pid not in self.slowed and send(pid, signal.SIGSTOP):
                    self.slowed.add(pid)
                    self.record("slow_exit", stage, pid=pid)
                    time.sleep(HANG_TIMEOUT_S + 3)
                    send(pid, signal.SIGCONT)
            time.sleep(0.02)

    def note_planned(self) -> None:
        for stage in self.stages:
            try:
                fired = (stage.cfg.run_dir / FAULTS_FIRED).read_text().split()
            except OSError:
                continue
            for item in fired:
                if (stage.name, item) not in self.planned_seen:
                    self.planned_seen.add((stage.name, item))
                    kind, _, at = item.partition("@")
                    self.record(f"planned_{kind}", stage, step=int(at))  # fired at `at`: a later save recovers

    def update_recoveries(self) -> None:
        now = time.monotonic()
        for stage in self.stages:
            st = stage.state()
            done, step, attempt = st.get("phase") == "done", stage.step(), stage.attempt()
            sup_pid = (st.get("supervisor") or {}).get("pid")
            for f in self.faults:
                if f["stage"] != stage.name or f["recovered_at"] is not None or not f["lifted"]:
                    continue
                if f["kind"] in ("supervisor_sigkill", "predecessor_sigkill"):
                    back = stage.sup is not None and sup_pid == stage.sup.pid and stage.starts > f["sup_start"]
                    ok = done or (back and (f.get("waiting") or step > f["step"]))
                elif f["kind"] == "slow_exit":
                    ok = done
                else:
                    later = f["attempt"] is None or attempt > f["attempt"]
                    ok = done or (later and step > f["step"])
                if ok:
                    f["recovered_at"] = now
                elif now - f["time"] > RECOVERY_TIMEOUT_S and not f.get("late"):
                    f["late"] = True
                    log(f"fault {f['kind']} on {stage.name} at step {f['step']} not recovered after "
                        f"{RECOVERY_TIMEOUT_S:.0f} s")

    def views(self) -> list[StageView]:
        """Every stage's view; one fault at a time over the pipeline (a stage failure then names its cause)."""
        settled = all(f["recovered_at"] is not None for f in self.faults)
        out = []
        for i, stage in enumerate(self.stages):
            st = stage.state()
            nxt = self.stages[i + 1].state().get("phase") if i + 1 < len(self.stages) else None
            out.append(StageView(stage.name, st.get("phase") or "", stage.trainer_pid() is not None,
                                 stage.sup is not None and stage.sup.poll() is None, stage.name in BEFORE,
                                 stage.name in PROBE_OF, nxt == "waiting_init", settled))
        return out

    # --- supervisors ------------------------------------------------------------------------------------------------
    def keep_alive(self) -> None:
        now = time.monotonic()
        for stage in self.stages:
            if stage.ended:
                continue
            if stage.restart_at is not None:
                if now >= stage.restart_at:
                    stage.start(self.plan(stage))
                    log(f"{stage.name}: supervisor #{stage.starts} pid {stage.sup.pid}")
                continue
            rc = stage.sup.poll()
            if rc is None:
                continue
            st = stage.state()
            if rc == 0 and st.get("phase") == "done":
                stage.ended = True
                log(f"{stage.name}: done")
                continue
            if rc in FINAL_EXITS:
                why = str(st.get("last_error") or st.get("reason") or "")[:300]
                # one fault at a time over the pipeline: the last ones before the failure, whatever their stage
                recent = [f"{f['kind']}@{f['stage']}:{f['step']}" for f in self.faults][-3:]
                cascade = "the run this one starts from failed" in why
                self.failures.append({"stage": stage.name, "exit": rc, "phase": st.get("phase"), "why": why,
                                      "after_faults": recent, "cascade": cascade})
                log(f"STAGE FAILURE: {stage.name} exit {rc}: {why} (after {recent})")
                if stage.revives >= MAX_REVIVES:
                    stage.ended = True
                    continue
                stage.revives += 1
                # as an operator would: once the outages in force are over (a revive into one fails again at once)
                stage.restart_at = max([now + 1.0] + [when + 1.0 for when, _ in self.lifts])
                continue
            stage.restart_at = now + 1.0

    def run(self) -> int:
        self.work.mkdir(parents=True, exist_ok=True)
        log(f"pipeline soak in {self.work} for {self.args.minutes} min, seed {self.args.seed}")
        self.setup()
        self.finished_all = False
        with mounted_faultfs(self.backing, self.mnt) as fs:
            self.fs = fs
            started = time.monotonic()
            for group in (self.refs, self.stages):
                for stage in reversed(group):  # the later stages first: they wait for their predecessors
                    stage.start(self.plan(stage) if group is self.stages else "")
            watcher = threading.Thread(target=self.watch_exits, daemon=True)
            watcher.start()
            inject_until = started + self.args.minutes * 60
            give_up = started + self.args.minutes * 60 * 3 + 600
            next_at = started + 5
            try:
                while not all(s.ended for s in self.stages) or any(r.sup.poll() is None for r in self.refs):
                    now = time.monotonic()
                    self.injecting = now < inject_until
                    if now > give_up:
                        log("the pipelines did not finish in time")
                        break
                    self.keep_alive()
                    self.lift_due(everything=not self.injecting)
                    self.note_planned()
                    self.update_recoveries()
                    if self.injecting and now >= next_at:
                        counts = {k: sum(f["kind"] == k for f in self.faults) for k in INJECTED}
                        choice = pick([k for k in self.kinds if k in INJECTED], self.views(), self.rng, counts)
                        if choice is not None:
                            try:
                                self.inject(choice[0], self.stage(choice[1]))
                            except OSError as e:  # it went away under us (ended, re-staged): another moment
                                log(f"could not inject {choice[0]} into {choice[1]} now: {e}")
                        next_at = time.monotonic() + self.rng.uniform(0.5, 3)
                    time.sleep(0.2)
            finally:
                self.finished_all = True
                self.injecting = False
                for stage in self.stages + self.refs:
                    if stage.sup is not None and stage.sup.poll() is None:
                        stage.sup.kill()
                        stage.sup.wait()
                self.lift_due(everything=True)
                fs.clear()
                from minilmd.daemon.child.orphans import terminate_orphans

                for stage in self.stages + self.refs:
                    terminate_orphans(stage.cfg.run_dir, grace=30)
            self.update_recoveries()
            elapsed = time.monotonic() - started
            (self.work / "faults.json").write_text(json.dumps(self.faults, indent=1, default=str))
            checks = {s.name: compare_final(s, r, self.backing / f"remote-{s.name}", self.work / "reference"
                                            / f"remote-{s.name}") for s, r in zip(self.stages, self.refs, strict=True)}
        return report(self, checks, elapsed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall time of the fault phase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a new $TMPDIR/minilmd-pipeline-soak-XXXXXXXX")
    parser.add_argument("--steps", type=int, default=0, help="training steps of the three stages together "
                        "(default: calibrated so that the undisturbed pipeline takes about 60 %% of the fault phase)")
    parser.add_argument("--kinds", default="", help=f"comma-separated subset of {','.join(INJECTED)},slow_exit,"
                        "planned (default: all)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    return PipelineSoak(args).run()


if __name__ == "__main__":
    sys.exit(main())
