"""Writing to a local remote (daemon/jobs/remote.py) that others may write too: no link followed.

Whoever can write the remote's root can place a link at a name a sync is about to make (its temporary copy, the
LoRA base's, a file in it), pointing at a file the sync's user may write (~/.bashrc): a write following it would
land there. So every directory a sync makes is made new (mkdir, never "exist ok": a name already taken is
refused, saying what it is), every file opened O_CREAT|O_EXCL|O_NOFOLLOW, and each directory on the way from the
root is opened without following a link (a descriptor, not a path: nothing can be swapped in between). A
pointer's temp file is mkstemp's (fsio.atomic_write_text): O_EXCL|O_NOFOLLOW already. The root itself is the
run's configuration, taken as it is. Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator

from minilmd.untrusted import file_kind, printable

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

Show = Callable[..., str]
"""Remote.show: how a path below the root is named in a message."""


def what_is(path: str) -> str:
    """What the entry at path is, itself (never followed): "a symbolic link to X", "a directory owned by uid N"."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return e.strerror or "unreadable"
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError):
            return f"a symbolic link to {printable(os.readlink(path))}"
        return "a symbolic link"
    owner = "" if st.st_uid == os.getuid() else f" owned by uid {st.st_uid}"
    return f"{file_kind(st.st_mode)}{owner}"


@contextlib.contextmanager
def parent_fd(root: str, names: tuple[str, ...], show: Show) -> Iterator[int]:
    """A descriptor of the directory that holds names[-1], reached from root one directory at a time, none of them
    a link (refused, saying what it is: ELOOP or ENOTDIR, an OSError the sync retries)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(names[:-1]):
            try:
                below = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                where = "/".join([root, *names[:i + 1]])
                raise OSError(e.errno, f"{show(*names[:i + 1])} is {what_is(where)}: not followed") from None
            os.close(fd)
            fd = below
        yield fd
    finally:
        os.close(fd)


def _taken(root: str, names: tuple[str, ...], show: Show) -> FileExistsError:
    what = what_is("/".join([root, *names]))
    return FileExistsError(errno.EEXIST, f"{show(*names)} is already there ({what}): not made by this sync, "
                                         f"never written into")


def mkdir_new(root: str, names: tuple[str, ...], show: Show) -> None:
    """Make each directory of names below root, every one new (the umask gives its mode, as the run's policy)."""
    for i in range(1, len(names) + 1):
        with parent_fd(root, names[:i], show) as fd:
            try:
                os.mkdir(names[i - 1], 0o777, dir_fd=fd)
            except FileExistsError:
                raise _taken(root, names[:i], show) from None


def open_new(root: str, names: tuple[str, ...], show: Show) -> int:
    """A new file at names below root, opened for writing: never one already there, nor through a link."""
    with parent_fd(root, names, show) as fd:
        try:
            return os.open(names[-1], NEW_FILE, 0o666, dir_fd=fd)
        except FileExistsError:
            raise _taken(root, names, show) from None
