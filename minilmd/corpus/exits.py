"""How the corpus commands (`prepare`, `corpus ...`, `tokenizer ...`, `demo-corpus`) end: each failure as its exit
status, said in one line, never a traceback; SIGTERM and SIGHUP as Ctrl-C. Torch-free.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer

EXIT_IO = 74  # sysexits EX_IOERR: a read or write failed (a full disk, EIO on a share); run it again once fixed


def io_error_exit(e: OSError, what: str, kept: str) -> typer.Exit:
    """A read or write that failed (ENOSPC on --out, EIO on an NFS source): said in one line, not a traceback;
    `kept` says what is left of the output (prepare's cleanup ran as the error unwound through it)."""
    where = f" ({e.filename})" if e.filename else ""
    typer.echo(f"error: {what}: {e.strerror or e}{where}; {kept}. Fix it (free space, the share) and run it again",
               err=True)
    return typer.Exit(EXIT_IO)


def interrupt_on_termination() -> None:
    """SIGTERM, and SIGHUP (an SSH session closed under it; nohup's SIG_IGN stays), end a corpus command as Ctrl-C
    does: KeyboardInterrupt unwinds through its cleanup (no half output, no temp dir left, a training child ended)."""
    import signal

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
        signal.signal(signal.SIGHUP, on_sigterm)


@contextlib.contextmanager
def prepare_exits(what: str, kept: str) -> Iterator[None]:
    """A prepare's failure as its exit status, said in one line: bad input or arguments (every ValueError: InputError,
    CorpusError, TokenizerError) by data_error_exit, a read or write that failed 74, interrupted 130; `kept` says
    what is left of the output (the cleanup ran as the error unwound through it)."""
    try:
        yield
    except ValueError as e:
        raise data_error_exit(e) from None
    except KeyboardInterrupt:
        typer.echo(f"{what}: interrupted, {kept}", err=True)
        raise typer.Exit(130) from None
    except OSError as e:
        raise io_error_exit(e, what, kept) from None


def data_error_exit(e: Exception) -> typer.Exit:
    """Bad input data -> 65 (EX_DATAERR, final); a source that failed while read -> 74 (EX_IOERR: run it again);
    a bad argument or tokenizer -> 2."""
    from minilmd.corpus.sources.jsonl import InputError, SourceReadError
    from minilmd.corpus_meta import CorpusError
    from minilmd.protocol import EXIT_CONFIG, EXIT_DATA

    typer.echo(f"error: {e}", err=True)
    if isinstance(e, SourceReadError):
        return typer.Exit(EXIT_IO)
    return typer.Exit(EXIT_DATA if isinstance(e, (InputError, CorpusError)) else EXIT_CONFIG)
