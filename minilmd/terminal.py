"""Everything a minilmd process writes to its stdout and stderr goes through `printable` (minilmd/untrusted.py):
the one place where a name from someone else's file (a checkpoint's manifest, a run directory's name, a corpus's
meta.json, a tokenizer's decoder) is kept from reaching a terminal as an escape sequence (OSC 52 writing the
clipboard, a clear screen, a title, a bidi override), whichever printer says it: typer.echo, print, a traceback,
a library's warning. The views and messages escape what they show too (printable, clipped); this is the floor under
them, so that a new message cannot forget it. The supervisor's stdout is the tmux window or systemd's journal; its
supervisor.log is a file, escaped where it is written (daemon/base/runstate.py EventLog).

What stays as written: newlines and tabs (printable's `lines`), and one line of minilmd's own, the progress bar of
`prepare` on a terminal (minilmd/corpus/progress.py Progress: a carriage return first, `ESC [ K` last,
nothing but printable ASCII between; `PROGRESS_BAR`), whose control characters are what draws it in place. A
foreign name of that exact shape could at most draw a progress bar.

Output that is bytes (sys.stdout.buffer, a child's output on an inherited descriptor) is not text and does not pass
here: the wrapper has no `buffer`, and a child of ours escapes its own: the trainer (`python -m minilmd.cli`), and
the torchrun agent over its ranks (trainer/loop/torchrun.py, rendezvous.py), whose failure summary quotes a rank's
error. A logging handler made before the wrapping (torch's, at its import) is pointed at the wrapper. What is
written to the descriptor itself passes nowhere here: faulthandler's stack dump escapes its names itself (CPython
writes nothing but printable ASCII and newlines there); native code's lines (torch's C++ log, NCCL, CUDA, glibc)
and the output of Pythons that are not minilmd's (torch.compile's workers) reach the attempt log as written
(docs/failure-modes.md). A py-spy dump is escaped before it is written (daemon/child/stackdump.py).
JSON stays JSON: json.dumps writes every C0 control escaped, and what printable escapes beyond that (DEL, C1, bidi)
it writes as \\uNNNN, which JSON reads as the same character.

rich, which typer draws help and error boxes with, is told it writes to no terminal
(_TYPER_FORCE_DISABLE_TERMINAL, read when typer loads typer.rich_utils): its colours are escape sequences too, which
this would show as text. The boxes stay; their colours go. Standard library only.
"""
from __future__ import annotations

import io
import os
import re
import sys
from typing import TextIO

from minilmd.untrusted import printable

PROGRESS_BAR = re.compile(r"\r\[[#.]+\] [ -~]*\x1b\[K")
"""The one line written with its control characters as they are: prepare's progress bar on a terminal."""


class EscapingWriter(io.TextIOBase):
    """A text stream that writes what it is given to `raw` through printable(lines=True)."""

    def __init__(self, raw: TextIO):
        self.raw = raw

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # click asks with b"" whether a stream takes bytes: it does not
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.raw.write(text if PROGRESS_BAR.fullmatch(text) else printable(text, lines=True))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.raw.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.raw.errors

    @property
    def line_buffering(self) -> bool:
        return getattr(self.raw, "line_buffering", False)


def escape_std_streams() -> None:
    """sys.stdout and sys.stderr through printable from here on (idempotent); called first by every entry point
    (minilmd.cli.main, the Slurm node helper, the rendezvous launcher)."""
    os.environ["_TYPER_FORCE_DISABLE_TERMINAL"] = "1"  # over FORCE_COLOR too; an empty one would not be
    wrapped: dict[int, EscapingWriter] = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, EscapingWriter):
            setattr(sys, name, EscapingWriter(stream))
            wrapped[id(stream)] = getattr(sys, name)
    _repoint_log_handlers(wrapped)


def _repoint_log_handlers(wrapped: dict[int, EscapingWriter]) -> None:
    """Each logging handler made before the streams were wrapped (a StreamHandler keeps the stream it was made
    with: importing torch makes one for its loggers, and the Slurm job's torchrun, rendezvous.py, imports torch
    before it can wrap) writes to the wrapper of its stream from here on. Nothing when logging was never imported:
    there is no handler then, and importing it would cost every command."""
    logging = sys.modules.get("logging")
    if logging is None or not wrapped:
        return
    loggers = [logging.getLogger(), *(logger for logger in list(logging.Logger.manager.loggerDict.values())
                                      if isinstance(logger, logging.Logger))]
    for logger in loggers:
        for handler in list(logger.handlers):
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in wrapped:
                handler.setStream(wrapped[id(stream)])
