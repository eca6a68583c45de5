"""What `[init] from` resolves to (InitSource) and the errors of a source that cannot be used, apart from the
resolving (minilmd/init_source.py) so that the readers of its files (minilmd/init_pth.py) need nothing else of it.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path

from minilmd.mounts import DEAD_MOUNT_ERRNOS


class InitSourceError(ValueError):
    """init.from cannot be used: missing, not a checkpoint nor a .pth, no LATEST, unreadable."""


class InitSourceUnreachable(InitSourceError):
    """init.from cannot be reached now: not there (a share gone, its mount vanished) or the storage fails (EIO, a
    dead FUSE daemon, a stale NFS handle, a timeout). Not final under the supervisor: staging waits for it with
    backoff, at the first launch as at a restart (`run --check` says so). A reader that cannot wait (the
    trainer alone) sees it as the InitSourceError it is."""


UNREACHABLE_ERRNOS = frozenset({
    errno.ENOENT, errno.EIO, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.ENETDOWN, errno.ENETUNREACH,
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EAGAIN, errno.EINTR, errno.ENOLINK,
    errno.EREMOTEIO, errno.ENOMEDIUM, errno.EKEYEXPIRED, *DEAD_MOUNT_ERRNOS})
"""The errors of a source that cannot be reached now (the storage, not the source, is at fault; a dead mount's,
mounts.DEAD_MOUNT_ERRNOS, among them: ENOTCONN, ESTALE). Any other OSError
(permission denied, not a directory, a link loop, a name too long) is of a source there and wrong: final."""


@dataclass(frozen=True)
class InitSource:
    kind: str
    """"checkpoint" or "minimind"."""
    path: Path
    """The checkpoint directory, or the .pth file."""
    pointer: str | None = None
    """BEST or LATEST when the checkpoint was found through that pointer (a run, a root, a pointer file): said in
    the trainer's "initialised from" line and recorded with the fingerprint; None when named directly."""
    owners: tuple[int, ...] = field(default=(), compare=False)
    """Whose files the checkpoint's (or the .pth) may be (init_place.owners_of the directory init.from names, or
    the .pth's directory); () when not resolved here (a staged copy: this run's own)."""
    identity: tuple[int, int] | None = field(default=None, compare=False)
    """(device, inode) of the checkpoint directory (of a .pth: the directory holding it) as resolve opened it: a
    later read opens that one or none (init_place.reopen)."""


def untrusted_failure(e) -> Exception:
    """An untrusted.Unreadable of init.from's file as its callers take it: the OSError of one that cannot be read
    now (missing: its share gone; EIO...) for `_unreadable`'s decision (and staging's wait); else a final
    InitSourceError saying what the file is ("a FIFO", "a symbolic link")."""
    if e.os_error is not None:
        return e.os_error
    if e.missing:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", e.path)
    return InitSourceError(f"{e.path} is unreadable ({e.why})")
