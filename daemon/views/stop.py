"""`minilmd stop`: SIGUSR2 to a run's supervisor (stop_signal), its end waited for, and what it left reported.

Only a process proven to be the run's is ever signalled (minilmd/procs.py): the supervisor that holds the run's lock
and carries its identity, or an orphaned trainer (no supervisor) after a grace to save. The exit status is one of
protocol.STOP_*. Like the other views (daemon/views/status.py), it reads what the supervisor wrote and escapes it
before it reaches the terminal.
"""
from __future__ import annotations

import math
import os
import signal
import socket
import stat
import sys
import time
from pathlib import Path

from minilmd import names, procs, protocol, run_owner
from minilmd.bounded import SHARED_STORAGE_PROBE_S
from minilmd.daemon.base import stoprequest
from minilmd.daemon.base.runstate import fmt_time
from minilmd.daemon.base.statesections import RemoteCheckpoint, StateJson, SupervisorInfo
from minilmd.daemon.views.liveness import load, lock_supervisor
from minilmd.daemon.views.newest import newest_local
from minilmd.daemon.views.pathlooks import Looks
from minilmd.daemon.views.runarg import moved, not_yours_line, opened_run
from minilmd.daemon.views.saidonce import fold
from minilmd.daemon.views.status import error_context, phase_reason
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.names import POINTER_MAX_BYTES
from minilmd.perms import own_uid
from minilmd.proc_info import catches_signal, of_another_boot, process_environ
from minilmd.run_states import Phase, SyncState
from minilmd.untrusted import Unreadable, printable, read_bytes, read_json
from minilmd.urls import is_url


def stop(run_dir: str | os.PathLike = ".", timeout: float = 0.0, out=None) -> int:
    """stop_signal to the run's supervisor; wait until it exited (the trainer saves, the last sync runs); report.
    timeout 0: wait as long as it takes. The exit status is one of protocol.STOP_*: 0 stopped (or not running),
    1 not stopped, 2 not a run, 3 stopped but the newest checkpoint is only in scratch. A run directory of another
    user is refused, its owner named (root may stop anyone's run). Only a process proven to be the run's is ever
    signalled (minilmd/procs.py): the supervisor that holds the run's lock and carries its identity, or the trainer
    it left behind (daemon/child/orphans.py); never one a file of the run names by its pid."""
    out = out or sys.stdout
    found, refused = opened_run(run_dir, "stop")  # a run directory, or a config file naming one
    if found is None:
        return refused  # protocol.STOP_NOT_A_RUN, or STOP_FAILED for another user's directory we cannot read
    with found as run:
        return _stop(run, timeout, out)


def _stop(run: Dir, timeout: float, out) -> int:
    """stop of the run directory judged (runarg.open_run): everything of it read through its descriptor; what is
    written (the stop request) and signalled (proven by the processes' environment, which names the path) only
    while its path still leads to it (runarg.moved)."""
    run_dir = run.path
    try:
        scope = procs.scope_at(run_dir, run.fd, moved(run))
    except (procs.Refused, OSError) as e:
        print(printable(str(e)), file=out)
        return protocol.STOP_FAILED
    if whose := not_yours_line(scope.run_dir, scope.owner, "stopping it"):  # root on a user's run: said first
        print(whose, file=out, flush=True)
    shown = printable(run_dir)  # another user's config or directory name may hold escapes
    raw, unreadable = load(run_dir, run.fd)
    if unreadable:
        print(f"{shown}: {names.STATE} unreadable ({unreadable}): the supervisor is found by its lock", file=out)
    state = StateJson.from_dict(raw)
    # before the lock is looked at: a supervisor that takes it later reads it, one whose start is under way too (it
    # takes the lock half a second after it starts). A run that ended for good, which no launcher starts by itself,
    # gets one for that start only (stoprequest.py after_end: status does not show it)
    restart_may_follow = protocol.restart_may_follow(raw or {})
    request = _leave_request(scope, run, out, after_end=not restart_may_follow)
    try:
        live = lock_supervisor(run_dir, run.fd)
    except OSError as e:  # supervisor.lock not readable (root squashed on NFS, say)
        print(f"{shown}: {names.LOCK} cannot be read ({e.strerror or e}): whether a supervisor holds it is unknown; "
              f"nothing signalled", file=out)
        return protocol.STOP_FAILED
    if live is None:
        outcome = state.outcome
        print(f"{shown}: not running" + (f" (ended {fmt_time(outcome.time)}, exit {outcome.exit}: "
                                           f"{printable(outcome.reason)})" if outcome else ""), file=out)
        if restart_may_follow:
            _pending_restart_words(request, state.supervisor, out)
        if _stop_orphans(scope, out, timeout) != protocol.STOP_DONE:
            return protocol.STOP_FAILED
        return _checkpoint_report(state, out, always=False, owner=scope.owner,
                                  shown=outcome.reason if outcome else "")
    if not restart_may_follow:  # started again since that end: its signal is a stop (a Slurm job tells by it)
        request = _leave_request(scope, run, out)
    if live.host and live.host != socket.gethostname():
        print(f"supervisor pid {live.pid} runs on {printable(live.host)}, not on this host: not signalled; run "
              f"`minilmd stop` there", file=out)
        return protocol.STOP_FAILED
    pid, ticks = live.pid, procs.process_start_ticks(live.pid)
    if request is None and (job := _slurm_job_of(pid, state)):
        print(f"supervisor pid {pid} runs in Slurm job {printable(job)}, where a SIGUSR2 with no stop request in "
              f"run.dir is Slurm's own warning, which saves, syncs and requeues the job: not signalled; end the job "
              f"with `scancel {printable(job)}`, or make the request writable (room in run.dir's file system; a "
              f"`minilmd stop` as the run's owner) and run `minilmd stop` again", file=out)
        return protocol.STOP_FAILED
    said, failed = _signal(scope, run, state, live.launch_id, pid, ticks)
    print(said, file=out, flush=True)
    if failed:
        return protocol.STOP_FAILED
    if request is not None:
        _request_left_words(request, out)
    started = time.monotonic()
    last_phase = None
    reasons: list[str] = []  # the reasons said: a long text in them is not said again (saidonce.py)

    def say_phase() -> None:  # each phase the supervisor passes through while it ends, once
        nonlocal state, last_phase
        state = _reread(run, state)
        if state.phase != last_phase:
            last_phase = state.phase
            reason = phase_reason(state)
            said = fold(reason, "\n".join(reasons), _long_texts(state))
            reasons.append(reason)
            print(f"  {printable(last_phase)}" + (f": {printable(said)}" if reason else ""), file=out, flush=True)

    if procs.wait_gone([(pid, ticks)], timeout or math.inf, say_phase, interval=0.2):
        print(f"supervisor pid {pid} still running after {timeout:.0f}s (see `minilmd logs {shown}`)", file=out)
        return protocol.STOP_FAILED
    state = _reread(run, state)
    outcome = state.outcome
    ended = fold(outcome.reason, "\n".join(reasons), _long_texts(state)) if outcome else None
    reasons += [outcome.reason] if outcome else []
    print(f"stopped after {time.monotonic() - started:.1f}s: exit {outcome.exit if outcome else None} "
          f"({printable(ended) if outcome else None})", file=out)
    return _checkpoint_report(state, out, always=True, owner=scope.owner, shown="\n".join(reasons))


def _long_texts(state: StateJson) -> tuple[str | None, ...]:
    """What a run's end may say more than once: its sync's error (a refusal's whole text), its last error, its
    reason."""
    return state.sync.error, state.last_error, state.reason


def _leave_request(scope: procs.RunScope, run: Dir, out, after_end: bool = False) -> Path | None:
    """The stop request a launcher's automatic restart honours (daemon/base/stoprequest.py), in the run directory
    judged only; None when it could not be written (said)."""
    try:
        return stoprequest.leave(scope.run_dir, scope.owner, run.identity, after_end)
    except (OSError, PlaceRefused) as e:
        why = printable(str(e.strerror or e if isinstance(e, OSError) else e))
        if after_end:
            print(f"{printable(scope.run_dir)}: the stop request cannot be written ({why}): a `minilmd run` of it "
                  f"starting at this moment would not see it", file=out)
            return None
        print(f"{printable(scope.run_dir)}: the stop request cannot be written ({why}): a launcher's restart still "
              f"to come would start the run", file=out)
        return None


def _slurm_job_of(pid: int, state: StateJson) -> str:
    """The Slurm job supervisor `pid` runs in ("" outside one), as it tells itself: its environment's SLURM_JOB_ID
    (daemon/slurm/job.py detect); where that cannot be read, state.json's slurm section when that names this pid as
    its supervisor. In a job, its signal without a stop request would be read as Slurm's warning (stoprequest.asked_now:
    the job requeued, the run trained on), so `stop` sends none: before, a stop whose request could not be written
    (run.dir full, root squashed on NFS) requeued the job it was asked to end."""
    environ = process_environ(pid)
    if environ:
        return environ.get(names.SLURM_JOB_ENV, "")
    job = (state.slurm or {}).get("job_id") if state.supervisor.pid == pid else None
    return job if isinstance(job, str) else ""


def _request_left_words(request: Path, out) -> None:
    """The request outlives the supervisor just signalled: say so, and what clears it (`status` shows it too)."""
    print(f"  stop request left at {printable(request)}: an automatic restart (the tmux window's, a Slurm requeue) "
          f"will not start the run; a start by hand (`minilmd run`, the tmux launcher, sbatch) clears it", file=out,
          flush=True)


def _pending_restart_words(request: Path | None, last: SupervisorInfo, out) -> None:
    """What becomes of a restart still to come, when a run ended without finishing and no supervisor runs; `last`:
    the supervisor that state.json names (the unit it ran as, when systemd ran it)."""
    unit = f"`systemctl{' --user' if last.systemd_user else ''} stop {printable(last.systemd_unit)}`"
    if request is not None:
        print(f"  no supervisor is running; the launcher's pending restart will not start the run (the tmux window's "
              f"restart, a Slurm requeue): stop request left at {printable(request)}; a start by hand (`minilmd "
              f"run`, the tmux launcher, sbatch) clears it", file=out)
    if last.systemd_unit:  # only a run state.json says ran under systemd: never a tmux or Slurm run's
        print(f"  its supervisor ran under systemd, whose restart of it does not read the request (it cannot be told "
              f"from a start): stop that unit: {unit}", file=out)
    elif request is None:
        print("  so whatever restarts it may start it again: stop it there (Ctrl-C in the tmux launcher's window "
              "run)", file=out)


def stop_signal(pid: int) -> int:
    """The signal `stop` sends the supervisor: SIGUSR2, a stop however often it comes (a `stop` run again to keep
    waiting, or from a second terminal at once, never kills the trainer in its save, as a second SIGTERM does), to one
    that catches it (/proc's SigCgt: this minilmd's); SIGTERM to a supervisor of an older minilmd, for which SIGUSR2
    would be death by its default action."""
    return signal.SIGUSR2 if catches_signal(pid, signal.SIGUSR2) else signal.SIGTERM


def _signal(scope: procs.RunScope, run: Dir, state: StateJson, launch_id: str | None, pid: int,
            ticks: int | None) -> tuple[str, bool]:
    """stop_signal to the run's supervisor (pid, ticks), proven the run's (procs.signal_supervisor): what `stop`
    says of it, and whether it failed (nothing sent to a process not proven the supervisor)."""
    sig = stop_signal(pid)
    if sig == signal.SIGTERM and _stopping_already(_reread(run, state), pid, ticks):
        return (f"supervisor pid {pid} (an older minilmd's, without SIGUSR2) is stopping already: not signalled again "
                f"(a second SIGTERM would kill the trainer in its save); waiting for it...", False)
    why = procs.signal_supervisor(scope, pid, ticks, launch_id, sig)
    if why is None:
        trainer = "the trainer's save and " if state.child is not None and state.child.pid else ""
        return (f"{signal.Signals(sig).name} sent to supervisor pid {pid}; waiting for {trainer}the last sync...",
                False)
    if why == "it has ended":
        return f"supervisor pid {pid} ended before the signal", False
    return f"pid {pid}, named by {names.LOCK}, is not proven to be this run's supervisor ({why}): not signalled", True


def _stopping_already(state: StateJson, pid: int, ticks: int | None) -> bool:
    """Whether state.json says the supervisor (pid, ticks) is stopping: what tells, for a supervisor of an older
    minilmd that only SIGTERM stops, that a stop reached it already (a window of a tick or two remains after the
    first stop's SIGTERM; this minilmd's own take SIGUSR2 instead, where none remains)."""
    info = state.supervisor
    return state.phase == Phase.STOPPING and info.pid == pid and ticks is not None and info.start_ticks == ticks \
        and not of_another_boot(info.boot)  # pid and start ticks repeat across boots


def _reread(run: Dir, state: StateJson) -> StateJson:
    """state.json again (through the run directory's descriptor); the last one read while there is none (or it
    cannot be read)."""
    raw, _ = load(run.path, run.fd)
    return StateJson.from_dict(raw) if raw else state


def _stop_orphans(scope: procs.RunScope, out, timeout: float = 0.0) -> int:
    """A supervisor killed with SIGKILL leaves its trainer running: `stop` must stop that one too (it saves on
    SIGTERM and exits; SIGKILL after the grace its supervisor would have given, daemon/child/grace.py). Only the
    trainer this run recorded (its trainer.json read through `scope`'s descriptor), never another process. A
    --timeout shorter than the grace ends the wait there (exit 1): the SIGKILL at the grace is left to a detached
    helper (daemon/child/orphans.py hand_over_kill)."""
    from minilmd.daemon.child.grace import orphan_save_grace
    from minilmd.daemon.child.orphans import find_orphans, terminate_orphans

    pids = find_orphans(scope)
    if not pids:
        return protocol.STOP_DONE
    grace = orphan_save_grace(scope.run_dir, scope.dir_fd)
    print(f"  trainer process(es) {pids} left by a killed supervisor: SIGTERM (they save first), SIGKILL after "
          f"{grace:.0f}s", file=out, flush=True)
    if timeout and timeout < grace:
        return _stop_orphans_within(scope, timeout, grace, out)
    terminate_orphans(scope, grace=grace)
    left = find_orphans(scope)
    print(f"  still running: {left}" if left else "  stopped", file=out)
    return protocol.STOP_FAILED if left else protocol.STOP_DONE


def _stop_orphans_within(scope: procs.RunScope, timeout: float, grace: float, out) -> int:
    """SIGTERM the orphans and wait `timeout` only; what still saves then is killed at the grace by the helper."""
    from minilmd.daemon.child.orphans import hand_over_kill, sigterm_orphans

    started = time.monotonic()
    launch, alive = sigterm_orphans(scope)
    left = procs.wait_gone(alive, timeout, interval=0.1)
    if launch is None or not left:
        print("  stopped", file=out)
        return protocol.STOP_DONE
    helper = hand_over_kill(launch, max(0.0, grace - (time.monotonic() - started)))
    print(f"  trainer process(es) {left} still saving after {timeout:.0f}s: not waited for any longer (exit "
          f"{protocol.STOP_FAILED}); the stop goes on: helper pid {helper} SIGKILLs them {grace:.0f}s after the "
          f"SIGTERM if they have not exited by then (`minilmd status {printable(scope.run_dir)}` shows them meanwhile)",
          file=out)
    return protocol.STOP_FAILED


def _checkpoint_report(state: StateJson, out, always: bool, owner: int | None = None, shown: str = "") -> int:
    """Where the newest checkpoint is; STOP_UNSYNCED when it is only in scratch. What state.json names is checked
    where it is: a scratch checkpoint gone (a reboot cleared scratch) is none, and run.remote's LATEST, when newer
    than state.json's record (a supervisor killed before it wrote it), is the remote's step. Before, a stop of a
    launch waiting for room for scratch after a reboot reported a step "only in scratch" at a path that did not
    exist, and the remote's older step from the killed supervisor's record: NOT SYNCED, exit 3, a false alarm."""
    looks = Looks()  # the paths state.json names, its user's to write: bounded, what stalls said (pathlooks.py)
    local_step, local_path = _local_there(state, owner, looks)
    remote = state.remote_checkpoint
    remote_step = _remote_step(remote, Path(state.run_dir) if state.run_dir else None, owner, looks)
    for said in looks.unanswered:
        print(f"  note: {printable(said)}: state.json's word taken", file=out)
    if always:  # a stage stopped while it waited has no checkpoint yet: "none", never "step None"
        local_words = f"local checkpoint step {local_step}" if local_step is not None else "no local checkpoint"
        verified = "" if remote is None or remote_step != remote.step else \
            f" ({'verified' if remote.verified else 'not verified'})"
        print(f"  {local_words}; remote checkpoint step {remote_step}{verified}" if remote_step is not None else
              f"  {local_words}; no remote checkpoint", file=out)
        if state.last_error:
            said = fold(state.last_error, shown, _long_texts(state))
            shown += f"\n{state.last_error}"
            print(f"  last error{error_context(state, time.time())}: {printable(said)}", file=out)
    if state.sync.state == SyncState.OFF or local_step is None or remote_step is not None and \
            remote_step >= local_step:
        return protocol.STOP_DONE
    step, path = local_step, local_path or "scratch"
    on_remote = f"step {remote_step}" if remote_step is not None else "no checkpoint"
    error = printable(fold(state.sync.error, shown, _long_texts(state))) if state.sync.error else None
    # after a final end (run.remote another run's: exit 2), its reason says what to fix first; never "copy it into
    # run.remote by hand", which may be another run's
    final = state.outcome is not None and state.outcome.exit in protocol.FINAL_EXIT_STATUSES
    how = "do what its end says, then start the run again (its first sync copies it)" if final else \
        "start the run again (its first sync copies it), or copy that directory into run.remote by hand"
    print(f"  NOT SYNCED (exit {protocol.STOP_UNSYNCED}): the newest checkpoint, step {step}, is only in scratch: "
          f"{printable(path)}; the remote has {on_remote}" + (f" (last sync error: {error})" if error else "") + ".\n"
          f"  It is lost if scratch is cleared (a reboot clears /dev/shm): {how}.", file=out)
    return protocol.STOP_UNSYNCED


def _local_there(state: StateJson, owner: int | None = None,
                 looks: Looks | None = None) -> tuple[int | None, str | None]:
    """(step, path) of the newest complete local checkpoint (one saved beside state.json's that it has not seen
    too: an orphan's save), (None, None) when there is none: state.json's names a directory gone, or without its
    manifest (scratch cleared by a reboot; a directory another user made there is no checkpoint either, as
    newest_local judges). A checkpoint state.json names without a path is taken at its word, and so is one whose
    scratch does not answer (looked at as pathlooks.py looks: bounded, said through `looks`)."""
    looks = looks or Looks()
    local = newest_local(state.local_checkpoint, owner, looks)  # what `status` says too (daemon/views/newest.py)
    if local is None or local.step is None:
        return None, None
    if local.path and not looks.look("scratch", Path(local.path).parent.parent, _is_regular,
                                     Path(local.path) / names.MANIFEST, default=True):
        return None, None
    return local.step, local.path


def _remote_step(remote: RemoteCheckpoint | None, run_dir: Path | None, owner: int | None = None,
                 looks: Looks | None = None) -> int | None:
    """The newest step run.remote has of the run: state.json's record, or the step the remote's LATEST names when
    newer (a file of the run's user, naming a step directory with its manifest, read as pathlooks.py looks, within
    the shared storage probe's bound: a hung mount is state.json's word, said through `looks`), and only while the
    remote's owner.json, read in the same look, names this run: a remote another run claimed since has that run's
    LATEST (review10d F5)."""
    recorded = remote.step if remote is not None else None
    if remote is None or not remote.path or is_url(remote.path) or not Path(remote.path).is_absolute():
        return recorded
    root = Path(remote.path).parent
    if run_dir is None:
        return recorded
    named = (looks or Looks()).look("run.remote", root, _latest_step, root, run_dir,
                                    own_uid() if owner is None else owner, default=None,
                                    timeout_s=SHARED_STORAGE_PROBE_S)
    if named is None:
        return recorded
    return named if recorded is None else max(recorded, named)


def _latest_step(root: Path, run_dir: Path, owner: int) -> int | None:
    try:
        claim = run_owner.checked(read_json(root / names.REMOTE_OWNER, max_bytes=names.OWNER_MAX_BYTES, owner=owner),
                                  names.REMOTE_OWNER)
    except (Unreadable, ValueError):
        return None
    if not run_owner.is_run(claim, run_dir):
        return None
    try:
        name = read_bytes(root / names.LATEST, max_bytes=POINTER_MAX_BYTES, owner=owner).decode().strip()
    except (Unreadable, UnicodeDecodeError):
        return None
    if not names.is_step_name(name) or not _is_regular(root / name / names.MANIFEST):
        return None
    return names.step_of(name)


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
