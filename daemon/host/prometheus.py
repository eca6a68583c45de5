"""`[log] prometheus_textfile = PATH`: the supervisor's view as `minilmd_*` gauges for node_exporter's textfile
collector (`--collector.textfile.directory`), rewritten atomically (temp file + rename: the collector never reads
half a file) at most every WRITE_EVERY_S seconds, at every phase change and at exit. Every sample carries the
label run="<run.name>": one file per run, many runs in one directory. A DPO run adds its rewards under TRL's names
(minilmd_rewards_accuracies, _margins, _chosen, _rejected), by split.

`render(state, t, gpu_waited_s)` is a pure function of state.json; `Textfile` is the supervisor's writer. Ages are
given twice: as a timestamp (`*_timestamp_seconds`, right even when the supervisor is gone and the file went stale:
alert on `time() - ...`) and as an age at the time of writing (`*_age_seconds`, for dashboards). Torch-free.
"""
from __future__ import annotations

import os
import stat
import time
from collections import Counter
from pathlib import Path

from minilmd.daemon.base.statesections import StateJson, TextfileState
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.metrics import REWARDS, number
from minilmd.path_checks import open_textfile_dir, textfile_dir_problem
from minilmd.perms import owned_by_me, user_words
from minilmd.run_states import INTERRUPTED, SYNC_TROUBLE, Phase, SyncState, shown_state

WRITE_EVERY_S = 5.0
TEXTFILE_MODE = 0o644
"""node_exporter runs as its own user: it must be able to read the file (it holds no secrets: numbers and the
run's name)."""

EARLIER = "earlier"
"""minilmd_restarts's cause for the run's restarts before the start after its last end (state.json keeps their count,
`earlier_restarts`, not their causes)."""
GAUGES: dict[str, str] = {
    "minilmd_up": "1 while the run's supervisor runs (0 in the file it writes at exit)",
    "minilmd_phase": "1 for the supervisor's current phase, 0 for the others (label phase)",
    "minilmd_step": "optimizer steps completed",
    "minilmd_total_steps": "steps of the budget",
    "minilmd_tokens_seen": "tokens trained on",
    "minilmd_loss": "latest training loss",
    "minilmd_val_loss": "latest validation loss",
    "minilmd_tokens_per_second": "real (non-PAD) tokens per second over the last logged interval",
    "minilmd_progress_timestamp_seconds": "when the trainer last logged a training step (Unix time)",
    "minilmd_heartbeat_timestamp_seconds": "the trainer's last heartbeat (Unix time)",
    "minilmd_restarts": "restarts of the trainer since the run began, by cause (label cause; \"earlier\": those before "
                        "the start after the run last ended, done, stopped or failed, whose causes are not kept; "
                        "\"all\": every one, as minilmd status says)",
    "minilmd_last_sync_timestamp_seconds": "when a sync to run.remote last succeeded, or when the supervisor started "
                                           "while none has (Unix time)",
    "minilmd_last_sync_age_seconds": "seconds since a sync last succeeded, when the file was written",
    "minilmd_sync_failing": "1 while the sync is failing, stalled, the remote unavailable, or none of its "
                            "checkpoints verifies; in the file written at exit, also for a sync cut by the exit",
    "minilmd_local_checkpoint_timestamp_seconds": "when the newest local checkpoint was saved (Unix time)",
    "minilmd_local_checkpoint_age_seconds": "age of the newest local checkpoint when the file was written",
    "minilmd_remote_checkpoint_timestamp_seconds": "when the newest remote checkpoint was synced (Unix time)",
    "minilmd_remote_checkpoint_age_seconds": "age of the newest remote checkpoint when the file was written",
    "minilmd_gpu_waited_seconds": "seconds this supervisor has spent waiting for free GPUs",
    "minilmd_predecessor_up": "while waiting for init.from: 1 while the run it starts from has a running supervisor, "
                              "0 while it has not (label predecessor)",
    "minilmd_predecessor_down_timestamp_seconds": "while waiting for init.from on a predecessor that is not "
                                                  "running: since when (its state.json's last write, Unix time)",
    "minilmd_textfile_timestamp_seconds": "when this file was written (Unix time)",
}
REWARD_MEANINGS = {
    "reward_accuracy": "the share of pairs whose chosen reply's implicit reward is above the rejected one's",
    "reward_margin": "the mean of the chosen reply's implicit reward minus the rejected one's",
    "reward_chosen": "the mean implicit reward beta * (log pi - log ref) of the chosen replies",
    "reward_rejected": "the mean implicit reward beta * (log pi - log ref) of the rejected replies",
}
REWARD_GAUGES = {f"minilmd_{trl.replace('/', '_')}": key for key, trl in REWARDS.items()}
"""A DPO run's rewards as TRL names them (rewards/accuracies -> minilmd_rewards_accuracies, ...): gauge -> the
metrics.jsonl key, with label split="train" (the latest logged step) or "val" (the latest validation)."""
GAUGES.update({name: f"DPO: {REWARD_MEANINGS[key]} (TRL's {REWARDS[key]}), latest, by split (label split: train "
                     f"or val)" for name, key in REWARD_GAUGES.items()})
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(run: str, **extra: str) -> str:
    pairs = {"run": run, **extra}
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in pairs.items()) + "}"


def render(state: dict, t: float, gpu_waited_s: float = 0.0, up: bool = True) -> str:
    """The textfile for one run's state.json at time t: HELP and TYPE for every gauge, samples for what is known
    (a value not known yet, such as the loss before the first logged step, has no sample)."""
    run = str(state.get("run") or "?")
    progress = state.get("progress") or {}
    sync = state.get("sync") or {}
    local, remote = state.get("local_checkpoint") or {}, state.get("remote_checkpoint") or {}
    samples: dict[str, list[tuple[str, float]]] = {name: [] for name in GAUGES}

    def put(name: str, value, **labels: str) -> None:
        read = number(value)
        if read is not None:
            samples[name].append((_labels(run, **labels), read))

    put("minilmd_up", 1 if up else 0)
    for phase in Phase:
        put("minilmd_phase", 1 if state.get("phase") == phase.value else 0, phase=phase.value)
    put("minilmd_step", progress.get("step"))
    put("minilmd_total_steps", progress.get("total_steps"))
    put("minilmd_tokens_seen", progress.get("tokens_seen"))
    put("minilmd_loss", progress.get("loss"))
    put("minilmd_val_loss", progress.get("val_loss"))
    put("minilmd_tokens_per_second", progress.get("tok_s"))
    rewards = progress.get("rewards")
    rewards = rewards if isinstance(rewards, dict) else {}
    for name, key in REWARD_GAUGES.items():
        put(name, rewards.get(key), split="train")
        put(name, rewards.get(f"val_{key}"), split="val")
    put("minilmd_progress_timestamp_seconds", progress.get("updated"))
    put("minilmd_heartbeat_timestamp_seconds", progress.get("heartbeat"))
    restarts = StateJson.from_dict({key: state.get(key) for key in ("restarts", "earlier_restarts")})
    causes = Counter(r.cause or "unknown" for r in restarts.restarts)
    if restarts.earlier_restarts:  # before the start after the run's last end: their causes are not kept
        causes[EARLIER] = restarts.earlier_restarts
    put("minilmd_restarts", restarts.run_restarts, cause="all")  # the run's, as status says it
    for cause, n in sorted(causes.items()):
        put("minilmd_restarts", n, cause=cause)
    if sync.get("state") != SyncState.OFF:
        started = number((state.get("supervisor") or {}).get("started"))
        last_ok = number(sync.get("last_ok")) or number(remote.get("time")) or started
        put("minilmd_last_sync_timestamp_seconds", last_ok)
        put("minilmd_last_sync_age_seconds", t - last_ok if last_ok else None)
        shown = shown_state(str(sync.get("state")), up)  # the file written at exit: a sync going on is cut
        put("minilmd_sync_failing", 1 if shown in (*SYNC_TROUBLE, INTERRUPTED) else 0)
    for name, ckpt in (("local", local), ("remote", remote)):
        when = number(ckpt.get("time"))
        put(f"minilmd_{name}_checkpoint_timestamp_seconds", when)
        put(f"minilmd_{name}_checkpoint_age_seconds", t - when if when else None)
    put("minilmd_gpu_waited_seconds", round(gpu_waited_s, 3))
    wait = state.get("init_wait")
    if (state.get("phase") == Phase.WAITING_INIT.value and isinstance(wait, dict)
            and isinstance(wait.get("running"), bool)):
        pred = str(wait.get("run") or "?")
        put("minilmd_predecessor_up", 1 if wait["running"] else 0, predecessor=pred)
        if not wait["running"]:
            put("minilmd_predecessor_down_timestamp_seconds", wait.get("not_running_since"), predecessor=pred)
    put("minilmd_textfile_timestamp_seconds", round(t, 3))
    lines = []
    for name, help_text in GAUGES.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f"{name}{labels} {value:.17g}" for labels, value in samples[name]]
    return "\n".join(lines) + "\n"


class Textfile:
    """The supervisor's writer: `tick(phase)` every loop turn, `close(phase)` at exit. A failed write (a full or
    missing directory) is said once through `emit` and tried again at the next turn; it never stops the run.

    The textfile directory may be one other users write too, so a file at the path that is not this run's user's
    (another user's, or a symlink or anything but a regular file: someone squatted the name) is never written
    through or replaced: its gauges are not this run's, and would stay there for ever. That, like a failed write,
    is kept in state.json's "prometheus" ({path, problem, since}; problem None while the file is written) for
    `minilmd status` and the run's final state, and said once as an event. So is a directory another user owns,
    can rearrange or can write, sticky or not (minilmd/path_checks.py textfile_dir_problem; `run --check` refuses it
    too): he could replace the run's gauges after it ends, or make their name first. The file is written through the
    directory's descriptor, opened by that rule's walk."""

    def __init__(self, path: str, state, emit, clock=time.monotonic):
        self.clock = clock
        self.path = Path(path) if path else None
        self.state = state
        self.emit = emit
        self.written_at = 0.0
        self.phase: str | None = None  # the phase of the last write
        self.current: str | None = None  # the phase of the last tick
        self.gpu_waited = 0.0
        self.last_tick = clock()
        self.problem: str | None = None
        if self.path is not None:
            self.state.prometheus = TextfileState(path=str(self.path))

    def tick(self, phase: str, force: bool = False, up: bool = True) -> None:
        clock = self.clock()
        if self.current == Phase.WAITING_GPU:
            self.gpu_waited += clock - self.last_tick
        self.last_tick, self.current = clock, phase
        if self.path is None:
            return
        if not force and phase == self.phase and clock - self.written_at < WRITE_EVERY_S:
            return
        self.phase = phase
        self.written_at = clock
        problem = squatted = place_problem(self.path) or why_not_replaced(self.path)
        if problem is None:
            try:
                _write(self.path, render(self.state.data, time.time(), self.gpu_waited, up))
            except (OSError, PlaceRefused) as e:
                problem = f"cannot be written: {e}"
                if self.problem is None:
                    self.emit("prometheus", f"cannot write the Prometheus textfile {self.path}: {e}; retrying")
        elif squatted != self.problem:
            self.emit("prometheus", f"the Prometheus textfile {self.path} {squatted}; what it holds is not this "
                                    f"run's gauges; retrying")
        if problem is not None:
            if problem != self.problem:
                self.state.prometheus = TextfileState(path=str(self.path), problem=problem, since=time.time())
            self.problem = problem
            return
        if self.problem is not None:
            self.emit("prometheus", f"the Prometheus textfile {self.path} is written again")
            self.state.prometheus = TextfileState(path=str(self.path))
            self.problem = None

    def close(self, phase: str) -> None:
        self.tick(phase, force=True, up=False)


def place_problem(path: Path) -> str | None:
    """Why the textfile's directory is not a place for this run's gauges: another user owns, can rearrange or can
    write it, or one above it (minilmd/path_checks.py textfile_dir_problem, `run --check`'s rule too), so he could
    replace them, or make their name first."""
    problem = textfile_dir_problem(path.parent)
    return f"is in a directory others control: {problem}" if problem else None


def _write(path: Path, text: str) -> None:
    """The textfile replaced atomically, through its directory opened once by the rule's walk (open_textfile_dir)."""
    with Dir(open_textfile_dir(path.parent), path.parent) as where:
        where.write_atomic(path.name, text.encode(), TEXTFILE_MODE)


def why_not_replaced(path: Path) -> str | None:
    """Why the file at path must not be replaced by this run (it belongs to another user, or is a symlink or
    not a regular file: a squatted name), or None (missing, or a regular file of ours)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be checked: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (not this run's: never followed nor replaced)"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (not this run's: never replaced)"
    if not owned_by_me(st):
        return f"belongs to {user_words(st.st_uid)}, not to this run's user: never replaced"
    return None
