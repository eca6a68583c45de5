"""init.from's place walked by descriptor: what the config names is opened once as it names it (a link on that path
followed, as every place a config names is: minilmd/shared_place.py); from there every name the source itself holds
(a run directory's run.toml, a root's LATEST and BEST, the step directory they name, its manifest.json and
trainer_state.json) is looked at and opened relative to that directory's descriptor (dirfd.Dir): no link followed,
no FIFO opened, bounded (untrusted.read_bytes), and owned by the owner of the directory init.from names or by this
user, judged before a byte of it is parsed (a teammate's run reads as hers, a file a third user planted in it does
not). A later reader (staging's copy, daemon/jobs/initstage.py) opens the directory resolved again by `reopen`:
that very one (device, inode) or none. What is refused says what it found (`Refused`, final: "/team/ckpts: LATEST
is a symbolic link: not followed"); a name not there, or storage that fails, is the OSError it is (init_source
decides: unreachable now, or final). Torch-free.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from pathlib import Path

from minilmd.dirfd import Dir
from minilmd.perms import own_uid, owner_in, owner_or_me, user_words
from minilmd.untrusted import Unreadable, file_kind, open_regular, printable, read_bytes

NAMED_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
"""How the directory the config names is opened: links on its path followed (the config names it so), a FIFO or a
file refused by O_DIRECTORY (ENOTDIR) before it is opened; O_PATH: search permission is enough (a 0711 run
directory), as it was for the lookups by path before."""
Owners = tuple[int, ...]


class Refused(ValueError):
    """A name in init.from's place that is not what it must be (a link, a FIFO, a third user's file): final."""


def open_named(path: str | os.PathLike) -> Dir:
    """The directory the config names, opened as it names it; NotADirectoryError for a file (or a FIFO) there,
    FileNotFoundError when nothing is, another OSError when the storage fails."""
    return Dir(os.open(path, NAMED_DIR), Path(os.path.abspath(path)))


class Moved(OSError):
    """The directory resolve opened is no longer what its path leads to (rewritten since, or swapped by whoever can
    write above it): not read; resolving again says what stands there now (ESTALE: waited for, not final)."""


def reopen(path: Path, identity: tuple[int, int] | None) -> Dir:
    """The directory resolve opened at `path`, opened again as open_named opens it: that very one (its `identity`,
    (device, inode), when given) or none (Moved, saying what stands there now)."""
    found = open_named(path)
    if identity is None or found.identity == identity:
        return found
    found.close()
    try:
        mode = os.lstat(path).st_mode
        now = "another directory" if stat.S_ISDIR(mode) else file_kind(mode)
    except OSError:
        now = "nothing"
    raise Moved(errno.ESTALE, f"not the directory resolved a moment ago ({now} there now: replaced since)", str(path))


def owners_of(source: Dir) -> Owners:
    """Whose files the source's are: the owner of the directory init.from names (a teammate's run reads as hers),
    or this user (perms.owner_or_me, a run's own rule)."""
    return owner_or_me(os.fstat(source.fd).st_uid)


def judge(where: Dir, name: str, owners: Owners) -> None:
    """`name` in `where` is a regular file of one of `owners`: opened as untrusted.read_bytes opens one, closed."""
    try:
        os.close(open_regular(name, owner=owners, dir_fd=where.fd))
    except Unreadable as e:
        raise refusal(where, name, e, owners) from None


def read_in(where: Dir, name: str, max_bytes: int, owners: Owners) -> bytes:
    """The bytes of `name` in `where`: a regular file of one of `owners`, at most max_bytes (read_bytes)."""
    try:
        return read_bytes(name, max_bytes=max_bytes, owner=owners, dir_fd=where.fd)
    except Unreadable as e:
        raise refusal(where, name, e, owners) from None


def open_dir_in(where: Dir, name: str, owners: Owners) -> Dir:
    """The directory `name` in `where`, opened without following a link and owned by one of `owners`."""
    try:
        found = Dir.at(where, name)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = where.lstat(name)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(where.path / name)) from None
        raise Refused(f"{printable(where.path)}: {printable(name)} is {file_kind(st.st_mode)}"
                      + (": not followed" if stat.S_ISLNK(st.st_mode) else ", not a directory")) from None
    st = os.fstat(found.fd)
    if not owner_in(st, owners):
        found.close()
        raise Refused(f"{printable(where.path)}: {printable(name)} {_foreign(st.st_uid, owners)}")
    return found


def refusal(where: Dir, name: str, e: Unreadable, owners: Collection[int]) -> Exception:
    """An Unreadable of `name` in `where` as init.from's readers take it: the OSError of a name not there or of
    storage that fails (for init_source's decision), else a Refused saying what was found."""
    if e.missing:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", str(where.path / name))
    if e.os_error is not None:
        return e.os_error
    said = {"link": "is a symbolic link: not followed", "not_regular": f"is {e.why}: not read"}.get(e.kind)
    if e.kind == "owner":
        st = where.lstat(name)
        said = _foreign(st.st_uid, owners) if st is not None else f"is {e.why}: not read"
    return Refused(f"{printable(where.path)}: {printable(name)} {said or f'is unreadable ({e.why})'}")


def _foreign(uid: int, owners: Collection[int]) -> str:
    """"is owned by X, not by the source's owner (Y) nor by you: not read" (owners: owners_of's)."""
    theirs = [user_words(u) for u in owners if u != own_uid()]
    return f"is owned by {user_words(uid)}, not by " + (f"the source's owner, {theirs[0]}, nor by " if theirs else "") \
        + "you: not read"
