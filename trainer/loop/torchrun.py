"""torchrun as the supervisor starts it for gpu.count > 1: `python -m minilmd.trainer.loop.torchrun ARGS...` is
`python -m torch.distributed.run ARGS...` with two differences, each a promise torch's own does not keep.

- Its stdout and stderr go through minilmd/terminal.py first. The agent writes into the attempt log: its warnings,
  and, when a rank fails, the ChildFailedError summary, which quotes the rank's error file (the exception text of a
  rank that records one, `@record`). Its ranks are `minilmd train` and escape what they print themselves; the agent
  is torch's, and would put an escape sequence in that text into the log as it is, for a `tail -f` of the file to
  obey (`minilmd logs` escapes what it shows). The streams are wrapped before torch is imported, so that the
  handlers torch gives its loggers are made on the wrapper (one made earlier is pointed at it:
  terminal.escape_std_streams; the Slurm job's torchrun, rendezvous.py, relies on that). What torch's C++ code
  writes to the descriptor itself passes neither (docs/failure-modes.md, the attempt log row).
- Its exit status is the ranks' own when every rank that failed gave the same one (`run`). torchrun exits 1 whatever
  its ranks exited with: a rank's 73 (run.dir full, saved to scratch first: protocol EXIT_RUN_DIR_FULL) or 75
  (stopped, saved) reached the supervisor as a crash. The ranks agree on a stop between two steps
  (trainer/loop/guards.py), so a run.dir that rank 1 finds full ends every rank with 73; torchrun stops the ranks
  still running once the first one has ended (SIGTERM), so its report may hold one rank, all, or some ended by that
  SIGTERM. When the ranks in it exited with one positive status, those SIGTERMs aside, this exits with that status;
  a mix (one rank crashed, 1, another 73) or another signal (a negative exit code, read from the log by
  daemon/child/process.py) leaves torchrun's own exit 1. The attempt's log lives in run.dir: on a full run.dir the
  report cannot be written, and Python's flush of the streams at exit, failing, would turn any status into 120, so
  the streams that hold what they could not write are replaced before the exit (`_exit_quietly`).
"""
from __future__ import annotations

import io
import os
import signal
import sys
from typing import TYPE_CHECKING

from minilmd import terminal
from minilmd.untrusted import printable

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


def main(argv: list[str] | None = None) -> None:
    terminal.escape_std_streams()
    run(sys.argv[1:] if argv is None else argv)


def run(argv: list[str]) -> None:
    """torchrun with `argv`; its ranks' shared status as this process's exit status (module docstring)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError as e:
        code = ranks_status(e)
        if code is None or code == 1:  # torch's own exit and report (a traceback: `ChildFailedError`) say it already
            raise
        _say(f"torchrun: every rank that ended exited {code}: exit status {code} (torchrun's own would be 1)\n"
             f"{e.format_msg()}\n")
        _exit_quietly(code)


def ranks_status(error: ChildFailedError) -> int | None:
    """The one positive exit status the failed ranks in torchrun's report gave, else None. A rank ended by SIGTERM
    beside them is one torchrun stopped itself once the first had ended (its report counts it as failed): no cause."""
    codes = {failure.exitcode for failure in error.failures.values()}
    said = {code for code in codes if code > 0}
    if len(said) != 1 or codes - said - {-signal.SIGTERM}:
        return None
    return said.pop()


def _say(text: str) -> None:
    """One unbuffered write to stderr, escaped (the report quotes a rank's error), dropped when it fails (a full
    run.dir): nothing left to flush at exit."""
    try:
        os.write(2, printable(text, lines=True).encode(errors="replace"))
    except OSError:
        pass


def _exit_quietly(code: int) -> None:
    """Exit with `code`, never 120: a stream whose flush fails is replaced by one that keeps nothing before Python's
    own flush at exit (the refused one is held in _REFUSED, so that it is not finalised, flushing, in between)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            _REFUSED.append(stream)
            setattr(sys, name, io.StringIO())
    sys.exit(code)


_REFUSED: list = []


if __name__ == "__main__":
    main()
