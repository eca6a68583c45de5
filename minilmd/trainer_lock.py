"""One trainer per checkpoint directory: an exclusive flock on <scratch>/trainer.lock, taken by the trainer itself
before it reads or writes a checkpoint, whichever way it was started (the supervisor's launch, a `minilmd train` by
hand, torchrun's rank 0), and held until the process ends (the kernel lets it go with the process, a SIGKILL too).

Before this, a `minilmd train` by hand on a config its supervisor was training resumed from the supervised run's
scratch, saved into it beside the real trainer, and the supervisor synced the intruder's steps to the remote
(user8 #1). The supervisor's own lock (supervisor.lock) could not catch it: a trainer by hand has no supervisor, and
under a supervisor the trainer is not the one holding that lock. So the trainer holds this one, and a second trainer
is refused (exit 69, protocol.EXIT_TRAINER_BUSY) with who holds it and what to do.

Only global rank 0 takes it (RANK unset or "0"): the ranks of one torchrun share its scratch (and a by-hand
rendezvous of two "nodes" on one host shares one scratch too), and rank 0 alone writes the checkpoints; a second
torchrun's rank 0 is refused, and torchrun then stops its other ranks before any of them has saved.

Scratch is the run's own (claimed before this: minilmd/scratch.py), and still opened as minilmd/dirfd.py says: the
directory walked without a planted link, the lock file opened relative to it without following a link and without
blocking, a regular file of ours only; its body (who holds it) is read bounded and printed, never trusted for more.
Torch-free."""
from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
from pathlib import Path

from minilmd import names
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.perms import own_uid, owned_by_me
from minilmd.place_rule import walk_to
from minilmd.untrusted import Unreadable, printable, read_json

SCRATCH_ADVICE = "set run.scratch to a place only you (and root) can change"
_held: list[int] = []
"""The lock's descriptor, kept open for the life of the process: closing it would let the lock go."""


class TrainerLockRefused(Exception):
    """The lock file cannot be used (a link, not ours): exit 2, the message says why."""


class TrainerLockHeld(TrainerLockRefused):
    """Another trainer holds the run's checkpoints. `retried`: the holder is this run's supervised trainer (its lock
    file says so, or cannot be read): exit 69 (protocol.EXIT_TRAINER_BUSY), which the supervisor retries, the holder
    most often the last attempt's rank 0 still dying after its SIGKILL. A `minilmd train` by hand holding them is
    exit 2, for good: retrying would have the supervisor sync and prune that trainer's checkpoints as its own, for
    as long as it trains (review10e F1)."""

    def __init__(self, message: str, retried: bool):
        super().__init__(message)
        self.retried = retried


def is_rank_zero(environ=os.environ) -> bool:
    """Whether this process is the one trainer of its launch that holds the lock: not a torchrun rank other than 0."""
    return environ.get("RANK", "0") == "0"


def hold_for(cfg) -> None:
    """hold() for a RunConfig's trainer, on rank 0 only; supervised when the supervisor launched it."""
    if is_rank_zero():
        hold(cfg.scratch_dir, cfg.run_dir, supervised=bool(os.environ.get(names.RUN_DIR_ENV)))


def hold(scratch: Path, run_dir: Path, supervised: bool) -> None:
    """Take the run's trainer lock for this process, or raise TrainerLockRefused naming the holder."""
    try:
        if not os.path.lexists(scratch):  # a trainer launched without a claim (tests' by-hand launches): made here,
            os.close(walk_to(scratch, "run.scratch", "the scratch", SCRATCH_ADVICE, 0o700)[0])  # as saving would
        where = Dir.open(scratch, "run.scratch")
    except (PlaceRefused, OSError) as e:
        raise TrainerLockRefused(f"cannot take the trainer lock in {printable(scratch)}: {e}") from None
    try:
        fd, _ = where.open_or_make(names.TRAINER_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                                   0o666)  # the umask decides, as for every file of the run (run.share)
    except OSError as e:  # a link (ELOOP), a FIFO's ENXIO aside (O_NONBLOCK): nothing followed, nothing waited on
        where.close()
        raise TrainerLockRefused(f"{printable(scratch / names.TRAINER_LOCK)}: cannot be opened as the trainer lock "
                                 f"({e.strerror or e}); move it away, then start again") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not owned_by_me(st):
            raise TrainerLockRefused(f"{printable(scratch / names.TRAINER_LOCK)}: not a regular file of yours, so not "
                                     "minilmd's trainer lock; move it away, then start again")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            body = holder(where.fd)
            raise TrainerLockHeld(held_message(body, scratch, run_dir), retried=not body or (
                body.get("supervised") is True and body.get("run_dir") == str(run_dir))) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "supervised": supervised,
                                   "run_dir": str(run_dir)}) + "\n").encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    finally:
        where.close()
    _held.append(fd)


def left_unheld(scratch: Path) -> bool:
    """Whether <scratch>/trainer.lock is only what an ended trainer of this user left: a regular file of ours (no
    link followed, nothing waited on) that no process holds now. A trainer launched into a scratch with no owner
    marker (a by-hand launch, a test's) leaves it there, and the scratch's adoption (minilmd/scratch.py) must not
    take it for someone's file; one held, another user's, a link or anything else is still one. The probe is a
    shared flock taken and let go at once: a trainer taking the lock in that instant is refused as by a holder,
    which a claim of a scratch with no marker, made before its trainer starts, does not meet."""
    try:
        where = Dir.open(scratch, "run.scratch")
    except (PlaceRefused, OSError):
        return False
    try:
        fd = where.open_own(names.TRAINER_LOCK)
    except OSError:  # a link, not a regular file, another user's (PermissionError), gone
        return False
    finally:
        where.close()
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # held (EWOULDBLOCK): a trainer trains there now
        return False
    finally:
        os.close(fd)  # the probe's shared lock goes with it
    return True


def release_all() -> None:
    """Let the locks this process holds go: a trainer run inside a longer-lived process (the tests' in-process
    trainer) releases it when it returns, as a trainer's own process does when it exits."""
    while _held:
        os.close(_held.pop())


def holder(dir_fd: int) -> dict:
    """Who the lock file says holds it (its body, bounded, owner checked); {} when it cannot be read."""
    try:
        body = read_json(names.TRAINER_LOCK, max_bytes=names.TRAINER_LOCK_MAX_BYTES, owner=own_uid(),
                         dir_fd=dir_fd)
    except (Unreadable, OSError):
        return {}
    return body if isinstance(body, dict) else {}


def held_message(body: dict, scratch: Path, run_dir: Path) -> str:
    """What a refused second trainer says: the holder (as its lock file names it) and what to do."""
    pid = body.get("pid") if isinstance(body.get("pid"), int) else None
    who = f"pid {pid}" if pid else "a process"
    host = body.get("host")
    if isinstance(host, str) and host != socket.gethostname():
        who += f" on {printable(host)}"
    checkpoints = printable(scratch / names.CHECKPOINTS)
    if body.get("supervised") is True:
        return (f"another trainer already trains this run: {who}, launched by the supervisor of "
                f"{printable(run_dir)}, holds {checkpoints}; nothing was read or written. Watch it with "
                f"`minilmd status {printable(run_dir)}`; to train by hand instead, `minilmd stop {printable(run_dir)}` "
                "first (it saves)")
    return (f"another trainer already trains this run: {who}, a `minilmd train` (no supervisor), holds {checkpoints}; "
            "nothing was read or written. Let it finish, or stop it (Ctrl-C in its terminal, or "
            f"kill -TERM {pid or 'PID'}: it saves), then start again")
