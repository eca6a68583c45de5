"""torchrun as the supervisor starts it for gpu.count > 1: `python -m minilmd.trainer.loop.torchrun ARGS...` is
`python -m torch.distributed.run ARGS...` whose own stdout and stderr go through minilmd/terminal.py first.

The agent writes into the attempt log: its warnings, and, when a rank fails, the ChildFailedError summary, which
quotes the rank's error file (the exception text of a rank that records one, `@record`). Its ranks are `minilmd
train` and escape what they print themselves; the agent is torch's, and would put an escape sequence in that text
into the log as it is, for a `tail -f` of the file to obey (`minilmd logs` escapes what it shows). The streams are
wrapped before torch is imported, so that the handlers torch gives its loggers are made on the wrapper (one made
earlier is pointed at it: terminal.escape_std_streams; the Slurm job's torchrun, rendezvous.py, relies on that).
What torch's C++ code writes to the descriptor itself passes neither (docs/failure-modes.md, the attempt log row).
"""
from __future__ import annotations

import sys

from minilmd import terminal


def main(argv: list[str] | None = None) -> None:
    terminal.escape_std_streams()
    from torch.distributed.run import main as torchrun

    torchrun(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
