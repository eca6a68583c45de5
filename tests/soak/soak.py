"""The soak: a small CPU training under `minilmd run` for a given wall time, with a random mix of faults injected at
random moments, then the checks that matter. Not part of the default test run (pytest does not collect this
directory: see tests/soak/conftest.py). Needs root and /dev/fuse for the flaky-NFS mount.

    python tests/soak/soak.py --minutes 30 [--seed N] [--workdir DIR]

What runs: the real trainer (`minilmd train`, a tiny model on real Chinese text, micro-batch 1 so that an injected
CUDA OOM has nothing to halve and the weights stay comparable bit for bit) under the supervisor, with the corpus
source and the remote on tests/faultfs.py (a FUSE mount that stalls or fails on request), and beside it the same
training run straight through without a supervisor (the reference). The number of steps is calibrated so that the
reference alone would take about 60 % of the wall time (faults and restarts take the rest).

Faults are injected until the wall time is over (the run must outlast it: give --steps generously on a loaded
machine), one at a time, each after the previous one recovered (plus a random pause):
  trainer_sigkill   SIGKILL to the trainer (the OOM killer's way)
  trainer_sigbus    SIGBUS to the trainer (a signal, as the kernel sends it)
  staged_truncate   the staged tokens.bin truncated under the trainer's mmap: a real SIGBUS, then re-staging
  trainer_hang/trainer_exception/trainer_oom
                    MINILMD_FAULT=kind@step planned into each supervisor's environment (hang: heartbeats stop;
                    oom: torch.OutOfMemoryError through the trainer's handler, exit 76)
  supervisor_sigkill
                    SIGKILL to the supervisor, restarted at once (as systemd would), with a new fault plan
  remote_stall / remote_eio / remote_drop_rename
                    every operation on the remote stalls / fails with EIO / renames are acknowledged but not done,
                    for a few seconds
  corrupt_local     the newest local checkpoint's weights damaged, then the trainer SIGKILLed: the resume must
                    quarantine it and use the previous one
  corrupt_remote    the remote's newest checkpoint damaged and scratch's checkpoints lost, then the trainer killed:
                    the fetch must quarantine it and use the previous one
Recovery of a fault: the run's newest local checkpoint is newer than the step at injection (and, for a remote
fault, a sync succeeded again). Checks at the end: the supervisor exited 0 with the run done, the final weights
equal the reference's bit for bit, the remote LATEST never named a checkpoint that does not validate (polled all
along; the soak's own corruptions excepted), never two trainers on the run. Prints a table: faults by kind,
recovered, time to recover (mean/max seconds). Exit status 0 when every check holds.
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
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the helper modules in tests/

from faults_fixtures import mounted_faultfs
from minilmd import checkpoint, checkpoint_dirs
from minilmd.config import load_config
from reliability_helpers import RemoteWatcher, TrainerCounter, expectation_for
from supervisor_helpers import env_for, state
from trainer_corpus import ONE_LAYER_MODEL, real_text_prepared, write_config

KINDS = ["trainer_sigkill", "trainer_sigbus", "staged_truncate", "supervisor_sigkill", "remote_stall", "remote_eio",
         "remote_drop_rename", "corrupt_local", "corrupt_remote"]
PLANNED = {"hang": "trainer_hang", "exception": "trainer_exception", "oom": "trainer_oom"}
RECOVERY_TIMEOUT_S = 180.0


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def send(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.kinds = args.kinds.split(",") if args.kinds else KINDS
        # without --workdir a new private directory (mkdtemp: 0700, never a name another user made first)
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="minilmd-soak-")).resolve()
        self.faults: list[dict] = []  # {kind, time, step, recovered_at}
        self.corrupted: set[str] = set()
        self.sup: subprocess.Popen | None = None
        self.sup_count = 0
        self.planned_seen: set[str] = set()
        self.lift = None  # (faultfs rule, when to lift it, its fault record) of the remote fault in force

    # --- set-up --------------------------------------------------------------------------------------------------
    def config(self, name: str, steps: int, remote: Path | None, source: Path, vocab: int) -> Path:
        body = {
            "data": {"val_windows": 2},
            "model": dict(ONE_LAYER_MODEL),
            "train": {"seq_len": 32, "micro_batch_size": 1, "grad_accum": 4, "max_steps": steps,
                      "checkpoint_every": 20, "keep_local": 2, "log_every": 5, "eval_every": 0},
            "sync": {"every": "3s", "keep": 3},
            "restart": {"backoff_initial": "0.2s", "backoff_max": "1s", "hang_timeout": "5s",
                        "max_restarts": 100000, "no_progress_limit": 10},
        }
        if remote is not None:
            body["run"] = {"remote": str(remote)}
        return write_config(self.work, (source, vocab), name, **body)

    def calibrate(self, source: Path, vocab: int) -> int:
        """Steps such that an undisturbed run takes about a half of the wall time."""
        cfg_path = self.config("calibrate", 60, None, source, vocab)
        load_config(cfg_path).run_dir.mkdir(parents=True, exist_ok=True)
        out = subprocess.run([sys.executable, "-m", "minilmd.cli", "train", str(cfg_path)], capture_output=True,
                             text=True, env=env_for(fake=False), timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"calibration run failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
        times = [json.loads(line)["step_time"] for line in (load_config(cfg_path).run_dir / "metrics.jsonl")
                 .read_text().splitlines() if '"kind": "train"' in line]
        per_step = sorted(times)[len(times) // 2] * 1.3  # saves and evals on top of the median step
        steps = int(self.args.minutes * 60 * 0.6 / per_step)
        log(f"calibration: {per_step * 1000:.0f} ms per step: {steps} steps for the soak")
        return max(200, steps // 20 * 20)

    # --- the supervisor ----------------------------------------------------------------------------------------------
    def start_supervisor(self) -> None:
        step = self.local_step()
        plan = []
        for _ in range(3):
            kind = self.rng.choice(list(PLANNED))
            plan.append(f"{kind}@{step + self.rng.randint(25, 400)}")
        env = env_for(fake=False, MINILMD_FAULT=",".join(plan))
        self.sup_count += 1
        out = open(self.work / "supervisor.out", "ab")
        self.sup = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", str(self.cfg_path)],
                                    stdout=out, stderr=subprocess.STDOUT, env=env)
        log(f"supervisor #{self.sup_count} pid {self.sup.pid}, fault plan {plan}")

    def local_step(self) -> int:
        steps = [checkpoint.step_of(p) for p in checkpoint_dirs.list_checkpoints(self.cfg.checkpoint_dir)]
        return max(steps, default=0)

    def child_pid(self) -> int | None:
        child = state(self.cfg.run_dir).get("child") or {}
        return child.get("pid")

    def phase(self) -> str:
        return state(self.cfg.run_dir).get("phase", "")

    # --- faults ---------------------------------------------------------------------------------------------------
    def inject(self, kind: str) -> bool:
        """Inject one fault; False when the moment does not allow it (no trainer running, say)."""
        pid = self.child_pid()
        training = self.phase() == "training" and pid
        if kind in ("trainer_sigkill", "trainer_sigbus", "staged_truncate", "corrupt_local", "corrupt_remote") \
                and not training:
            return False
        step = self.local_step()
        if step >= self.steps - 40:  # the run is about to end: no newer checkpoint would ever show recovery
            return False
        record = {"kind": kind, "time": time.monotonic(), "step": step, "recovered_at": None}
        if kind in ("trainer_sigkill", "trainer_sigbus"):
            if not send(pid, signal.SIGKILL if kind == "trainer_sigkill" else signal.SIGBUS):
                return False  # it ended just now

        elif kind == "staged_truncate":
            tokens = self.cfg.scratch_dir / "corpus" / "train" / "tokens.bin"
            os.truncate(tokens, tokens.stat().st_size // 4)
        elif kind == "supervisor_sigkill":
            self.sup.send_signal(signal.SIGKILL)
            self.sup.wait()
            time.sleep(self.rng.uniform(0.2, 1.5))  # systemd's RestartSec
            self.start_supervisor()
        elif kind in ("remote_stall", "remote_eio", "remote_drop_rename"):
            if kind == "remote_stall":
                rule = self.fs.stall("remote*", 600, op="*")
            elif kind == "remote_eio":
                rule = self.fs.add_rule("*", "remote*", "error", errno=5)
            else:
                rule = self.fs.drop_rename("remote/*")
            # lifted by the main loop (lift_due) after a few seconds; recovery needs a good sync after the lift
            self.lift = (rule, time.monotonic() + self.rng.uniform(2, 12), record)
            record["needs_sync_after"] = float("inf")
        elif kind == "corrupt_local":
            newest = checkpoint_dirs.list_checkpoints(self.cfg.checkpoint_dir)
            if not newest:
                return False
            damage(newest[-1] / "model.safetensors")
            send(pid, signal.SIGKILL)  # if it ended just now, its next resume meets the damage all the same
            record["step"] = checkpoint.step_of(newest[-1])
        elif kind == "corrupt_remote":
            remote_steps = checkpoint_dirs.list_checkpoints(self.remote)
            if len(remote_steps) < 2:
                return False
            newest = remote_steps[-1]
            self.corrupted.add(newest.name)
            damage(newest / "model.safetensors")
            send(pid, signal.SIGKILL)
            for p in checkpoint_dirs.list_checkpoints(self.cfg.checkpoint_dir):
                shutil.rmtree(p, ignore_errors=True)  # a new machine: scratch holds nothing
        self.faults.append(record)
        log(f"fault {len(self.faults)}: {kind} at step {step}")
        return True

    def lift_due(self) -> None:
        if self.lift is not None and time.monotonic() >= self.lift[1]:
            rule, _, record = self.lift
            self.fs.remove(rule)
            record["needs_sync_after"] = time.time()
            self.lift = None

    def note_planned(self) -> None:
        """Faults the trainer fired from its MINILMD_FAULT plan (recorded in <run dir>/faults-fired)."""
        fired = self.cfg.run_dir / "faults-fired"
        if not fired.exists():
            return
        fired_at = time.monotonic() - max(0.0, time.time() - fired.stat().st_mtime)  # polled late: the file knows
        for item in fired.read_text().split():
            if item not in self.planned_seen:
                self.planned_seen.add(item)
                kind, _, at = item.partition("@")
                self.faults.append({"kind": PLANNED[kind], "time": fired_at, "step": int(at) - 1,
                                    "recovered_at": None})
                log(f"fault {len(self.faults)}: {PLANNED[kind]} fired at step {at}")

    def update_recoveries(self) -> None:
        local = self.local_step()
        sync = state(self.cfg.run_dir).get("sync") or {}
        for f in self.faults:
            if f["recovered_at"] is not None:
                continue
            ok = local > f["step"]
            if "needs_sync_after" in f:
                ok = ok and sync.get("state") == "ok" and (sync.get("last_ok") or 0) > f["needs_sync_after"]
            if ok:
                f["recovered_at"] = time.monotonic()

    def all_recovered(self) -> bool:
        return all(f["recovered_at"] is not None for f in self.faults)

    def keep_supervisor_alive(self) -> None:
        """Restart a supervisor that exited on its own (as systemd would, unless it finished or gave up)."""
        if self.sup is not None and self.sup.poll() is not None and self.sup.returncode not in (0, 2, 65, 79):
            log(f"supervisor exited {self.sup.returncode}: restarting it")
            self.start_supervisor()

    # --- main ------------------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.work.mkdir(parents=True, exist_ok=True)
        log(f"soak in {self.work} for {self.args.minutes} min, seed {self.args.seed}")
        source, vocab = real_text_prepared(self.work / "corpus", n_docs=1500, vocab_size=512)
        steps = self.steps = self.args.steps or self.calibrate(source, vocab)
        backing, mnt = self.work / "nfs-backing", self.work / "nfs"
        backing.mkdir(exist_ok=True)
        mnt.mkdir(exist_ok=True)
        shutil.copytree(source, backing / "corpus", dirs_exist_ok=True)
        with mounted_faultfs(backing, mnt) as fs:
            self.fs = fs
            self.remote = backing / "remote"
            self.cfg_path = self.config("soak", steps, mnt / "remote", mnt / "corpus", vocab)
            self.cfg = load_config(self.cfg_path)
            ref_path = self.config("reference", steps, None, source, vocab)
            load_config(ref_path).run_dir.mkdir(parents=True, exist_ok=True)
            reference = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "train", str(ref_path)],
                                         stdout=open(self.work / "reference.out", "ab"), stderr=subprocess.STDOUT,
                                         env=env_for(fake=False))
            watcher = RemoteWatcher(self.remote, expectation_for(self.cfg_path), interval=0.2)
            watcher.start()
            counter = TrainerCounter(self.cfg.run_dir, interval=0.2)
            counter.start()
            started = time.monotonic()
            inject_until = started + self.args.minutes * 60
            self.start_supervisor()
            next_at = time.monotonic() + 10
            try:
                while self.sup.poll() is None or self.sup.returncode not in (0, 2, 65, 79):
                    self.keep_supervisor_alive()
                    self.lift_due()
                    self.note_planned()
                    self.update_recoveries()
                    now = time.monotonic()
                    if now - started > self.args.minutes * 60 * 2:
                        log("the run did not finish in twice the wall time")
                        break
                    if now >= next_at and now < inject_until and self.all_recovered() and self.lift is None:
                        kind = self.rng.choice(self.kinds)
                        try:
                            injected = self.inject(kind)
                        except OSError as e:  # the file went away under us (pruned, re-staged): another moment
                            log(f"could not inject {kind} now: {e}")
                            injected = False
                        if injected:
                            next_at = time.monotonic() + self.rng.uniform(0.5, 4)
                        else:
                            next_at = time.monotonic() + 0.5
                    for f in self.faults:
                        if f["recovered_at"] is None and now - f["time"] > RECOVERY_TIMEOUT_S and not f.get("late"):
                            f["late"] = True
                            log(f"fault {f['kind']} at step {f['step']} not recovered after {RECOVERY_TIMEOUT_S}s")
                    time.sleep(0.2)
            finally:
                if self.sup.poll() is None:
                    self.sup.kill()
                    self.sup.wait()
                fs.clear()
                self.lift = None
                from minilmd.daemon.child.orphans import terminate_orphans

                terminate_orphans(self.cfg.run_dir, grace=30)
                if reference.poll() is None and sys.exc_info()[0] is not None:
                    reference.kill()
            reference.wait()
            self.update_recoveries()
            self.note_planned()
            violations = [v for v in watcher.stop() if not any(name in v for name in self.corrupted)]
            two_trainers = counter.stop()
            elapsed = time.monotonic() - started
        return self.report(steps, ref_path, reference.returncode, violations, two_trainers, elapsed)

    def report(self, steps: int, ref_path: Path, ref_rc: int, violations: list[str], two_trainers: list[str],
               elapsed: float) -> int:
        final = f"step-{steps:08d}"
        st = state(self.cfg.run_dir)
        problems = []
        if self.sup.returncode != 0 or st.get("phase") != "done":
            problems.append(f"the run did not finish: supervisor exit {self.sup.returncode}, phase {st.get('phase')}: "
                            f"{st.get('reason')}")
        if ref_rc != 0:
            problems.append(f"the reference run failed with exit {ref_rc}")
        try:
            got = json.loads((self.remote / final / "manifest.json").read_text())["files"]["model.safetensors"]
            ref_dir = load_config(ref_path).checkpoint_dir / final
            want = json.loads((ref_dir / "manifest.json").read_text())["files"]["model.safetensors"]
            if got["sha256"] != want["sha256"]:
                problems.append(f"final weights differ from the undisturbed run's: {got['sha256'][:16]} vs "
                                f"{want['sha256'][:16]}")
        except (OSError, KeyError, ValueError) as e:
            problems.append(f"cannot compare the final weights: {e}")
        if checkpoint_dirs.read_latest(self.remote) != final:
            problems.append(f"remote LATEST is {checkpoint_dirs.read_latest(self.remote)}, not {final}")
        problems += violations[:5] + two_trainers[:5]
        unrecovered = [f for f in self.faults if f["recovered_at"] is None]
        if unrecovered:
            problems.append(f"{len(unrecovered)} fault(s) never recovered: "
                            f"{[(f['kind'], f['step']) for f in unrecovered][:10]}")

        by_kind = defaultdict(list)
        for f in self.faults:
            by_kind[f["kind"]].append(f)
        lines = [f"soak: {elapsed / 60:.1f} min, {steps} steps, {len(self.faults)} faults, "
                 f"{self.sup_count} supervisor starts, seed {self.args.seed}, work dir {self.work}",
                 f"{'fault':<20} {'injected':>8} {'recovered':>9} {'mean s':>7} {'max s':>7}"]
        for kind in sorted(by_kind):
            fs = by_kind[kind]
            times = [f["recovered_at"] - f["time"] for f in fs if f["recovered_at"] is not None]
            mean = f"{sum(times) / len(times):7.1f}" if times else "      -"
            worst = f"{max(times):7.1f}" if times else "      -"
            lines.append(f"{kind:<20} {len(fs):>8} {len(times):>9} {mean} {worst}")
        total = [f["recovered_at"] - f["time"] for f in self.faults if f["recovered_at"] is not None]
        lines.append(f"{'total':<20} {len(self.faults):>8} {len(total):>9} "
                     f"{(sum(total) / len(total) if total else 0):7.1f} {max(total, default=0):7.1f}")
        lines.append("time to recover = from the fault until a checkpoint newer than the step at the fault exists "
                     "(remote faults: and a sync succeeded after the fault was lifted)")
        lines.append(f"restarts recorded by the supervisor: {len(st.get('restarts') or [])}; remote LATEST checks: "
                     f"{len(violations)} violations; two trainers at once: {len(two_trainers)}")
        lines.append("RESULT: " + ("PASS, final weights identical to the undisturbed run" if not problems
                                   else "FAIL\n  " + "\n  ".join(problems)))
        print("\n".join(lines), flush=True)
        return 0 if not problems else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall time of the soak")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a new $TMPDIR/minilmd-soak-XXXXXXXX")
    parser.add_argument("--steps", type=int, default=0,
                        help="training steps (default: calibrated so that an undisturbed run takes about half the "
                             "wall time; on a loaded machine the calibration is short, so give it here)")
    parser.add_argument("--kinds", default="", help=f"comma-separated subset of {','.join(KINDS)} (default: all)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
