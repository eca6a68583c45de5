"""What the trainer tells the outside world: metrics.jsonl lines, the heartbeat, throughput (MFU: mfu.py).

metrics.jsonl gets one JSON object per line, each with a "kind":
  {"kind": "train", "step", "tokens_seen", "loss", "lr", "grad_norm", "tok_s", "step_time", "eval_s",
  "checkpoint_s", "compile_s", "total_steps", "time"} (+ "mfu" and "peak_mem_gib" on CUDA),
  {"kind": "eval", "step", "val_loss", "time"},
  {"kind": "checkpoint", "step", "blocking_s", "path", "time"}.
A DPO run's train lines also carry REWARDS' keys, its eval lines the same with "val_" before each.
"step" is the number of optimizer steps completed. The heartbeat file's body is that number too, with "/TOTAL", the
steps the trainer counts for its budget (its train lines' total_steps), once it knows them (never in the "exiting"
beat: a supervisor of a version before the total, still running after an upgrade, reads a step only from a plain
number, and the step of that beat is what tells it the trainer finished; docs/operations.md, upgrades), followed by
" compiling" while the first torch.compile'd step runs (the supervisor then allows restart.compile_timeout instead
of restart.hang_timeout) and by " exiting" once training is over and the final checkpoint is saved, before the
teardown (restart.exit_timeout then; a trainer that ends in any way after it has finished), and by " reference
DONE/TOTAL/FROM/SECONDS" while a DPO run's reference pass runs (pairs done of all, done when this attempt's pass
began, its seconds since; `minilmd status` shows it, with its rate and ETA). It is rewritten (temp
file + rename, no fsync: it is a liveness signal, not data) after a step at most once a second, and always at a
save, an evaluation, a phase change and the exit.
"tok_s" (real tokens per second), "step_time" and so "mfu" cover the training time of the interval since the
previous train line only: the seconds spent since then in evaluations ("eval_s"), checkpoint saves ("checkpoint_s":
the loop's whole stall, as blocking_s) and the first torch.compile'd step of the process ("compile_s": compile plus
that one step, whose tokens are left out too; bucketed, also the warm-up at the widest width before it and each step
with a new width) are measured and reported apart (`Throughput`). A line whose interval
holds nothing but the compile step reports that step's figures, compile included (its compile_s says how much of
step_time that is).
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from minilmd.fsio import atomic_write_text, dir_removed, is_disk_full
from minilmd.jsonlines import NotALog, append_line, end_torn_line
from minilmd.names import HEARTBEAT, HEARTBEAT_EXITING, METRICS
from minilmd.supervision import supervision

HEARTBEAT_INTERVAL_S = 1.0
"""The heartbeat is rewritten at most this often between forced beats: a step of a few milliseconds must not cost
a file write each (a supervisor's hang_timeout is minutes). The trainer uses less under a short hang_timeout
(heartbeat_interval)."""


REWARDS = {"reward_accuracy": "rewards/accuracies", "reward_margin": "rewards/margins",
           "reward_chosen": "rewards/chosen", "reward_rejected": "rewards/rejected"}
"""A DPO run's metrics (trainer/loop/objective_dpo.py): metrics.jsonl's key -> the name TRL reports it by, which
TensorBoard's tags, the Prometheus gauges and `plot` use. reward_chosen and reward_rejected: the mean implicit reward
beta * (log pi - log ref) of the chosen and the rejected replies; reward_margin: the mean of chosen minus rejected;
reward_accuracy: the share of pairs whose chosen reward is above its rejected one."""


def number(value) -> float | None:
    """A metric's value read from a line of metrics.jsonl (another process's file): the float of an int or float,
    None for anything else (a bool, a string, a list: JSON's true is not 1)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def heartbeat_interval(hang_timeout_s: float) -> float:
    """About once a second, and at least ten times per hang_timeout: the throttle never brings a healthy trainer
    near the supervisor's limit (tests run with hang_timeout = 2 s)."""
    return min(HEARTBEAT_INTERVAL_S, hang_timeout_s / 10)


class RunDirFileRefused(ValueError):
    """A file the trainer writes in run.dir is not one it may write (a link, a FIFO at metrics.jsonl): final, the
    trainer's refusal (trainer/loop/exits.py: exit 2, its words in fault.json)."""


class RunDirGone(Exception):
    """run.dir is not there at the trainer's start (removed after its supervisor, or main(), made it): the trainer
    never makes it again (its run's other files, state.json, the config copy, would be missing from the new one) and
    exits 73 as for a run.dir it cannot write (trainer/loop/exits.py), saying so in one line."""


class RunDirWrites:
    """The trainer's writes into run.dir (metrics.jsonl, the heartbeat, its log: trainer/loop/guards.py) on a full
    file system, or into a run.dir removed while it trains (`run_dir`, set by MetricsLog: the one it writes; the
    same rule as the supervisor's, fsio.dir_removed): each one that fails so is dropped and counted, never raised (a
    traceback there ended the trainer without a save, losing the steps since the last one). `full` says why from the
    first such failure on (`removed` when run.dir is gone): the loop then stops at the next step boundary, saves to
    scratch and exits 73 (protocol.EXIT_RUN_DIR_FULL), rather than train on blind: with no heartbeat the supervisor
    cannot tell it from a hung one, and the run's curve and log would have a hole the length of the outage."""

    def __init__(self):
        self.full: str | None = None
        self.removed = False
        self.dropped = 0
        self.run_dir: Path | None = None

    def failed(self, e: OSError, what: str) -> None:
        """A write of `what` raised `e`: dropped and counted when the disk is full or run.dir is gone, raised again
        otherwise."""
        gone = self.run_dir is not None and dir_removed(e, self.run_dir)
        if not (is_disk_full(e) or gone):
            raise e
        self.dropped += 1
        if self.full is None:
            self.removed = gone
            self.full = f"{what}: {e.strerror}" if gone else f"no room to write {what}: {e.strerror}"

    def why(self) -> str:
        """Why the trainer stops for its run.dir (once `full` is set): full, or removed."""
        if self.removed:
            return f"run.dir {self.run_dir} was removed while the trainer ran ({self.full})"
        return f"run.dir is full ({self.full})"


class MetricsLog:
    """Appends lines to <run dir>/metrics.jsonl and refreshes <run dir>/heartbeat. Inactive on ranks != 0. A write
    that finds run.dir full, or gone, is dropped and counted in `writes` (RunDirWrites), never raised; one missing at
    the start under a supervisor is RunDirGone (`_need_run_dir`)."""

    def __init__(self, run_dir: str | os.PathLike, active: bool = True,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL_S, writes: RunDirWrites | None = None):
        self.run_dir = Path(run_dir)
        self.active = active
        self.heartbeat_interval = heartbeat_interval
        self.writes = writes or RunDirWrites()
        self._last_beat: tuple[float, str] | None = None  # (monotonic time, phase) of the last heartbeat written
        self.total_steps: int | None = None
        """The steps the trainer counts, set once it knows them (after a resume: a budget in tokens or epochs counts
        after what the checkpoint trained); every heartbeat then says it beside the step, so that the supervisor
        shows a restarted trainer's total before its first train line."""
        if active:
            self._need_run_dir()
            self.writes.run_dir = self.writes.run_dir or self.run_dir
            self._end_torn_line()

    def _need_run_dir(self) -> None:
        """Under a supervisor (minilmd/supervision.py) run.dir was made before the launch: one missing now was removed
        since, and is RunDirGone, never made again (a new one would lack the run's state.json and config copy).
        Elsewhere (`minilmd train` on its own, whose main() has just made it: place_rule.settle_run_dir; a Trainer
        built in a test) it is made."""
        if self.run_dir.is_dir():
            return
        if supervision() is not None:
            raise RunDirGone(f"run.dir {self.run_dir} is not there (removed since the supervisor made it?): the "
                             f"trainer does not make it again")
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def _end_torn_line(self) -> None:
        """Every attempt appends (a resume never truncates the curve); one killed mid-line must not glue this
        attempt's first line to its torn last one. A metrics.jsonl that is not a regular file (a link, a FIFO: only
        the run's user can put one in run.dir) is a refusal at the start (RunDirFileRefused, final: exit 2), never
        written through, never waited on."""
        try:
            end_torn_line(self.run_dir / METRICS)
        except NotALog as e:
            raise RunDirFileRefused(f"{self.run_dir / METRICS} is {e.strerror}: the trainer appends the run's metrics "
                                    f"there; remove it") from None
        except OSError as e:
            self.writes.failed(e, METRICS)

    def write(self, kind: str, **fields) -> None:
        if not self.active:
            return
        line = json.dumps({"kind": kind, **fields, "time": round(time.time(), 3)})
        try:  # whole or not at all (minilmd/jsonlines.py): a line cut by a full disk is not left to glue to the next
            append_line(self.run_dir / METRICS, (line + "\n").encode())
        except OSError as e:
            self.writes.failed(e, METRICS)

    def heartbeat(self, step: int, phase: str = "", force: bool = False, note: str = "") -> bool:
        """Refresh the heartbeat file with `step` (and `phase`: "", "compiling", "reference" or "exiting",
        names.HEARTBEAT_*, with its `note`, one word: the reference pass's "DONE/TOTAL"): when forced, when the
        phase changed, or when the last one is heartbeat_interval seconds old. Returns whether it was written."""
        if not self.active:
            return False
        now = time.monotonic()
        last = self._last_beat
        if not force and last is not None and phase == last[1] and now - last[0] < self.heartbeat_interval:
            return False
        # a temp name no one can guess (a link planted at a predictable one was written through), no fsync: the
        # next beat comes in seconds
        # the exiting beat's step stays a plain number: a supervisor from before "/TOTAL" (one still running after
        # an upgrade restarted its trainer) reads "20/20" as no step, so a trainer killed in a slow teardown was not
        # the run's finish but a restart, again at every attempt, until the run failed (no_progress_limit)
        total = self.total_steps if phase != HEARTBEAT_EXITING else None
        stepped = f"{step}/{total}" if total is not None else str(step)
        body = " ".join(str(w) for w in (stepped, phase, note) if w != "") + "\n"
        try:
            atomic_write_text(self.run_dir / HEARTBEAT, body, durable=False)
        except OSError as e:
            self.writes.failed(e, HEARTBEAT)
            return False
        self._last_beat = (now, phase)
        return True


APART = ("eval_s", "checkpoint_s", "compile_s")
"""What the train line reports apart from the training time (seconds in the interval)."""


class Throughput:
    """Real tokens per second and step time over the training time of the interval since the last report: what
    ran inside `apart(kind)` (an evaluation, a save, the compiling step) is timed on its own and left out."""

    def __init__(self, clock=time.perf_counter, sync=None):
        self.clock = clock
        self.sync = sync
        """torch.cuda.synchronize on CUDA: the steps queued before a block apart are training, not the block's
        (steps never sync; an evaluation's first float() would wait for them), and the block's own kernels are
        its own. Called twice per block apart: a few per run."""
        self.reset()

    def reset(self) -> None:
        self.t0 = self.clock()
        self.tokens = 0
        self.steps = 0
        self.apart_s = dict.fromkeys(APART, 0.0)
        self.untimed_tokens = 0
        self.untimed_steps = 0

    @contextmanager
    def apart(self, kind: str | None):
        """Time the block as `kind` (one of APART), not as training; None: an ordinary block."""
        if kind is None:
            yield
            return
        if self.sync:
            self.sync()
        t0 = self.clock()
        try:
            yield
        finally:
            if self.sync:
                self.sync()
            self.apart_s[kind] += self.clock() - t0

    def add(self, real_tokens: int, timed: bool = True) -> None:
        """One optimizer step; `timed` False for the compiling step (its tokens left out with its time)."""
        if timed:
            self.tokens += real_tokens
            self.steps += 1
        else:
            self.untimed_tokens += real_tokens
            self.untimed_steps += 1

    def report(self) -> tuple[float, float, dict[str, float]]:
        """(tokens/s, seconds per step, {eval_s, checkpoint_s, compile_s}) since the last reset, then reset."""
        wall = self.clock() - self.t0
        apart = {k: round(v, 4) for k, v in self.apart_s.items()}
        if self.steps:
            dt = max(wall - sum(self.apart_s.values()), 1e-9)
            tok_s, step_time = self.tokens / dt, dt / self.steps
        else:  # only the compiling step: its own figures, compile included (compile_s says how much)
            dt = max(wall - self.apart_s["eval_s"] - self.apart_s["checkpoint_s"], 1e-9)
            tok_s, step_time = self.untimed_tokens / dt, dt / max(self.untimed_steps, 1)
        self.reset()
        return tok_s, step_time, apart
