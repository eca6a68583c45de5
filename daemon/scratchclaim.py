"""The launch's claim of scratch (daemon/preflight.py launch): the default scratch's root settled
(minilmd/scratch_root.py settle), scratch made this run's (minilmd/scratch.py claim), and the wait when there is no
room to make them, with how the launch ends before any supervisor runs (`LaunchEnds`).

No room (ENOSPC, EDQUOT: fsio.is_disk_full, the one rule; a tmpfs's inodes used up by another user's files, a quota)
is no refusal but a wait, as a scratch full by bytes is (staging's `no room in scratch`): another user's empty files
must not end an unattended run for good (hostile audit 7 F2). The wait keeps the promises of a running supervisor
(review9c finding 1; before, it waited unseen before the run lock and systemd's READY: the unit's TimeoutStartSec
killed it every 5 min, and its 5th start in an hour left the unit failed; `minilmd stop` said "not running"):
- it holds the run lock (daemon/host/lock.py RunLock), so `minilmd stop` finds this process (it carries the run's
  identity: minilmd/procs.py) and signals it, and no second supervisor starts beside it;
- it tells systemd READY=1 with a STATUS line saying what it waits for, and pings its watchdog;
- state.json says so: phase waiting_scratch, the reason (which place, how full, whose entries fill it), this process
  as the run's supervisor (daemon/waitrecord.py), so that `minilmd status` shows the wait;
- its signals are the supervisor's from its start (daemon/host/signals.py `Signals`: the handlers only record) and
  are acted on as the supervisor acts on them: a stop (`minilmd stop`'s SIGUSR2, `systemctl stop`'s SIGTERM) ends it at
  once: `StoppedWaiting`, exit 0, nothing started, state.json `done` (stopped); in a Slurm job a SIGUSR1 or a
  SIGTERM is a preemption with nothing to save: the job is requeued as a preempted supervisor's is
  (daemon/slurm/job.py SlurmJob.plan), at once, and state.json gets the `slurm` section a preempted supervisor's
  has; a SIGHUP reopens supervisor.log (where the wait's transitions are logged, daemon/waitrecord.py) and a
  SIGUSR1 outside Slurm is ignored, both said; none of them ends the process by its default (review10a F1).
Once scratch is made, the lock, the same signal record and the wait's state.json record are handed to the
supervisor held (`Held`: Supervisor.run never takes the lock again, its first tick acts on a stop that came
meanwhile, and an early exit of it ends the wait's record): there is no moment between the wait and the supervisor
in which `minilmd stop` finds no holder ("not running") or a signal ends the process unrecorded.
A run.dir with no room for the private root's record is run.dir full: exit 73 (`RunDirFull`), as everywhere.
Torch-free.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minilmd import names, protocol, scratch, scratch_hold, scratch_root
from minilmd.backoff import exponential
from minilmd.config import ConfigError, RunConfig
from minilmd.daemon.host.lock import LockHeld, LockUnsafe, RunLock, lock_holder
from minilmd.daemon.host.sdnotify import Notifier
from minilmd.daemon.host.signals import Signals
from minilmd.daemon.phases.rundirwatch import full_at_start
from minilmd.daemon.waitrecord import WaitRecord
from minilmd.fsio import is_disk_full
from minilmd.roomwords import no_room as _no_room

if TYPE_CHECKING:
    from minilmd.daemon.base.runstate import RunState

SLICE_S = 1.0
"""How long the wait sleeps between two looks at a stop and the watchdog."""


class LaunchEnds(Exception):
    """The launch ends before the supervisor starts, said on stdout, with `exit_status`."""

    exit_status = protocol.SUPERVISOR_RETRY


class ScratchRootUnknown(LaunchEnds):
    """run.dir's record of the private scratch root could not be read (scratch_root.RecordUnreadable): said, and
    exit 1, so that systemd starts the launch again; never the default root, which another user may have made."""

    def __init__(self, why: scratch_root.RecordUnreadable):
        super().__init__(str(why))
        print(f"minilmd run: nothing started: {why}; the default scratch root is not used instead (it may be "
              f"another user's); start the run again once run.dir reads", flush=True)


class RunDirFull(LaunchEnds):
    """run.dir could not be made or written: its file system is full (`minilmd run` exits 73)."""

    exit_status = protocol.SUPERVISOR_RUN_DIR_FULL


class StoppedWaiting(LaunchEnds):
    """A stop (SIGTERM, SIGINT) while the launch waited for room for scratch: nothing started, exit 0."""

    exit_status = protocol.SUPERVISOR_DONE


class PreemptedWaiting(LaunchEnds):
    """Slurm's SIGUSR1 or SIGTERM while the launch waited: the job ended as a preempted supervisor's (requeued, or
    stopped, cancelled), nothing started; `exit_status` the supervisor's for that end."""

    def __init__(self, why: str, exit_status: int, ended: str):
        super().__init__(why)
        self.exit_status, self.ended = exit_status, ended


WAIT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2, signal.SIGHUP, signal.SIGUSR1)
"""The signals the supervisor records (daemon/host/signals.py): the wait records the same, from its start."""


@dataclass
class Held:
    """What the wait hands the supervisor without letting go (Supervisor.run): the run lock, the signals' record
    (installed at the wait's start; a stop that came since is its first tick's), and the wait's state.json record
    (`record`: ended by an exit of the supervisor before its own start, `refused`). `give_back()`: lock and handlers
    let go, for a caller that starts no supervisor (a test)."""

    lock: RunLock
    signals: Signals
    before: dict
    """The signal handlers before the wait's (give_back puts them back)."""
    record: WaitRecord | None = None

    def refused(self, status: int, why: str) -> None:
        """The supervisor exits with `status` before its start: the wait's record ends so (failed), never left
        `waiting_scratch` with no outcome (review10a F2)."""
        if self.record is not None:
            self.record.failed(status, f"after the wait for room for scratch: {why}")

    def give_back(self) -> None:
        self.lock.release()
        for sig, handler in self.before.items():
            signal.signal(sig, handler)


def run_lock(held: Held | None, run_dir: str | os.PathLike) -> RunLock:
    """The run lock, held: the one the wait handed over (never let go since; LockUnsafe unless it is `run_dir`'s,
    the very directory), else taken now (LockHeld, LockUnsafe, OSError: daemon/host/lock.py)."""
    if held is None:
        lock = RunLock(run_dir)
    else:
        lock = held.lock
        if not _same_dir(lock.path.parent, run_dir):
            raise LockUnsafe(f"the run lock the scratch wait holds is {lock.path}, not in {run_dir}, the run "
                             f"directory the supervisor settled: nothing started")
    lock.acquire()  # a no-op on the handed one
    return lock


def _same_dir(one: str | os.PathLike, other: str | os.PathLike) -> bool:
    """The same directory (device and inode; lstat: a link to it is not it)."""
    try:
        a, b = os.lstat(one), os.lstat(other)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def claim_scratch(cfg: RunConfig, config_path: str = "", sleep: Callable[[float], None] = time.sleep,
                  notifier: Notifier | None = None, signals: Signals | None = None) -> Held | None:
    """Scratch settled and claimed for this run; ConfigError (exit 2) when refused. No room: said once, then tried
    again with the restart backoff for as long as it takes, the run lock held, state.json and systemd told (module
    docstring). Returns what the wait holds for the supervisor (None when there was no wait). `signals`: the record
    `minilmd run` installed at its start (a stop before the wait is the wait's); None: one of the wait's own."""
    full = _settle_and_claim(cfg)
    if full is None:
        return None
    notifier = notifier or Notifier()
    lock = RunLock(cfg.run_dir)
    try:
        lock.acquire()
    except (LockHeld, LockUnsafe) as e:
        raise ConfigError([str(e)], cfg.source) from None
    except OSError as e:
        if full_at_start(cfg.run_dir, e):
            raise RunDirFull(str(cfg.run_dir)) from e
        raise
    before = {sig: signal.getsignal(sig) for sig in WAIT_SIGNALS}
    signals = Signals() if signals is None else signals
    signals.install()
    record: WaitRecord | None = None
    try:
        record = WaitRecord(cfg, config_path or cfg.source)
        tries = _wait_for_room(cfg, full, signals, record, notifier, sleep)
        print(f"minilmd run: room again in {scratch_root.base()}: scratch made after {tries} waits", flush=True)
        record.made(f"room again in {scratch_root.base()}: scratch made after {tries} waits")
        return Held(lock, signals, before, record)
    except BaseException as e:
        try:
            if record is not None and isinstance(e, StoppedWaiting):
                record.stopped(f"stopped ({e}) while waiting for room for scratch: nothing started")
            elif record is not None and isinstance(e, PreemptedWaiting):
                record.preempted(e.ended, e.exit_status, str(e))
            elif record is not None and isinstance(e, Exception):  # a refusal or an error of a later try
                record.failed(_exit_status(e), f"while waiting for room for scratch: {e}")
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
            lock.release()
        raise


def _wait_for_room(cfg: RunConfig, full: str | None, signals: Signals, record: WaitRecord, notifier: Notifier,
                   sleep: Callable[[float], None]) -> int:
    """Tries again until scratch is made (returns how many waits that took); StoppedWaiting on a stop,
    PreemptedWaiting on Slurm's preemption."""
    tries = 0
    while full is not None:
        tries += 1
        wait = exponential(cfg.restart.backoff_initial_s, tries, cfg.restart.backoff_max_s)
        record.waiting(f"waiting for room for scratch: {full}; tried again in {wait:.3g}s (try {tries}); "
                       f"`minilmd stop` ends the wait")
        if tries == 1:
            print(f"minilmd run: waits: {full}; not a failure: waiting for room (another user's files there?), "
                  f"tried again with backoff (next in {wait:.0f}s) for as long as it takes; the run lock is "
                  f"held meanwhile (`minilmd stop` ends the wait)", flush=True)
            notifier.ready(_status(cfg, full))
        else:
            notifier.status(_status(cfg, full))
        left = wait
        while left > 0 and not _wait_ends(cfg, signals, record):
            step = min(left, SLICE_S)
            sleep(step)
            left -= step
            notifier.watchdog()
            record.alive()
        if _wait_ends(cfg, signals, record):
            notifier.stopping()
            _end_on_signal(cfg, signals, record)
        full = _settle_and_claim(cfg)
    return tries


def _wait_ends(cfg: RunConfig, signals: Signals, record: WaitRecord) -> bool:
    """Whether a signal ends the wait; the others said and let be, as the supervisor's loop does (a SIGHUP reopens
    supervisor.log; a SIGUSR1 outside Slurm is ignored)."""
    if signals.take_hup():
        record.reopen_log()
        print("minilmd run: SIGHUP while waiting for room for scratch: supervisor.log reopened", flush=True)
    in_slurm = bool(os.environ.get(names.SLURM_JOB_ENV))
    if signals.usr1 and not in_slurm:
        signals.take_usr1()
        print("minilmd run: SIGUSR1 ignored while waiting for room for scratch: not in a Slurm job", flush=True)
    from minilmd.daemon.base import stoprequest

    if in_slurm and signals.asked and not signals.stop and not stoprequest.asked_now(cfg.run_dir):
        signals.usr2_as_warning()  # `minilmd stop` writes its request before its SIGUSR2: this one is Slurm's
        print("minilmd run: SIGUSR2 with no `minilmd stop` request in run.dir: Slurm's --signal warning (B:USR2), "
              "taken as its USR1", flush=True)
    return bool(signals.stopping or signals.usr1)


def _end_on_signal(cfg: RunConfig, signals: Signals, record: WaitRecord) -> None:
    """The wait ends on the signal it got: StoppedWaiting on a stop, PreemptedWaiting in a Slurm job (its SIGTERM,
    as the supervisor's, is a preemption: daemon/slurm/job.py on_signal)."""
    got = "USR1" if signals.usr1 else signals.stop_by or "SIGTERM"
    if not os.environ.get(names.SLURM_JOB_ENV):
        print(f"minilmd run: stopped ({got}) while waiting for room for scratch: nothing started, nothing made in "
              f"{scratch_root.base()}", flush=True)
        raise StoppedWaiting(got)
    from minilmd.daemon.base import stoprequest

    request = stoprequest.honoured(cfg.run_dir)  # `minilmd stop`'s signal (it wrote this first): no requeue
    status, ended, why = _slurm_preempted(got, request.words() if request else "",
                                          record.state if record.state is not None else {},
                                          "while waiting for room for scratch: nothing started")
    print(f"minilmd run: {why}", flush=True)
    raise PreemptedWaiting(why, status, ended)


def preempted_in_checks(signal_name: str) -> int | None:
    """A stop signal (its name) that ended the launch's checks (daemon/host/signals.py LaunchStopped) in a Slurm job:
    a preemption with nothing made, ended as the wait's (_slurm_preempted: requeued unless Slurm requeues it itself
    or it is being cancelled), said; the exit status. None outside a Slurm job: a stop, the caller's to say. A
    SIGUSR2 there is Slurm's warning (`--signal=B:USR2`), taken as its USR1: `minilmd stop` signals only the holder
    of the run lock, which the checks do not take yet (a stop request it left meanwhile is the requeued start's to
    honour). Before, the job exited 0 "stopped", never requeued, where the same signal a moment later requeues it."""
    if not os.environ.get(names.SLURM_JOB_ENV):
        return None
    if signal_name == "SIGUSR2":
        print("minilmd run: SIGUSR2 during the launch's checks, before the run lock `minilmd stop` signals: Slurm's "
              "--signal warning (B:USR2), taken as its USR1", flush=True)
        signal_name = "USR1"
    status, _, why = _slurm_preempted(signal_name, "", {}, "during the launch's checks: nothing made")
    print(f"minilmd run: {why}", flush=True)
    return status


def _slurm_preempted(signal_name: str, stop_asked: str, state: RunState | dict, when: str) -> tuple[int, str, str]:
    """Slurm's USR1 or SIGTERM during the wait (or the launch's checks, `when` says which): a preemption with nothing
    started, nothing to save or sync, ended as the supervisor's (SlurmJob.plan: requeued unless Slurm requeues it
    itself, it is being cancelled or `stop_asked`), at once. (exit status, ended, why). The SlurmJob is made on the
    wait's record's `state`, so that its one writer of state.json's `slurm` section (job id, nodes, cards, restart
    count, Slurm's state, requeued) writes it there as on a supervisor's preemption; before, it wrote into a dict
    thrown away, and state.json had none. The checks have made no state.json: theirs is thrown away."""
    from minilmd.daemon.slurm.job import SlurmJob, detect

    alloc = detect()
    assert alloc is not None  # only called in a Slurm job
    job = SlurmJob(alloc, state, lambda _kind, message, **_: print(f"minilmd run: {message}", flush=True))
    job.preempted_by = signal_name  # no end watch: there is no save nor sync to cut
    plan = job.plan(False, None, "", stop_asked)
    why = f"{plan.ended} ({signal_name} in Slurm job {alloc.job_id} {when}" \
          f"{f'; {stop_asked}' if stop_asked else ''})"
    if plan.requeue and (problem := job.requeue()) is not None:
        return protocol.SUPERVISOR_RETRY, plan.ended, f"{why}; but {problem}"
    return protocol.SUPERVISOR_DONE, plan.ended, why


def _exit_status(e: Exception) -> int:
    """The launch's exit status for an error that ends the wait (`minilmd run`: daemon/supervisor.py run_supervisor)."""
    if isinstance(e, ConfigError):
        return protocol.SUPERVISOR_CONFIG
    return e.exit_status if isinstance(e, LaunchEnds) else protocol.SUPERVISOR_RETRY


def _status(cfg: RunConfig, full: str) -> str:
    return f"{cfg.run.name}: waiting for room for scratch ({full})"[:200]


def _settle_and_claim(cfg: RunConfig) -> str | None:
    """One try of claim_scratch: None when claimed; why there is no room, in words, when there is none."""
    try:
        if cfg.scratch_root_settled:  # decided once, here: every attempt's command names the scratch in it
            settled, moved = scratch_root.settle(cfg.run_dir)
            cfg.fix_scratch_root(settled)
            if moved:
                print(f"minilmd run: {moved}", flush=True)  # the start event says it again (scratch_root.in_use)
    except scratch_root.RecordUnreadable as e:
        raise ScratchRootUnknown(e) from None
    except scratch_root.RecordUnwritten as e:  # run.dir's own file: full is exit 73, as any run.dir full
        if full_at_start(cfg.run_dir, e.error):
            raise RunDirFull(str(cfg.run_dir)) from e.error
        raise ConfigError([f"run.dir {cfg.run_dir}: the record of this run's private scratch root cannot be "
                           f"written: {e.error.strerror or e.error}"], cfg.source) from None
    except OSError as e:  # the private root could not be made (base full, say)
        if is_disk_full(e):
            return (f"the default scratch root is another user's, and a private one cannot be made now: "
                    f"{_no_room(e, scratch_root.base())}")
        raise ConfigError([f"the default scratch root is another user's, and a private one could not be made in "
                           f"{scratch_root.base()}: {e.strerror or e}"], cfg.source) from None
    try:
        scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)
        scratch_hold.hold(cfg.scratch_dir)  # no other supervisor of this run in it (a run.dir removed under one)
    except scratch.ScratchRefused as e:
        raise ConfigError(e.problems, cfg.source) from None
    except scratch_hold.ScratchInUse as e:
        raise ConfigError([in_use_words(cfg, str(e))], cfg.source) from None
    except OSError as e:
        if is_disk_full(e):
            return f"run.scratch {cfg.scratch_dir} cannot be made now: {_no_room(e, cfg.scratch_dir.parent)}"
        raise ConfigError([f"run.scratch {cfg.scratch_dir} cannot be made this run's: {e}"], cfg.source) from None
    return None


def in_use_words(cfg: RunConfig, busy: str, wait_s: float = scratch_hold.PROBE_WAIT_S) -> str:
    """Why this launch stops when another supervisor of this run holds its scratch's marker (`busy`: scratch_hold's
    words, of a supervisor whose run.dir was removed under it, still in its last sync). A supervisor started at the
    same moment as this one (two `minilmd run` of one config at once) claims scratch just before it takes run.dir's
    lock: once it holds the lock (looked at for `wait_s`, while run.dir is there) it is named as any running
    supervisor is (fault11 F6: before, the words said that run.dir had been removed while it ran)."""
    give_up = time.monotonic() + wait_s
    while True:
        try:
            holder = lock_holder(cfg.run_dir)
        except OSError:
            holder = None
        if holder is not None:
            return str(LockHeld(holder.pid, holder.host, holder.since, cfg.run_dir / names.LOCK))
        if time.monotonic() >= give_up or not os.path.isdir(cfg.run_dir):
            return busy
        time.sleep(0.05)
