"""One writer at a time for a prepared corpus: `prepare` into an --out, `prepare --force`, `prepare --append`.

The lock is an exclusive `flock` on `<out>.lock`, a file beside the corpus directory, not on the directory itself:
`prepare --force` replaces the directory by a rename, and a lock on the old inode would not exclude a writer of the
new one (issue 21: an append and a --force on one --out both exited 0 and left a corpus whose sizes disagree). The
lock file holds who took it (pid, command, since), which a second writer prints. The writer that created it removes
it on the way out, whatever the outcome (a failed prepare leaves nothing beside --out), while it still holds the
lock and only when the name still leads to the very file it made (identity-checked through the directory's
descriptor). That removal cannot let two writers in: a writer that opened the file before it was removed and locks
it after finds its name gone (or leading elsewhere) and opens the name again. A lock file this writer did not create
(one left by an older minilmd, or made by hand) is left where it is. A second writer fails at once, exit 2, naming
the holder: a prepare of a big corpus runs for hours, and a command that waits silently that long looks hung.

The lock file may sit in a directory other users can write (a shared /tmp-like parent): it is opened without
following a link, without blocking, must be a regular file owned by the current user, with one link, holding nothing
but a holder line (a file of the user's own of that name is never overwritten), and is refused (exit 2) otherwise
(minilmd/lockfile.py's checks and body reader, every lock file's). The parent directory is opened once, as a
minilmd/dirfd.py `Dir` (a symbolic link followed only when it is the user's own or root's), after the rule of every
place minilmd writes in: a parent other users can rearrange (writable by them, not sticky) is refused (exit 2)
unless the user opted in with `--group-share`. Everything prepare makes beside --out goes through that descriptor
(`lock.parent`); `check_parent` refuses (exit 2) when its name no longer leads there, and an append opens the corpus
directory through it (`open_locked_dir`), writes through that open directory and refuses when `--out` no longer
leads to it (`check_same_dir`).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

from minilmd import lockfile
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.names import HOLD_CORPUS_LOCK_ENV
from minilmd.perms import owned_by_me, user_words
from minilmd.place_rule import InTheWay, walk_problem, walk_to
from minilmd.untrusted import file_kind, printable

LOCK_SUFFIX = ".lock"
OPEN_TRIES = lockfile.STILL_NAMED_TRIES  # opens of the lock name, each after the file just locked was removed before
HOLD_FOR_TEST = HOLD_CORPUS_LOCK_ENV  # tests/test_prepare_lock.py


def lock_name(out_name: str) -> str:
    """`<out>.lock` beside the corpus directory `<out>`."""
    return out_name + LOCK_SUFFIX


GROUP_SHARE_ADVICE = ("choose an --out only you (and root) can change, or pass --group-share to prepare into a team "
                      "directory anyway (docs/operations.md: everything there then goes through the directory opened "
                      "once)")


CANNOT_WRITE_THERE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)
"""Why the lock file could not be made that is the directory's, not the lock's: no write permission, a read-only or
full file system."""


OUT_WALK = ("the directory of --out", "the corpus", GROUP_SHARE_ADVICE)
"""(label, what, advice) of the walk to the directory of --out: the same words when it judges (check_out_place)
and when it makes (make_out_parent)."""


def check_out_place(out: Path, group_share: bool) -> None:
    """ValueError (exit 2) before anything is made when someone else could rearrange the directory of --out or one
    above it (minilmd/dirfd.py's rule, scratch's and the lock directory's); `--group-share` waives it for the
    directory of --out alone. Judged by make_out_parent's walk itself, nothing made (place_rule.walk_problem): by
    path, abspath read `a/link/../out` as `a/out`, where the walk, as the kernel, goes up from where the link leads."""
    problem = walk_problem(out.parent, *OUT_WALK, group_share=group_share)
    if problem:
        raise ValueError(f"{problem}; nothing was changed")


def make_out_parent(out: Path, group_share: bool, mode: int) -> None:
    """The directories missing on the way to --out made (`mode`) by the walk (place_rule.walk_to: at each parent
    already judged, a link followed only when root's or ours), never by path: a link planted after check_out_place
    leads nothing into another directory (PlaceRefused, a ValueError), nothing made past it."""
    os.close(walk_to(out.parent, *OUT_WALK, mode, group_share=group_share)[0])


class CorpusLock:
    """The exclusive lock of one corpus --out; `with CorpusLock(out, "prepare --append"):`. ValueError (exit 2)
    when another writer holds it or the lock file is not safe to use."""

    def __init__(self, out: str | os.PathLike, command: str, group_share: bool = False):
        self.out = Path(out)
        self.command = command
        self.group_share = group_share
        self.parent: Dir | None = None
        self.parent_fd = -1
        self.fd = -1
        self.created = self.locked = False
        """Whether this writer made the lock file, and holds its lock: then it removes it on the way out."""

    def __enter__(self) -> CorpusLock:
        parent = self.out.parent
        try:
            self.parent = Dir.open(parent, "the directory of --out", group_share=self.group_share)
        except InTheWay as e:  # a file where the directory should be: --group-share would not move it
            raise ValueError(f"{e}; nothing was changed") from None
        except PlaceRefused as e:
            raise ValueError(f"{e}; or pass --group-share (docs/operations.md); nothing was changed") from None
        except OSError as e:
            raise ValueError(f"{parent}: cannot open the directory of --out ({e.strerror})") from None
        self.parent_fd = self.parent.fd
        self.parent_id = self.parent.identity
        for _ in range(OPEN_TRIES):
            self._open_and_lock()
            if self._still_named():
                break
            self._close_lock_file()  # its maker removed it between the open and the lock: the name again
        else:
            self.close()
            raise ValueError(f"{self.out}: its lock file keeps being replaced; nothing was changed. Check who does "
                             "it, then run this again")
        if _holder_line(self.fd) is None:  # somebody's own file of that name: never overwritten
            self.close()
            raise ValueError(_not_a_lock_words(parent / lock_name(self.out.name), self.out))
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                                        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n").encode(), 0)
        return self

    def _open_and_lock(self) -> None:
        """self.fd: the lock file, opened (made when missing, LOCK_FILE_MODE) without following a link, locked, by
        lockfile.take, every run lock's protocol: an older prepare's wider file narrowed and replaced, one only other
        users' processes hold replaced and taken, said on stderr (hostile11 F4: before, it was made 0644, and one
        left by a killed prepare and flocked by another user refused every prepare to --out for good). self.fd -1
        when its name led elsewhere once locked (the caller opens it again); ValueError (the lock closed) when it is
        not safe to use or another writer holds it."""
        name, path = lock_name(self.out.name), self.out.parent / lock_name(self.out.name)
        self.fd = -1
        if self.parent is None:  # closed: no directory to open it in
            return
        self._refuse_a_file_of_another_kind(name, path)
        try:
            taken = lockfile.take(self.parent, name, None, tries=1)  # the still-named tries are __enter__'s
        except lockfile.Replaced:
            return
        except lockfile.Unsafe as e:
            self.close()
            raise ValueError(f"{path}: {self._lock_problem(e.st)}") from None
        except lockfile.Held as e:
            self.close()
            raise ValueError(f"{self.out}: another prepare is writing it ({_holder(e.body)}); nothing was changed. "
                             f"Wait for it to end and run this again{lockfile.unknown_holder_words(e.holders, path)}"
                             ) from None
        except OSError as e:  # a link, or a directory we may not write
            in_the_way = self._foreign_lock(name) if e.errno in CANNOT_WRITE_THERE else None
            self.close()
            if in_the_way:  # another user's file at the lock's name, not the directory: his, named
                raise ValueError(f"{path}: {in_the_way}") from None
            if e.errno in CANNOT_WRITE_THERE:  # the directory of --out, not the lock: exit 74 as every output's
                raise OSError(e.errno, e.strerror, str(self.out.parent)) from None
            raise ValueError(f"{path}: cannot open the lock file of {self.out} ({e.strerror}); it must be a regular "
                             "file of yours (remove it, or choose another --out)") from None
        self.fd, self.created, self.locked = taken.fd, taken.created, True
        if taken.strangers:
            print(f"minilmd prepare: {printable(path)} was {lockfile.strangers_words(taken.strangers, 'prepare')}",
                  file=sys.stderr, flush=True)

    def _refuse_a_file_of_another_kind(self, name: str, path: Path) -> None:
        """ValueError when a file of the user's own with wider bits than a lock's, which nobody holds, stands at the
        lock's name and says no holder line: a file of hers that happens to have that name, left as it was (take
        would narrow it, and put a copy in its place). Whatever else is there is take's to judge; one held is read
        after its lock (a writer's line may be half written now)."""
        try:
            fd, _ = lockfile.open_lock(self.parent_fd, name, mode=None, write=False)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if lockfile.problem(st) or not lockfile.found_wide(st) or lockfile.holders(fd) or \
                    _holder_line(fd) is not None:
                return
        finally:
            os.close(fd)
        self.close()
        raise ValueError(_not_a_lock_words(path, self.out))

    def _lock_problem(self, st: os.stat_result) -> str | None:
        """Why the file `st` describes, at the lock's name, is not a lock file this prepare may use (lockfile.problem):
        another user's (named: he made it, and only he or root can remove it), not a regular file, or one with more
        than one link (its body written would be another file's)."""
        if lockfile.problem(st) is None:
            return None
        if owned_by_me(st) and stat.S_ISREG(st.st_mode):
            return (f"the lock file of {self.out} {lockfile.problem(st)}; nothing was changed. Remove it, or choose "
                    "another --out")
        kind = "" if stat.S_ISREG(st.st_mode) else f"{file_kind(st.st_mode)}, "
        whose = "yours, but not a regular file" if owned_by_me(st) else f"owned by {user_words(st.st_uid)}, not yours"
        return (f"the lock file of {self.out} is {kind}{whose}; nothing was changed. Remove it (or have its owner "
                "remove it), or choose another --out")

    def _foreign_lock(self, name: str) -> str | None:
        """_lock_problem of what stands at the lock's name, when the open of it was refused (EACCES: another user's
        0644 file or FIFO there): his file, not the directory, is in the way. None when nothing is there, or a
        file of ours (then the directory is what cannot be written)."""
        try:
            st = os.stat(name, dir_fd=self.parent_fd, follow_symlinks=False)
        except OSError:
            return None
        return self._lock_problem(st) if not owned_by_me(st) else None

    def _still_named(self) -> bool:
        """Whether the lock file's name (in the directory held open) still leads to the file self.fd locked."""
        return self.fd >= 0 and lockfile.still_named(self.parent_fd, lock_name(self.out.name), self.fd)

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the lock file when this writer made it and its name still leads to it (while it is still locked:
        see the module's docstring), then let go of it and of the directory."""
        if self.created and self.locked and self.parent is not None and self._still_named():
            with contextlib.suppress(OSError):  # left behind: the next writer uses it as it is
                self.parent.remove_file(lock_name(self.out.name))
        self._close_lock_file()
        if self.parent is not None:
            self.parent.close()
        self.parent = None
        self.parent_fd = -1

    def _close_lock_file(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.created, self.locked = -1, False, False

    def check_parent(self) -> None:
        """ValueError (exit 2) when --out's directory is no longer the one that was locked."""
        try:
            now = _identity(os.stat(self.out.parent))
        except OSError:
            now = None
        if now != self.parent_id:
            raise ValueError(f"{self.out.parent}: the directory of --out was replaced while this prepare ran; "
                             "nothing was published. Check who moves it, then run this again")


def open_locked_dir(lock: CorpusLock) -> Dir:
    """The corpus directory --out itself, opened through the locked parent (a link as its last component followed
    only when the user's or root's: Dir.at's own_links); the caller closes it."""
    assert lock.parent is not None
    try:
        return Dir.at(lock.parent, lock.out.name, own_links=True)
    except OSError as e:
        raise ValueError(f"{lock.out}: cannot open ({e.strerror}); is it a prepared corpus (a directory, or a "
                         "link of yours to one)?") from None


def check_same_dir(lock: CorpusLock, identity: tuple[int, int]) -> None:
    """ValueError (exit 2) when the name --out no longer leads to the directory that was opened under the lock."""
    lock.check_parent()
    try:
        now = _identity(os.stat(lock.out.name, dir_fd=lock.parent_fd))
    except OSError:
        now = None
    if now != identity:
        raise ValueError(f"{lock.out}: it was replaced or moved while this prepare --append ran (it is no longer "
                         "the directory it locked); nothing was appended. Check who moves it, then run this again")


def hold_for_test() -> None:
    """The HOLD_FOR_TEST hook: wait here until the test closes its FIFO (nothing happens without the variable)."""
    path = os.environ.get(HOLD_FOR_TEST)
    if path:
        with open(path, "rb") as fifo:
            fifo.read()


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _holder_line(fd: int) -> dict | None:
    """The holder line a writer left in the lock file ({} for an empty file); None for anything else."""
    raw = lockfile.read_raw(fd)
    if not raw:
        return {}
    h = lockfile.parse_body(raw)
    return h if h and {"pid", "host", "command", "since"} <= h.keys() else None


def _holder(h: dict) -> str:
    """Who holds the lock, from the line it wrote (its body, lockfile.read_body): "pid 123 on host, prepare
    --append, since ..."."""
    try:
        return printable(f"pid {int(h['pid'])} on {str(h['host'])[:64]}, {str(h['command'])[:64]}, "
                         f"since {str(h['since'])[:32]}")
    except (ValueError, KeyError, TypeError):
        return "a process that has not said who it is yet"


def _not_a_lock_words(path: Path, out: Path) -> str:
    return (f"{path}: exists and is not a lock file of minilmd's (the lock of {out} is this name); nothing was "
            "changed. Move it away, or choose another --out")
