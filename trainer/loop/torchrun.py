"""torchrun as the supervisor starts it for gpu.count > 1: `python -m minilmd.trainer.loop.torchrun ARGS...` is
`python -m torch.distributed.run ARGS...` with these differences, each a promise torch's own does not keep.

- Its stdout and stderr go through minilmd/terminal.py first. The agent writes into the attempt log: its warnings,
  and, when a rank fails, the ChildFailedError summary, which quotes the rank's error file (the exception text of a
  rank that records one, `@record`). Its ranks are `minilmd train` and escape what they print themselves; the agent
  is torch's, and would put an escape sequence in that text into the log as it is, for a `tail -f` of the file to
  obey (`minilmd logs` escapes what it shows). The streams are wrapped before torch is imported, so that the
  handlers torch gives its loggers are made on the wrapper (one made earlier is pointed at it:
  terminal.escape_std_streams; the Slurm job's torchrun, rendezvous.py, relies on that). What torch's C++ code
  writes to the descriptor itself passes neither (docs/failure-modes.md, the attempt log row).
- Its exit status is the ranks' own when every rank that failed gave the same one (`run`), as one trainer's would
  be: torchrun exits 1 whatever its ranks exited with, so a rank's 73 (run.dir full, saved to scratch first:
  protocol EXIT_RUN_DIR_FULL) or 75 (stopped, saved) reached the supervisor as a crash. The ranks agree on a stop
  between two steps (trainer/loop/guards.py), so a run.dir that rank 1 finds full ends every rank with 73; torchrun
  stops the ranks still running once the first one has ended (SIGTERM), so its report may hold one rank, all, or
  some ended by that SIGTERM. When the ranks in it exited with one positive status, those SIGTERMs aside, this
  exits with that status, whichever it is (`ranks_status`): 73 and 75, and also a shared 2 or 65 (config or data
  refused: final), 74, 76 (CUDA OOM: fault.json) or 120, each classified by the supervisor as one trainer's exit
  with it (before, any status but 73 and 75 was exit 1, a crash, restarted); a shared 1 is torch's own exit. A mix
  (one rank crashed, 1, another 73) or another signal (a negative exit code, read from the agent's summary by
  daemon/child/torchrun_summary.py) leaves torchrun's exit 1 and its report.
- A stop signal to torchrun itself (the supervisor's SIGTERM to the trainer's group, systemd's stop): torch's agent
  raises SignalException after it has sent the signal on to the ranks and waited for them (its shutdown grace,
  then SIGKILL). That grace is the run's save grace, the one the supervisor gives a single trainer
  (restart.hang_timeout, passed as names.TORCHRUN_GRACE_ENV: daemon/child/grace.py), not torch's 30 s, which cut
  a stop save of rank 0 longer than that while the supervisor would have waited (`_give_grace`); the agent's other
  closes keep torch's 30 s: its stop of the other ranks once one has failed, and its close after any other
  exception (a rendezvous or store error). The ranks' exit statuses are read as the agent's
  close leaves them (`_record_rank_ends`); every rank ended with the same positive status (each saved and exited
  75, or 73) is this process's status, as for a rank's own (before: exit 1 always, the ranks' 75 lost). A rank
  SIGKILLed at the end of the grace, one still running, or a mix leaves exit 1 and torch's traceback.
- The attempt's log lives in run.dir: on a full run.dir the report cannot be written, and Python's flush of the
  streams at exit, failing, would turn any status into 120, so the streams that hold what they could not write are
  replaced before every exit that follows torchrun's end, exit 1 and its traceback included (`_exit_quietly`).
"""
from __future__ import annotations

import io
import os
import signal
import sys
import traceback
from typing import TYPE_CHECKING, NoReturn

from minilmd import names, terminal
from minilmd.untrusted import printable

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


def main(argv: list[str] | None = None) -> None:
    terminal.escape_std_streams()
    run(sys.argv[1:] if argv is None else argv)


def run(argv: list[str]) -> None:
    """torchrun with `argv`; its ranks' shared status as this process's exit status (module docstring)."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    ends = _record_rank_ends(_give_grace(os.environ.get(names.TORCHRUN_GRACE_ENV, "")))
    try:
        torchrun(argv)
    except ChildFailedError as e:
        code = ranks_status(e)
        if code is None or code == 1:  # torch's own exit and report (a traceback: `ChildFailedError`)
            _exit_quietly(1, _traceback(e))
        _exit_quietly(code, f"torchrun: every rank that ended exited {code}: exit status {code} (torchrun's own "
                            f"would be 1)\n{e.format_msg()}\n")
    except SignalException as e:
        code = shared_status(ends)
        if code is None:
            _exit_quietly(1, _traceback(e))
        _exit_quietly(code, f"torchrun: stopped by {signal.Signals(e.sigval).name}; every rank exited {code}: exit "
                            f"status {code} (torchrun's own would be 1)\n")


def ranks_status(error: ChildFailedError) -> int | None:
    """The one positive exit status the failed ranks in torchrun's report gave, whichever it is, else None. A rank
    ended by SIGTERM beside them is one torchrun stopped itself once the first had ended (its report counts it as
    failed): no cause."""
    return shared_status([failure.exitcode for failure in error.failures.values()], spared=-signal.SIGTERM)


def shared_status(codes: list[int | None], spared: int | None = None) -> int | None:
    """The one positive status every rank of `codes` exited with (None: still running), those that exited `spared`
    aside; else None."""
    said = {code for code in codes if code is not None and code > 0}
    if len(said) != 1 or any(code is None or (code not in said and code != spared) for code in codes):
        return None
    return said.pop()


def _give_grace(value: str) -> int | None:
    """The agent's wait between its SIGTERM to the ranks and its SIGKILL on a stop signal to this process: `value`
    (names.TORCHRUN_GRACE_ENV, whole seconds), given by `_record_rank_ends` to the one close the agent makes while it
    handles that signal. None: torch's 30 s kept (unset, or not a whole number of seconds). Not through torch's own
    knob (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, LaunchConfig.shutdown_timeout): torch 2.13's SimpleElasticAgent.run gives it
    to the close in its `finally` as well, after any other exception (a rendezvous or store error: a peer's agent
    gone with the store), where ranks stuck in a collective (NCCL) would then hold the restart for the whole grace
    (review10b F1). Every other close keeps 30 s, as it should: those ranks wait for no save of theirs (an agreed
    stop's ranks exit only after rank 0's write: Saves.exit_barrier), the stop of the other ranks once one has failed
    (LocalElasticAgent._stop_workers) too."""
    return int(value) if value.isdigit() else None


def _record_rank_ends(grace: int | None = None) -> list[int | None]:
    """A list that holds, once torch's agent has closed its ranks (PContext.close: after they all exited, or after
    its stop signal, grace and SIGKILL), each rank's exit status (Popen.poll: None for one it had to abandon). The
    agent does not hand them on with the SignalException it raises after a stop signal.

    `grace` (`_give_grace`): the wait between SIGTERM and SIGKILL of the close the agent makes while it handles a
    stop signal (inside its `except SignalException`), in place of torch's 30 s; its other closes keep theirs. The
    one place this launcher leans on torch's internals: PContext.close(death_sig, timeout), and where the agent calls
    it; should that change, a stop gets torch's 30 s again (the safe side), which tests/test_torchrun_grace.py
    catches."""
    from torch.distributed.elastic.multiprocessing import SignalException, api

    ends: list[int | None] = []
    close = api.PContext.close

    def recording_close(self, death_sig=None, timeout=30):
        if grace is not None and isinstance(sys.exc_info()[1], SignalException):
            timeout = grace
        try:
            close(self, death_sig, timeout)
        finally:
            handlers = getattr(self, "subprocess_handlers", None) or {}
            ends[:] = [handler.proc.poll() for handler in handlers.values()]

    api.PContext.close = recording_close  # type: ignore[method-assign]
    return ends


def _traceback(error: BaseException) -> str:
    """What Python would print of `error` left uncaught (torch's report is the ChildFailedError's text)."""
    return "".join(traceback.format_exception(error))


def _say(text: str) -> None:
    """One unbuffered write to stderr, escaped (the report quotes a rank's error), dropped when it fails (a full
    run.dir): nothing left to flush at exit."""
    try:
        os.write(2, printable(text, lines=True).encode(errors="replace"))
    except OSError:
        pass


def _exit_quietly(code: int, report: str) -> NoReturn:
    """Say `report`, then exit with `code`, never 120: a stream whose flush fails is replaced by one that keeps
    nothing before Python's own flush at exit (the refused one is held in _REFUSED, so that it is not finalised,
    flushing, in between). The streams are flushed first, so that what they hold comes before the report."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            _REFUSED.append(stream)
            setattr(sys, name, io.StringIO())
    _say(report)
    sys.exit(code)


_REFUSED: list = []


if __name__ == "__main__":
    main()
