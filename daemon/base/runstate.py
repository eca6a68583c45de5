"""The files through which a run is watched: state.json, events.jsonl, supervisor.log, and the trainer's outputs.

`RunState` is the supervisor's view (typed sections, daemon/base/statesections.py, rewritten atomically so that
`minilmd status` never reads half a file). `EventLog` appends one JSON line per event and one human line per event
to supervisor.log (and stdout, for the journal). `MetricsTail` reads the trainer's metrics.jsonl incrementally
(minilmd/logread.py new_lines: no link followed, never blocked, bounded).
`process_alive` (minilmd/procs.py, the one rule) tells a live process from a recycled pid. Torch-free and light:
`minilmd status` imports this module.

A full run.dir never raises out of a write here: `RunState.save` and `EventLog.emit` keep going (stdout still gets
every event), say why in their `unwritten`, and write again once there is room; the supervisor decides what a full
run.dir means for the run (daemon/phases/rundirwatch.py, which also keeps the reserve file for its last words).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from minilmd import names
from minilmd.daemon.base import timeline
from minilmd.daemon.base.statesections import (
    ChildInfo,
    LocalCheckpoint,
    Progress,
    RemoteCheckpoint,
    Staging,
    StateJson,
    SupervisorInfo,
    Sync,
)
from minilmd.fmt import fmt_time as fmt_time  # the views' and the jobs' import of it (its home: minilmd/fmt.py)
from minilmd.fsio import atomic_write_json, dir_removed, is_disk_full
from minilmd.jsonlines import append_line, append_whole, json_records, open_log
from minilmd.logread import new_lines, open_regular_or_none
from minilmd.metrics import REWARDS, number
from minilmd.names import HEARTBEAT_MAX_BYTES
from minilmd.perms import own_uid, owner_or_me, run_dir_owner
from minilmd.proc_info import boot_id
from minilmd.procs import (  # noqa: F401 - here too: callers and tests import them from here
    process_alive,
    process_environ,
    process_start_ticks,
)
from minilmd.run_states import Phase, StagingState, SyncState
from minilmd.untrusted import Unreadable, printable, read_json, read_open

STATE_VERSION = 1


def now() -> float:
    return time.time()


# --- Process identity ------------------------------------------------------------------------------------------

def supervisor_runs_here(sup: SupervisorInfo) -> bool:
    """Whether the supervisor a state.json names runs on this host: that process, by its pid and its start time. A
    pid alone is whichever process has it now (recycled, another user's); the caller decides what another host's
    means (`sup.host`). A record of an earlier boot names none (a supervisor started at boot gets much the same pid
    and start time each boot)."""
    return sup.start_ticks is not None and process_alive(sup.pid, sup.start_ticks, sup.boot)


# --- state.json ------------------------------------------------------------------------------------------------

def state_owners(run_dir: str | os.PathLike, dir_fd: int | None = None) -> tuple[int, ...]:
    """Whose state.json of run_dir is read: the run directory's owner's (its supervisor runs as that user), or
    our own. Anyone else's file there is another user's doing, never the supervisor's. `dir_fd`: the run directory
    opened (a view's, daemon/views/runarg.py open_run): its owner, not the owner of what its path leads to now
    (perms.run_dir_owner)."""
    owner = run_dir_owner(run_dir, dir_fd)
    return (own_uid(),) if owner is None else owner_or_me(owner)


def load_state(run_dir: str | os.PathLike, dir_fd: int | None = None) -> dict:
    """state.json of run_dir through the hardened reader (minilmd/untrusted.py: a regular file of its owner, at most
    names.STATE_MAX_BYTES, a JSON object of bounded depth). Raises Unreadable (`missing` when there is none).
    `dir_fd`: the run directory opened (the views': daemon/views/runarg.py open_run), read through it, not by
    run_dir's path (then only for words)."""
    owners = state_owners(run_dir, dir_fd)
    if dir_fd is None:
        return read_json(Path(run_dir) / names.STATE, max_bytes=names.STATE_MAX_BYTES, owner=owners)
    return read_json(names.STATE, max_bytes=names.STATE_MAX_BYTES, owner=owners, dir_fd=dir_fd)


def read_state(run_dir: str | os.PathLike, dir_fd: int | None = None) -> dict | None:
    """state.json of run_dir, None when there is none or it is not one (`load_state` says why; `dir_fd` its)."""
    try:
        return load_state(run_dir, dir_fd)
    except Unreadable:
        return None


def names_remote(path: str | None, url: str | None) -> bool:
    """`path` (a RemoteCheckpoint's, a sync/fetch event's remote) is `url` or a checkpoint directly under it: a
    record of another remote (run.remote changed since) says nothing of this one, nor does any record once the run
    has no remote."""
    if not path or not url:
        return False
    url, path = url.rstrip("/"), str(path).rstrip("/")
    return path == url or path.rsplit("/", 1)[0] == url


def new_state(name: str, run_dir: Path, config_path: str) -> dict:
    """The shape of state.json; every key is always present so that readers need no guessing."""
    t = now()
    return StateJson(version=STATE_VERSION, run=name, run_dir=str(run_dir), config=config_path,
                     phase=Phase.WAITING_GPU, since=t,
                     supervisor=SupervisorInfo(pid=os.getpid(), start_ticks=process_start_ticks(os.getpid()),
                                               boot=boot_id(), host=socket.gethostname(), started=t,
                                               parent_pid=os.getppid(),
                                               parent_start_ticks=process_start_ticks(os.getppid())),
                     sync=Sync(state=SyncState.OFF), staging=Staging(state=StagingState.NOT_STARTED),
                     restarts_since=t, updated=t).to_dict()


def passed_on_child(old: dict) -> dict | None:
    """The trainer a state.json passes on to the next supervisor (RunState.adopt): the one its supervisor ran, or
    when it ran none (a launch's wait for scratch, daemon/waitrecord.py; a supervisor ended before its first launch),
    the one it had adopted itself ("previous_child"): a wait must not make its successor forget an orphan's attempt."""
    child = old.get("child")
    if not isinstance(child, dict):
        child = old.get("previous_child")
    return child if isinstance(child, dict) else None


def dpo_rewards(known: dict | None, rec: dict, prefix: str) -> dict | None:
    """`known` (a DPO run's latest rewards, Progress.rewards) with those of a train (prefix "") or eval ("val_")
    line of metrics.jsonl; None while no line has carried any (not a DPO run)."""
    found = {prefix + key: rec[prefix + key] for key in REWARDS if number(rec.get(prefix + key)) is not None}
    return {**(known or {}), **found} if found else known


class RunState(StateJson):
    """state.json held in memory, its sections as attributes (daemon/base/statesections.py); `save()` rewrites it
    atomically."""

    def __init__(self, path: Path, data: dict):
        read = StateJson.from_dict(data)
        super().__init__(**{f.name: getattr(read, f.name) for f in dataclasses.fields(StateJson)})
        self.path = path
        self.previous_child: dict | None = None
        """The trainer the previous supervisor ran, once `adopt` has read its state.json (key only then)."""
        self.previous_attempt: ChildInfo | None = None
        """That trainer, typed: until this supervisor launches one, what it saved (an orphan's save at its stop, read
        at the start) is progress of its attempt (apply_progress)."""
        self.adopted = False
        self.unwritten: str | None = None
        """Why the last save did not reach the disk (its filesystem is full); None when it did."""
        self.previous_unreadable = ""
        """Why the previous supervisor's state.json could not be read ("" when it could or there was none): its
        remote checkpoint is then unknown (daemon/jobs/remotewait.py)."""
        self.lineage_since = 0.0
        """When the current lineage began (the time of the last `run --fresh` marker read, apply_progress); 0.0 when
        none was."""
        self.other_remote: RemoteCheckpoint | None = None
        """The previous supervisor's remote checkpoint when it is on another remote than run.remote now (`adopt`):
        not this run's remote checkpoint, which starts its own record with the first sync there."""

    def __getitem__(self, key: str):
        """state["devices"], state["slurm"]: for daemon/slurm/job.py, which its tests hand a plain dict."""
        return getattr(self, self._field(key))

    def __setitem__(self, key: str, value) -> None:
        setattr(self, self._field(key), value)

    @staticmethod
    def _field(key: str) -> str:
        if key not in {f.name for f in dataclasses.fields(StateJson)}:
            raise KeyError(key)
        return key

    @property
    def data(self) -> dict:
        """state.json as `save()` writes it."""
        out = self.to_dict()
        if self.adopted:
            out["previous_child"] = self.previous_child
        return out

    def record_error(self, message: str) -> None:
        """The latest failure, stamped with when and at which step, so that status can tell a current problem
        from one the run has long recovered from."""
        self.last_error = message
        self.last_error_at = now()
        self.last_error_step = self.progress.step

    def adopt(self, old: dict | None, remote: str | None) -> None:
        """Keep from the previous supervisor's state.json what must survive a restart: the micro-batch the GPU
        fits, the last remote checkpoint when it is on `remote` (the run.remote now; one on another remote is kept
        in `other_remote` only, for the caller to say: nothing is synced to this one yet), the restart history and
        the last error (with its time and step: history, as after a restart of the trainer) if that supervisor did
        not end (it crashed or was killed; one that ended leaves its restarts to the run's earlier count), which
        trainer it ran (passed_on_child), and the notes of its init.from (the run goes on from that checkpoint). A
        field of the wrong type there counts as missing."""
        if not old or not isinstance(old, dict):
            return
        read = StateJson.from_dict(old)
        self.overrides = read.overrides
        self.notes = read.notes  # of the init.from it started from: said again only when that is staged again
        self.shape_changes = read.shape_changes  # the run's history: staging forgets it at a start from step 0
        self.remote_checkpoint = read.remote_checkpoint
        if read.remote_checkpoint is not None and not names_remote(read.remote_checkpoint.path, remote):
            self.other_remote, self.remote_checkpoint = read.remote_checkpoint, None
        self.restarts, self.no_progress_streak = read.restarts, read.no_progress_streak
        self.restarts_since, self.earlier_restarts = read.restarts_since, read.earlier_restarts
        if read.outcome is None or not old.get("outcome"):  # that supervisor did not end (or its outcome is bad)
            self.last_error, self.last_error_at, self.last_error_step = \
                read.last_error, read.last_error_at, read.last_error_step
        else:  # the run ended: this start counts its restarts anew, the run's earlier ones kept apart
            self.count_restarts_anew(self.supervisor.started or now())
        self.previous_child = passed_on_child(old)
        self.previous_attempt = ChildInfo.from_dict(self.previous_child) if self.previous_child else None
        self.adopted = True

    def apply_progress(self, records: list[dict], beat: Heartbeat | None) -> None:
        """Fold the trainer's new metrics.jsonl lines and its heartbeat (`read_heartbeat`) into "progress" and
        "local_checkpoint". A `run --fresh` start's marker (daemon/base/timeline.py) empties "progress": what came
        before it (the supervisor reads metrics.jsonl from its start) is another lineage's, and so is a heartbeat
        older than it. The ETA is counted last, from the step shown (the heartbeat's when newer): it moves with the
        heartbeat, not only at the train lines."""
        progress = self.progress
        for rec in records:
            kind = rec.get("kind")
            if timeline.is_marker(rec):
                self.progress = progress = Progress()
                self.lineage_since = max(self.lineage_since, number(rec.get("time")) or 0.0)
            elif kind == "train":
                for key in ("step", "total_steps", "loss", "lr"):
                    if rec.get(key) is not None:
                        setattr(progress, key, rec[key])
                if rec.get("tokens_seen") is not None:  # with its own line's step: one pair, never the heartbeat's
                    progress.tokens_seen, progress.tokens_seen_step = rec["tokens_seen"], rec.get("step")
                # the current trainer's
                progress.tok_s, progress.step_time = rec.get("tok_s"), number(rec.get("step_time"))
                progress.rates_awaited_since = None
                progress.updated = rec.get("time") or now()
                progress.rewards = dpo_rewards(progress.rewards, rec, "")
            elif kind == "eval":
                progress.val_loss = rec.get("val_loss")
                progress.rewards = dpo_rewards(progress.rewards, rec, "val_")
            elif kind == "checkpoint":
                self.local_gone = None
                self.local_checkpoint = LocalCheckpoint(step=rec.get("step"), time=rec.get("time") or now(),
                                                        path=rec.get("path"), blocking_s=rec.get("blocking_s"))
                if self._is_progress(self.local_checkpoint):
                    self.no_progress_streak = 0
        if self.child is None:  # no trainer runs: a dead one's last heartbeat is no reference pass going on
            progress.reference_pass = None
        if beat is not None:
            progress.heartbeat = beat.mtime
            if self.child is not None:
                progress.reference_pass = beat.reference_pass()
            restarted = progress.rates_awaited_since is not None and beat.mtime >= progress.rates_awaited_since
            if beat.step is not None and (progress.step is None or beat.step > progress.step or restarted) and \
                    beat.mtime >= self.lineage_since:
                if restarted and progress.step is not None and beat.step < progress.step:
                    # resumed below the earlier trainer's step: its loss and rate are of a step this one has not
                    # reached (a new user read `step 144 ... loss 2.1110`, step 160's loss, beside a sparkline
                    # ending at step 140's 2.4372); none until this trainer logs a step
                    progress.loss = progress.lr = None
                progress.step = beat.step  # a restarted trainer's first beats: the step it resumed from
                # the budget it counts, never an earlier trainer's; its exiting beat says none (minilmd/metrics.py:
                # readable by a supervisor from before the total), the one its earlier beats said stays
                if beat.total is not None or (restarted and beat.phase != names.HEARTBEAT_EXITING):
                    progress.total_steps = beat.total
        progress.eta_s = progress.eta_after()

    def _is_progress(self, saved: LocalCheckpoint) -> bool:
        """Whether a checkpoint line is the current attempt's progress: saved since its trainer was launched, beyond
        the newest checkpoint then (the rule the restart policy applies at its end: supervisor.py `made_progress`).
        The attempt is this supervisor's trainer, or before it launches one the previous supervisor's."""
        attempt = self.child if self.child is not None else self.previous_attempt
        if attempt is None or attempt.started is None or attempt.newest_at_launch is None:
            return False
        when = number(saved.time)
        return isinstance(saved.step, int) and saved.step > attempt.newest_at_launch and \
            when is not None and when >= attempt.started

    def await_new_rates(self) -> None:
        """A restart: the earlier trainer's step, rate (tok/s, step time) and ETA are set aside, none until the next
        trainer logs a step; its heartbeats give the step it resumed from meanwhile (apply_progress), with the total
        they say (the trainer counts it: a budget in tokens or epochs after what its checkpoint trained, a budget
        raised since). Called once every line of the earlier trainers is folded in (apply_progress): a train line
        after it is the new one's. Set aside whether or not the earlier trainer logged a rate: one that died before
        its first train line left a step (its heartbeat's) the next one's may be below."""
        progress = self.progress
        if progress.step is None and progress.tok_s is None and progress.eta_s is None:
            return  # no trainer before this one: nothing to set aside
        progress.tok_s = progress.eta_s = progress.step_time = None
        progress.rates_awaited_since = now()

    def check_local(self, steps: list[int]) -> LocalCheckpoint | None:
        """The recorded local checkpoint, when scratch's complete checkpoints (`steps`) no longer hold it (a reboot
        emptied /dev/shm): moved to "local_gone" and returned; None when it is there (or none was recorded)."""
        local = self.local_checkpoint
        if local is None or local.step in steps:
            return None
        self.local_checkpoint, self.local_gone = None, local
        return local

    def save(self) -> None:
        self.updated = now()
        try:
            atomic_write_json(self.path, self.data)  # a failed write leaves the previous state.json whole
        except OSError as e:
            if not (is_disk_full(e) or dir_removed(e, self.path.parent)):
                raise
            self.unwritten = f"{self.path.name}: {e.strerror}"
            return
        self.unwritten = None


# --- events.jsonl and supervisor.log ---------------------------------------------------------------------------

class EventLog:
    """One JSON line per event (events.jsonl), the same as a human line in supervisor.log and on stdout."""

    def __init__(self, run_dir: Path, echo: bool = True):
        self.run_dir = run_dir
        self.echo = echo
        self._log: int | None = None  # supervisor.log, opened O_APPEND
        self.unwritten: str | None = None
        """Why the last event did not reach events.jsonl or supervisor.log (full); None when it did."""
        self.reopen()

    def reopen(self) -> None:
        """Reopen supervisor.log (after logrotate moved it: SIGHUP)."""
        self.close()
        self._log = open_log(self.run_dir / names.SUPERVISOR_LOG)

    def emit(self, event: str, message: str, **details) -> None:
        ts = now()
        record = {"time": ts, "event": event, "message": message, **details}
        # a message may name another user's file (a checkpoint's manifest, an init.from's path): the log and the
        # window it is echoed to get it escaped (events.jsonl: json.dumps escapes it as JSON)
        line = printable(f"{fmt_time(ts)} [{event}] {message}", lines=True)
        problems = []
        try:
            append_line(self.run_dir / names.EVENTS, (json.dumps(record, sort_keys=True, default=str) + "\n").encode())
        except OSError as e:
            if not (is_disk_full(e) or dir_removed(e, self.run_dir)):
                raise
            problems.append(f"{names.EVENTS}: {e.strerror}")
        assert self._log is not None  # opened by __init__ through reopen()
        try:
            append_whole(self._log, (line + "\n").encode())
        except OSError as e:
            if not is_disk_full(e):
                raise
            problems.append(f"{names.SUPERVISOR_LOG}: {e.strerror}")
        self.unwritten = "; ".join(problems) or None
        if self.echo:
            self._echo(line)

    def _echo(self, line: str) -> None:
        """The event on stdout, unless stdout has gone: an SSH session closed under `minilmd run` (EIO on its
        terminal, EPIPE from an ended `| tee`). The files have every event; a lost terminal must not end the run."""
        try:
            print(line, file=sys.stdout, flush=True)
        except (OSError, ValueError):  # ValueError: stdout closed
            self.echo = False
            # what is left in stdout's buffer would fail again at exit (Python's exit status 120 then): /dev/null
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)

    def close(self) -> None:
        if self._log is not None:
            os.close(self._log)
            self._log = None


# --- the trainer's outputs -------------------------------------------------------------------------------------

class MetricsTail:
    """Reads complete new lines of metrics.jsonl since the last call (the trainer may be mid-line)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.problem: str | None = None
        """Why metrics.jsonl could not be read at the last call (it is not a regular file); None when it could."""

    def read_new(self) -> list[dict]:
        try:
            lines, self.offset = new_lines(self.path, self.offset)
        except Unreadable as e:
            self.problem = e.why
            return []
        self.problem = None
        return json_records(lines)


def _heartbeat(run_dir: Path) -> tuple[float, list[str]] | None:
    """(mtime, words) of the heartbeat file, None when there is none or it is not a small regular file."""
    try:
        fd = open_regular_or_none(run_dir / names.HEARTBEAT)
    except Unreadable:
        return None
    if fd is None:
        return None
    try:
        mtime = os.fstat(fd).st_mtime
        body = read_open(fd, names.HEARTBEAT, max_bytes=HEARTBEAT_MAX_BYTES)
    except (OSError, Unreadable):  # gone, or longer than any heartbeat
        return None
    finally:
        os.close(fd)
    return mtime, body.decode(errors="replace").split()


class Heartbeat(NamedTuple):
    """One reading of the trainer's heartbeat file: its mtime and its body, "STEP[/TOTAL][ PHASE]". The supervisor
    reads it once per tick and judges everything by that one reading: a second read may find the next heartbeat
    (a compile that has just ended: a fresh step, no phase) and pair its phase with the first one's mtime."""

    mtime: float
    step: int | None
    phase: str
    """"compiling" during the trainer's first torch.compile'd step, "exiting" once training is over, "reference"
    during a DPO run's reference pass, else ""."""
    note: str = ""
    """What follows the phase: the reference pass's "DONE/TOTAL/FROM/SECONDS" pairs (FROM: done when this attempt's
    pass began, SECONDS since; an older trainer's "DONE/TOTAL")."""
    total: int | None = None
    """The steps the trainer counts ("STEP/TOTAL", minilmd/metrics.py), once it knows them; None before, in its
    "exiting" beat (the step alone, as a supervisor from before the total reads it), or from a trainer that does not
    say it."""

    def reference_pass(self) -> list[int] | None:
        """[pairs done, pairs in all, done when this attempt's pass began, its seconds since] ([done, all] of an
        older trainer) while a DPO run's reference pass runs, else None (or a body that is not one)."""
        if self.phase != names.HEARTBEAT_REFERENCE or \
                not re.fullmatch(r"[0-9]{1,12}/[0-9]{1,12}(/[0-9]{1,12}/[0-9]{1,12})?", self.note):
            return None
        return [int(n) for n in self.note.split("/")]


def reference_pass_words(ref: Sequence[int]) -> str:
    """"DPO reference pass 896/2,446 pairs": how status, systemd's STATUS and supervisor.log name a reference pass's
    progress ([done, all, ...]: Heartbeat.reference_pass, or a saved pass's two numbers)."""
    return f"DPO reference pass {ref[0]:,}/{ref[1]:,} pairs"


def reference_pass_rate(ref: list[int]) -> tuple[float, float] | None:
    """(pairs a second, seconds left) of a reference pass as its heartbeat gives it (Heartbeat.reference_pass, or
    the supervisor's state.json copy: read typed, a list of ints), from this attempt's pairs and seconds; None before
    it has a rate (its first second, no pair yet, or an older trainer's two numbers)."""
    if len(ref) != 4 or ref[3] <= 0 or ref[0] <= ref[2]:
        return None
    rate = (ref[0] - ref[2]) / ref[3]
    return rate, max(0, ref[1] - ref[0]) / rate


def read_heartbeat(run_dir: Path) -> Heartbeat | None:
    """The trainer's heartbeat, or None if there is none."""
    beat = _heartbeat(Path(run_dir))
    if beat is None:
        return None
    mtime, body = beat
    stepped, _, total = (body[0] if body else "").partition("/")
    return Heartbeat(mtime, _count(stepped), body[1] if len(body) > 1 else "", " ".join(body[2:]), _count(total))


def _count(word: str) -> int | None:
    """A heartbeat's step or total, None where it is none (not written, or not a count)."""
    return int(word) if re.fullmatch(r"[0-9]{1,19}", word) else None
