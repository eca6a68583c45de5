"""A preempted job's end, asked of Slurm in the background from the signal on, and moved when Slurm answers.

At the preemption's signal (SlurmJob.preempt) a `Worker` thread asks `scontrol show job` for the job's end, and
after a SIGTERM `scontrol show config` for Slurm's KillWait too, each within SIGNAL_TIMEOUT_S. A slurmctld that
does not answer (busy requeuing or preempting, failing over) is asked again after each of RETRY_DELAYS_S, until
`scontrol show job` answers or the tries are spent. The loop never waits for it: the trainer's save and the last
sync begin at once, and each tick reads the end from what has come so far (daemon/slurm/jobend.py's rule, its one
home: SLURM_JOB_END_TIME and the fallback until scontrol answers), each answer as soon as it comes (the job's
EndTime is not held while KillWait is asked). An answer moves the deadline, earlier or later, and the change is
said once in supervisor.log (a change of source alone, the same end, is not a move and is not said). Only the
loop emits; the thread stores its findings in one attribute. Torch-free.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping

from minilmd.daemon.base.worker import Worker
from minilmd.daemon.slurm import jobend

RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0)
"""The waits before each try after the first: five tries in at most 15 s of waits plus five SIGNAL_TIMEOUT_S
(twice that after a SIGTERM, KillWait asked too). Two begin before a SIGTERM's default fallback deadline (30 s
less REQUEUE_MARGIN_S) even when every call is silent; all of them in time for a USR1's (300 s less it)."""


def ask_kill_wait(runner: Callable[[list[str]], str]) -> float | None:
    """Slurm's KillWait from `scontrol show config`, or None when it does not answer."""
    try:
        return jobend.kill_wait(runner(["scontrol", "show", "config"]))
    except (OSError, subprocess.SubprocessError):
        return None


def _when(at: float | None) -> str:
    return "no end" if at is None else jobend.clock(at)


class EndWatch:
    """The job's end as far as Slurm has told it: `current()` from the loop, the asking in a thread.
    `ask_job()` answers scontrol show job's pairs ({} when it does not answer); `runner` runs `scontrol show config`
    (both bounded by SIGNAL_TIMEOUT_S)."""

    def __init__(self, ask_job: Callable[[], dict[str, str]], runner: Callable[[list[str]], str],
                 environ: Mapping[str, str], signal_name: str, signalled_at: float, emit: Callable[..., None],
                 delays: tuple[float, ...] = RETRY_DELAYS_S):
        self.signal_name, self.signalled_at = signal_name, signalled_at
        self._ask_job, self._runner, self._environ, self._emit, self._delays = ask_job, runner, environ, emit, delays
        self.known: tuple[dict[str, str], float | None, int, float] = ({}, None, 0, 0.0)
        """What the thread has learned, stored whole: scontrol's job line ({} until it answers), KillWait (None
        until it answers, or not asked), the tries made, and when the last one ended."""
        self._said: jobend.JobEnd | None = None
        self._worker = Worker("slurm-job-end", self._ask)

    @property
    def settled(self) -> bool:
        """Whether the asking is over: scontrol answered, or the tries are spent."""
        return self._worker.done

    def _ask(self) -> None:
        kill_wait = None
        for tries, delay in enumerate((0.0, *self._delays), 1):
            time.sleep(delay)
            line = self._ask_job()
            if line:  # used at once: not held while KillWait is asked (up to SIGNAL_TIMEOUT_S more)
                self.known = (line, kill_wait, tries, time.time())
            if self.signal_name == "SIGTERM" and kill_wait is None:  # the fallback's, or the time limit's, kill
                kill_wait = ask_kill_wait(self._runner)
            self.known = (line, kill_wait, tries, time.time())
            if line:
                return

    def current(self, now: float | None = None) -> jobend.JobEnd:
        """The job's end from what Slurm has said so far, said in supervisor.log when it is first relied on or
        moves. Not said while the first try is out (normally a few milliseconds) unless its deadline has come."""
        line, kill_wait, tries, told_at = self.known
        end = jobend.read(self._environ, line, self.signal_name, self.signalled_at, kill_wait)
        now = time.time() if now is None else now
        if end != self._said and (tries or (end.deadline is not None and now >= end.deadline)):
            self._say(end, bool(line), told_at)
        return end

    def _say(self, end: jobend.JobEnd, answered: bool, told_at: float) -> None:
        before, self._said = self._said, end
        if before is not None and before.at == end.at:  # only how it is known changed (KillWait's default, read)
            return
        if before is not None:
            self._emit("slurm", f"the job's end moved from {_when(before.at)} to {_when(end.at)}: Slurm answered "
                                f"{told_at - self.signalled_at:.0f}s after the {self.signal_name}; {end.words()}")
        elif answered:
            self._emit("slurm", end.words())
        else:
            again = "asked again in the background" if not self.settled else "its tries are spent"
            self._emit("slurm", f"{end.words()} (scontrol show job did not answer: {again})")
