"""The one way minilmd takes a lock file: an flock on a file named in a directory held open (minilmd/dirfd.py's Dir,
or a descriptor a walk gave), its body saying who holds it.

Five locks use it: the supervisor's run lock (daemon/host/lock.py), the trainer's (minilmd/trainer_lock.py), a
prepared corpus's (minilmd/corpus/prepare/lock.py), the GPU leases (daemon/host/leases.py) and the scratch's hold
(minilmd/scratch_hold.py). Before, each wrote the protocol itself with different guards: one followed no check of
links (a hard link planted at the trainer's lock name had the trainer truncate and write another file of the user's),
one parsed its holder unbounded, one read /proc/locks matching the inode number alone (another device's lock with
that number was named as the holder).
So here, once:
- `open_lock`: the name opened relative to the directory's descriptor, never through a link (O_NOFOLLOW), never
  blocking on a FIFO (O_NONBLOCK), never a controlling terminal, close-on-exec; made new (O_EXCL) with an explicit
  mode (fchmod after the create: the umask does not choose it) when missing;
- `problem`: what an open lock file must be before it is locked or written: a regular file, with one link (a hard
  link could be another file's name), and whose it may be (`owner`, one argument: the user's own by default, a given
  uid's, or anyone's, Whose.ANYONE, for a caller that only reads and locks another's: leases);
- `try_flock`: a non-blocking flock (`block_flock` for the one caller that waits on purpose), `unlock`,
  `probe_free` (a shared lock taken and let go: nobody holds it);
- `take`: all of it, and after the lock the "still named" check: the name still leads to the file locked (its
  maker may have removed it between the open and the flock, prepare's way out), else opened again, STILL_NAMED_TRIES
  times at most. `Held` (with the holder's body) when another holds it, `Unsafe` when the file is no lock of ours;
- `replace`: a lock file put in place of an old one (`private`'s wide file, `strangers`' one), one replacement at a
  time among this user's processes: under an exclusive flock on its guard (`guarded`: `.NAME.guard` beside it, made
  0600 O_EXCL by us, removed by its maker), and only while the name still leads to the old file. Before (review12c
  F1, F3), two of ours that both found the old file replaced it one after the other, each renaming its fresh file
  over the name, and both held "the" lock; and the guard was an flock on the directory itself, which anyone who can
  open the directory can hold: another user holding it and the old file refused the run for good (hostile11 F1a);
- `read_body` / `holder`: the body read bounded (BODY_MAX_BYTES) and parsed bounded in depth (minilmd/untrusted.py),
  never trusted for more than words and the caller's own comparisons.
- `LOCK_FILE_MODE`: a run's lock files (supervisor.lock, trainer.lock, scratch's owner marker) are their owner's
  alone, whatever run.share says: anyone who can open one, read-only, can flock it, and before, one `sleep` of
  another user holding supervisor.lock (0644 under run.share "all") refused every restart of the run for good
  (hostile10 F1, F2). `private` takes wider bits away and, since a descriptor opened before a chmod outlives it,
  replaces such a file by a fresh inode (`fresh`); `strangers` names the holders when every one is another user's
  process, and then the caller replaces the file too: that user's lock on the old inode holds nothing of ours. On a
  file found wide (`found_wide`) a holder whose user cannot be read (the pid /proc/locks names has ended, its lock
  kept by a child it forked; another pid namespace's) counts as another user's: only a holder proven ours keeps it
  (hostile11 F1b: before, such a holder refused the run for good, "pid None on an unknown host").
Who holds an flock by the kernel's record (device and inode, /proc) is minilmd/proc_info.py's (`flock_holders`,
`process_uids`; minilmd/procs.py re-exports them, with `holds_flock`). tests/test_one_lockfile.py fails on
fcntl.flock or fcntl.lockf called anywhere else, and on /proc/locks read outside procs' readers. Torch-free."""
from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import os
import secrets
import shlex
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from minilmd.dirfd import Dir
from minilmd.openflags import NO_FOLLOW_NO_BLOCK
from minilmd.perms import own_uid, owned_by_me, owner_in, user_words
from minilmd.proc_info import flock_holders, process_uids
from minilmd.tmpnames import atomic_tmp_prefix, lock_guard_name
from minilmd.untrusted import loads

LOCK_OPEN = NO_FOLLOW_NO_BLOCK
"""Every open of a lock file: never through a symlink, never blocked on a FIFO, never a controlling terminal, never
inherited by a child (a trainer must not keep its supervisor's lock alive)."""
BODY_MAX_BYTES = 4096
"""What is read of a lock file's body, at most: another user (or a full disk) may have put anything there."""
GUARD_WAIT_S = 5.0
"""How long `replace` waits for its guard's flock: another of ours holds it for one fresh file's making."""
GUARD_POLL_S = 0.01
STILL_NAMED_TRIES = 100
"""Opens of the lock name, each after the file just locked was no longer the one the name leads to."""
BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
"""What flock says when another open file holds a conflicting lock."""
LOCK_FILE_MODE = 0o600
"""A run's lock files (supervisor.lock, trainer.lock, scratch's owner.json): never shared, whatever run.share says.
Whoever can open a lock file, even read-only, can flock it and so refuse the run (hostile10 F1, F2)."""


class Whose(enum.Enum):
    """Whose file `problem` lets a lock file be, besides a given uid's (an int)."""
    MINE = "mine"
    """This process's user's (perms.owned_by_me): a lock it takes or writes."""
    ANYONE = "anyone"
    """Any user's: a lease file another user made, only read and locked (daemon/host/leases.py); run.dir's reserve,
    whose owner is run.dir's place rule's (an admin's file there this process may write is no reason to stop)."""


class Unsafe(Exception):
    """The file at the lock's name is not a lock file this process may use: `problem` says why ("is not a regular
    file", "has 2 hard links ...", "belongs to uid N, not to you (uid M)"), `st` what it is."""

    def __init__(self, problem: str, st: os.stat_result):
        super().__init__(problem)
        self.problem, self.st = problem, st


class Held(Exception):
    """Another open file holds the lock; `body`: what its file says of the holder ({} when unreadable or empty);
    `holders`: who holds it by the kernel's record (`holders`: pid, uid or None)."""

    def __init__(self, body: dict, holders: list[tuple[int, int | None]] | None = None):
        super().__init__(f"held by {body or 'a holder that has not said who it is'}")
        self.body, self.holders = body, holders or []


_found_wide: set[tuple[int, int, int]] = set()
"""(device, inode, ctime in ns after the chmod) of the lock files `private` found with wider bits than LOCK_FILE_MODE
and narrowed, in this process: `strangers` judges them as still wide (a descriptor opened while they were outlives
the chmod). The ctime tells a later file given the same inode number apart (it changes with any write of the file's
body or mode too: by then one of ours has taken it, or another of ours narrows it and knows)."""


class Replaced(Exception):
    """The name kept leading to another file than the one just locked, STILL_NAMED_TRIES times."""


@dataclass
class Taken:
    fd: int
    """The lock file, opened read-write and locked: closing it lets the lock go."""
    created: bool
    """This process made the file (it may remove it on its way out: prepare's lock)."""
    strangers: list[tuple[int, int | None]] = field(default_factory=list)
    """Other users' processes (pid, uid) that held the file at the lock's name, which was replaced by a fresh one
    (`strangers`): the caller says so (`strangers_words`)."""


def _dir_fd(where: Dir | int) -> int:
    return where.fd if isinstance(where, Dir) else where


def open_lock(where: Dir | int, name: str, *, mode: int | None, write: bool = True) -> tuple[int, bool]:
    """(descriptor, made now) of the lock file `name` in `where`, opened with LOCK_OPEN; made (O_EXCL, `mode` set
    exactly) when missing and `mode` is given. OSError as the open says it: ELOOP for a link, ENXIO for a FIFO with
    no writer, ENOENT when missing and nothing is made."""
    dir_fd, flags = _dir_fd(where), (os.O_RDWR if write else os.O_RDONLY) | LOCK_OPEN
    if mode is not None:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass  # made earlier (or a link: O_EXCL never follows one, the open below refuses it)
        else:
            try:
                os.fchmod(fd, mode)  # the caller's mode, not what the umask left of it
            except BaseException:
                os.close(fd)
                raise
            return fd, True
    return os.open(name, flags, dir_fd=dir_fd), False


def problem(st: os.stat_result, *, owner: int | Whose = Whose.MINE) -> str | None:
    """Why the file `st` describes (an open file's fstat, or a name's lstat) must not be used as a lock file, or
    None: the one rule of "fit to be a lock", and of a file of ours opened by name and written (run.dir's reserve): a
    regular file, at most one link (more: it could be another file's name, whose body we would write), and `owner`'s:
    ours (Whose.MINE), a given uid's (a run directory's owner, whose lock a teammate looks at) or anyone's
    (Whose.ANYONE: a lease file another user made, only read and locked; run.dir's reserve).
    No link at all passes: a file removed after it was opened (prepare's maker removes its lock on the way out;
    another of ours replaced a lock or marker by a fresh one; an `rm -r` of run.dir took the reserve) has no name, so
    it is no other file's body. A caller to whom the name matters asks after its flock whether the name still leads
    there (`still_named`: take, guarded, scratch_hold open the name again); the reserve's zeros test the room all the
    same, and its next making puts one at the name. Refused, it was a refusal naming a file gone (review12b F3: exit
    2; the scratch hold waited on another user's holder of a marker no longer there and called him a supervisor)."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_nlink > 1:
        return f"has {st.st_nlink} hard links (it could be another file's name)"
    if isinstance(owner, int):
        return None if owner_in(st, (owner,)) else f"belongs to uid {st.st_uid}, not to uid {owner}"
    if owner is Whose.MINE and not owned_by_me(st):
        return f"belongs to uid {st.st_uid}, not to you (uid {own_uid()})"
    return None


def check(fd: int) -> os.stat_result:
    """The open lock file's stat, or Unsafe (the descriptor left to the caller to close): a lock of ours."""
    st = os.fstat(fd)
    if why := problem(st):
        raise Unsafe(why, st)
    return st


def try_flock(fd: int, exclusive: bool = True) -> bool:
    """An flock without waiting: False when another open file holds a conflicting one."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in BUSY:
            return False
        raise
    return True


def block_flock(fd: int) -> None:
    """An exclusive flock, waiting for it (the trainer's rank 0 beside its own job's holder, on purpose)."""
    fcntl.flock(fd, fcntl.LOCK_EX)


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def probe_free(fd: int) -> bool:
    """Whether nobody holds the lock: a shared flock taken and let go at once."""
    if not try_flock(fd, exclusive=False):
        return False
    unlock(fd)
    return True


def still_named(where: Dir | int, name: str, fd: int, strict: bool = False) -> bool:
    """Whether `name` in `where` still leads to the file `fd` is (device and inode; no link followed). A name that
    cannot be looked at (EACCES, EIO, EMFILE) is False, or with `strict` that OSError (leases.keep looks again)."""
    try:
        named = os.stat(name, dir_fd=_dir_fd(where), follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        if strict:
            raise
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def take(where: Dir | int, name: str, body: bytes | None, *, mode: int = LOCK_FILE_MODE,
         tries: int = STILL_NAMED_TRIES) -> Taken:
    """The lock `name` in `where` taken (exclusive, not waiting) and its body replaced by `body` (None: left as it
    is, for a caller that looks at it first); its file given `mode` (`private`), and replaced by a fresh one when
    only other users' processes hold it (`strangers`, listed in Taken.strangers). Held when another holds it, Unsafe
    when the file is no lock of ours (`problem`), Replaced when its name kept leading elsewhere, OSError from the
    open (see open_lock)."""
    for _ in range(tries):
        try:
            fd, created = open_lock(where, name, mode=mode)
        except FileNotFoundError:
            continue  # removed between the create's try and the open: made on the next
        found: list[tuple[int, int | None]] = []
        try:
            check(fd)
            fd = private(where, name, fd, mode)
            if not try_flock(fd):
                if not (found := strangers(fd)) or not own_dir(where):
                    raise Held(read_body(fd), holders(fd))
                try:
                    new = replace(where, name, fd, mode=mode)
                except GuardBusy:
                    raise Held(read_body(fd), holders(fd)) from None
                if new is None:
                    os.close(fd)  # replaced meanwhile (by another of ours, which holds it): the name again
                    continue
                fd = _swap(fd, new)
            if not still_named(where, name, fd):
                os.close(fd)  # its maker removed it between our open and our lock: the name again
                continue
            if body is not None:
                write_body(fd, body)
        except BaseException:
            os.close(fd)
            raise
        return Taken(fd, created, found)
    raise Replaced(f"{name}: its lock file keeps being replaced")


def _swap(old: int, new: int) -> int:
    os.close(old)
    return new


def holders(fd: int) -> list[tuple[int, int | None]]:
    """Who holds an flock on the open file `fd` by the kernel's record (/proc/locks, matched on device and inode):
    (pid, its effective uid, None when it cannot be read: gone, another pid namespace's). For words, and for
    `strangers`: never a reason to signal anyone."""
    found: list[tuple[int, int | None]] = []
    for pid in flock_holders(os.fstat(fd)):
        uids = process_uids(pid) if pid > 0 else None
        found.append((pid, uids[1] if uids else None))
    return found


def strangers(fd: int, *, unreadable_is_one: bool = True) -> list[tuple[int, int | None]]:
    """The holders (pid, effective uid) of an flock on the open file `fd` when every one is another user's process
    than the file's owner's (none of its uids the owner's, not this process): a lock file once readable by others,
    locked by one of them. On a file found wide (`found_wide`) a holder whose uids cannot be read is one (uid None):
    anyone could have opened it then, and only a holder proven the owner's keeps it; not with `unreadable_is_one`
    False (a look of another user's, daemon/host/lock.py lock_look: under hidepid the owner's own supervisor is such
    a holder to it). [] when none is named, or one is the owner's, or, on a file never wide, cannot be told (a real
    holder, as before)."""
    st = os.fstat(fd)
    wide = found_wide(st) and unreadable_is_one
    found: list[tuple[int, int | None]] = []
    for pid in flock_holders(st):
        uids = process_uids(pid) if pid > 0 else None
        if pid == os.getpid() or uids and owner_in(st, uids) or not uids and not wide:
            return []
        found.append((pid, uids[1] if uids else None))
    return found


def found_wide(st: os.stat_result) -> bool:
    """Whether the lock file `st` describes has, or had when this process found it (`private`), wider bits than
    LOCK_FILE_MODE: a file other users could open, so a holder of it may be theirs."""
    return bool(stat.S_IMODE(st.st_mode) & ~LOCK_FILE_MODE) or _wide_key(st) in _found_wide


def _wide_key(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_dev, st.st_ino, st.st_ctime_ns


def strangers_words(found: list[tuple[int, int | None]], what: str) -> str:
    """"held by user mal (uid 1001)'s process 4242, not a supervisor of yours: ..." (`what`: the lock's holder); a
    holder whose user cannot be read is said so."""
    who = ", ".join(f"{user_words(uid)}'s process {pid}" if uid is not None else
                    f"process {pid} (its user cannot be read: it ended, its lock kept by a process it started)"
                    for pid, uid in found)
    return (f"held by {who}, not a {what} of yours: your lock file was readable by others; replaced by a new one "
            f"only you can open, and taken")


def unknown_holder_words(found: list[tuple[int, int | None]], path: object) -> str:
    """For a lock held (Held.holders) by a process whose user cannot be read, the way out: "; if no process of yours
    holds it, ..., mv PATH PATH.stale" ("" when every holder's user is known). Such a holder keeps a lock file of
    today's (`strangers`), and a start that narrowed an old wide one and died before replacing it left one: its
    note that the file was wide (`_found_wide`) died with it, and nothing else ever replaces that file."""
    if not any(uid is None for _pid, uid in found):
        return ""
    shown = shlex.quote(str(path))
    return (f"; if no process of yours holds it (its holder's user cannot be read: one that ended, its lock kept by "
            f"a process it started, or another user's that opened the file while it was readable), move the lock "
            f"file away: mv {shown} {shlex.quote(f'{path}.stale')}")


def own_dir(where: Dir | int) -> bool:
    """Whether the directory holding the lock is this user's: only there is a lock file of ours replaced."""
    return owned_by_me(os.fstat(_dir_fd(where)))


def private(where: Dir | int, name: str, fd: int, mode: int = LOCK_FILE_MODE, *,
            body_max: int = BODY_MAX_BYTES) -> int:
    """The open lock file `fd` (checked ours: `check`) given no bits beyond `mode`: wider ones taken away (fchmod);
    and since a descriptor another user opened before outlives a chmod, the file is then replaced by a fresh one
    (`replace`, its body copied) when nobody holds it and its directory is ours. Returns the descriptor to go on
    with: `fd`, or the fresh file's, locked (exclusive), `fd` then closed. A fresh file that cannot be made (no
    room), or a body longer than `body_max`, leaves `fd`, narrowed."""
    if not stat.S_IMODE(os.fstat(fd).st_mode) & ~mode:
        return fd
    os.fchmod(fd, mode)
    _found_wide.add(_wide_key(os.fstat(fd)))  # its holders judged as a wide file's (`strangers`) after the chmod
    if not own_dir(where) or not try_flock(fd):
        return fd  # held: by one of ours, the caller's refusal; by another user only, its `strangers` replacement
    try:
        body = os.pread(fd, body_max + 1, 0)  # at 0, not untrusted.read_open, which moves the lock fd's offset
        if len(body) > body_max:
            raise OSError(errno.EFBIG, "not copied whole")
        new = replace(where, name, fd, body, mode=mode, held=True)
    except OSError:
        new = None
    if new is None:  # no longer named (another of ours replaced it: review12c F3), or not replaced: the caller's
        unlock(fd)  # still-named check after its own flock opens the name again
        return fd
    return _swap(fd, new)


class GuardBusy(OSError):
    """`replace` waited GUARD_WAIT_S for its guard's flock (another of ours holds it), or the guard's name holds no
    guard of ours (a file another user put there: only in a directory others may write)."""


@contextlib.contextmanager
def guarded(where: Dir | int, name: str) -> Iterator[None]:
    """An exclusive flock on `name`'s guard in `where`, held for the body of the `with`: a file of ours, 0600 from its
    making (O_EXCL; open_lock), so no other user can open it, let alone hold it (hostile11 F1a: the directory's own
    flock was the guard, and anyone who can open the directory can hold that). Its maker removes it after, still
    holding it, and whoever locked it checks afterwards that the name still leads to it (else opens the name
    again), as `take` does. A guard left by a maker killed meanwhile is used and left. GuardBusy after GUARD_WAIT_S
    or for a guard that is not ours; OSError as the open says (no room, a link planted there)."""
    dir_fd, gname = _dir_fd(where), lock_guard_name(name)
    give_up, fd, made = time.monotonic() + GUARD_WAIT_S, -1, False
    try:
        while True:
            if fd < 0:
                fd, made = _open_guard(dir_fd, gname)
            if fd >= 0 and try_flock(fd):
                if still_named(dir_fd, gname, fd):
                    break
                os.close(fd)  # its maker removed it as we waited: the name again
                fd = -1
            if time.monotonic() >= give_up:
                raise GuardBusy(errno.EAGAIN, f"{name}: its guard {gname} stayed locked by another process")
            time.sleep(GUARD_POLL_S)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    try:
        yield
    finally:
        if made and still_named(dir_fd, gname, fd):
            with contextlib.suppress(OSError):  # left: the next replacement uses it as it is
                os.unlink(gname, dir_fd=dir_fd)
        os.close(fd)  # its flock let go with it


def _open_guard(dir_fd: int, gname: str) -> tuple[int, bool]:
    """(descriptor, made now) of the guard `gname`, made 0600 when missing (open_lock); (-1, False) when its maker
    removed it between our create's try and our open. GuardBusy for a file there that is no guard of ours."""
    try:
        fd, made = open_lock(dir_fd, gname, mode=LOCK_FILE_MODE)
    except FileNotFoundError:
        return -1, False
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if why := problem(st) or (mode & ~LOCK_FILE_MODE and f"is mode {mode:o}, others may open it"):
        os.close(fd)
        raise GuardBusy(errno.EPERM, f"{gname}: {why}, so not a guard of yours")
    return fd, made


def replace(where: Dir | int, name: str, fd: int, body: bytes = b"", *, mode: int = LOCK_FILE_MODE,
            held: bool = False) -> int | None:
    """A fresh lock file (`fresh`, `body`) put at `name` in place of the open file `fd`, one replacement at a time
    among this user's processes: under the flock of `name`'s guard (`guarded`), let go once the rename is done. Only
    while the name still leads to `fd`'s file and, unless `held` (the caller holds `fd`'s lock), only other users'
    processes hold it (`strangers`): else None, nothing made, and the caller opens the name again (whoever replaced
    it holds the new file). Returns the fresh file's descriptor, locked; `fd` is left open to the caller. GuardBusy
    as `guarded` says; OSError as `fresh` says."""
    with guarded(where, name):
        if not still_named(where, name, fd) or not held and not strangers(fd):
            return None
        return fresh(where, name, body, mode=mode)


def fresh(where: Dir | int, name: str, body: bytes = b"", *, mode: int = LOCK_FILE_MODE) -> int:
    """A new lock file (a new inode, `mode`, `body` written and synced) made under a temporary name in `where`,
    locked (exclusive) and renamed over `name`: whoever holds or opened the file there before holds nothing of it.
    Its descriptor, read-write and locked. OSError as the create or rename says."""
    dir_fd = _dir_fd(where)
    tmp = f"{atomic_tmp_prefix(name)}{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | LOCK_OPEN, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)  # not what the umask leaves of it
        try_flock(fd)  # nobody else has it open yet
        if body:
            os.pwrite(fd, body, 0)
            os.fsync(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return fd


def write_body(fd: int, body: bytes) -> None:
    """The held lock's body replaced: who holds it now."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, body, 0)


def read_raw(fd: int) -> bytes:
    """The body's bytes, BODY_MAX_BYTES + 1 at most (one more than a body may be: too long is told apart by
    parse_body). Not untrusted.read_open: that refuses a long body, and reads from the offset of a lock's descriptor
    that is read again (pread at 0 leaves it)."""
    return os.pread(fd, BODY_MAX_BYTES + 1, 0)


def parse_body(raw: bytes) -> dict | None:
    """The holder a body names ({} when empty), None when it is not one (too long, not a JSON object, too deep)."""
    if not raw.strip():
        return {}
    if len(raw) > BODY_MAX_BYTES:
        return None
    try:
        body = loads(raw, expect=None)  # bounded depth: never RecursionError
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def read_body(fd: int) -> dict:
    """What the open lock file says of its holder; {} when it says nothing readable."""
    try:
        return parse_body(read_raw(fd)) or {}
    except OSError:
        return {}


def holder(where: Dir | int, name: str) -> dict:
    """What the lock file `name` in `where` says of its holder, whether or not anyone holds it: {} when it is
    missing, unsafe (`problem`: a lock of ours), or says nothing readable. Nothing is locked or made."""
    try:
        fd, _ = open_lock(where, name, mode=None, write=False)
    except OSError:
        return {}
    try:
        return {} if problem(os.fstat(fd)) else read_body(fd)
    finally:
        os.close(fd)
