"""What the supervisor's loop holds beyond state.json, in one record: `Supervisor.loop`, read and written by the loop
(daemon/supervisor.py) and its ending (daemon/ending.py) alike. The phase is not here: state.json's record of it is
the only one (`Supervisor.phase`). Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from minilmd.daemon.base.states import Cause, Phase
from minilmd.daemon.child.process import Child

if TYPE_CHECKING:
    from minilmd.daemon.scratchclaim import Held


@dataclass(frozen=True)
class Backoff:
    """A wait in `backoff`: until when, and the phase it goes to then (set together, never one without the other)."""

    until: float
    then: Phase


@dataclass
class SupervisorState:
    exit_status: int = 0
    """The supervisor's exit status (minilmd/protocol.py SUPERVISOR_*), set with a final phase or a crash."""
    stop_requested: bool = False
    """A stop was asked (a signal, `minilmd stop`'s request at a launcher's restart): the run ends after a last sync."""
    stop_reason: str = "stopped on request"
    """The reason `done` will give a stop."""
    stop_signals_taken: int = 0
    """The SIGTERM/SIGINTs the stop was taken on (1; 0 for `minilmd stop`'s SIGUSR2, a stop request, Slurm's USR1):
    one more than these is the second stop signal, which kills the trainer in its save."""
    gpu_lost: str = ""
    """Why the trainer was asked to save and stop: its card's lease lost to another run (daemon/attempt.py
    _leave_lost_gpu); its end then goes back to waiting_gpu (policy.decide's gpu_lost). "" otherwise."""
    child: Child | None = None
    """The trainer of the current attempt, while it runs (or is not reaped yet)."""
    attempt: int = 0
    """The number of the newest attempt (counted on from the run's earlier supervisors: their logs)."""
    backoff: Backoff | None = None
    """While in `backoff`: its end and the phase after it."""
    last_cause: Cause | None = None
    """How the newest trainer ended (a `Cause`): the ending asks whether it finished."""
    scratch_kept: str = ""
    """Why scratch is kept whole at exit, though the failure is final (no staged input given back): set when a
    finished trainer left nothing in scratch to sync (Ending._nothing_to_sync)."""
    ended: str = ""
    """How the run ended (protocol.ENDED_*), set as it goes done: state.json's outcome.ended (failed when not done)."""
    resumes: bool = False
    """The launch found a checkpoint of the run's own, in scratch or on run.remote (daemon/preflight.py launch): no
    first start, though this machine's state.json is lost (daemon/phases/initwait.py at_start)."""
    held: Held | None = None
    """What the launch's wait for room for scratch handed over held (daemon/scratchclaim.py): the run lock, never let
    go between the wait and the loop, and the stop signals' record; None when the launch did not wait."""
