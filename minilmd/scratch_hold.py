"""A supervisor's hold on its run's scratch: an flock on the scratch's owner marker (names.SCRATCH_OWNER), taken
when the launch claims scratch and again at each claim before staging (a scratch made anew gets it anew), kept until
the supervisor ends (the kernel lets it go with the process; `let_go` at its shutdown).

The run lock lives in run.dir (daemon/host/lock.py). A run.dir removed while the run runs takes that lock with it:
the supervisor stops its trainer and goes on with its last sync (daemon/phases/rundirwatch.py), which may take
minutes, while a new `minilmd run` makes run.dir anew with a free lock. The scratch's owner marker names the run by
its run directory's path (minilmd/run_owner.py), the same for both, so the claim let the second supervisor stage,
start a trainer and prune in the scratch the first was still syncing from. This hold refuses it (exit 2, the first
supervisor's pid named, from /proc/locks), `run --check` says the same (`in_use`), and once the first has ended the
run starts again. Only supervisors hold it (their trainers, a Slurm node's claim, `minilmd train` do not), and the
descriptor is close-on-exec: no trainer keeps it past its supervisor. The marker is its owner's alone
(lockfile.LOCK_FILE_MODE, 0600, minilmd/scratch.py writes it so): before, under run.share "all" any user who could
read it held an flock on it and every start of the run was refused as "another supervisor" (hostile10 F2). An older
marker with wider bits is narrowed and replaced by a fresh copy, and one held by other users' processes only is
replaced (its words copied) and taken, said on stderr (lockfile.private, strangers, replace: one replacement
at a time among this user's processes, and the name checked to lead to the marker locked, review12c F1, F2).
A marker removed or replaced after the hold's open is not waited on, whoever holds it (a process of ours too): its
holder holds nothing the name leads to, and the hold opens the name again, where the marker decides as for a hold
opened a moment later (a live supervisor's refuses; none there is the claim's). Before, that holder was waited on and
named as the scratch's supervisor, ScratchInUse, though the next start took the scratch. Torch-free.
"""
from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

from minilmd import lockfile
from minilmd.names import OWNER_MAX_BYTES, SCRATCH_OWNER
from minilmd.openflags import OPEN_FLAGS  # the marker: never through a link, never blocking on a FIFO
from minilmd.perms import user_words
from minilmd.procs import flock_holders, process_uids

PROBE_WAIT_S = 2.0
"""How long `hold` tries again before it calls the marker held: `in_use`'s probe (a `run --check`, a launch's own
check) holds a shared lock for microseconds, a supervisor holds it for its life; before (review11c F1), a restart
that met a user's `run --check` in that instant was refused for good, exit 2, naming no supervisor."""
PROBE_POLL_S = 0.02

_holds: dict[str, tuple[int, int, int]] = {}
"""This process's holds: the scratch's absolute path -> (descriptor, device, inode) of the marker it locks."""


class ScratchInUse(ValueError):
    """Another process holds this scratch's marker: a supervisor of this run that has not ended."""


def hold(scratch: Path) -> None:
    """Take (or keep) this process's hold on `scratch`, claimed for its run just before (its marker written):
    ScratchInUse when another supervisor holds it. A hold of a marker since replaced (a scratch made anew) moves to
    the new one. A marker that is not there, not a regular file, or cannot be opened is left to the claim's checks."""
    key = os.path.abspath(scratch)
    try:
        dir_fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        _hold(Path(scratch), key, dir_fd)
    finally:
        os.close(dir_fd)


def _hold(scratch: Path, key: str, dir_fd: int) -> None:
    old = _holds.get(key)
    for _ in range(lockfile.STILL_NAMED_TRIES):
        try:
            fd = os.open(SCRATCH_OWNER, OPEN_FLAGS, dir_fd=dir_fd)
        except OSError:
            return
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or old is not None and (old[1], old[2]) == (st.st_dev, st.st_ino):
            os.close(fd)
            return
        give_up = time.monotonic() + PROBE_WAIT_S
        try:
            if not lockfile.problem(st):  # an older run's marker others could read: a fresh one
                fd = lockfile.private(dir_fd, SCRATCH_OWNER, fd, body_max=OWNER_MAX_BYTES)
            locked = lockfile.try_flock(fd)
            while not locked:
                if not lockfile.still_named(dir_fd, SCRATCH_OWNER, fd):
                    break  # removed or replaced since our open: its holder, ours or not, holds no marker of this
                    # scratch now; the marker at the name decides (as for a hold opened a moment later)
                if found := _strangers(dir_fd, fd):
                    if (new := _fresh(scratch, dir_fd, fd, found)) is not None:
                        fd, gone = new, fd
                        os.close(gone)
                        break
                if time.monotonic() >= give_up:
                    raise ScratchInUse(_in_use_words(scratch, os.fstat(fd)))
                time.sleep(PROBE_POLL_S)
                locked = lockfile.try_flock(fd)
            # the marker locked may no longer be the one named: another supervisor moved it to a fresh file between
            # our open and our flock (review12c F2: both held the scratch); the name again, as lockfile.take does
            if locked and lockfile.still_named(dir_fd, SCRATCH_OWNER, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    else:
        raise ScratchInUse(f"run.scratch {scratch}: its owner marker {SCRATCH_OWNER} kept being replaced while it "
                           "was locked (someone else writes this scratch)")
    if old is not None:
        os.close(old[0])
    st = os.fstat(fd)
    _holds[key] = (fd, st.st_dev, st.st_ino)


def _strangers(dir_fd: int, fd: int) -> list[tuple[int, int | None]]:
    """lockfile.strangers, for a marker of ours (lockfile.problem) in a scratch of ours only: the ones replaced. One
    with no link left (removed after our open) too: `_fresh` finds it no longer named, and the hold opens the name
    again (`_hold` asks that first, whoever holds it: before, it waited on another user's holder of a gone marker,
    ScratchInUse, review12b F3; and on a holder of ours, until this stop's review)."""
    st = os.fstat(fd)
    if lockfile.problem(st) or not lockfile.own_dir(dir_fd):
        return []
    return lockfile.strangers(fd)


def _fresh(scratch: Path, dir_fd: int, fd: int, found: list[tuple[int, int | None]]) -> int | None:
    """The marker held by other users' processes only replaced by a fresh copy (its words), taken, one replacement
    at a time among ours (lockfile.replace); None when another of ours replaced it meanwhile or it was let go."""
    body = os.pread(fd, OWNER_MAX_BYTES + 1, 0)  # at 0, not untrusted.read_open: a later try reads it again
    if len(body) > OWNER_MAX_BYTES:  # no marker of ours: the claim's checks say so
        raise ScratchInUse(_in_use_words(scratch, os.fstat(fd)))
    try:
        new = lockfile.replace(dir_fd, SCRATCH_OWNER, fd, body)
    except lockfile.GuardBusy:
        return None
    if new is not None:
        print(f"minilmd run: {scratch / SCRATCH_OWNER} was {lockfile.strangers_words(found, 'supervisor')}",
              file=sys.stderr, flush=True)
    return new


def let_go(scratch: Path) -> None:
    """This process's hold on `scratch` given up (its supervisor's end); nothing when it holds none."""
    held = _holds.pop(os.path.abspath(scratch), None)
    if held is not None:
        os.close(held[0])


def in_use(scratch: Path) -> str | None:
    """Why a launch now would be refused (another process holds `scratch`'s marker), or None: a probe that takes
    and lets go a shared lock at once, creating nothing (`run --check`; the launch's own check). None for a scratch
    this process holds, and for one without a marker."""
    if os.path.abspath(scratch) in _holds:
        return None
    try:
        fd = os.open(Path(scratch) / SCRATCH_OWNER, OPEN_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            if lockfile.probe_free(fd) or lockfile.strangers(fd):  # the latter: the launch replaces it (hold)
                return None
            return _in_use_words(Path(scratch), st)
        except OSError:
            return None
    finally:
        os.close(fd)


def _in_use_words(scratch: Path, st: os.stat_result) -> str:
    pids = [pid for pid in flock_holders(st) if pid != os.getpid()]
    who = ", ".join(f"pid {pid}, a process of {_owner_words(pid)}" for pid in pids) or \
        "a process /proc/locks does not name here"
    return (f"run.scratch {scratch} is still held by another supervisor of this run ({who}, which holds "
            f"{scratch / SCRATCH_OWNER}): a run whose run.dir was removed while it ran goes on with its last sync "
            f"from there before it stops; wait for it to end, then start the run again")


def _owner_words(pid: int) -> str:
    uids = process_uids(pid)
    return user_words(uids[1] if uids else None)
