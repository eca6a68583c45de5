"""When Slurm ends this job, as known since its preemption, and the last sync's deadline before it.

A preempted job's trainer save and last sync (daemon/slurm/lastsynccut.py) must end before Slurm kills the job, or
`scontrol requeue` never runs and the run stops for good. The end is asked of Slurm from the signal on (SlurmJob.
preempt, before the trainer's save: Slurm has moved EndTime by then), in the background and again while it does
not answer (daemon/slurm/endwatch.py), and read here, the rule's one home, from what has come so far:

- `scontrol show job`'s EndTime: Slurm's own view now, moved earlier by a preemption with a grace time (the end
  becomes the preemption's time plus the grace) or a `scontrol update TimeLimit`. scontrol runs with
  SLURM_TIME_FORMAT=%s (daemon/slurm/job.py run_command), so it prints epoch seconds, whatever format the user
  set and unambiguous in a DST fall-back hour; a Slurm that ignores it prints local time (`2026-12-06T04:00:00`),
  also read (the earlier instant in a fall-back hour: conservative);
- SLURM_JOB_END_TIME (epoch seconds) where the job's environment has it: set from the start of the job, so it
  misses such a move. Not set by Slurm 22.05 (its libslurmfull has no such name: checked on the test cluster's
  22.05.8); newer releases set it. The earlier of the two is taken;
- neither (scontrol has not answered, or shows no end): the warning's own length from the signal,
  `--signal=B:USR1@300`'s 300 s after a USR1; after a SIGTERM Slurm's KillWait (`scontrol show config`, asked with
  the job after a SIGTERM; its default, 30 s, while that has not answered either), the least any SIGTERM of Slurm's
  leaves before its SIGKILL (`guessed`); `minilmd stop`'s SIGUSR2 ends no job: none is guessed, nothing is cut.

While scontrol has not answered, the end is the fallback (or SLURM_JOB_END_TIME); its answer moves it, earlier or
later. A SIGTERM at the time limit itself finds EndTime reached: Slurm's SIGKILL then follows that SIGTERM by
KillWait, so the end is taken as the signal plus KillWait. An end still ahead is taken as it is, though a kill may
come KillWait after it: the earlier, the safer. Torch-free.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime

END_TIME_ENV = "SLURM_JOB_END_TIME"
WARNING_S = 300.0
"""The lead of deploy/slurm/*.sbatch's `--signal=B:USR1@300` (tests/test_slurm_lastsync.py reads it there)."""
KILL_WAIT_S = 30.0
"""Slurm's default KillWait: its SIGKILL follows the SIGTERM it sends at the job's end by this much. Taken while
`scontrol show config` has not said the cluster's own."""
MAX_KILL_WAIT_S = 65533.0
"""slurm.conf's largest KillWait: a larger figure is no KillWait read."""
REQUEUE_MARGIN_S = 20.0
"""The one home of the margin (the docs refer here): a trainer still saving, or a last sync still copying, is cut
this long before the job's end, for what must still run after it and before the kill: the loop's next tick (0.2 s),
a SIGKILLed trainer's reaping (SAVE_CUT_REAP_S, 2 s, daemon/ending.py), `scontrol show job` for the plan (whether
Slurm requeues the job itself, or it is cancelled: bounded at daemon/slurm/job.py's SIGNAL_TIMEOUT_S, 3 s, after a
cut or a failed last sync, asked once: its Requeue is what daemon/slurm/unsynced_end.py reads), state.json and the
events written to run.dir (a shared filesystem: a second or two), `scontrol requeue`
(bounded at SCONTROL_TIMEOUT_S, 10 s, for a busy slurmctld) and the supervisor's exit: 15 s of bounds, the rest for
the writes. The job's end itself is asked from the signal on, in the background, before any of it. More would cut
copies that had time to end; a SIGTERM at the time limit leaves only KillWait (30 s by default), of which it keeps
10 for the save and the sync."""
MAX_AHEAD_S = 400 * 24 * 3600.0
"""An end further than this is no end (Slurm's `UNLIMITED` time limit gives a date years ahead): no deadline."""


@dataclass(frozen=True)
class JobEnd:
    """When Slurm ends the job (epoch seconds; None: never, an unlimited job) and how that is known, in words."""

    at: float | None
    source: str
    guessed: bool = False
    """Neither scontrol's job nor the environment told it: the warning's lead (or KillWait) from the signal."""

    @property
    def deadline(self) -> float | None:
        """When a last sync still copying is cut (None: never)."""
        return None if self.at is None else self.at - REQUEUE_MARGIN_S

    def words(self) -> str:
        if self.at is None:
            return f"the job has no end ({self.source}): the last sync is waited for as on one server"
        return (f"the job ends at {clock(self.at)} ({self.source}): a last sync still copying at "
                f"{clock(self.at - REQUEUE_MARGIN_S)} is cut, {REQUEUE_MARGIN_S:.0f}s before, so that the requeue "
                f"runs before Slurm's kill")


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _epoch(value: str) -> float | None:
    """SLURM_JOB_END_TIME's epoch seconds, or None."""
    value = value.strip()
    return float(value) if value.isdigit() and int(value) > 0 else None


def _end_time(value: str) -> float | None:
    """scontrol's EndTime: epoch seconds (SLURM_TIME_FORMAT=%s), else local time with no zone; None for `Unknown`,
    `None`, anything else."""
    if (epoch := _epoch(value)) is not None:
        return epoch
    try:
        return datetime.fromisoformat(value.strip()).timestamp() if "T" in value else None
    except ValueError:
        return None


def kill_wait(config: str) -> float | None:
    """KillWait from `scontrol show config`'s lines (`KillWait                = 30 sec`), or None."""
    found = re.search(r"^KillWait\s*=\s*(\d+) sec", config, re.M)
    return float(found.group(1)) if found and int(found.group(1)) <= MAX_KILL_WAIT_S else None


def read(environ, job_line: dict[str, str], signal_name: str, signalled_at: float,
         kill_wait_s: float | None = None) -> JobEnd:
    """The job's end from its environment, `job_line` (scontrol show job's pairs, {} while it has not answered)
    and `kill_wait_s` (scontrol show config's KillWait, None while not known), as the module says."""
    kill = KILL_WAIT_S if kill_wait_s is None else kill_wait_s
    why_kill = "Slurm's default KillWait" if kill_wait_s is None else "Slurm's KillWait (scontrol show config)"
    known = [(at, source) for at, source in ((_end_time(job_line.get("EndTime", "")), "scontrol's EndTime"),
                                             (_epoch(environ.get(END_TIME_ENV, "")), END_TIME_ENV))
             if at is not None]
    if known:
        at, source = min(known)
        if at - signalled_at > MAX_AHEAD_S:
            return JobEnd(None, f"{source} is {clock(at)}, over a year ahead")
        if signal_name == "SIGTERM" and at <= signalled_at:
            return JobEnd(signalled_at + kill, f"{source} reached: Slurm's SIGTERM, {why_kill} {kill:.0f}s "
                                               f"before SIGKILL")
        return JobEnd(at, source)
    if signal_name == "SIGUSR2":  # `minilmd stop`'s (daemon/views/stop.py): a stop, no end of the job near
        return JobEnd(None, f"neither scontrol nor {END_TIME_ENV} told it, and `minilmd stop`'s SIGUSR2 ends no job")
    lead = WARNING_S if signal_name == "USR1" else kill
    why = "the --signal=B:USR1@300 warning's lead" if signal_name == "USR1" else why_kill
    return JobEnd(signalled_at + lead, f"neither scontrol nor {END_TIME_ENV} told it: {lead:.0f}s after the "
                                       f"{signal_name}, {why}; none if it was `minilmd stop`'s", guessed=True)
