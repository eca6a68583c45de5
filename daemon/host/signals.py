"""The supervisor's signals: SIGTERM/SIGINT (stop; a second one kills the trainer in its save), SIGUSR2 (`minilmd
stop`'s stop, never more than a stop however often it comes), SIGHUP (reopen supervisor.log), SIGUSR1 (Slurm's
warning). The handlers only record what came; the supervisor's loop acts on it at its next tick. Torch-free.

`minilmd run` installs them as its first step (daemon/supervisor.py run_supervisor), before the launch's checks, and
the same record goes to the scratch wait and the supervisor (before, they were installed just before the loop: a
SIGTERM, SIGHUP or `minilmd stop`'s SIGUSR2 during the launch ended the process by its default action, its cleanup
skipped, after it had made run.dir's files and claimed scratch). While the launch only checks (`checking`, nothing
made yet), a stop signal raises `LaunchStopped` from its handler, as Python's default SIGINT raises
KeyboardInterrupt, so that Ctrl-C or a SIGTERM ends a slow check (a share that does not answer) at once; from the
first thing the launch makes (`record_only`), a stop is only recorded, and the supervisor's first tick ends the run
as a stop does: its scratch given back, state.json `done` (stopped), its run lock let go."""
from __future__ import annotations

import signal
from dataclasses import dataclass


class LaunchStopped(BaseException):
    """A stop signal (its name) while the launch only checked: nothing made, nothing started. A BaseException, as
    KeyboardInterrupt is: no `except Exception` of a check takes it for a failed check."""


@dataclass
class Signals:
    """What the handlers saw; only the loop acts on it, through the methods below (nothing else writes the
    fields: tests/test_supervisor_dispatch.py)."""

    stop: int = 0  # count of SIGTERM/SIGINT received: a second one kills the trainer in its save
    asked: bool = False  # a SIGUSR2 came: `minilmd stop`'s, a stop that never escalates (run again, or twice at once)
    stop_by: str = ""  # the last one's name ("SIGTERM"), for the words of a stop
    hup: bool = False
    usr1: bool = False  # Slurm's --signal warning: preemption or the time limit is near (daemon/slurm/job.py)
    checking: bool = False  # the launch only checks, nothing made yet: a stop raises LaunchStopped (record_only)

    def install(self) -> None:
        """The handlers, writing this record (installed again: the same record, nothing lost)."""
        def on_stop(signum, frame):
            self.stop += 1
            self.stop_by = signal.Signals(signum).name
            self._end_check()

        def on_asked(signum, frame):
            self.asked = True
            self.stop_by = signal.Signals(signum).name
            self._end_check()

        def on_hup(signum, frame):
            self.hup = True

        def on_usr1(signum, frame):
            self.usr1 = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGUSR2, on_asked)
        signal.signal(signal.SIGHUP, on_hup)
        signal.signal(signal.SIGUSR1, on_usr1)

    def _end_check(self) -> None:
        if self.checking:
            self.checking = False  # raised once: a second signal meanwhile is only recorded
            raise LaunchStopped(self.stop_by)

    def record_only(self) -> None:
        """From now on a stop is only recorded: the launch is about to make something, which its stop must undo."""
        self.checking = False

    @property
    def stopping(self) -> bool:
        """Whether a stop came: a SIGTERM or SIGINT, or `minilmd stop`'s SIGUSR2."""
        return bool(self.stop or self.asked)

    def take_hup(self) -> bool:
        """Whether a SIGHUP came since the last call (the loop reopens supervisor.log once per call that says so)."""
        came, self.hup = self.hup, False
        return came

    def take_usr1(self) -> bool:
        """Whether a SIGUSR1 came since the last call."""
        came, self.usr1 = self.usr1, False
        return came

    def usr2_as_warning(self) -> None:
        """A SIGUSR2 that is no `minilmd stop`'s (no request of it in run.dir: stoprequest.asked_now) in a Slurm job:
        Slurm's `--signal=B:USR2` warning, taken as its USR1 (a preemption), no stop asked."""
        self.asked, self.usr1 = False, True

    def stop_as_first_signal(self) -> None:
        """A stop the loop itself asks for (Slurm's USR1 warning: a preemption), counted as the first stop signal:
        the trainer saves, then the last sync; a SIGTERM after it is the second (kill the trainer now)."""
        self.stop = max(self.stop, 1)
