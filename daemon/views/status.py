"""`minilmd status`: the operator's view of a run directory (`minilmd logs`: daemon/views/logs.py; `minilmd stop`:
daemon/views/stop.py).

Everything here reads files the supervisor and the trainer wrote (state.json, metrics.jsonl, the heartbeat), through
the descriptor of the run directory daemon/views/runarg.py judged (open_run), and works
whether or not a supervisor is running. Light imports only: `minilmd status` must answer in well under a second.
Each function returns the command's exit status (0 fine, 2 not a run directory; `stop` has more:
protocol.STOP_*). What these files say is escaped before it reaches the terminal (minilmd/untrusted.py `printable`):
another user's run directory holds what that user wrote, escape sequences included.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from minilmd import names, protocol
from minilmd.daemon.base import stoprequest
from minilmd.daemon.base.keeper import unguarded
from minilmd.daemon.base.runstate import fmt_time, reference_pass_rate, reference_pass_words, state_owners
from minilmd.daemon.base.seen import Seen, supervisor_seen
from minilmd.daemon.base.states import FINAL_PHASES, FIRST_HEARTBEAT
from minilmd.daemon.base.statesections import ChildInfo, GpuWait, Progress, SpaceWait, Staging, StateJson
from minilmd.daemon.views.fitwatch import fit_lines
from minilmd.daemon.views.interrupted import staging_interrupted, sync_interrupted
from minilmd.daemon.views.lastwords import could_not_start, ended_in_events, no_state_lines, starting_holder
from minilmd.daemon.views.liveness import load, orphan_lines, trainer_alone
from minilmd.daemon.views.logs import logs  # noqa: F401 - `minilmd logs`, status's neighbour (daemon/views/logs.py)
from minilmd.daemon.views.newest import changed_sections, current
from minilmd.daemon.views.pathlooks import Looks
from minilmd.daemon.views.remotenow import RemoteNow, remote_words
from minilmd.daemon.views.reproducible import reproducibility_lines
from minilmd.daemon.views.run_context import RunContext
from minilmd.daemon.views.runarg import opened_run, run_problem
from minilmd.daemon.views.saidonce import fold
from minilmd.daemon.views.savedpass import saved_pass_words
from minilmd.dirfd import Dir
from minilmd.fmt import fmt_duration, fmt_times, not_answering
from minilmd.fmt import fmt_mb as _mb
from minilmd.proc_info import of_another_boot
from minilmd.run_states import SYNC_TROUBLE, Phase, StagingState, SyncState
from minilmd.scratch_end import SCRATCH_GONE_WHY
from minilmd.untrusted import printable


def _is_a_run(run_dir: Path, command: str = "status") -> bool:
    """Whether run_dir is a run directory this user can read (daemon/views/runarg.py); if not, says why on
    stderr. A command that also takes a config file calls runarg.opened_run instead."""
    problem = run_problem(run_dir, command)
    if problem:
        print(problem, file=sys.stderr)
    return problem is None


def is_run_dir(run_dir: str | os.PathLike, command: str = "status") -> bool:
    """Whether run_dir is a run directory; if not, says why on stderr (suggesting `minilmd COMMAND` on a run)."""
    return _is_a_run(Path(run_dir), command)


def summary_lines(state: StateJson, alive: bool, t: float | None = None, alone: list[int] | None = None,
                  saved_pass: str = "", remote_now: RemoteNow | None = None, seen: Seen | None = None,
                  looks: Looks | None = None) -> list[str]:
    """A few human lines from state.json (read tolerantly: `StateJson.from_dict`); `alone`: the pids of the trainer
    a killed supervisor left training (liveness.trainer_alone); `saved_pass`: what a stopped DPO reference pass
    kept at step 0 (savedpass.py), said on the step line when no pass runs; `remote_now`: what run.remote holds
    now (remotenow.look_now); `seen`: where its supervisor is and how that is known (daemon/base/seen.py; not
    given: its record alone); `looks`: the view's looks at the paths state.json names (pathlooks.py)."""
    t = t or time.time()
    seen = seen or supervisor_seen(state)
    lines = [_head_line(state, alive, t, alone, seen)]
    why = _why(state) if state.reason else ""
    if why:  # a killed supervisor's mid-run is what it last wrote, not why anything happens now (user10 #6)
        stale = not alive and not state.outcome and state.phase not in FINAL_PHASES and not seen.elsewhere
        lines += _block("  last reason: " if stale else "  why: ", why)
    if state.slurm:
        from minilmd.daemon.slurm.job import status_line

        lines.append(status_line(state.slurm))
    lines += _progress_lines(state.progress, alive, saved_pass)
    if state.child and alive:
        lines.append(_trainer_line(state.child, state, t))
    if (w := state.init_wait) and state.phase == Phase.WAITING_INIT:
        lines.append(f"  waiting for init.from: {w.why} (run dir {w.run_dir}; checked {fmt_times(w.checks)} "
                     f"since {_ago(t, w.since) if w.since else '-'}); starts from {w.root} "
                     f"once it has finished")  # its why says whether the predecessor runs (initwait.waiting_why)
    if state.gpu_wait and state.phase == Phase.WAITING_GPU:
        lines += _gpu_lines(state.gpu_wait, t)
    if state.space_wait and state.phase == Phase.WAITING_SPACE:
        lines.append(_space_line(state.space_wait, t))
    lines.append(_checkpoints_line(state, t, alive, remote_now, shown=why, looks=looks))
    if (textfile := state.prometheus) is not None and textfile.problem:
        lines.append(f"  prometheus textfile {textfile.path} {textfile.problem}: this run's current gauges are not "
                     f"in it")
    lines += _staging_lines(state.staging, staging_interrupted(state, alive))
    lines += _restart_lines(state, t)
    if state.overrides:
        lines.append(f"  overrides: {state.overrides}")
    lines += [f"  note: {note}" for note in state.notes]  # what init.from's checkpoint says (init_from_notes)
    if state.last_error:  # a failed run's is its why, a refused sync's the sync's error: said once (saidonce.py)
        said = fold(state.last_error, "\n".join([why, *lines]), (state.sync.error, state.reason))
        lines += _block(f"  last error{error_context(state, t)}: ", said)
    return lines


BLOCK_LINES = 16
"""The most lines of a reason shown (a trainer's refusal: its sentence, then the [model] lines to paste)."""


def _block(head: str, text: str) -> list[str]:
    """A reason of several lines (a trainer's refusal, daemon/child/death.py) as lines, each printed escaped on
    its own: the first after `head`, the rest as they are indented (the lines to paste), at most BLOCK_LINES."""
    first, *rest = text.split("\n")
    more = len(rest) - (BLOCK_LINES - 1)
    shown = [head + first] + [line if line.startswith(" ") else f"    {line}" for line in rest[:BLOCK_LINES - 1]]
    return shown + ([f"    ... {more} more line(s): `minilmd logs` has them all"] if more > 0 else [])


def _ago(t: float, then: float) -> str:
    return f"{fmt_duration(t - then)} ago"


def phase_reason(state: StateJson) -> str:
    """The reason of the phase as the views say it (status's why, stop's phases): state.reason, but during a wait
    of staging that wait (the phase's reason is how staging began, the GPU's: a new user read "why: no GPU
    needed" of a run waiting for its remote, and of one waiting for its corpus's share): for run.remote, for a
    source that cannot be read or a scratch without room now (staging.waiting), for a source that does not answer."""
    if state.phase != Phase.STAGING:
        return state.reason
    staging = state.staging
    if staging.state == StagingState.WAITING_REMOTE:
        return "waiting for run.remote's newest checkpoint before training (the fetch is retried)"
    if staging.stalled is not None:
        return f"waiting for {staging.stalled.what}, which does not answer, before training"
    if staging.unreachable_since is not None:
        return f"waiting before training: {staging.waiting or 'init source unreachable'} (retried until it can go on)"
    return state.reason


def _why(state: StateJson) -> str:
    """phase_reason; training's, how it began (its first heartbeat), as the phase that goes on."""
    if state.phase == Phase.TRAINING and state.reason.startswith(FIRST_HEARTBEAT):
        return f"training, since the {state.reason}"
    return phase_reason(state)


def _head_line(state: StateJson, alive: bool, t: float, alone: list[int] | None = None,
               seen: Seen | None = None) -> str:
    """The run, its phase and for how long (a `done` one by how it ended: `stopped`, `early-stopped`, as `status
    --all` shows it), and whether its supervisor runs (or how it ended; of a killed one, whether the trainer it
    left, `alone`'s pids, trains on: "not running" alone read as nothing training; of another host's, that this
    host cannot check it: `seen`, daemon/base/seen.py)."""
    from minilmd.daemon.views.overview import shown_phase

    since = state.since
    run = f"run {state.run or '?'} ({state.run_dir or '?'}): "
    phase = shown_phase({"phase": state.phase, "ended": protocol.how_ended(state.to_dict()),
                         "staging_state": state.staging.state}) if state.phase else "?"
    head = run + f"{phase} for {fmt_duration(t - since if since else None)}"
    seen = seen or supervisor_seen(state)
    if alive:
        return head + "; " + seen.running_words()
    if seen.unjudged:  # its record's supervisor is gone, another pid holds the run lock: neither dead nor running
        return run + (f"supervisor not judged: {seen.unjudged}; state.json was last written {fmt_time(state.updated)} "
                      f"in {state.phase or '?'} by pid {state.supervisor.pid}, gone now")
    outcome = state.outcome
    if outcome:
        return head + f"; not running (ended {fmt_time(outcome.time)} with exit {outcome.exit})"
    if seen.elsewhere:  # not known dead from here: never "killed or crashed"
        return run + seen.elsewhere_words(state.phase)
    # its phase is only what a dead supervisor last wrote: never "training for ..." of a run nothing trains
    if alone:
        return run + (f"supervisor not running (killed or crashed, last seen {fmt_time(state.updated)} in "
                      f"{state.phase or '?'}) but its trainer is (pid {', '.join(map(str, alone))}): `minilmd run` "
                      f"again stops that trainer (it saves first) and resumes")
    if of_another_boot(state.supervisor.boot):  # not "killed or crashed": the machine went down under it
        return run + (f"not running (last seen {fmt_time(state.updated)} in {state.phase or '?'}; this host has "
                      f"restarted since (another boot id); `minilmd run` again resumes)")
    return run + (f"not running (last seen {fmt_time(state.updated)} in {state.phase or '?'}, the supervisor did not "
                  f"exit cleanly: killed or crashed; `minilmd run` again resumes){seen.judged()}")


def _earlier_trainers(p: Progress) -> bool:
    """Whether the step is an earlier trainer's: a restart set its rates aside (rates_awaited_since) and no trainer
    has beaten since (a restarted trainer's first beat gives the step it resumed from, runstate.apply_progress). It
    may not be where the run resumes (the remote's older checkpoint after scratch was lost), and its total not the
    budget's now (a config edited before the restart): user9 F11 saw `step 753/3,000` while staging a run of 900."""
    return p.rates_awaited_since is not None and (p.heartbeat is None or p.heartbeat < p.rates_awaited_since)


STEP_WORDS = ("step", "last known step")
"""The words the step line begins with (_progress_lines): the run's step, or the step of the trainer before a
restart; the sparkline and the earlier lineage's words go under it."""


def _progress_lines(p: Progress, alive: bool, saved_pass: str = "") -> list[str]:
    if p.step is None:
        return []
    total = p.total_steps
    if _earlier_trainers(p):  # staging, a fetch, a compile: the step and total are the trainer's before the restart
        parts = [f"{STEP_WORDS[1]} {p.step:,}" + (f" (of {total:,} then)" if total else "")]
    else:
        parts = [f"{STEP_WORDS[0]} {p.step:,}" + (f"/{total:,} ({100 * p.step / total:.1f}%)" if total else "")]
    if saved_pass and not (alive and p.reference_pass):  # a pass running says how far it is, below
        parts[0] += saved_pass
    if p.loss is not None:
        parts.append(f"loss {p.loss:.4f}")
    if p.val_loss is not None:
        parts.append(f"val {p.val_loss:.4f}")
    if p.lr is not None:  # the rate of the trainer's last step (its schedule at the run's peak rate)
        parts.append(f"lr {p.lr:.3g}")
    if p.tok_s:
        parts.append(f"{p.tok_s:,.0f} tok/s")
    if p.eta_s is not None and alive:
        parts.append(f"ETA {fmt_duration(p.eta_s)}")
    elif p.rates_awaited_since is not None and alive:  # an earlier trainer's rate would count staging as training
        parts.append(f"no ETA until the new trainer logs a step (since {fmt_time(p.rates_awaited_since)})")
    if alive and (ref := p.reference_pass) and len(ref) in (2, 4):  # read typed: a list of ints
        rate = reference_pass_rate(ref)  # before step 0: training waits for it, and no step gives an ETA
        parts.append(reference_pass_words(ref) + (
            f", {rate[0]:,.1f} pairs/s, ETA {fmt_duration(rate[1])}" if rate else ""))
    return ["  " + "  ".join(parts)]


def _trainer_line(child: ChildInfo, state: StateJson, t: float) -> str:
    """The trainer now. A heartbeat older than its launch is the trainer's before a restart, not its own: said as
    none yet (a new user read `starting for 7s ... attempt 3, heartbeat 13s ago` right after a SIGKILL)."""
    beat = state.progress.heartbeat
    devices = ",".join(str(d) for d in state.devices) or "cpu"
    started = child.started if isinstance(child.started, (int, float)) else None
    if beat and started is not None and beat < started:
        said = f"none yet (the trainer before it beat last {_ago(t, beat)})"
    else:
        said = _ago(t, beat) if beat else "none yet"
    return f"  trainer pid {child.pid}, attempt {child.attempt}, devices {devices}, heartbeat {said}, log {child.log}"


def _gpu_lines(gpu_wait: GpuWait, t: float) -> list[str]:
    lines = []
    for d in gpu_wait.devices:
        if not isinstance(d, dict):
            continue  # a damaged entry
        why = ("free: " + ", ".join(d.get("checks") or []) if d.get("free")
               else "; ".join(d.get("reasons") or ["busy"]))
        lines.append(f"  GPU {d.get('index')}: {why} (since {fmt_duration(t - d['since']) if d.get('since') else '-'})")
        lines += [f"    fallback: {f}" for f in d.get("fallbacks") or []]
    return lines


def _space_line(wait: SpaceWait, t: float) -> str:
    """The wait for room in scratch: how long, the numbers, and that it is not a restart (no limit counts it)."""
    since = wait.since
    return (f"  scratch: full for {fmt_duration(t - since if since else None)}: a checkpoint needs "
            f"{_mb(wait.needs)}, {_mb(wait.free)} free in {wait.path}; checked "
            f"{fmt_times(wait.checks)}; the trainer starts again once it fits (not counted as a restart)")


def _gone(path: str, looks: Looks | None = None) -> bool:
    """Whether the checkpoint at `path` (state.json's: only looked at, never opened, as pathlooks.py looks) is
    known not to be there now; a place that does not answer is not known gone."""
    return not (looks or Looks()).look("the checkpoint", path, os.path.lexists, path, default=True)


def _checkpoints_line(state: StateJson, t: float, alive: bool = True, remote_now: RemoteNow | None = None,
                      shown: str = "", looks: Looks | None = None) -> str:
    """The local checkpoint, the remote one (daemon/views/remotenow.py) and the sync between them (one in progress
    that no supervisor carries on: daemon/views/interrupted.py); the sync's error "said above" when `shown` (the
    why) holds it (saidonce.py)."""
    local, sync = state.local_checkpoint, state.sync
    # scratch holds none (metrics.jsonl's is gone)
    if state.staging.state in (StagingState.FETCHING, StagingState.WAITING_REMOTE):
        local = None
    line = "  local checkpoint: " + (
        f"step {local.step} ({'fetched from the remote ' if local.fetched else ''}"
        f"{_ago(t, local.time)})" if local and local.time else "none")
    if local is None and (gone := state.local_gone) is not None:  # the supervisor found scratch emptied
        line += f" (step {gone.step} is gone from scratch: emptied, by a reboot?; {state.resume_words()})"
    elif (local and local.path and not alive and sync.state != SyncState.OFF and not supervisor_seen(state).elsewhere
          and _gone(local.path, looks)):  # a finished run gave its scratch back: the save it names is on the remote
        line += f", gone from scratch ({SCRATCH_GONE_WHY})"
    if sync.state == SyncState.OFF:  # where the only copy is: a scratch in /dev/shm is lost at a reboot
        if local and local.path and (host := supervisor_seen(state).elsewhere):  # that host's scratch, not ours
            return line + (f"   remote: none configured (checkpoints only in scratch on host {host}, the newest at "
                           f"{local.path}: a reboot of {host} may lose them; not looked at from here)")
        if local and local.path and _gone(local.path, looks):
            return line + (f"   remote: none configured (checkpoints only in scratch, and the newest, {local.path}, "
                           f"is gone: lost with scratch)")
        where = f", the newest at {local.path}" if local and local.path else ""
        return line + f"   remote: none configured (checkpoints only in scratch{where}: a reboot may lose them)"
    line += "   remote: " + remote_words(state, t, alive, remote_now)
    if cut := sync_interrupted(state, alive):
        return line + f"   sync: {cut}"
    line += f"   sync: {sync.state}"
    if sync.error and sync.state in SYNC_TROUBLE:
        line += f" ({fold(sync.error, shown, (sync.error,))})"
    elif sync.progress and sync.state == SyncState.RUNNING:
        line += f", {sync.progress}"
    return line


def _staging_lines(staging: Staging, interrupted: str | None = None) -> list[str]:
    if interrupted:  # no supervisor carries it on: what it waited for is said in it
        return [interrupted]
    if staging.stalled is not None:
        return [f"  {not_answering(staging.stalled.what, staging.stalled.since)}, waiting for it"]
    if staging.unreachable_since is not None:
        return [f"  {staging.waiting or 'init source unreachable'} since {fmt_time(staging.unreachable_since)}, "
                f"retrying ({staging.unreachable})"]
    if staging.state in (StagingState.DONE, StagingState.NOT_STARTED):
        return []
    prog = f" {staging.progress}" if staging.progress is not None else ""
    return [f"  staging: {staging.state}{prog}" + (f" ({staging.error})" if staging.error else "")]


def _restart_lines(state: StateJson, t: float) -> list[str]:
    """The restarts restart.max_restarts counts, those since the start after the run's last end; where the run
    had restarts before that start, the start's time and the run's count since it began say which count it is."""
    restarts, earlier = state.restarts, state.earlier_restarts
    if not restarts and not earlier:
        return []
    since = "" if not earlier else \
        f" since the start at {fmt_time(state.restarts_since)} ({state.run_restarts} since the run began)"
    if not restarts:
        return [f"  restarts: 0{since}"]
    last = restarts[-1]
    at = f" at step {last.step}" if last.step is not None else ""  # a trainer that died before its first step
    return [f"  restarts: {len(restarts)}{since} (last: {last.cause}{at}, "
            f"{_ago(t, last.time) if last.time is not None else '-'} -> {last.action}; "
            f"{state.no_progress_streak} in a row without progress)"]


def error_context(state: StateJson, t: float) -> str:
    """" (3m ago, at step 130; training went on to step 240)": tells a current problem from an old one."""
    when, at = state.last_error_at, state.last_error_step
    if not when:
        return ""
    parts = [_ago(t, when)] + ([f"at step {at}"] if at is not None else [])
    step = state.progress.step
    if at is not None and step is not None and step > at:
        parts.append(f"training went on to step {step}")
    return " (" + ", ".join(parts[:2]) + ("; " + parts[2] if len(parts) > 2 else "") + ")"


def status(run_dir: str | os.PathLike = ".", as_json: bool = False, out=None) -> int:
    """The run directory judged (runarg.open_run), every file of it read through its descriptor: a directory put
    at its path meanwhile (by whoever can rename one above it) is never what is shown under its name."""
    out = out or sys.stdout
    found, refused = opened_run(run_dir)  # a run directory, or a config file naming one
    if found is None:
        return refused
    with found as run:
        return _status(run, as_json, out)


def _status(run: Dir, as_json: bool, out) -> int:
    """status of the run directory open in `run`: `run_dir` (its real path) names it, the readers that take a path
    are given `inside` (/proc/self/fd/N: its names looked up in the directory the descriptor holds)."""
    run_dir, inside = run.path, run.inside
    raw, unreadable = load(run_dir, run.fd)
    written = StateJson.from_dict(raw) if raw is not None else None  # a wrongly typed field reads as its default
    seen = supervisor_seen(written, run_dir, run.fd, os.fstat(run.fd).st_uid) if written is not None else None
    alive = seen is not None and seen.alive is True
    # no supervisor keeps state.json up to date: what the trainer wrote since (daemon/views/newest.py), --json too
    looks = Looks()  # the paths state.json and run.toml name, their user's to write: bounded, what stalls said
    state = current(inside, written, alive, os.fstat(run.fd).st_uid, looks) if written is not None else None
    state, claims = _as_read(run, state, looks) if state is not None else (None, None)
    if as_json:
        _print_json(run, raw, changed_sections(written, state) if written is not None and state is not None
                    else {}, alive, unreadable, out, unguarded(state, alive) if state is not None else None)
        return 0
    if unreadable:
        print(f"{printable(run_dir)}: {names.STATE} unreadable ({unreadable})", file=out)
        return 0
    if state is None:  # none yet, or its supervisor gave up before it could write one (its end in events.jsonl)
        print("\n".join(printable(line) for line in no_state_lines(run_dir, run.fd)), file=out)
        return 0
    alone = trainer_alone(run_dir, state, alive, run.fd)  # a killed supervisor's trainer, still training
    context = RunContext(run)
    lines = summary_lines(state, alive, alone=alone, saved_pass=saved_pass_words(run_dir, state, run.fd, looks),
                          remote_now=context.remote_now(state, alive, looks), seen=seen, looks=looks)
    lines += orphan_lines(run_dir, state, alone, inside)
    lines += context.lineage_lines(state, looks) + context.corpus_owner_lines(looks)
    lines += [own_root] if (own_root := _scratch_root(run)[0]) else []
    if claims:
        lines.insert(1, claims)
    if request := stoprequest.status_line(run_dir, state.supervisor.systemd_unit, run.fd):  # `minilmd stop` left it
        lines.insert(1, request)
    if alone_now := unguarded(state, alive):  # its tmux session closed under it: nothing starts it again
        lines.insert(1, f"  {alone_now}")
    from minilmd.daemon.views.curves import earlier_words, read_timeline, sparkline_line

    metrics = read_timeline(inside, recent=True)  # metrics.jsonl's end once, the current lineage's (after --fresh)
    lines += fit_lines(inside, metrics.records)
    lines += reproducibility_lines(inside, state)  # daemon/views/reproducible.py
    step_line = tuple(f"  {words} " for words in STEP_WORDS)
    after_step = next((i for i, line in enumerate(lines) if line.startswith(step_line)), 0) + 1
    if earlier := earlier_words(metrics):
        lines.insert(after_step, f"  {earlier}: status and plot show the current one only")
    if spark := sparkline_line(inside, upto=state.progress.step):  # the step line's moment
        lines.insert(after_step, spark)
    lines += [f"  note: {said}" for said in looks.unanswered]  # a path of its files that stalls (pathlooks.py)
    print("\n".join(printable(line) for line in lines), file=out)  # each line built from state.json's strings
    return 0


def _as_read(run: Dir, state: StateJson, looks: Looks | None = None) -> tuple[StateJson, str | None]:
    """state as shown for the directory status read: when its state.json names another run directory (a run dir
    copied or moved here, or a state.json someone planted: another user's made `status` print the victim's run name
    and path), the run is this directory, named by it, and a line says what the file claims."""
    claimed, run_dir = state.run_dir, run.path
    if not claimed or _same_dir(Path(claimed), run, looks):
        return state, None
    shown = dataclasses.replace(state, run=run_dir.name, run_dir=str(run_dir))
    return shown, (f"  its state.json names run {state.run or '?'} in {claimed}, another directory (moved or copied "
                   f"here, or not this run's): shown as what this directory holds")


def _same_dir(claimed: Path, run: Dir, looks: Looks | None = None) -> bool:
    """Whether state.json's claim leads to the directory read (its descriptor's: never the path's, which another
    directory may stand at by now). The claim is looked at as pathlooks.py looks: bounded, a link there not
    followed (a link is not the directory); one that does not answer is not the same."""
    if claimed == run.path:
        return True
    return (looks or Looks()).look("the run directory state.json names", claimed, _identity, claimed,
                                   default=None) == run.identity


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path` itself, an lstat (nothing opened, no link followed); None when it cannot be had."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):  # gone, unreachable, a NUL in the claim
        return None
    return st.st_dev, st.st_ino


def _print_json(run: Dir, raw: dict | None, caught_up: dict, alive: bool, unreadable: str, out,
                unguarded_words: str | None = None) -> None:
    """`status --json`: state.json as read, with the sections the trainer's own files moved on since laid over it
    (`caught_up`, from newest.changed_sections: the facts plain status shows, in the file's shape), and whether
    there were any; "unguarded" when nothing would start its running supervisor again (daemon/base/keeper.py: the
    tmux launcher reads it)."""
    run_dir = run.path
    left = stoprequest.as_json(run_dir, dir_fd=run.fd)  # `minilmd stop` left it: an automatic restart will not start it
    state = {**raw, **caught_up} if raw is not None else None
    starting = starting_holder(run_dir, run.fd) if raw is None and not unreadable else None  # a teammate's too
    end = ended_in_events(run.inside, state_owners(run_dir, run.fd)) if raw is None and not unreadable and \
        not starting else None
    own_root = _scratch_root(run)[1]
    why = could_not_start(run_dir, run.fd) if raw is None and not unreadable and not starting and not end else None
    print(json.dumps({"running": alive or starting is not None, "state": state, "caught_up": bool(caught_up),
                      "stop_request": left, **({"unreadable": unreadable} if unreadable else {}),
                      **({"scratch_root": own_root} if own_root else {}),
                      **({"starting_pid": starting.pid} if starting else {}),
                      **({"ended_in_events": end.to_dict()} if end else {}),
                      **({"could_not_start": why} if why else {}),
                      **({"unguarded": unguarded_words} if unguarded_words else {})},
                     indent=2, sort_keys=True), file=out)


def _scratch_root(run: Dir) -> tuple[str, dict | None]:
    """The private scratch root run.dir's record names (another user took the default's: minilmd/scratch_root.py),
    read through the run directory's descriptor as its owner's file; ("", None) when the run uses the default."""
    from minilmd.scratch_root import status_words

    return status_words(run.inside, os.fstat(run.fd).st_uid)
