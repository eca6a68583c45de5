"""How a command ends: each failure as its exit status (minilmd/protocol.py holds the numbers), said in one line,
never a traceback; SIGTERM and SIGHUP as Ctrl-C (`interruptible`). The corpus commands (`prepare`, `corpus ...`,
`tokenizer ...`, `demo-corpus`) end through all of it, `export` and `bench` through `interruptible`; the
command-line modules import the statuses from here at module level (tests/test_layers.py CLI_MODULE_LEVEL).
Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
from collections.abc import Iterator

import typer

from minilmd.fsio import is_disk_full, no_inode_left
from minilmd.protocol import COMMAND_FAILED, COUNT_FOUND, EXIT_CONFIG, EXIT_DATA, EXIT_INTERRUPTED, EXIT_IO

__all__ = ["COMMAND_FAILED", "COUNT_FOUND",
           "EXIT_CONFIG", "EXIT_DATA", "EXIT_INTERRUPTED", "EXIT_IO", "data_error_exit", "interruptible", "out_dir_of",
           "out_error_exit",
           "io_error_exit", "prepare_exits"]


def io_error_exit(e: OSError, what: str, kept: str) -> typer.Exit:
    """A read or write that failed (ENOSPC on --out, EIO on an NFS source): said in one line, not a traceback;
    `kept` says what is left of the output (prepare's cleanup ran as the error unwound through it)."""
    where = f" ({e.filename})" if e.filename else ""
    todo = IO_WHAT_TO_DO.get(e.errno or 0, "Fix it (free space, the share) and run it again")
    typer.echo(f"error: {what}: {e.strerror or e}{where}; {kept}. {todo}", err=True)
    return typer.Exit(EXIT_IO)


IO_WHAT_TO_DO = {
    errno.EACCES: "Fix its permissions, or choose another path, and run it again",
    errno.EPERM: "Fix its permissions, or choose another path, and run it again",
    errno.EROFS: "It is on a read-only file system: choose another path",
}
"""io_error_exit's advice where freeing space or the share would not help (a read or a write: the path says)."""


OUT_WHAT_TO_DO = {
    errno.EACCES: "choose a directory you may write, or have its owner let you",
    errno.EPERM: "choose a directory you may write, or have its owner let you",
    errno.EROFS: "choose a directory on a file system mounted read-write",
    errno.ENOSPC: "free some space there (or choose another directory), then run it again",
    errno.EDQUOT: "free some space there (or choose another directory), then run it again",
    errno.EIO: "fix the disk or the share (the system log says more), then run it again",
    errno.ENAMETOOLONG: "choose a shorter path (or name) for the output",
}
"""What to do when an output cannot be written there, by errno; anything else: fix the disk or the share."""


def out_error_exit(e: OSError, tool: str, where: str | os.PathLike, kept: str) -> typer.Exit:
    """The one way a command that writes an output (prepare, demo-corpus, plot, tokenizer train and template) ends
    when the write fails: exit 74, the message naming the directory the user typed (`where`), never the temporary
    name the error may carry, what failed in words of what it is (`_what_failed`: a permission with whose directory
    it is, a read-only file system, a disk that failed, a name too long, a full disk or quota with its file system),
    what is left (`kept`) and what to do (OUT_WHAT_TO_DO). A file in the way or a directory others can rearrange is a
    PlaceRefused instead (exit 2), said before this."""
    todo = OUT_WHAT_TO_DO.get(e.errno or 0, "fix the disk or the share, then run it again")
    todo = getattr(e, "what_to_do", todo)  # dirfd.NameHeld: another user's name in a sticky directory
    typer.echo(f"{tool}: {_what_failed(e, where)}; {kept}; {todo}", err=True)
    return typer.Exit(EXIT_IO)


def _what_failed(e: OSError, where: str | os.PathLike) -> str:
    """What went wrong writing in `where`, by what it is: before, every error was "cannot write in WHERE: <what the
    system said>", a disk that failed and a read-only mount worded as a permission the user could fix."""
    said = e.strerror or str(e)
    if e.errno == errno.EROFS:
        return f"cannot write in {where}: it is on a read-only file system ({said})"
    if e.errno == errno.EIO:
        return f"the disk (or share) under {where} failed while it was written to ({said})"
    if e.errno == errno.ENAMETOOLONG:
        return f"cannot write in {where}: a name there is too long for its file system ({said})"
    if e.errno in (errno.EACCES, errno.EPERM) and not getattr(e, "what_to_do", None):
        return f"cannot write in {where}: {said}{_whose(e, where)}"
    return f"cannot write in {where}: {said}{_file_system(e, where)}"


def _whose(e: OSError, where: str | os.PathLike) -> str:
    """" (the directory D belongs to user X (uid N), mode M)": the nearest directory there is of the one refused (the
    error's file name, else `where`), looked at in a bounded probe; "" when it cannot be."""
    from minilmd.bounded import bounded_probe

    answered, said, _ = bounded_probe(_owner_of, str(e.filename or where))
    return said if answered else ""


def _owner_of(path: str) -> str:
    from minilmd.perms import user_words

    path = os.path.abspath(path)
    for _ in range(path.count(os.sep) + 1):  # the nearest directory there is: the refused one may not be made yet
        try:
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                return f" (the directory {path} belongs to {user_words(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):o})"
        except OSError:
            pass
        path = os.path.dirname(path)
    return ""


def _file_system(e: OSError, where: str | os.PathLike) -> str:
    """Which file system `where` is on and the room left there, for a write that failed for want of space (ENOSPC;
    EDQUOT: the mount alone, the quota being the user's): the errors where freeing space helps and the disk still
    answers. Any other is said without a look at the file system: on EIO or ESTALE (a hard NFS mount that stopped
    answering) each stat could hang the error path itself. The look is bounded all the same (SHARED_STORAGE_PROBE_S:
    minilmd/bounded.py); a file system that does not answer in time is not named."""
    if not is_disk_full(e) or getattr(e, "what_to_do", None):
        return ""
    from minilmd.bounded import bounded_probe

    answered, said, _ = bounded_probe(_room, e.errno, str(where))
    return said if answered else ""


def _room(error: int, where: str) -> str:
    """_file_system's look (in bounded_probe's thread): the mount point of `where`, with the room left on ENOSPC."""
    path = os.getcwd() if where.startswith(". (") else os.path.abspath(where)  # out_dir_of's ". (CWD)"
    for _ in range(path.count(os.sep) + 1):  # the nearest directory there is: --out itself may not be made yet
        try:
            st = os.stat(path)
            break
        except OSError:
            path = os.path.dirname(path)
    else:
        return ""
    path = os.path.realpath(path)  # a link on the way leads to the file system written to
    mount = path
    while mount != os.sep:  # up to where another device begins: its mount point
        try:
            if os.stat(os.path.dirname(mount)).st_dev != st.st_dev:
                break
        except OSError:
            break
        mount = os.path.dirname(mount)
    if error != errno.ENOSPC:
        return f" (on the file system mounted at {mount})"
    try:
        vfs = os.statvfs(path)
    except OSError:
        return f" (the file system mounted at {mount} is full)"
    free = f"{vfs.f_bavail * vfs.f_frsize / 1e6:,.1f} MB free"
    if no_inode_left(vfs):  # ENOSPC of inodes, with bytes to spare: freeing bytes would not help
        return f" (the file system mounted at {mount} has no inode left for a new file; {free})"
    return f" (the file system mounted at {mount}: {free} now, with what was written removed)"


def out_dir_of(out: str | os.PathLike) -> str:
    """The directory of an output file as the user typed it ("." for a bare name, said as the directory it is)."""
    parent = os.path.dirname(str(out))
    return parent or f". ({os.getcwd()})"


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
def prepare_exits(what: str, kept: str, out: str | os.PathLike) -> Iterator[None]:
    """A prepare's failure as its exit status, said in one line: bad input or arguments (every ValueError: InputError,
    CorpusError, TokenizerError) by data_error_exit, interrupted 130, and 74 for a source that failed while read
    (SourceReadError, naming it) or a write that failed: out_error_exit's words, naming `out` (the corpus
    directory as typed, never a temporary name inside it) and, on a full disk, its file system and the room left
    (the OSError of a write has no file name to say); `kept` says what is left of the output (the cleanup ran as the
    error unwound through it)."""
    with interruptible(f"{what}: interrupted, {kept}"):
        try:
            yield
        except ValueError as e:
            raise data_error_exit(e) from None
        except OSError as e:  # the sources' reads are SourceReadError: a write, beside --out or in its directory
            raise out_error_exit(e, what, out, kept) from None


def data_error_exit(e: Exception) -> typer.Exit:
    """Bad input data -> 65 (EX_DATAERR, final); a source that failed while read -> 74 (EX_IOERR: run it again);
    a bad argument or tokenizer -> 2, a source that is not a file one can read among them (not there, a directory,
    a FIFO, not readable by this user: SourceNotOpened), as a config file or --tokenizer that is not there."""
    from minilmd.corpus.sources.jsonl import InputError, SourceNotOpened, SourceReadError
    from minilmd.corpus_meta import CorpusError

    typer.echo(f"error: {e}", err=True)
    if isinstance(e, SourceReadError):
        return typer.Exit(EXIT_IO)
    if isinstance(e, SourceNotOpened):
        return typer.Exit(EXIT_CONFIG)
    return typer.Exit(EXIT_DATA if isinstance(e, (InputError, CorpusError)) else EXIT_CONFIG)
