"""How a trainer's end is read: `classify()` turns an ended child's exit status, with its own fault.json (the
trainer's note, consumed here) and the end of its attempt log, into a `Death` with one `Cause`
(daemon/base/states.py; CAUSES says what each means). The restart policy (daemon/child/policy.py) acts on the
cause. A SIGKILL is the OOM killer's only with evidence (daemon/child/oomevidence.py). The attempt log and
faults-fired are read as files anyone in the run directory could have replaced (a FIFO, a link: never opened).
Torch-free.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from minilmd import names, protocol
from minilmd.daemon.base.states import Cause
from minilmd.daemon.child.oomevidence import kernel_log_oom, oom_kills_after
from minilmd.daemon.child.process import SUPERVISOR_LINE, Child, is_torchrun
from minilmd.daemon.child.torchrun_summary import root_cause_signal
from minilmd.logread import tail_lines
from minilmd.untrusted import Unreadable, clipped

CAUSES: dict[Cause, str] = {
    Cause.DONE: "the trainer reached its budget and saved the final checkpoint (exit 0)",
    Cause.STOPPED: "the trainer exited on SIGTERM (exit 75), after saving at a step boundary (nothing during the DPO "
                   "reference pass: its log says which)",
    Cause.CONFIG_ERROR: "the trainer refused the config (exit 2): final",
    Cause.DATA_ERROR: "the trainer refused the data (exit 65): final",
    Cause.CUDA_OOM: "CUDA ran out of memory (exit 76, fault.json)",
    Cause.SIGBUS: "SIGBUS: a page of a mapped file could not be read (staged corpus or checkpoint damaged?)",
    Cause.OOM_KILL: "SIGKILL by the kernel's OOM killer (cgroup memory events or kernel log)",
    Cause.KILLED: "SIGKILL with no OOM record: the supervisor's own (the detail says why), or from outside (a kill "
                  "-9, an injected fault, or an OOM kill whose record could not be read: the detail says which records "
                  "were read)",
    Cause.HANG: "no heartbeat for restart.hang_timeout: stack dumped, group killed",
    Cause.SIGNAL: "killed by another signal",
    Cause.CRASH: "exited with an error (traceback in the attempt log)",
    Cause.SCRATCH_FULL: "a checkpoint did not fit in scratch (exit 74, fault.json says needs and free)",
    Cause.RUN_DIR_FULL: "run.dir had no room for the trainer's metrics, heartbeat or log, or was removed (exit 73; "
                        "the detail says which): it saved to scratch at a step boundary first",
}


@dataclass
class Death:
    cause: Cause
    exit: int | None
    detail: str
    fault: dict | None = None


def classify(child: Child, returncode: int, run_dir: Path, stop_requested: bool) -> Death:
    """One cause for an ended child. fault.json (the trainer's own note) is consumed here."""
    fault = _own_fault(run_dir, child.started)
    rc = returncode
    if child.killed_for_hang:
        return Death(Cause.HANG, rc, (child.hang_detail or "no heartbeat") + _injected(run_dir, child.started, "hang"),
                     fault)
    sig = -rc if rc < 0 else None
    if rc == 1 and is_torchrun(child.command):
        sig = _torchrun_worker_signal(child.log_path)  # torchrun exits 1 whatever killed a worker
    if sig == signal.SIGBUS:
        return Death(Cause.SIGBUS, rc, "killed by SIGBUS (bus error on a mapped file)"
                     + _injected(run_dir, child.started, "sigbus"), fault)
    if sig == signal.SIGKILL:
        return _sigkill_death(child, rc, run_dir, fault)
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return Death(Cause.SIGNAL, rc, f"killed by {name}", fault)
    if rc == protocol.EXIT_DONE:
        return Death(Cause.DONE, rc, "finished", fault)
    if rc == protocol.EXIT_STOPPED:
        # not "saved": what was saved is the checkpoint lines' to say (a stop in the loop saves at step N, one during
        # the DPO reference pass step 0 with the pass's sums so far; the trainer's log says which)
        who = "on request" if stop_requested else "on the supervisor's SIGTERM" if child.stop_sent is not None \
            else "on a SIGTERM the supervisor did not send"  # a final decision's (run.dir full, another run's remote)
        return Death(Cause.STOPPED, rc, f"stopped {who}", fault)
    if rc == protocol.EXIT_CONFIG:
        return Death(Cause.CONFIG_ERROR, rc, _refusal(fault, child.log_path) or "config error", fault)
    if rc == protocol.EXIT_TRAINER_BUSY:  # most often the last attempt's rank 0 still dying: retried with backoff
        return Death(Cause.CRASH, rc, "another trainer still held the run's trainer.lock, nothing read or written: "
                                      + (_last_lines(child.log_path) or f"exit status {rc}"), fault)
    if rc == protocol.EXIT_DATA:
        return Death(Cause.DATA_ERROR, rc, _refusal(fault, child.log_path) or "data error", fault)
    if rc == protocol.EXIT_SCRATCH_FULL or protocol.fault_note(fault) is protocol.FaultNote.SCRATCH_FULL:
        return Death(Cause.SCRATCH_FULL, rc, (fault or {}).get("message", "scratch full"), fault)
    if rc == protocol.EXIT_RUN_DIR_FULL:  # no fault.json: there is no room for it, or no run.dir to hold it
        if not run_dir.is_dir():  # the trainer's own 73 for both (fsio.dir_removed): the words must not say "full"
            return Death(Cause.RUN_DIR_FULL, rc, "run.dir was removed while the run ran: the trainer saved to scratch "
                                                 "at a step boundary, then exited (its metrics, heartbeat and log had "
                                                 "nowhere to go)", fault)
        return Death(Cause.RUN_DIR_FULL, rc, "run.dir full: the trainer saved to scratch at a step boundary, then "
                                             "exited (its metrics, heartbeat and log had no room)", fault)
    if rc == protocol.EXIT_CUDA_OOM or protocol.fault_note(fault) is protocol.FaultNote.CUDA_OOM:
        return Death(Cause.CUDA_OOM, rc, (fault or {}).get("message", "CUDA out of memory"), fault)
    detail = (fault or {}).get("message") or _last_lines(child.log_path) or f"exit status {rc}"
    return Death(Cause.CRASH, rc, detail, fault)


def _sigkill_death(child: Child, rc: int, run_dir: Path, fault: dict | None) -> Death:
    """OOM_KILL only with evidence: the memory cgroup of the child (or of a torchrun rank of it) counted an OOM kill
    during it, or the kernel log records the OOM killer taking its pid (or a rank's). Otherwise KILLED, and the
    detail says what was read: an injected fault (faults-fired) names itself; a readable kernel log without a record
    of the pids says it was not the OOM killer (a hand-sent kill, a scheduler); with nothing readable it says that
    it cannot be told."""
    stayed, rose, ranks_own = [], "", False
    for counter, after in oom_kills_after(child.cgroup_oom).items():
        before, whose = child.cgroup_oom[counter], child.counter_of.get(counter)
        if after is not None and after > before and not rose:
            rose = f"{counter}: oom_kill {before} -> {after}" + (f", the memory cgroup of {whose}" if whose else "")
            ranks_own = bool(whose)  # a counter the agent shares with its ranks does not say which: the log may
        elif after is not None:
            stayed.append(f"{after} ({counter})")
    counter_words = f"the memory cgroup's oom_kill counter stayed at {', '.join(stayed)}" if stayed else ""
    pids = [child.pid, *(r.pid for r in child.ranks)]
    named = kernel_log_oom(pids, child.started) if not rose or (child.ranks and not ranks_own) else None
    if rose or named:
        rank = next((r for r in child.ranks if named and r.pid == named[0]), None)
        said = f"kernel log names pid {named[0]}{f', torchrun {rank.name}' if rank else ''}" if named else ""
        return Death(Cause.OOM_KILL, rc, f"SIGKILL by the OOM killer ({'; '.join(w for w in (rose, said) if w)})",
                     fault)
    if child.killed_by:  # the supervisor's own SIGKILL, no OOM kill before it
        return Death(Cause.KILLED, rc, f"killed {child.killed_by} (SIGKILL)", fault)
    injected = _injected(run_dir, child.started, "sigkill")
    if injected:
        return Death(Cause.KILLED, rc, "killed by SIGKILL" + injected, fault)
    ranks = "".join(f", nor of {rank.name}'s pid {rank.pid}" for rank in child.ranks)
    records = [w for w in (counter_words, "the kernel log holds no OOM record of pid "
                           f"{child.pid}{ranks}" if named is not None else "") if w]
    if records:
        return Death(Cause.KILLED, rc, f"killed by SIGKILL from outside, not by the OOM killer ({'; '.join(records)})",
                     fault)
    return Death(Cause.KILLED, rc, "killed by SIGKILL from outside; whether by the OOM killer cannot be told (the "
                 "kernel log is not readable here and no memory cgroup counts OOM kills)", fault)


def _injected(run_dir: Path, started: float, kind: str) -> str:
    """" (injected by MINILMD_FAULT: sigkill@15)" when this attempt fired a fault of `kind` as its last one (the
    trainer appends it to faults-fired just before it fires: trainer/loop/faults.py); "" otherwise."""
    path = run_dir / names.FAULTS_FIRED
    try:
        if path.stat().st_mtime < started - 1:
            return ""  # an earlier attempt's
        last = tail_lines(path, 1, max_bytes=4096)[0]
    except (OSError, Unreadable):  # a FIFO or a link put there: never opened
        return ""
    fired = last[-1].strip() if last else ""
    return f" (injected by {names.FAULT_ENV}: {fired})" if fired.partition("@")[0] == kind else ""


def _own_fault(run_dir: Path, started: float) -> dict | None:
    """fault.json if this attempt wrote it (a stale one from an earlier attempt is ignored); consumed."""
    path = run_dir / names.FAULT
    try:
        fresh = path.stat().st_mtime >= started - 1
    except FileNotFoundError:
        return None
    fault = protocol.read_fault(run_dir) if fresh else None
    path.unlink(missing_ok=True)
    return fault


REFUSAL_MAX = 8192  # characters of a trainer's refusal kept: ours are under 2,000 (a sentence, the lines to paste)


def _refusal(fault: dict | None, log_path: Path) -> str:
    """A final refusal in the trainer's words, whole (fault.json "refused": a [model] block to paste comes with the
    sentence that says why), bounded; else the attempt log's last lines (a trainer refused before it wrote one: a
    config it could not load, run.dir refused), to REFUSAL_MAX too: cut to 400 characters, the refusal of a run.dir
    whose default ACL an older version let pass lost its fix (`setfacl -k DIR`) in state.json and supervisor.log."""
    said = (fault or {}).get("message") if protocol.fault_note(fault) is protocol.FaultNote.REFUSED else None
    if isinstance(said, str) and said.strip():
        return clipped(said, REFUSAL_MAX)
    return _last_lines(log_path, limit=REFUSAL_MAX)


def _last_lines(path: Path, n: int = 3, limit: int = 400) -> str:
    """The trainer's last words: up to n of its last lines, whole, joined by " | " within `limit` characters. The
    supervisor's own lines in the log (they start with "# ": the attempt header, a stack dump's header) are not the
    trainer's words. A last line longer than the limit keeps its start, cut after a word and marked " …"."""
    try:
        lines = [ln.strip() for ln in tail_lines(path, 50, max_bytes=8192)[0]]
    except Unreadable:  # a FIFO or a link put there: never opened
        return ""
    lines = [ln for ln in lines if ln and not ln.startswith(SUPERVISOR_LINE)][-n:]
    if not lines:
        return ""
    kept = [lines.pop()]
    while lines and len(" | ".join([lines[-1], *kept])) <= limit:
        kept.insert(0, lines.pop())
    text = " | ".join(kept)
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 1)
    return text[:cut if cut > 0 else limit - 2] + " …"


def _torchrun_worker_signal(log_path: Path) -> int | None:
    try:
        lines = tail_lines(log_path, 1 << 20, max_bytes=16384)[0]
    except Unreadable:  # a FIFO or a link put there: never opened
        return None
    return root_cause_signal(lines)
