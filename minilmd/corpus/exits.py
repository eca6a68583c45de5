"""How a command ends: each failure as its exit status (minilmd/protocol.py holds the numbers), said in one line,
never a traceback; SIGTERM and SIGHUP as Ctrl-C (`interruptible`). The corpus commands (`prepare`, `corpus ...`,
`tokenizer ...`, `demo-corpus`) end through all of it, `export` and `bench` through `interruptible`; the
command-line modules import the statuses from here at module level (tests/test_layers.py CLI_MODULE_LEVEL).
Torch-free.
"""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import typer

from minilmd.protocol import EXIT_CONFIG, EXIT_DATA, EXIT_INTERRUPTED, EXIT_IO

__all__ = ["EXIT_CONFIG", "EXIT_DATA", "EXIT_INTERRUPTED", "EXIT_IO", "data_error_exit", "interruptible",
           "io_error_exit", "prepare_exits"]


def io_error_exit(e: OSError, what: str, kept: str) -> typer.Exit:
    """A read or write that failed (ENOSPC on --out, EIO on an NFS source): said in one line, not a traceback;
    `kept` says what is left of the output (prepare's cleanup ran as the error unwound through it)."""
    where = f" ({e.filename})" if e.filename else ""
    typer.echo(f"error: {what}: {e.strerror or e}{where}; {kept}. Fix it (free space, the share) and run it again",
               err=True)
    return typer.Exit(EXIT_IO)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def interruptible(said: str) -> Iterator[None]:
    """A command's body, ended by Ctrl-C, SIGTERM or SIGHUP (an SSH session closed under it; nohup's SIG_IGN stays)
    alike: KeyboardInterrupt unwinds through its cleanup (no half output, no temporary copy left, a child ended),
    then `said` in one line on stderr and exit 130 (typer's own handler exits 130 without a word)."""
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
        signal.signal(signal.SIGHUP, _interrupt)
    try:
        yield
    except KeyboardInterrupt:
        typer.echo(said, err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


@contextlib.contextmanager
def prepare_exits(what: str, kept: str) -> Iterator[None]:
    """A prepare's failure as its exit status, said in one line: bad input or arguments (every ValueError: InputError,
    CorpusError, TokenizerError) by data_error_exit, a read or write that failed 74, interrupted 130; `kept` says
    what is left of the output (the cleanup ran as the error unwound through it)."""
    with interruptible(f"{what}: interrupted, {kept}"):
        try:
            yield
        except ValueError as e:
            raise data_error_exit(e) from None
        except OSError as e:
            raise io_error_exit(e, what, kept) from None


def data_error_exit(e: Exception) -> typer.Exit:
    """Bad input data -> 65 (EX_DATAERR, final); a source that failed while read -> 74 (EX_IOERR: run it again);
    a bad argument or tokenizer -> 2."""
    from minilmd.corpus.sources.jsonl import InputError, SourceReadError
    from minilmd.corpus_meta import CorpusError

    typer.echo(f"error: {e}", err=True)
    if isinstance(e, SourceReadError):
        return typer.Exit(EXIT_IO)
    return typer.Exit(EXIT_DATA if isinstance(e, (InputError, CorpusError)) else EXIT_CONFIG)
