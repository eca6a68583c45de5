"""`minilmd status` with no run directory (or `--all`): one line per run of this machine that the user may see,
from the registry (daemon/host/registry.py); `minilmd forget RUN`.

Each row: name, phase (with "not running" when its supervisor is gone before the end, "killed or crashed" after a
final phase it never wrote its outcome for, "on host H: not checked from here" when state.json names another host,
"not judged: pid N holds its run lock ..." when its supervisor is gone and another pid holds the run lock:
status's rule, daemon/base/seen.py; "vanished" when its run
directory is gone, "unreadable (why)" when its state.json is not a file its owner wrote: a FIFO, a link, too big,
not a JSON object), step/total, loss, tok/s, ETA, the GPUs held or how long it has waited for them, the last
successful sync's age (with its trouble, or "(interrupted)" for a sync that was going on when its supervisor
ended: minilmd/run_states.py shown_state), restarts; "(stop requested)" after the phase while `minilmd stop`'s
request is left (daemon/base/stoprequest.py: an automatic restart will not start the run). `--json` gives the same
rows as a list (the request: "stop_request"). With no supervisor alive, the row is of state.json caught up with
what its trainer wrote since (daemon/views/newest.py: the step plain `minilmd status` shows; "caught_up" true when
that moved it).
A run without state.json is "starting (supervisor pid N)" while a supervisor holds its run lock, else "not started",
or "failed (exit N)" when its supervisor gave up before it could write one (its events.jsonl records that end:
daemon/views/lastwords.py; a line after the table gives the reason), or "could not start" when its run lock alone is
there, free, on a run.dir with 0 bytes free now (a line after the table says so), or "unreadable (supervisor.lock:
why: cannot tell if starting)" when its lock cannot be opened nor the kernel's lock table read (a teammate's row is
"starting" from that table: lastwords.py).
Everything shown came from files other users may have written: every name and path
is escaped for the terminal (minilmd/untrusted.py `printable`), and the registry's notes on what it skipped follow
the table. A run directory on storage that stalls (an NFS server gone) is given ROW_WAIT_S to answer, then shown
"unreadable (did not answer ...)": it never hides the other runs. A path its state.json names (its scratch, which
its user chose: an autofs or FUSE path that never answers) is looked at as daemon/views/pathlooks.py looks, for less
than that: the row is shown from state.json, and a line after the table names the path that did not answer.
Nor does one user's flood of entries: another user with more than GROUP_ABOVE runs is one line after the table.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from minilmd import names, protocol
from minilmd.daemon.base import stoprequest
from minilmd.daemon.base.runstate import reference_pass_rate
from minilmd.daemon.base.states import FINAL_PHASES
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.host import registry
from minilmd.daemon.views.lastwords import no_state_row
from minilmd.dirfd import Dir
from minilmd.fmt import fmt_duration
from minilmd.perms import own_uid, user_words
from minilmd.proc_info import of_another_boot
from minilmd.run_states import INTERRUPTED, SYNC_TROUBLE, Phase, StagingState, SyncState, remote_unanswered, shown_state
from minilmd.untrusted import Unreadable, printable, read_json

COLUMNS = ("run", "phase", "step", "loss", "tok/s", "eta", "gpu", "sync", "restarts", "run_dir")


PHASE_WIDTH = 40
"""A phase longer than this is cut in the table: it came from a file that is not what it says."""
ROW_WAIT_S = 5.0
"""How long one run's row may take (its run directory and state.json looked at): a stalled mount gets no more."""
GROUP_ABOVE = 20
"""Another user with more runs than this shows as one line in the table, not a row each: root's overview reads every
user's entries, and one user's thousand (up to the registry's per-user cap) would bury everyone else's. --json
still lists every row; the reader's own runs are never grouped."""
GONE_NAMED = 3
"""How many runs whose directory is gone the hint under the table names; it says how many more."""


def row(entry: registry.Entry, t: float) -> dict:
    """One run's line as data (what --json prints, and what the table shows). Its run directory is opened once as
    `minilmd status` opens one (runarg.real_path: a link on the way followed only when its owner owns the place it
    leads to; the directory itself no link) and every file of the row read through that descriptor: an owner who
    swaps her run directory for a link meanwhile leads root's look nowhere else. state.json is read as a file the
    run's owner wrote (minilmd/untrusted.py): "unreadable" with why when it is not one; any value of the wrong type
    in it is None."""
    from minilmd.daemon.views.runarg import RunProblem, real_path

    base = {"run": entry.name, "run_dir": str(entry.run_dir), "uid": entry.uid, "registered": entry.registered}
    try:
        as_dir = real_path(entry.run_dir, "status")
    except RunProblem as e:  # a third user's link on the way, a loop
        return {**base, "phase": "unreadable", "why": printable(str(e)), "running": False}
    with _opened(as_dir) as run:
        if run is None:
            return {**base, "phase": "vanished", "running": False}
        return {**base, **_row_in(run, entry.uid, t)}


def _row_in(run: Dir, owner: int, t: float) -> dict:
    """row's fields of the run directory open in `run`, of user `owner` (the registry entry's)."""
    try:  # another user's file (root's overview reads everyone's): the hardened reader, its owner checked first
        raw = read_json(names.STATE, max_bytes=names.STATE_MAX_BYTES, owner=owner, dir_fd=run.fd)
    except Unreadable as e:
        if e.missing:  # none yet, or its supervisor gave up before it could write one (its end in events.jsonl)
            return no_state_row(run, owner)
        return {"phase": "unreadable", "why": e.why, "running": False}
    from minilmd.daemon.base.seen import supervisor_seen
    from minilmd.daemon.views.liveness import trainer_alone
    from minilmd.daemon.views.newest import changed_sections, current
    from minilmd.daemon.views.pathlooks import Looks

    written = StateJson.from_dict(raw)  # a wrongly typed field reads as its default
    seen = supervisor_seen(written, run.path, run.fd, owner)  # status's rule (daemon/base/seen.py)
    alive = seen.alive is True
    looks = Looks()  # the paths its state.json names: bounded, what stalls said under the table (pathlooks.py)
    state = current(run.inside, written, alive, owner, looks)  # no supervisor: what its trainer wrote since
    progress, sync = state.progress, state.sync
    last_ok = sync.last_ok or (state.remote_checkpoint.time if state.remote_checkpoint else None)
    waited_since = state.gpu_wait.since if state.gpu_wait else None
    return {
        "phase": state.phase,
        "reason": state.reason,
        "ended": protocol.how_ended(raw),
        "running": alive,
        "elsewhere": seen.elsewhere,  # not known dead from here, nor alive: not checkable on this host
        "judged_by": seen.how,  # the run lock (the kernel's lock table), the record alone, or "other host"
        "unjudged": seen.unjudged,  # its record's supervisor gone, another pid holding its run lock: not judged
        "restarted": not alive and of_another_boot(written.supervisor.boot),  # its record is of an earlier boot
        "step": progress.step,
        "total_steps": progress.total_steps,
        "loss": progress.loss,
        "val_loss": progress.val_loss,
        "tok_s": progress.tok_s,
        "eta_s": progress.eta_s if alive else None,
        "reference_pass_eta_s": _pass_eta_s(progress) if alive else None,
        "devices": state.devices,
        "gpu_waited_s": t - waited_since if state.phase == Phase.WAITING_GPU and waited_since else None,
        "sync_state": sync.state,
        "staging_state": state.staging.state,
        "last_sync_age_s": t - last_ok if last_ok else None,
        "remote_unanswered": alive and remote_unanswered(sync.state, sync.error),  # what its supervisor knows now
        "restarts": state.run_restarts,  # the run's, as status says it (StateJson.run_restarts)
        "last_error": state.last_error,
        "predecessor": (state.init_wait.not_running or None) if state.init_wait and alive
        and state.phase == Phase.WAITING_INIT else None,
        "stop_request": stoprequest.as_json(run.path, owner, run.fd),  # `minilmd stop` left it: see _cells
        "caught_up": bool(changed_sections(written, state)),  # the step is the trainer's, newer than state.json's
        # a killed supervisor's trainer that trains on (the phase is then no word of a dead one: see _cells)
        "trainer_alone": (trainer_alone(run.path, state, alive, run.fd) or []) if state.phase not in FINAL_PHASES
        else [],
        "unanswered": looks.unanswered,  # the paths of its files that did not answer: said after the table
    }


def _pass_eta_s(progress) -> float | None:
    """Seconds left of a DPO run's reference pass, which comes before any step (so before the steps' ETA): its
    pairs left at this attempt's rate (runstate.reference_pass_rate); None outside the pass or before it has a
    rate."""
    ref = progress.reference_pass
    rate = reference_pass_rate(ref) if isinstance(ref, list) and len(ref) == 4 else None
    return rate[1] if rate else None


def rows_in_time(entries: list[registry.Entry], t: float) -> list[dict]:
    """row() of each entry, each in a thread of its own, all given ROW_WAIT_S together (runs on one stalled server
    cost ROW_WAIT_S once, not once each); a row that does not answer is "unreadable" (its thread is left behind, a
    daemon, stuck in the file system: nothing here can end it)."""
    done: list[list[dict]] = [[] for _ in entries]
    workers = [threading.Thread(target=lambda e=e, into=into: into.append(row(e, t)), daemon=True)
               for e, into in zip(entries, done, strict=True)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + ROW_WAIT_S
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    return [into[0] if into else
            {"run": e.name, "run_dir": str(e.run_dir), "uid": e.uid, "registered": e.registered,
             "phase": "unreadable", "why": f"no answer within {ROW_WAIT_S:g} s: its storage stalls", "running": False}
            for e, into in zip(entries, done, strict=True)]


SHOWN_ENDINGS = {protocol.ENDED_STOPPED: "stopped", protocol.ENDED_EARLY_STOPPED: "early-stopped",
                 protocol.ENDED_REQUEUED: "requeued", protocol.ENDED_CANCELLED: "cancelled",
                 protocol.ENDED_UNSYNCED: "unsynced"}
"""A "done" run as the table shows it, by how it ended (the row's "ended", protocol.how_ended); finished: "done"."""


OWN_PHASES = ("vanished", "unreadable", "not started", "could not start")
"""The overview's own phases, for a row that no supervisor runs for (none of them is a phase of state.json), shown
without "(not running)": nothing there was running to stop."""


def shown_phase(r: dict) -> str:
    """The phase as the table shows it: "done" is told apart by how the run ended (SHOWN_ENDINGS: "stopped" on
    request, "early-stopped" before its budget, its Slurm job "requeued" or "cancelled"; "done" its budget
    reached); staging that waits for the remote is "staging: waiting_remote". The raw phase stays in --json's
    "phase"."""
    phase = str(r.get("phase"))
    # scratch empty, the remote out of reach
    if phase == Phase.STAGING and r.get("staging_state") == StagingState.WAITING_REMOTE:
        return "staging: waiting_remote"  # waited for, never a start from step 0 (daemon/jobs/remotewait.py)
    if phase != Phase.DONE:
        return phase
    return SHOWN_ENDINGS.get(str(r.get("ended")), phase)


def _cells(r: dict) -> list[str]:
    phase = printable(shown_phase(r))[:PHASE_WIDTH]
    if r.get("phase") == "unreadable" and r.get("why"):
        phase += f" ({r['why']})"
    elif r.get("phase") not in (*FINAL_PHASES, *OWN_PHASES) and not r.get("running") and r.get("elsewhere"):
        phase += f" (on host {printable(r['elsewhere'])}: not checked from here)"  # not known dead (seen.py)
    elif r.get("unjudged") and not r.get("running"):
        phase += f" (not judged: {printable(r['unjudged'])})"  # neither running nor known gone (seen.py)
    elif r.get("phase") not in (*FINAL_PHASES, *OWN_PHASES) and not r.get("running"):
        phase += " (trainer without supervisor)" if r.get("trainer_alone") else " (not running)"
    elif r.get("events_exit") is not None:
        phase += f" (exit {r['events_exit']})"  # no state.json: its events.jsonl's end (lastwords.py)
    elif r.get("starting"):
        phase = printable(r["starting"])[:PHASE_WIDTH]  # no state.json: a supervisor holds the lock (lastwords.py)
    elif r.get("phase") in FINAL_PHASES and r.get("ended") is None and not r.get("running") \
            and not r.get("elsewhere"):  # its run ended, its supervisor did not exit cleanly: no outcome written
        phase += " (host restarted since)" if r.get("restarted") else " (killed or crashed)"
    if (request := r.get("stop_request")) and not request.get("problem") and not request.get("after_end"):
        phase += " (stop requested)"  # an automatic restart will not start it, until a start by hand
    step = "-" if r.get("step") is None else f"{r['step']:,}" + (f"/{r['total_steps']:,}" if r.get("total_steps")
                                                                  else "")
    if r.get("devices"):
        gpu = "held " + ",".join(str(d) for d in r["devices"])
    elif r.get("gpu_waited_s") is not None:
        gpu = f"waiting {fmt_duration(r['gpu_waited_s'])}"
    else:
        gpu = "-"
    if r.get("sync_state") == SyncState.OFF:
        sync = "off"
    else:
        sync = f"{fmt_duration(r['last_sync_age_s'])} ago" if r.get("last_sync_age_s") is not None else "-"
        # no supervisor: no sync goes on; one of another host is not known dead from here (interrupted.py's rule)
        shown = shown_state(str(r.get("sync_state")), bool(r.get("running") or r.get("elsewhere")))
        if shown == SyncState.FAILED and r.get("remote_unanswered"):  # not any failure: the remote is gone now
            sync += " (failed: remote not answering)"
        elif shown in (*SYNC_TROUBLE, INTERRUPTED):
            sync += f" ({shown})"
    return [printable(r["run"]), phase, step, f"{r['loss']:.4f}" if r.get("loss") is not None else "-",
            f"{r['tok_s']:,.0f}" if r.get("tok_s") else "-", _eta_cell(r), gpu, sync,
            str(r.get("restarts", "-")), printable(r["run_dir"])]


def _eta_cell(r: dict) -> str:
    """The steps' ETA, or during a DPO run's reference pass the pass's own, named so ("pass 47s")."""
    if r.get("eta_s") is None and r.get("reference_pass_eta_s") is not None:
        return f"pass {fmt_duration(r['reference_pass_eta_s'])}"
    return fmt_duration(r.get("eta_s"))


def table(rows: list[dict]) -> list[str]:
    cells = [[c.upper() for c in COLUMNS]] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells]


def status_all(as_json: bool = False, out=None) -> int:
    """The table (or --json's list) of the runs the registry shows this user, then its notes: entries skipped as
    unreadable, shadowing another user's run or over the per-user cap (on stderr with --json)."""
    out = out or sys.stdout
    t = time.time()
    scan = registry.scan()
    rows = rows_in_time(list(scan.entries), t)
    if as_json:
        print(json.dumps(rows, indent=2, sort_keys=True), file=out)
        _notes(scan.notes, sys.stderr)
        return 0
    if not rows:
        print(f"no runs registered for you on this machine (registry: {printable(registry.user_dir())}; a "
              f"supervisor registers its run when it starts)", file=out)
        _notes(scan.notes, out)
        return 0
    rows, crowds = grouped(rows, own_uid())  # an entry's uid is its supervisor's own_uid
    print("\n".join(table(rows) + crowds), file=out)
    for r in rows:
        if r.get("predecessor"):
            print(f"{printable(r['run'])}: waiting for init.from: {printable(r['predecessor'])}", file=out)
        if r.get("events_exit") is not None:
            print(printable(f"{r['run']}: {r['phase']} (exit {r['events_exit']}): {r.get('reason')} (no "
                            f"{names.STATE}: from its {names.EVENTS})"), file=out)
        if r.get("could_not_start"):  # no state.json nor events.jsonl: only its run lock (lastwords.py)
            print(printable(f"{r['run']}: {r['could_not_start']}"), file=out)
        for said in r.get("unanswered") or []:  # a path its state.json names stalls: the row is state.json's word
            print(printable(f"{r['run']}: {said}"), file=out)
    _vanished_hint(rows, out)
    _notes(scan.notes, out)
    return 0


def _vanished_hint(rows: list[dict], out) -> None:
    """Which runs' directories are gone, and how to forget them: by name, or by run directory when a name is shared
    (every demo is `demo`: the name alone would not say which); the first GONE_NAMED of them, and how many more (a
    shared machine's registry held 29: one line naming them all was no hint)."""
    vanished = [r for r in rows if r["phase"] == "vanished"]
    if not vanished:
        return
    shared = Counter(r["run"] for r in rows)
    by_dir = any(shared[r["run"]] > 1 for r in vanished)
    said = ", ".join(printable(r["run"]) + (f" ({printable(r['run_dir'])})" if by_dir else "")
                     for r in vanished[:GONE_NAMED])
    if len(vanished) > GONE_NAMED:
        said += f" and {len(vanished) - GONE_NAMED} more (PHASE vanished above)"
    how = "`minilmd forget RUN_DIR`" if by_dir else "`minilmd forget NAME`"
    print(f"run directories gone: {said}: {how} removes them from this list", file=out)


def grouped(rows: list[dict], reader: int) -> tuple[list[dict], list[str]]:
    """(the rows shown one by one, one line for each other user with more than GROUP_ABOVE runs): how many, how
    many running, their most common phases (escaped and cut: his files say them)."""
    per_user = Counter(r["uid"] for r in rows)
    crowded = sorted(uid for uid, n in per_user.items() if n > GROUP_ABOVE and uid != reader)
    lines = []
    for uid in crowded:
        theirs = [r for r in rows if r["uid"] == uid]
        phases = Counter(printable(shown_phase(r))[:PHASE_WIDTH] for r in theirs).most_common()
        said = ", ".join(f"{phase} {n}" for phase, n in phases[:5]) + (
            f", {len(phases) - 5} other phases" if len(phases) > 5 else "")
        running = sum(1 for r in theirs if r.get("running"))
        lines.append(f"{user_words(uid)}: {len(theirs)} runs in one line ({running} running; {said}); "
                     f"`minilmd status --all --json` lists each")
    return [r for r in rows if r["uid"] not in crowded], lines


def _notes(notes: list[str], out) -> None:
    for note in notes:
        print(f"registry: {note}", file=out)


def forget(target: str, out=None) -> int:
    """Exit 0 when something was forgotten; COMMAND_FAILED (1) when no entry of yours matched, or only runs that
    still exist did (kept, and said why), or the run directory named is running (its entry kept: a live run stays
    listed); 2 when a third user's link leads to the run directory named (runarg's rule: root's forget through a
    user's link took a third user's live run off the list). The run directory and its owner are said first when it
    is not ours. A bare NAME that is also a directory here is that run directory too; when it is running, only it is
    kept: the gone runs of that name are still forgotten (`cd ~/runs; minilmd forget demo` while ./demo trains)."""
    from minilmd.daemon.views.runarg import RunProblem, real_path

    out = out or sys.stdout
    as_dir = None
    if "/" in target or Path(target).exists():
        try:
            as_dir = real_path(Path(target), "forget")
        except RunProblem as e:
            print(e, file=sys.stderr)
            return e.exit
    with _opened(as_dir) as run:
        return _forget(target, as_dir, run, out)


@contextlib.contextmanager
def _opened(as_dir: Path | None) -> Iterator[Dir | None]:
    """The run directory a row or forget is given, opened once (runarg's JUDGED_DIR: no link followed), its files
    read through that descriptor; None when there is none (gone: what forget is for) or it is no directory."""
    from minilmd.daemon.views.runarg import JUDGED_DIR

    try:
        run = Dir(os.open(as_dir, JUDGED_DIR), as_dir) if as_dir is not None else None
    except OSError:
        run = None
    try:
        yield run
    finally:
        if run is not None:
            run.close()


def _forget(target: str, as_dir: Path | None, run: Dir | None, out) -> int:
    """forget, `as_dir` the run directory named (its real path; None by a bare name no directory here has), open in
    `run` (None when it is gone)."""
    from minilmd.daemon.views import liveness
    from minilmd.daemon.views.runarg import not_yours_line

    running_dir = None
    by_name = "/" not in target
    if as_dir is not None:
        holder = liveness.lock_supervisor_or_none(as_dir, run.fd) if run is not None else None
        if holder is not None:
            print(f"kept {printable(as_dir)}: its supervisor (pid {holder.pid}) holds the run's lock: a running run "
                  f"stays listed (`minilmd stop` it first)", file=out)
            if not by_name:
                return protocol.COMMAND_FAILED
            as_dir, running_dir = None, as_dir  # by name: the gone runs of that name are still forgotten
        if run is not None and as_dir is not None and (  # gone (what forget is for): no one's to name
                whose := not_yours_line(as_dir, os.fstat(run.fd).st_uid, _forgetting())):
            print(whose, file=out, flush=True)
    done = registry.forget(target, None if as_dir is None else str(as_dir))
    for entry in done.kept:
        if entry.run_dir != running_dir:  # that one said above
            print(f"kept {printable(target)} at {printable(entry.run_dir)}: its run directory still exists (a name "
                  f"may be shared; `minilmd forget {printable(entry.run_dir)}` forgets that one)", file=out)
    if not done.removed:
        if not done.kept:
            print(f"minilmd forget: no registered run of yours named {target!r} (see `minilmd status --all`)",
                  file=sys.stderr)
        return protocol.COMMAND_FAILED
    for path in done.removed:
        print(f"forgot {printable(target)}: removed {printable(path)}", file=out)
    if as_dir is not None and run is not None and _holds(run, names.STATE):
        print(f"  {printable(target)} still exists: it is listed again when its supervisor starts", file=out)
    return 0


def _holds(run: Dir, name: str) -> bool:
    """Whether the directory open in `run` holds `name` (looked at through its descriptor, a link there followed
    as Path.exists follows one)."""
    try:
        os.stat(name, dir_fd=run.fd)
        return True
    except OSError:
        return False


def _forgetting() -> str:
    """What forget does with another user's run directory's entries: root removes anyone's, a user only his own."""
    from minilmd.perms import own_uid

    return "forgetting its entries" if own_uid() == 0 else "forgetting only your own entries of it (its owner's stay)"
