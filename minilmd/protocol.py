"""The contract between the trainer (a plain child process) and the supervisor.

The trainer reports through files in the run directory and through its exit status; nothing else. Each exit
status has one meaning and one restart rule (docs/failure-modes.md has the table). This module is torch-free:
the supervisor imports it. So do the readers of a run's end: how a run ended (state.json's outcome.ended,
`how_ended`) is read here alone, by the views and by a later stage's init wait (minilmd/init_source.py).
"""
from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from minilmd.names import FAULT, FAULT_MAX_BYTES

# fsio and untrusted are imported where fault.json is written and read: every command line imports this module at
# its start for the exit statuses (minilmd/corpus/exits.py), and `minilmd status` should pay for no more.


# --- Special token ids (MiniMind's): PAD <|endoftext|>, BOS <|im_start|>, EOS <|im_end|>. -----------------------
PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
SPECIAL_TOKENS = {"<|endoftext|>": PAD_ID, "<|im_start|>": BOS_ID, "<|im_end|>": EOS_ID}

# --- Exit statuses of `minilmd train` -----------------------------------------------------------------------------
EXIT_DONE = 0  # the budget is reached and the final checkpoint saved
EXIT_CRASH = 1  # an unexpected exception (traceback in the attempt log): restart with backoff
EXIT_CONFIG = 2  # the config is invalid: final, never restarted
EXIT_DATA = 65  # the input data is invalid (sysexits EX_DATAERR): final, never restarted
EXIT_STOPPED = 75  # stopped on request (SIGTERM), saved at a step boundary first (EX_TEMPFAIL); during the DPO
# reference pass, step 0 saved with the pass's sums so far (the next start goes on from there)
EXIT_CUDA_OOM = 76  # CUDA ran out of memory; fault.json says where: wait for the GPU or halve the micro-batch
EXIT_IO = 74  # sysexits EX_IOERR: a read or write failed (a full disk, EIO on a share); run it again once fixed
EXIT_SCRATCH_FULL = EXIT_IO  # a checkpoint did not fit in scratch; fault.json says needs/free: wait for space
EXIT_RUN_DIR_FULL = 73  # run.dir had no room for its metrics, heartbeat or log: saved to scratch at a step boundary
# first (EX_CANTCREAT, as the supervisor's SUPERVISOR_RUN_DIR_FULL): the supervisor stops after the last sync
EXIT_TRAINER_BUSY = 69  # another trainer still holds this scratch's trainer.lock (EX_UNAVAILABLE): nothing read or
# written; under the supervisor a retry with backoff (the last attempt's rank 0 still dying), never a config error
EXIT_INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP ended a command (128 + SIGINT, as a shell says it): its cleanup ran

# --- Exit statuses of `minilmd run` (the supervisor) ------------------------------------------------------------
SUPERVISOR_DONE = 0  # the run finished, or was stopped on request with a synced checkpoint
SUPERVISOR_CONFIG = 2  # bad config or a run already owned by another supervisor: do not restart (bad data: 65)
SUPERVISOR_GAVE_UP = 79  # too many restarts, or too many without progress, or a trainer that ended done with no
#                          checkpoint in scratch to sync (it saved elsewhere), or too many Slurm requeues in a row
#                          after a last sync that gave up: do not restart (systemd prevents it)
SUPERVISOR_RUN_DIR_FULL = 73  # run.dir's disk is full (EX_CANTCREAT): stopped after the last sync; do not restart
SUPERVISOR_RETRY = 1  # failed, not for good: systemd restarts it (a last sync that failed, a supervisor error, a
#                        Slurm requeue refused, a scratch record unreadable at --check); never in FINAL_EXIT_STATUSES
FINAL_EXIT_STATUSES = (SUPERVISOR_CONFIG, EXIT_DATA, SUPERVISOR_GAVE_UP, SUPERVISOR_RUN_DIR_FULL)

# --- Exit statuses of the other commands, beside EXIT_CONFIG (2: bad arguments), EXIT_DATA, EXIT_IO ----------------
COMMAND_FAILED = 1  # the command could not do its work, not for its arguments: plot without matplotlib, a demo
#                     corpus not made, a tokenizer's training failed, an export's checkpoint unreadable, verify's
#                     "not ok"
COUNT_FOUND = 1  # `corpus count --fail-if-found`: a pattern was found

# --- How a run ended: state.json's outcome.ended, written by the supervisor as it exits (daemon/runfiles.py) -----
ENDED_FINISHED = "finished"  # its budget reached, or early_stop ended it: a stage after it starts from its checkpoint
ENDED_EARLY_STOPPED = "early_stopped"  # never written: how_ended's "finished" before the run's total_steps
ENDED_STOPPED = "stopped"  # stopped on request (`minilmd stop`, SIGTERM) after its last sync: a restart goes on
ENDED_REQUEUED = "requeued"  # its Slurm job preempted and requeued: it resumes when Slurm starts the job again
ENDED_CANCELLED = "cancelled"  # its Slurm job cancelled (scancel): stopped until the job is submitted again
ENDED_FAILED = "failed"  # failed, or a supervisor error: outcome.exit says whether for good (FINAL_EXIT_STATUSES)
ENDED_UNSYNCED = "unsynced"  # an older minilmd's only (finished, its last checkpoint kept in scratch, run.remote's
#                              owner.json not its own): now that last sync waits; still read in older state.json files
FINAL_SYNC_WAITING = "final sync waiting: "
"""The first words of the stopping phase's reason while a finished run's last sync waits (room on its remote, its
remote's owner record: daemon/jobs/syncworker.py): what a stage after it reads as why it still waits."""
RECORDED_ENDINGS = (ENDED_FINISHED, ENDED_STOPPED, ENDED_REQUEUED, ENDED_CANCELLED, ENDED_FAILED, ENDED_UNSYNCED)
FINISHED_ENDINGS = (ENDED_FINISHED, ENDED_EARLY_STOPPED)
ENDED_BY_REASON = (("stopped", ENDED_STOPPED), ("requeued by Slurm", ENDED_REQUEUED),
                   ("the Slurm job was cancelled", ENDED_CANCELLED))
"""The first words of a `done` reason, as versions before outcome.ended wrote them (any other: finished)."""


def how_ended(state: dict) -> str | None:
    """How the run of a state.json (as read: any JSON object) ended, one of RECORDED_ENDINGS or
    ENDED_EARLY_STOPPED (finished before its progress.total_steps); None while its supervisor runs, or when it was
    killed (no outcome). Its outcome.ended decides; only a state.json written before that field existed is read by
    its reason's first words (ENDED_BY_REASON)."""
    outcome = state.get("outcome")
    if not isinstance(outcome, dict):
        return None
    ended = outcome.get("ended")
    if ended not in RECORDED_ENDINGS:
        ended = _ended_by_reason(state)
    if ended == ENDED_FINISHED and _before_budget(state.get("progress")):
        return ENDED_EARLY_STOPPED
    if ended == ENDED_STOPPED and _synced_at_budget(state):
        return ENDED_FINISHED
    return ended


def _ended_by_reason(state: dict) -> str:
    """An older version's outcome: failed unless it ended `done`; then its reason's first words say how."""
    from minilmd.run_states import Phase

    if state.get("phase") != Phase.DONE:
        return ENDED_FAILED
    reason = state.get("reason")
    reason = reason if isinstance(reason, str) else ""
    return next((ended for words, ended in ENDED_BY_REASON if reason.startswith(words)), ENDED_FINISHED)


def restart_may_follow(state: dict) -> bool:
    """Whether a start a launcher makes by itself may still come after how the run of a state.json (as read: any
    JSON object) ended: while its supervisor runs or after it was killed (no outcome: the tmux window's or systemd's
    restart), after a failure that is not final (FINAL_EXIT_STATUSES) and after a Slurm requeue. Not after its end
    for good: finished, stopped or cancelled (exit 0, which neither the tmux window nor systemd restarts, and a job
    not requeued), or failed with a final status (`minilmd stop` then leaves a request only a start already under
    way honours: daemon/base/stoprequest.py after_end)."""
    ended = how_ended(state)
    if ended is None or ended == ENDED_REQUEUED:
        return True
    if ended == ENDED_FAILED:
        outcome = state.get("outcome")
        return not isinstance(outcome, dict) or outcome.get("exit") not in FINAL_EXIT_STATUSES
    return False


def _synced_at_budget(state: dict) -> bool:
    """Whether a run recorded `stopped` had in fact finished: its last step at its total_steps and that step on
    run.remote (remote_checkpoint). An earlier version recorded a stop that came during a finished run's last sync
    as `stopped` (daemon/ending.py), and a later stage whose init.from named the run waited for it for ever."""
    progress, remote = state.get("progress"), state.get("remote_checkpoint")
    if not isinstance(progress, dict) or not isinstance(remote, dict):
        return False
    step, total, synced = progress.get("step"), progress.get("total_steps"), remote.get("step")
    if not isinstance(step, int) or not isinstance(total, int) or not isinstance(synced, int) or \
            any(isinstance(n, bool) for n in (step, total, synced)):
        return False
    return step >= total > 0 and synced >= total


def _before_budget(progress) -> bool:
    """Whether state.json's progress says its last step is before its total_steps (both there, both integers)."""
    if not isinstance(progress, dict):
        return False
    step, total = progress.get("step"), progress.get("total_steps")
    if not isinstance(step, int) or not isinstance(total, int) or isinstance(step, bool) or isinstance(total, bool):
        return False
    return step < total


# --- Exit statuses of `minilmd stop` (daemon/views/stop.py) -----------------------------------------------------------
STOP_DONE = 0  # the supervisor is gone (or was not running); the newest checkpoint is on the remote, or none is set
STOP_FAILED = 1  # not stopped: still running at --timeout, an orphaned trainer survived SIGKILL, or the supervisor
#                  belongs to another user or host (never signalled), or so does a run directory we may not read
STOP_NOT_A_RUN = 2  # not a run directory, nor a config naming one (as for `status` and `logs`: views/runarg.py)
STOP_UNSYNCED = 3  # stopped, but the newest checkpoint is only in scratch (the last sync failed): stop says where;
#                    on /dev/shm a reboot loses it

# --- Fault injection, for tests and the demo ----------------------------------------------------------------------
# MINILMD_FAULT="kind@step[,kind@step...]" with kind in FAULT_KINDS. Each fault fires once per run: the trainer
# records a fired fault in <run dir>/faults-fired so that a restarted trainer does not fire it again.
FAULT_KINDS = ("oom", "sigbus", "sigkill", "hang", "exception")


class FaultNote(str, Enum):
    """fault.json's "kind": why the trainer is about to exit, in its own words (trainer/loop/exits.py writes it,
    daemon/child/death.py reads it). Not FAULT_KINDS, which are the faults MINILMD_FAULT injects."""

    REFUSED = "refused"  # a final refusal (a config or data error), its whole text in "message"
    SCRATCH_FULL = "scratch_full"  # a checkpoint did not fit in scratch: needs, free, path
    CUDA_OOM = "cuda_oom"  # CUDA ran out of memory: step, micro_batch_size, device, rank, source
    SCRATCH_GONE = "scratch_gone"  # run.scratch removed (or another directory there) while it trained: a save
    #                                refused, exit EXIT_CRASH (restarted: staging claims and stages it afresh);
    #                                step, checkpoint_step, path


def write_fault(run_dir: str | os.PathLike, kind: FaultNote, message: str, **details) -> None:
    """Leave a note for the supervisor about why the trainer is about to exit."""
    from minilmd.fsio import atomic_write_json

    atomic_write_json(Path(run_dir) / FAULT, {"kind": FaultNote(kind).value, "message": message, **details})


def fault_note(fault: dict | None) -> FaultNote | None:
    """The kind of a fault.json read_fault returned; None when there is none or it names no kind of FaultNote."""
    kind = (fault or {}).get("kind")
    return next((note for note in FaultNote if note.value == kind), None)


def read_fault(run_dir: str | os.PathLike) -> dict | None:
    from minilmd.untrusted import Unreadable, read_json

    try:  # the run directory's file, read as one another user may have written (minilmd/untrusted.py)
        return read_json(Path(run_dir) / FAULT, max_bytes=FAULT_MAX_BYTES)
    except Unreadable as e:
        if e.os_error is not None:
            raise e.os_error from None
        return None
