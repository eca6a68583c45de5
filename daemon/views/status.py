"""`minilmd status`, `minilmd logs`, `minilmd stop`: the operator's view of a run directory.

Everything here reads files the supervisor wrote (state.json, supervisor.log, logs/attempt-NNNN.log) and works
whether or not a supervisor is running. Light imports only: `minilmd status` must answer in well under a second.
Each function returns the command's exit status (0 fine, 2 not a run directory; `stop` has more:
protocol.STOP_*). What these files say is escaped before it reaches the terminal (minilmd/untrusted.py `printable`):
another user's run directory holds what that user wrote, escape sequences included.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
import time
from pathlib import Path

from minilmd import names, procs, protocol
from minilmd.daemon.runstate import fmt_time, new_lines, process_alive, tail_lines
from minilmd.daemon.states import SyncState
from minilmd.daemon.statesections import ChildInfo, GpuWait, Progress, SpaceWait, Staging, StateJson
from minilmd.daemon.views.fitwatch import fit_lines
from minilmd.daemon.views.liveness import load, orphan_lines, supervisor_alive
from minilmd.daemon.views.reproducible import reproducibility_lines
from minilmd.fmt import fmt_duration
from minilmd.fmt import fmt_mb as _mb
from minilmd.untrusted import Unreadable, printable

NOT_A_RUN = 2


def _run_problem(run_dir: Path) -> str | None:
    try:
        if not run_dir.exists():
            return f"{run_dir}: no such directory"
        if not run_dir.is_dir():
            return f"{run_dir}: not a directory"
        found = any((run_dir / name).exists() for name in (names.STATE, names.RUN_CONFIG_COPY, names.LOCK))
    except OSError as e:  # a directory of another user we may not look into
        return f"{run_dir}: cannot be read ({e.strerror or e})"
    if not found:
        return (f"{run_dir}: not a minilmd run directory (no {names.STATE}, {names.RUN_CONFIG_COPY} or "
                f"{names.LOCK}); give the run.dir of a run config, e.g. `minilmd status /path/to/run`")
    return None


def _is_a_run(run_dir: Path) -> bool:
    """Whether run_dir is a run directory; if not, says why on stderr (the caller exits NOT_A_RUN)."""
    problem = _run_problem(run_dir)
    if problem:
        print(problem, file=sys.stderr)
    return problem is None


def is_run_dir(run_dir: str | os.PathLike) -> bool:
    """Whether run_dir is a run directory; if not, says why on stderr."""
    return _is_a_run(Path(run_dir))


def summary_lines(state: StateJson, alive: bool, t: float | None = None) -> list[str]:
    """A few human lines from state.json (read tolerantly: `StateJson.from_dict`)."""
    t = t or time.time()
    lines = [_head_line(state, alive, t)]
    if state.reason:
        lines.append(f"  why: {state.reason}")
    if state.slurm:
        from minilmd.daemon.slurm.job import status_line

        lines.append(status_line(state.slurm))
    lines += _progress_lines(state.progress, alive)
    if state.child and alive:
        lines.append(_trainer_line(state.child, state, t))
    if (w := state.init_wait) and state.phase == "waiting_init":
        lines.append(f"  waiting for init.from: {w.why} (run dir {w.run_dir}; checked {w.checks} "
                     f"times since {_ago(t, w.since) if w.since else '-'}); starts from {w.root} "
                     f"once it has finished")
        if w.not_running and alive:
            lines.append(f"  {w.not_running}")
    if state.gpu_wait and state.phase == "waiting_gpu":
        lines += _gpu_lines(state.gpu_wait, t)
    if state.space_wait and state.phase == "waiting_space":
        lines.append(_space_line(state.space_wait, t))
    lines.append(_checkpoints_line(state, t))
    if (textfile := state.prometheus) is not None and textfile.problem:
        lines.append(f"  prometheus textfile {textfile.path} {textfile.problem}: this run's current gauges are not "
                     f"in it")
    lines += _staging_lines(state.staging)
    lines += _restart_lines(state, t)
    if state.overrides:
        lines.append(f"  overrides: {state.overrides}")
    if state.last_error:
        lines.append(f"  last error{_error_context(state, t)}: {state.last_error}")
    return lines


def _ago(t: float, then: float) -> str:
    return f"{fmt_duration(t - then)} ago"


def _head_line(state: StateJson, alive: bool, t: float) -> str:
    """The run, its phase and for how long, and whether its supervisor runs (or how it ended)."""
    since = state.since
    head = (f"run {state.run or '?'} ({state.run_dir or '?'}): {state.phase or '?'} for "
            f"{fmt_duration(t - since if since else None)}")
    if alive:
        return head + f"; supervisor pid {state.supervisor.pid} running"
    outcome = state.outcome
    if outcome:
        return head + f"; not running (ended {fmt_time(outcome.time)} with exit {outcome.exit})"
    return head + (f"; not running (last seen {fmt_time(state.updated)}, the supervisor did not exit "
                   f"cleanly: killed or crashed; `minilmd run` again resumes)")


def _progress_lines(p: Progress, alive: bool) -> list[str]:
    if p.step is None:
        return []
    total = p.total_steps
    parts = [f"step {p.step:,}" + (f"/{total:,} ({100 * p.step / total:.1f}%)" if total else "")]
    if p.loss is not None:
        parts.append(f"loss {p.loss:.4f}")
    if p.val_loss is not None:
        parts.append(f"val {p.val_loss:.4f}")
    if p.tok_s:
        parts.append(f"{p.tok_s:,.0f} tok/s")
    if p.eta_s is not None and alive:
        parts.append(f"ETA {fmt_duration(p.eta_s)}")
    return ["  " + "  ".join(parts)]


def _trainer_line(child: ChildInfo, state: StateJson, t: float) -> str:
    beat = state.progress.heartbeat
    devices = ",".join(str(d) for d in state.devices) or "cpu"
    return (f"  trainer pid {child.pid}, attempt {child.attempt}, devices {devices}, "
            f"heartbeat {_ago(t, beat) if beat else 'none yet'}, log {child.log}")


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
            f"{wait.checks} times; the trainer starts again once it fits (not counted as a restart)")


def _checkpoints_line(state: StateJson, t: float) -> str:
    """The local checkpoint, the remote one and the sync between them."""
    local, remote, sync = state.local_checkpoint, state.remote_checkpoint, state.sync
    if state.staging.state in ("fetching", "waiting_remote"):  # scratch holds none (metrics.jsonl's is gone)
        local = None
    line = "  local checkpoint: " + (
        f"step {local.step} ({'fetched from the remote ' if local.fetched else ''}"
        f"{_ago(t, local.time)})" if local and local.time else "none")
    if sync.state == "off":
        return line + "   remote: none configured"
    line += "   remote: " + (f"step {remote.step} ({_ago(t, remote.time)}, "
                             f"{'verified' if remote.verified else 'NOT verified'})"
                             if remote and remote.time else "none")
    line += f"   sync: {sync.state}"
    if sync.error and sync.state in ("failed", "stalled", "unavailable"):
        line += f" ({sync.error})"
    return line


def _staging_lines(staging: Staging) -> list[str]:
    if staging.stalled is not None:
        return [f"  {staging.stalled.what} not answering since {fmt_time(staging.stalled.since)} (stalled), "
                f"waiting for it"]
    if staging.unreachable_since is not None:
        return [f"  {staging.waiting or 'init source unreachable'} since {fmt_time(staging.unreachable_since)}, "
                f"retrying ({staging.unreachable})"]
    if staging.state in ("done", "not_started"):
        return []
    prog = f" {staging.progress}" if staging.progress is not None else ""
    return [f"  staging: {staging.state}{prog}" + (f" ({staging.error})" if staging.error else "")]


def _restart_lines(state: StateJson, t: float) -> list[str]:
    restarts = state.restarts
    if not restarts:
        return []
    last = restarts[-1]
    return [f"  restarts: {len(restarts)} (last: {last.cause} at step {last.step}, "
            f"{_ago(t, last.time) if last.time is not None else '-'} -> {last.action}; "
            f"{state.no_progress_streak} in a row without progress)"]


def _error_context(state: StateJson, t: float) -> str:
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
    out = out or sys.stdout
    run_dir = Path(run_dir)
    if not _is_a_run(run_dir):
        return NOT_A_RUN
    raw, unreadable = load(run_dir)
    state = StateJson.from_dict(raw) if raw is not None else None  # a wrongly typed field reads as its default
    alive = supervisor_alive(state)
    if as_json:
        print(json.dumps({"running": alive, "state": raw, **({"unreadable": unreadable} if unreadable else {})},
                         indent=2, sort_keys=True), file=out)
        return 0
    if unreadable:
        print(f"{run_dir}: {names.STATE} unreadable ({unreadable})", file=out)
        return 0
    if state is None:
        print(f"{run_dir}: no state.json yet (the supervisor has not started here, or is just starting)", file=out)
        return 0
    lines = summary_lines(state, alive) + orphan_lines(run_dir, state, alive) + _lineage_lines(run_dir)
    lines += fit_lines(run_dir)
    lines += reproducibility_lines(run_dir, state)  # daemon/views/reproducible.py
    from minilmd.daemon.views.curves import sparkline_line

    spark = sparkline_line(run_dir)
    if spark:
        lines.insert(next((i for i, line in enumerate(lines) if line.startswith("  step ")), 0) + 1, spark)
    print("\n".join(printable(line) for line in lines), file=out)  # each line built from state.json's strings
    return 0


def _lineage_lines(run_dir: Path) -> list[str]:
    """init.from behind the newest local checkpoint, stage by stage (daemon/phases/initwait.py lineage)."""
    from minilmd.config import ConfigError, load_config
    from minilmd.daemon.phases.initwait import lineage

    try:
        chain = lineage(load_config(run_dir / names.RUN_CONFIG_COPY, untrusted=True).checkpoint_dir)
    except (ConfigError, OSError):
        return []
    return [f"  lineage: {' <- '.join(chain)}"] if chain else []


def _attempt_logs(run_dir: Path) -> list[Path]:
    """The attempt logs of a run, from its logs/ directory itself: a link there (to another place's files) is not
    followed, as each log is opened without following one (tail_lines)."""
    folder = run_dir / names.ATTEMPT_LOGS
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
        return sorted(p for p in folder.iterdir() if names.is_attempt_log(p.name))
    except OSError:  # gone meanwhile, unreadable: no logs to show
        return []


def _tail(path: Path, n: int) -> tuple[str, int]:
    """The last n lines of a file and the offset of its end (read from at most its last MiB, a regular file only:
    daemon/runstate.py tail_lines); a file that is not one is "unreadable (why)"."""
    try:
        lines, size = tail_lines(path, n)
    except Unreadable as e:
        return f"unreadable ({e.why})\n", 0
    return "".join(printable(line) + "\n" for line in lines), size


def logs(run_dir: str | os.PathLike = ".", follow: bool = False, lines: int = 20, out=None,
         poll_s: float = 0.3) -> int:
    """The last `lines` lines of the supervisor's log and as many of the current attempt's trainer output; with
    follow, new lines of both as they come, switching to the next attempt's log when the supervisor starts one.
    Follows until interrupted."""
    out = out or sys.stdout
    run_dir = Path(run_dir)
    problem = _run_problem(run_dir)
    if problem and follow:
        # `logs -f` started beside `run` (the tmux launcher) may come before the run directory: wait for it
        print(f"{problem}\nwaiting for it to become a run (Ctrl-C to quit)...", file=sys.stderr, flush=True)
        try:
            while _run_problem(run_dir):
                time.sleep(poll_s)
        except KeyboardInterrupt:
            return NOT_A_RUN
        problem = None
    if problem:
        print(problem, file=sys.stderr)
        return NOT_A_RUN
    sup_path = run_dir / names.SUPERVISOR_LOG
    text, sup_off = _tail(sup_path, lines)
    out.write(f"==> {sup_path} <==\n{text}")
    attempts = _attempt_logs(run_dir)
    current = attempts[-1] if attempts else None
    cur_off = 0
    if current:
        text, cur_off = _tail(current, lines)
        out.write(f"==> {current} <==\n{text}")
    out.flush()
    if not follow:
        return 0
    try:
        while True:
            sup_off = _copy_new(sup_path, sup_off, "supervisor", out)
            if current:
                cur_off = _copy_new(current, cur_off, current.stem, out)
            attempts = _attempt_logs(run_dir)
            if attempts and attempts[-1] != current:
                if current:
                    cur_off = _copy_new(current, cur_off, current.stem, out)
                current, cur_off = attempts[-1], 0
                out.write(f"==> {current} (new attempt) <==\n")
            out.flush()
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return 0


def _copy_new(path: Path, offset: int, label: str, out) -> int:
    try:
        lines, offset = new_lines(path, offset)
    except Unreadable:
        return offset  # said once by _tail; a file that becomes one again is followed from where it was
    for line in lines:
        out.write(f"[{label}] {printable(line.decode(errors='replace'))}\n")
    return offset


# --- stop ---------------------------------------------------------------------------------------------------------

ORPHAN_GRACE_S = 120.0
"""How long `minilmd stop` lets an orphaned trainer save before it kills it."""


def stop(run_dir: str | os.PathLike = ".", timeout: float = 0.0, out=None) -> int:
    """SIGTERM to the run's supervisor; wait until it exited (the trainer saves, the last sync runs); report.
    timeout 0: wait as long as it takes. The exit status is one of protocol.STOP_*: 0 stopped (or not running),
    1 not stopped, 2 not a run, 3 stopped but the newest checkpoint is only in scratch. A run directory of another
    user is refused, its owner named (root may stop anyone's run). Only a process proven to be the run's is ever
    signalled (minilmd/procs.py): the supervisor that holds the run's lock and carries its identity, or the trainer
    it left behind (daemon/child/orphans.py); never one a file of the run names by its pid."""
    out = out or sys.stdout
    run_dir = Path(run_dir)
    if not _is_a_run(run_dir):
        return protocol.STOP_NOT_A_RUN
    try:
        scope = procs.scope_of(run_dir)
    except (procs.Refused, OSError) as e:
        print(str(e), file=out)
        return protocol.STOP_FAILED
    raw, unreadable = load(run_dir)
    if unreadable:
        print(f"{run_dir}: {names.STATE} unreadable ({unreadable}): the supervisor is found by its lock", file=out)
    state = StateJson.from_dict(raw)
    try:
        live = _live_supervisor(run_dir)
    except OSError as e:  # supervisor.lock not readable (root squashed on NFS, say)
        print(f"{run_dir}: {names.LOCK} cannot be read ({e.strerror or e}): whether a supervisor holds it is unknown; "
              f"nothing signalled", file=out)
        return protocol.STOP_FAILED
    if live is None:
        outcome = state.outcome
        print(f"{run_dir}: not running" + (f" (ended {fmt_time(outcome.time)}, exit {outcome.exit}: "
                                           f"{printable(outcome.reason)})" if outcome else ""), file=out)
        if _stop_orphans(run_dir, out) != protocol.STOP_DONE:
            return protocol.STOP_FAILED
        return _checkpoint_report(state, out, always=False)
    if live.host and live.host != socket.gethostname():
        print(f"supervisor pid {live.pid} runs on {printable(live.host)}, not on this host: not signalled; run "
              f"`minilmd stop` there", file=out)
        return protocol.STOP_FAILED
    pid, ticks = live.pid, procs.process_start_ticks(live.pid)
    why = procs.signal_supervisor(scope, pid, ticks, live.launch_id, signal.SIGTERM)
    if why is None:
        print(f"SIGTERM sent to supervisor pid {pid}; waiting for the trainer's save and the last sync...", file=out,
              flush=True)
    elif why == "it has ended":
        print(f"supervisor pid {pid} ended before the signal", file=out)
    else:
        print(f"pid {pid}, named by {names.LOCK}, is not proven to be this run's supervisor ({why}): not "
              f"signalled", file=out)
        return protocol.STOP_FAILED
    started = time.monotonic()
    last_phase = None
    while process_alive(pid, ticks):
        if timeout and time.monotonic() - started > timeout:
            print(f"supervisor pid {pid} still running after {timeout:.0f}s (see `minilmd logs {run_dir}`)", file=out)
            return protocol.STOP_FAILED
        state = _reread(run_dir, state)
        if state.phase != last_phase:
            last_phase = state.phase
            print(f"  {printable(last_phase)}" + (f": {printable(state.reason)}" if state.reason else ""), file=out,
                  flush=True)
        time.sleep(0.2)
    state = _reread(run_dir, state)
    outcome = state.outcome
    print(f"stopped after {time.monotonic() - started:.1f}s: exit {outcome.exit if outcome else None} "
          f"({printable(outcome.reason) if outcome else None})", file=out)
    return _checkpoint_report(state, out, always=True)


def _reread(run_dir: Path, state: StateJson) -> StateJson:
    """state.json again; the last one read while there is none (or it cannot be read)."""
    raw, _ = load(run_dir)
    return StateJson.from_dict(raw) if raw else state


def _live_supervisor(run_dir: Path):
    """The holder of the run lock (daemon/host/lock.py LockInfo: pid, host, launch id), None when no process holds
    it. Never state.json's pid: anyone who can write the run directory writes that. OSError when the lock cannot be
    opened."""
    from minilmd.daemon.host.lock import lock_holder

    holder = lock_holder(run_dir)
    return holder if holder is not None and holder.pid else None


def _stop_orphans(run_dir: Path, out) -> int:
    """A supervisor killed with SIGKILL leaves its trainer running: `stop` must stop that one too (it saves on
    SIGTERM and exits; SIGKILL after the grace). Only the trainer this run recorded, never another process."""
    from minilmd.daemon.child.orphans import find_orphans, terminate_orphans

    pids = find_orphans(run_dir)
    if not pids:
        return protocol.STOP_DONE
    print(f"  trainer process(es) {pids} left by a killed supervisor: SIGTERM (they save first), SIGKILL after "
          f"{ORPHAN_GRACE_S:.0f}s", file=out, flush=True)
    terminate_orphans(run_dir, grace=ORPHAN_GRACE_S)
    left = find_orphans(run_dir)
    print(f"  still running: {left}" if left else "  stopped", file=out)
    return protocol.STOP_FAILED if left else protocol.STOP_DONE


def _checkpoint_report(state: StateJson, out, always: bool) -> int:
    """Where the newest checkpoint is; STOP_UNSYNCED when it is only in scratch."""
    local_step = state.local_checkpoint.step if state.local_checkpoint else None
    remote = state.remote_checkpoint
    if always:  # a stage stopped while it waited has no checkpoint yet: "none", never "step None"
        local_words = f"local checkpoint step {local_step}" if local_step is not None else "no local checkpoint"
        print(f"  {local_words}; remote checkpoint step {remote.step} "
              f"({'verified' if remote.verified else 'not verified'})" if remote and remote.step is not None else
              f"  {local_words}; no remote checkpoint", file=out)
        if state.last_error:
            print(f"  last error{_error_context(state, time.time())}: {printable(state.last_error)}", file=out)
    unsynced = _only_in_scratch(state)
    if unsynced is None:
        return protocol.STOP_DONE
    step, path = unsynced
    on_remote = f"step {remote.step}" if remote and remote.step is not None else "no checkpoint"
    error = printable(state.sync.error) if state.sync.error else None
    print(f"  NOT SYNCED (exit {protocol.STOP_UNSYNCED}): the newest checkpoint, step {step}, is only in scratch: "
          f"{printable(path)}; the remote has {on_remote}" + (f" (last sync error: {error})" if error else "") + ".\n"
          "  It is lost if scratch is cleared (a reboot clears /dev/shm): start the run again (its first sync "
          "copies it), or copy that directory into run.remote by hand.", file=out)
    return protocol.STOP_UNSYNCED


def _only_in_scratch(state: StateJson) -> tuple[int, str] | None:
    """(step, path) of the newest local checkpoint when a remote is set and has none as new: the last sync failed,
    or a trainer saved with no supervisor left to sync (an orphan stopped by `stop`). Reads the checkpoint root
    beside the checkpoint state.json names, for a save state.json has not seen."""
    if state.sync.state == SyncState.OFF:
        return None
    local = state.local_checkpoint
    step, path = (local.step, local.path) if local else (None, None)
    if path:
        root = Path(path).parent
        try:
            saved = [names.step_of(p) for p in root.iterdir() if names.is_step_name(p.name)
                     and (p / names.MANIFEST).is_file()]
        except OSError:
            saved = []
        if saved and (step is None or max(saved) > step):
            step, path = max(saved), str(root / names.step_name(max(saved)))
    if step is None:
        return None
    synced = state.remote_checkpoint.step if state.remote_checkpoint else None
    if synced is not None and synced >= step:
        return None
    return step, path or "scratch"
