"""A local source (the input of `prepare`, `prepare --append`, `tokenizer train`, `corpus report` and `corpus count`),
and every other file the user names for them to read (a tokenizer.json, the files beside it, a --chat-template file,
export's --tokenizer: read_source), reached under the one link rule, minilmd/place_rule.py `link_followed`, as the
views' run argument is (daemon/views/runarg.py): a symbolic link on the way is followed only when it is the caller's,
root's, or the owner's of the file it leads to (his link to his own file chooses nothing of hers).

A glob over a team directory names links the user never made: a teammate's `b.jsonl` there, linked to her private
file (0600, in a 0700 directory), was read with her rights and published in a corpus he reads (hostile audit 6 F1).
Such a link is refused (LinkRefused, a ValueError: exit 2, before anything is written), naming it, its owner and
where it leads. The path is resolved first (place_rule.real_path, by that rule), then the file is opened from "/" one
directory at a time by descriptor, no link followed, so a directory swapped for a link meanwhile is refused, never
followed; the file opened is checked to be the owner's whose link led to it. Never a blocking open (a FIFO nobody
writes would hang the command for good), nor a device read. Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Collection, Set
from pathlib import Path

from minilmd.openflags import OPEN_FLAGS as OPEN_SOURCE
from minilmd.perms import owner_in, user_words
from minilmd.place_rule import MAX_LINKS, WALK_DIR, ForeignLink, PlaceRefused, TooManyLinks, real_path
from minilmd.untrusted import Unreadable, file_kind, mode_kind, printable, read_open

LINK_ADVICE = ("a link on the way to a file you name (a source, a tokenizer) is followed only when it is yours, "
               "root's or the owner's of the file it leads to (anyone else's chooses what your command reads, and "
               "what it publishes); nothing written. Name the file itself if you mean it, or remove the link")


class LinkRefused(PlaceRefused):
    """Another user's link on the way to a source, to what is not his (exit 2): the message names it, its owner and
    its target."""


def real_source(path: str | os.PathLike) -> tuple[Path, Set[int]]:
    """(the real path `path` leads to, the other users whose links were followed on the way): each of those must own
    the file reached (open_source checks it on the open file). LinkRefused for another user's link to anything else
    (the first one met: he chose where the path leads, even past the caller's own links)."""
    refusals: dict[int, ForeignLink] = {}
    while True:
        try:
            real = real_path(path, frozenset(refusals))
            break
        except ForeignLink as e:
            if e.owner in refusals or len(refusals) > MAX_LINKS:
                raise _refused(path, e, None) from None
            refusals[e.owner] = e
    if refusals:
        with contextlib.suppress(OSError):
            reached = os.lstat(real)  # a real path: its own owner, no link's
            refusals = {uid: e for uid, e in refusals.items() if not owner_in(reached, {uid})}
            if not refusals:
                return real, frozenset({reached.st_uid})
        first = next(iter(refusals.values()))
        raise _refused(path, first, real)
    return real, frozenset()


def _refused(given: str | os.PathLike, e: ForeignLink, reached: Path | None) -> LinkRefused:
    try:
        target = os.readlink(e.link)
    except OSError:
        target = "?"
    try:
        leads = f", a file of {user_words(os.lstat(reached).st_uid)}" if reached else ""
    except OSError:
        leads = ", which does not exist" if reached else ""
    where = "" if Path(given) == e.link else f"{printable(given)}: "  # names another user chose: escaped
    return LinkRefused(f"{where}{printable(e.link)} is a symbolic link of {user_words(e.owner)} to "
                       f"{printable(target)}{leads}: {LINK_ADVICE}")


NOT_REGULAR = ", not a regular file: give the JSONL file itself"


def open_source(path: str | os.PathLike, ask: str = NOT_REGULAR) -> tuple[int, Path]:
    """(a descriptor of the regular file `path` leads to, read-only and blocking, its real path). LinkRefused as
    real_source says; Unreadable (a ValueError) for what is not a regular file (what it is, then `ask`); OSError
    (its filename the path given) when it cannot be opened."""
    real, owners = real_source(path)
    fd = _open_unlinked(real, path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{file_kind(st.st_mode)}{ask}", kind=mode_kind(st.st_mode))
        if owners and not owner_in(st, owners):  # swapped since the look: another's file now, his link chose it
            raise LinkRefused(f"{printable(path)}: {printable(real)} was replaced while being opened (now a file of "
                              f"{user_words(st.st_uid)}, reached through another user's link); {LINK_ADVICE}")
        os.set_blocking(fd, True)
        return fd, real
    except BaseException:
        os.close(fd)
        raise


def read_source(path: str | os.PathLike, *, max_bytes: int,
                owner: Collection[int] | None = None) -> tuple[bytes, Path]:
    """(the bytes of the file `path` leads to, its real path): opened by open_source (the one link rule, never a
    blocking open) and read as untrusted.read_bytes reads (at most max_bytes), a file of one of `owner` when given.
    For a file the user names that is not a source (a tokenizer.json, the files beside it, a --chat-template
    file): a teammate's link to her private file is refused there as among the sources. LinkRefused as
    real_source says; Unreadable for the rest (missing, not a regular file, too big, another's file, EIO)."""
    try:
        fd, real = open_source(path, "")  # what it is said as untrusted.read_bytes says it: "a FIFO"
    except TooManyLinks as e:  # a loop: said as what the file is
        raise Unreadable(str(e), path, kind="link") from None
    except Unreadable as e:
        raise Unreadable(e.why, path, kind=e.kind) from None
    except FileNotFoundError:
        raise Unreadable("missing", path, missing=True) from None
    except OSError as e:
        raise Unreadable(e.strerror or str(e), path, os_error=e) from None
    try:
        st = os.fstat(fd)
        if owner is not None and not owner_in(st, owner):
            raise Unreadable(f"owned by {user_words(st.st_uid)}", path, kind="owner")
        return read_open(fd, path, max_bytes=max_bytes), real
    finally:
        os.close(fd)


def _open_unlinked(real: Path, given: str | os.PathLike) -> int:
    """`real` (a path without links, as real_source found it) opened from "/" by descriptor, no link followed: a
    directory on the way, or the file, that is a link now was put there since, and is refused."""
    parts = real.parts[1:]
    fd = os.open("/", WALK_DIR)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            try:
                below = os.open(name, OPEN_SOURCE, dir_fd=fd) if last else os.open(name, WALK_DIR, dir_fd=fd)
            except OSError as e:
                here = Path("/", *parts[:i + 1])
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, name):
                    raise LinkRefused(f"{printable(given)}: {printable(here)} is a symbolic link now (it was not "
                                      f"when looked at: never followed); {LINK_ADVICE}") from None
                raise OSError(e.errno, e.strerror, str(given)) from None
            os.close(fd)
            fd = below
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_link(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
