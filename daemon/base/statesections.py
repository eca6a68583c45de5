"""The sections of state.json as dataclasses: one per concern, each field documented, written with exactly the keys
and values state.json has always had, read tolerantly.

`Section.to_dict()` writes every field, except those in `OMIT_WHEN_NONE` while they are None (keys that state.json
has only once they were set). `Section.from_dict()` takes what fits each field's type and the default for a field
that is missing or of another type (an older or a damaged file): a reader never gets a traceback from a bad value.
`StateJson` is the whole file; `RunState` (daemon/base/runstate.py) is it, in memory and saved. Torch-free, light:
`minilmd status` imports this module.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from minilmd.run_states import StagingState, SyncState

_UNFIT = object()  # a value that does not fit a field's type


class Section:
    """What every section of state.json can do: be written as today's JSON, and be read back tolerantly."""

    OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ()
    """Fields whose key state.json has only once they hold a value."""

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  # every Section is a dataclass
            value = getattr(self, f.name)
            if value is None and f.name in self.OMIT_WHEN_NONE:
                continue
            out[f.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, raw: Any):
        """The section `raw` describes; the default for each field that is missing or does not fit its type."""
        raw = raw if isinstance(raw, dict) else {}
        hints = _hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in raw:
                continue  # the dataclass default
            value = _fit(raw[f.name], hints[f.name])
            if value is not _UNFIT:
                values[f.name] = value
        return cls(**values)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _plain(value):
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _fit(value, hint):
    """`value` if it fits the type `hint` (sections and their lists read in turn), else _UNFIT."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None if type(None) in typing.get_args(hint) else _UNFIT
        for arm in typing.get_args(hint):
            if arm is not type(None) and (fitted := _fit(value, arm)) is not _UNFIT:
                return fitted
        return _UNFIT
    if origin is list or hint is list:
        if not isinstance(value, list):
            return _UNFIT
        (item,) = typing.get_args(hint) or (Any,)
        fitted = (_fit(v, item) for v in value)
        return [v for v in fitted if v is not _UNFIT]
    if origin is dict or hint is dict:
        return dict(value) if isinstance(value, dict) else _UNFIT
    if isinstance(hint, type) and issubclass(hint, Section):
        return hint.from_dict(value) if isinstance(value, dict) else _UNFIT
    if hint is float:
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else _UNFIT
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _UNFIT
    return value if isinstance(value, hint) else _UNFIT


# --- the sections ------------------------------------------------------------------------------------------------

@dataclass
class SupervisorInfo(Section):
    pid: int | None = None
    """The supervisor's pid."""
    start_ticks: int | None = None
    """Its start time in clock ticks since boot: with the pid, it tells the supervisor from a recycled pid."""
    boot: str = ""
    """The boot it started in (proc_info.boot_id; "" in a file of a version before it): a record of another boot's
    names no process of this one, whatever its pid and start time match now."""
    host: str = ""
    """The host it runs on."""
    started: float | None = None
    """When it started (epoch seconds)."""
    systemd_unit: str = ""
    """The systemd unit it runs as (`minilmd@tiny.service`; "" outside systemd): `stop` names it when no supervisor
    runs, since systemd's restart of it does not read the stop request (daemon/base/stoprequest.py)."""
    systemd_user: bool = False
    """That unit is a user manager's (`systemctl --user`)."""
    parent_pid: int | None = None
    """The process that started it (the tmux launcher's window loop, a shell, systemd, a Slurm batch script)."""
    parent_start_ticks: int | None = None
    """That parent's start time, with parent_pid its identity in a record read later. Whether it still runs is the
    supervisor's own /proc entry's to say (daemon/base/keeper.py: still its child), never this pid's entry, which
    /proc mounted hidepid=2 hides when the parent is another user's (slurmstepd, su)."""


@dataclass
class ChildInfo(Section):
    pid: int | None = None
    """The trainer's pid (its process group leader)."""
    start_ticks: int | None = None
    """Its start time in clock ticks since boot."""
    attempt: int = 0
    """Which attempt of the trainer this is (attempt logs are numbered by it)."""
    started: float | None = None
    """When it was launched."""
    log: str = ""
    """Its attempt log."""
    command: list[str] = field(default_factory=list)
    """The command it was launched with."""
    newest_at_launch: int | None = None
    """The step of the newest local checkpoint when it was launched (-1: none). A checkpoint it saves beyond it is
    progress: "no_progress_streak" goes back to 0 (RunState.apply_progress). None in a file of a version before it."""


@dataclass
class GpuWait(Section):
    since: float | None = None
    """When the wait for a GPU began."""
    devices: list = field(default_factory=list)
    """What the last poll saw of each GPU (GpuReport.to_dict()["devices"])."""


@dataclass
class TextfileState(Section):
    path: str = ""
    """[log] prometheus_textfile."""
    problem: str | None = None
    """Why the supervisor cannot write it (another user's file, a link, a write error); None while it writes it."""
    since: float | None = None
    """When that problem was first seen."""


@dataclass
class InitWait(Section):
    since: float | None = None
    """When the wait for the run init.from names began."""
    checks: int = 0
    """How many times that run's state.json was read."""
    run: str = ""
    """Its name."""
    run_dir: str = ""
    """Its run.dir."""
    root: str = ""
    """The runs root it was found in."""
    why: str = ""
    """What its state says, in words; while its supervisor is not running, that, with those words as what it last
    said (initwait.waiting_why: one reading, never "training" beside "not running")."""
    running: bool | None = None
    """Whether its supervisor runs (its pid alive, its state.json fresh); None: not judged (it
    has not started, or its state.json cannot be read)."""
    not_running_since: float | None = None
    """When it was last seen running (its state.json's last write), while it is not."""
    not_running: str = ""
    """"predecessor X is not running since T (...)" while it is not; "" while it runs."""


@dataclass
class SpaceWait(Section):
    since: float | None = None
    """When the wait for room in scratch began."""
    needs: int = 0
    """Bytes a checkpoint needs."""
    free: int | None = None
    """Bytes free at the last check (None: not measured)."""
    path: str = ""
    """The checkpoint directory whose filesystem is full."""
    checks: int = 0
    """How many times the room was checked."""
    inodes: int = 0
    """Inodes a start and a checkpoint need (scratch_room.START_INODES), checked where the file system counts them."""
    inodes_free: int | None = None
    """Inodes free at the last check (None: the file system does not count them, or not measured)."""


@dataclass
class Progress(Section):
    OMIT_WHEN_NONE = ("rewards", "reference_pass", "rates_awaited_since")

    step: int | None = None
    """The trainer's latest step (metrics.jsonl or its heartbeat, whichever is newer)."""
    total_steps: int | None = None
    """The steps the run will make."""
    loss: float | None = None
    """The latest training loss."""
    val_loss: float | None = None
    """The latest validation loss."""
    lr: float | None = None
    """The latest learning rate."""
    tok_s: float | None = None
    """Tokens per second of the latest logged steps (the current trainer's: None until it has logged one)."""
    tokens_seen: int | None = None
    """Tokens trained on so far, as the latest train line that said it counted them."""
    tokens_seen_step: int | None = None
    """The step of that train line: tokens_seen / tokens_seen_step is a step's real tokens (`step` may be the
    heartbeat's, newer: `run --check` timed the steps left at tokens of step 50 over step 85). None in a file of a
    version before it."""
    step_time: float | None = None
    """Seconds a step took, as the current trainer's latest train line logged it (None until it has logged one)."""
    eta_s: float | None = None
    """Seconds left: the steps left from `step` (the heartbeat's when newer) x step_time (eta_after), so it moves
    with the heartbeat, not only at the train lines. None until the current trainer has logged a step."""
    rates_awaited_since: float | None = None
    """When a restart (a supervisor's start, a trainer's launch) set the earlier trainer's step, tok_s, step_time
    and eta_s aside: its rate says nothing of the time staging, a fetch and a compile take now, and the next trainer's
    heartbeat gives the step it resumed from, lower or not. None once the trainer logs a step."""
    heartbeat: float | None = None
    """The mtime of the trainer's heartbeat file."""
    updated: float | None = None
    """When the latest train record was logged."""
    rewards: dict | None = None
    """A DPO run's latest rewards (minilmd.metrics.REWARDS' keys from its latest train line, and with "val_" before
    them from its latest eval line); absent for another run."""
    reference_pass: list[int] | None = None
    """[pairs done, pairs in all, done when this attempt's pass began, its seconds since] of a DPO run's reference
    pass while its heartbeat says it runs and its trainer does (Heartbeat.reference_pass; an older trainer's: the
    first two); absent otherwise (a dead trainer's last heartbeat is no pass going on)."""

    def eta_after(self) -> float | None:
        """Seconds the steps left take: from the step shown (the heartbeat's when newer) to total_steps at the
        latest step time; None without a step time (none logged since the restart) or a total."""
        step, total, per_step = self.step, self.total_steps, self.step_time
        if per_step is None or not isinstance(step, int) or not isinstance(total, int) or total <= 0:
            return None
        return max(0, total - step) * per_step


@dataclass
class LocalCheckpoint(Section):
    OMIT_WHEN_NONE = ("blocking_s", "fetched")

    step: int | None = None
    """The newest checkpoint's step in scratch."""
    time: float | None = None
    """When it was saved (or fetched)."""
    path: str | None = None
    """Where it is."""
    blocking_s: float | None = None
    """How long the save stalled the training loop (as the trainer logged it)."""
    fetched: bool | None = None
    """True when it was fetched from the remote rather than saved by this run's trainer."""


@dataclass
class RemoteCheckpoint(Section):
    step: int | None = None
    """The newest step synced to the remote."""
    time: float | None = None
    """When that sync ended."""
    verified: bool = False
    """Whether the copy on the remote was verified."""
    path: str = ""
    """Where it is on the remote."""


@dataclass
class Sync(Section):
    OMIT_WHEN_NONE = ("last_ok", "progress")

    state: str = "off"
    """The sync's state (SyncState)."""
    since: float | None = None
    """Since when it is in that state."""
    error: str | None = None
    """Why the last sync failed, or the remote is unavailable."""
    attempts: int = 0
    """Syncs started by this supervisor."""
    last_ok: float | None = None
    """When the last sync succeeded."""
    progress: str | None = None
    """A running sync past the stall limit that still moves bytes: "slow (X MB/s, Y of Z WHAT)"; None else."""


@dataclass
class StagingStall(Section):
    what: str = ""
    """What staging reads that does not answer: "the corpus source PATH", "[eval] probe PATH", "init.from PATH"."""
    since: float | None = None
    """When a read of it last returned: it has not answered since."""


@dataclass
class Staging(Section):
    OMIT_WHEN_NONE = ("finished", "unreachable", "unreachable_since", "waiting", "stalled", "from_copy")

    state: str = "not_started"
    """Staging's state (StagingState)."""
    path: str | None = None
    """The staged corpus in scratch."""
    since: float | None = None
    """When the latest staging began."""
    error: str | None = None
    """Why staging or the fetch failed."""
    progress: Any = None
    """What the copy or the fetch is doing, in words (written from its thread)."""
    finished: float | None = None
    """When staging last ended well."""
    unreachable: str | None = None
    """Why staging cannot go on now, waited for and retried, never counted (daemon/jobs/stagingworker.py
    `_wait_for`): the corpus, the probe corpus or init.from cannot be read, or scratch has no room now."""
    unreachable_since: float | None = None
    """When that began; None while staging can go on."""
    waiting: str | None = None
    """What staging waits for, as status says it: "corpus source unreachable", "probe source unreachable" ([eval]
    probe), "init source unreachable" (also when absent, as state.json had it before), "no room in scratch"."""
    stalled: StagingStall | None = None
    """A source staging reads whose reads block (a stalled mount: no error, no answer) for longer than
    MINILMD_SYNC_STALLED_AFTER (daemon/base/knobs.py); None while its reads return."""
    from_copy: str | None = None
    """Why the latest staging trained from the verified copy already in scratch instead of its source: the source
    could not be read (its share gone or not mounted, EIO); None when it staged from the source. That copy may be
    the only one within reach, so a final failure keeps it (minilmd/scratch_end.py `release_inputs`)."""

    def to_dict(self) -> dict:
        out = super().to_dict()
        if self.state == StagingState.NOT_STARTED and self.progress is None:
            del out["progress"]  # state.json has "progress" once staging has begun
        return out


@dataclass
class Restart(Section):
    time: float | None = None
    """When the trainer ended."""
    attempt: int = 0
    """The attempt that ended."""
    cause: str = ""
    """Why it ended (Cause)."""
    exit: int | None = None
    """Its exit status."""
    step: int | None = None
    """Its last step."""
    detail: str = ""
    """What happened, in words."""
    action: str = ""
    """What the supervisor did (Action)."""
    delay_s: float = 0.0
    """The backoff before the next phase."""


@dataclass
class Outcome(Section):
    exit: int | None = None
    """The supervisor's exit status."""
    phase: str = ""
    """Its last phase."""
    time: float | None = None
    """When it exited."""
    reason: str = ""
    """The reason of its last phase, in words."""
    ended: str = ""
    """How the run ended (protocol.RECORDED_ENDINGS: finished, stopped, requeued, cancelled, failed); "" in a file of
    a version before it, which protocol.how_ended reads by the reason's words."""


@dataclass
class StateJson(Section):
    """The whole of state.json; every key but "slurm", "prometheus", "local_gone" and "previous_child" is always
    there."""

    OMIT_WHEN_NONE = ("slurm", "prometheus", "local_gone")

    version: int = 1
    """The format's version (STATE_VERSION)."""
    run: str = ""
    """run.name."""
    run_dir: str = ""
    """The resolved run.dir."""
    config: str = ""
    """The config file the supervisor was started with."""
    phase: str = ""
    """The supervisor's phase (Phase; "" in a file that lacks it); only Supervisor._go() changes it."""
    since: float | None = None
    """When that phase began."""
    reason: str = ""
    """Why the run is in that phase, in words."""
    supervisor: SupervisorInfo = field(default_factory=SupervisorInfo)
    """The supervisor process."""
    child: ChildInfo | None = None
    """The trainer process, while there is one."""
    devices: list = field(default_factory=list)
    """The GPUs the trainer runs on."""
    gpu_wait: GpuWait | None = None
    """The wait for a GPU, while waiting_gpu."""
    init_wait: InitWait | None = None
    """The wait for the run init.from names, while waiting_init."""
    space_wait: SpaceWait | None = None
    """The wait for room in scratch, while waiting_space."""
    progress: Progress = field(default_factory=Progress)
    """The trainer's progress."""
    local_checkpoint: LocalCheckpoint | None = None
    """The newest checkpoint in scratch."""
    local_gone: LocalCheckpoint | None = None
    """The local checkpoint last recorded, found gone from scratch when a supervisor started or staged again (a
    reboot emptied /dev/shm): the trainer resumes from the remote's; None once scratch holds one again."""
    remote_checkpoint: RemoteCheckpoint | None = None
    """The newest checkpoint synced to the remote."""
    sync: Sync = field(default_factory=Sync)
    """The sync to the remote."""
    staging: Staging = field(default_factory=Staging)
    """Staging the corpus into scratch, and fetching a checkpoint."""
    restarts: list[Restart] = field(default_factory=list)
    """Each end of the trainer that led to another attempt since `restarts_since`: what restart.max_restarts bounds.
    A start after the run ended (done, stopped, failed) counts anew, so that a run that gave up can be started again
    once fixed; a supervisor killed or crashed passes its count on (`count_restarts_anew`)."""
    restarts_since: float | None = None
    """When `restarts` began counting: the start after the run's last end (or its first start)."""
    earlier_restarts: int = 0
    """The restarts of the run's starts before `restarts_since`: with `restarts`, the run's count since it began."""
    no_progress_streak: int = 0
    """Attempts in a row that saved no newer checkpoint: 0 again as soon as the trainer saves one (not only when it
    ends), so that a run training on after a restart shows none."""
    overrides: dict = field(default_factory=dict)
    """Config overrides the supervisor chose (train.micro_batch_size after an OOM...)."""
    notes: list[str] = field(default_factory=list)
    """What the run does that its config may not mean, said once init.from's checkpoint is staged
    (minilmd/stage_notes.py init_from_notes: another tokenizer or chat template than the corpus's...); notes, not
    errors."""
    shape_changes: list[str] = field(default_factory=list)
    """Each resume that changed the batch stream since the run's first start ("step N: train.seq_len = 64 (was
    32)", minilmd/batch_stream.py, said by staging): `status` says the run is not bit-reproducible."""
    last_error: str | None = None
    """The latest failure."""
    last_error_at: float | None = None
    """When it happened."""
    last_error_step: int | None = None
    """At which step."""
    outcome: Outcome | None = None
    """How the supervisor ended (None while it runs, or when it was killed)."""
    updated: float | None = None
    """When state.json was last written."""
    slurm: dict | None = None
    """The Slurm job (daemon/slurm/job.py), inside one."""
    prometheus: TextfileState | None = None
    """[log] prometheus_textfile and whether the supervisor can write it (key only with a textfile)."""

    @property
    def run_restarts(self) -> int:
        """The run's restarts since it began: those of its starts before `restarts_since` and this count's. The one
        number `status`, `status --all`'s RESTARTS and Prometheus's minilmd_restarts{cause="all"} give, so that a
        clean stop and a start again (which counts `restarts` anew for restart.max_restarts) never makes the run's
        count go back (before, the overview and the textfile gave this start's count, status the run's)."""
        return self.earlier_restarts + len(self.restarts)

    def count_restarts_anew(self, since: float) -> None:
        """A start after the run ended: `restarts` counts from 0 again (and the streak), the earlier ones kept in
        `earlier_restarts`, so that status says both (daemon/views/status.py)."""
        self.earlier_restarts += len(self.restarts)
        self.restarts, self.no_progress_streak, self.restarts_since = [], 0, since

    def resume_words(self) -> str:
        """Where the trainer resumes from once scratch lost its checkpoints ("local_gone"): the remote's newest (the
        step the last sync recorded, or one a sync finished after state.json's last write); the start with no
        remote. For `status` and the supervisor's event."""
        if self.sync.state == SyncState.OFF:
            return "no remote holds a copy: the trainer starts from the beginning"
        remote = self.remote_checkpoint
        return (f"the trainer resumes from the remote's newest checkpoint (the last sync recorded step {remote.step})"
                if remote and remote.step is not None
                else "the trainer resumes from the remote's newest checkpoint, if it holds one")
