"""One trainer per checkpoint directory: an exclusive flock on <scratch>/trainer.lock, taken by the trainer itself
before it reads or writes a checkpoint, whichever way it was started (the supervisor's launch, a `minilmd train` by
hand, torchrun's rank 0), and held until the process ends (the kernel lets it go with the process, a SIGKILL too).

Before this, a `minilmd train` by hand on a config its supervisor was training resumed from the supervised run's
scratch, saved into it beside the real trainer, and the supervisor synced the intruder's steps to the remote
(user8 #1). The supervisor's own lock (supervisor.lock) could not catch it: a trainer by hand has no supervisor, and
under a supervisor the trainer is not the one holding that lock. So the trainer holds this one, and a second trainer
is refused (exit 69, protocol.EXIT_TRAINER_BUSY) with who holds it and what to do.

Global rank 0 takes it (RANK unset or "0"), and so does every node's local rank 0 (LOCAL_RANK "0"): the ranks of
one node share its scratch, rank 0 alone writes the checkpoints, and each other node has a scratch of its own (a
node's RAM or disk), which a `minilmd train` by hand on that node, or a second torchrun there, would resume from and
save into unrefused were it unlocked (before, only node 0's scratch was). A second torchrun's rank 0 or node rank 0
is refused, and torchrun then stops its other ranks before any of them has saved. Two "nodes" of one job on one
host (a by-hand rendezvous on loopback) share one scratch: whichever of their local ranks 0 comes second finds the
lock held by its own job (the holder's `launch`, torchrun's run id and its workers' store address, is its own) and
goes on without it. The store's port is new at each torchrun start with a c10d rendezvous
(`--rdzv-backend c10d`, `--standalone`); a static one (`--master-addr A --master-port P`, no rdzv id: run id "none")
has the same `launch` at each start, so a dying rank of an earlier such job counts as the same job (harmless for
the checkpoints: a rank 0 never goes on beside a rank 0). Ranks end at different times, and global rank 0, the
checkpoints' writer, may save for minutes after the holder has exited: a rank 0 going on without the lock keeps
blocking on it in a thread (_wait_to_hold) and holds it the moment the holder lets go (review11a F2; before, a
`minilmd train` by hand could take it while rank 0 saved). Only a rank 0 never goes on beside another rank 0, an
earlier torchrun's still dying (ranks other than 0 write no checkpoint).

Scratch is the run's own (claimed before this: minilmd/scratch.py), and still opened as minilmd/dirfd.py says: the
directory walked without a planted link, the lock file opened relative to it without following a link and without
blocking, a regular file of ours with one link only (minilmd/lockfile.py's checks, as every lock file's: before,
a hard link planted at its name had its body written into another file of the user's), and the name still leading
to the file once locked. The file is its owner's alone (lockfile.LOCK_FILE_MODE, 0600, whatever run.share says:
before, any user who could read it held an flock on it and the trainer looped on exit 69, hostile10 F2); an older
one with wider bits is narrowed and replaced by a fresh file, and one held by other users' processes only is
replaced and taken, said on stderr (lockfile.private, strangers). Its body (who holds it) is read bounded, owner
checked, printed, and its `launch` and `rank` compared with this process's (a match lets a rank of the same job go
on beside the holder, never a rank 0 beside a rank 0), never trusted for more.
No room for the lock (ENOSPC, EDQUOT: inodes or bytes, fsio.is_disk_full; another user's files may fill scratch
after staging) is no refusal: TrainerLockNoRoom, exit 74, the supervisor's wait for room (hostile9 F2; before, exit 2,
"config error, final", with advice to move away a file that did not exist).
Torch-free."""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from minilmd import lockfile, names
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.fsio import is_disk_full
from minilmd.place_rule import SCRATCH_ADVICE, walk_to
from minilmd.proc_info import boot_id, process_alive, recorded_boot
from minilmd.roomwords import no_room, top_of
from minilmd.supervision import supervision
from minilmd.untrusted import printable

JOB_BODY_WAIT_S = 10.0
"""How long a torchrun rank finding the lock held reads its holder's file again before it is refused (_taken_or_holder):
a rank of its own job writes it microseconds after its flock, seconds on a loaded host."""
GONE_HOLDER_WAIT_S = 2.0
"""How long a trainer outside torchrun tries the lock again while the holder its file names is gone: the instant of
left_unheld's shared probe, or a holder's exit, lasts microseconds; a live holder is refused at once."""
_held: list[int] = []
"""The lock's descriptor, kept open for the life of the process: closing it would let the lock go."""
_waiting: list[_Waiter] = []
"""Rank 0's blocked takes of the lock beside its job's holder (_wait_to_hold), until granted."""
_waiting_lock = threading.Lock()


class TrainerLockRefused(Exception):
    """The lock file cannot be used (a link, not ours): exit 2, the message says why."""


class TrainerLockNoRoom(Exception):
    """Scratch has no room for the lock (ENOSPC, EDQUOT: fsio.is_disk_full, inodes or bytes): another user's files
    may fill it after staging (hostile9 F2). No refusal of the config: exit 74 (protocol.EXIT_SCRATCH_FULL), fault.json
    kind scratch_full, and the supervisor waits for room (waiting_space). The message names what is used up and
    whose entries fill it (minilmd/roomwords.py)."""

    def __init__(self, scratch: Path, run_dir: Path, what: str, e: OSError):
        self.scratch, self.run_dir = scratch, run_dir
        super().__init__(f"scratch full: {what} cannot be made in {printable(scratch)}: "
                         f"{no_room(e, scratch, top_of(scratch))}; waiting for room, not a fault of the config")


class TrainerLockHeld(TrainerLockRefused):
    """Another trainer holds the run's checkpoints. `retried`: the holder is this run's supervised trainer (its lock
    file says so, or cannot be read): exit 69 (protocol.EXIT_TRAINER_BUSY), which the supervisor retries, the holder
    most often the last attempt's rank 0 still dying after its SIGKILL. A `minilmd train` by hand holding them is
    exit 2, for good: retrying would have the supervisor sync and prune that trainer's checkpoints as its own, for
    as long as it trains (review10e F1)."""

    def __init__(self, message: str, retried: bool):
        super().__init__(message)
        self.retried = retried


def takes_lock(environ=os.environ) -> bool:
    """Whether this process is one that holds its scratch's lock: global rank 0 (or no torchrun) or a node's local
    rank 0, the ranks 0 of the node's scratch."""
    return environ.get("RANK", "0") == "0" or environ.get("LOCAL_RANK") == "0"


def launch_of(environ=os.environ) -> str | None:
    """The torchrun job this process is a rank of, the same on each of its nodes: the rendezvous's run id and the
    workers' store (rank 0's agent's, on a port picked at each torchrun start with c10d or --standalone; a static
    rendezvous's user-fixed MASTER_ADDR:MASTER_PORT and run id "none" are the same at each start, see the module's
    docstring). None outside torchrun."""
    run_id, addr, port = (environ.get(k) for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"))
    return f"{run_id}@{addr}:{port}" if run_id and addr and port else None


def hold_for(cfg, environ=os.environ) -> None:
    """hold() for a RunConfig's trainer, on the ranks that take it (takes_lock); supervised when the supervisor
    launched it."""
    if takes_lock(environ):
        hold(cfg.scratch_dir, cfg.run_dir, supervised=supervision(environ) is not None,
             rank=int(environ.get("RANK", "0")), launch=launch_of(environ))


def same_job(body: dict, rank: int, launch: str | None) -> bool:
    """Whether the lock's holder is a rank of this process's own torchrun job (a node of it sharing this scratch),
    and not two ranks 0: then this one goes on, its job's holder guarding the scratch."""
    return launch is not None and body.get("launch") == launch and not (rank == 0 and body.get("rank") == 0)


def hold(scratch: Path, run_dir: Path, supervised: bool, rank: int = 0, launch: str | None = None) -> None:
    """Take the run's trainer lock for this process, or raise TrainerLockRefused naming the holder. `rank`,
    `launch`: this process's global rank and torchrun job (launch_of); a lock held by another rank of the same job
    (same_job) is left to it."""
    try:
        if not os.path.lexists(scratch):  # a trainer launched without a claim (tests' by-hand launches): made here,
            os.close(walk_to(scratch, "run.scratch", "the scratch", SCRATCH_ADVICE, 0o700)[0])  # as saving would
        where = Dir.open(scratch, "run.scratch")
    except (PlaceRefused, OSError) as e:
        if isinstance(e, OSError) and is_disk_full(e):
            raise TrainerLockNoRoom(scratch, run_dir, "the scratch directory", e) from None
        raise TrainerLockRefused(f"cannot take the trainer lock in {printable(scratch)}: {e}") from None
    try:  # never shared, whatever run.share says: whoever can open it can lock it (hostile10 F2)
        fd, _ = lockfile.open_lock(where, names.TRAINER_LOCK, mode=lockfile.LOCK_FILE_MODE)
    except OSError as e:  # a link (ELOOP), a FIFO's ENXIO aside (O_NONBLOCK): nothing followed, nothing waited on
        where.close()
        if is_disk_full(e):  # no inode (or byte) left: room to wait for, no file to move away
            raise TrainerLockNoRoom(scratch, run_dir, names.TRAINER_LOCK, e) from None
        raise TrainerLockRefused(f"{printable(scratch / names.TRAINER_LOCK)}: cannot be opened as the trainer lock "
                                 f"({e.strerror or e}); move it away, then start again") from None
    try:
        if problem := lockfile.problem(os.fstat(fd)):  # a hard link too: never another file's body written
            raise TrainerLockRefused(f"{printable(scratch / names.TRAINER_LOCK)}: {problem}, so not minilmd's "
                                     "trainer lock; move it away, then start again")
        fd = lockfile.private(where, names.TRAINER_LOCK, fd)  # an older run's wider file: a fresh one
        fd = _past_strangers(where, fd, scratch)
        mine = _body(supervised, run_dir, rank, launch)
        if (body := _taken_or_holder(where.fd, fd, rank, launch)) is not None:
            if same_job(body, rank, launch):
                if rank == 0:  # the checkpoints' writer: it takes the lock the moment its job's holder lets go
                    _wait_to_hold(fd, mine)
                else:
                    os.close(fd)
                return
            raise TrainerLockHeld(held_message(body, scratch, run_dir), retried=not body or (
                body.get("supervised") is True and body.get("run_dir") == str(run_dir))) from None
        lockfile.write_body(fd, mine)
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError) and is_disk_full(e):  # its body had no room
            raise TrainerLockNoRoom(scratch, run_dir, names.TRAINER_LOCK, e) from None
        raise
    finally:
        where.close()
    _held.append(fd)


def _past_strangers(where: Dir, fd: int, scratch: Path) -> int:
    """`fd`, or, when only other users' processes hold it (lockfile.strangers: a lock file they could read, from an
    older run) and scratch is ours, a fresh lock file put in its place (lockfile.replace), taken: that user's lock
    holds nothing of ours (hostile10 F2: before, the trainer looped on exit 69 for as long as it was held)."""
    if lockfile.try_flock(fd) or not (found := lockfile.strangers(fd)) or not lockfile.own_dir(where):
        return fd
    try:  # one replacement at a time among ours (review12c F1)
        new = lockfile.replace(where, names.TRAINER_LOCK, fd)
    except lockfile.GuardBusy:
        new = None
    if new is None:  # replaced by another of ours meanwhile (it holds the new file), or let go: the lock's checks
        return fd  # after (_taken_or_holder: the name's holder, or "replaced while it was being locked")
    os.close(fd)
    print(f"minilmd train: {printable(scratch / names.TRAINER_LOCK)} was "
          f"{lockfile.strangers_words(found, 'trainer')}", file=sys.stderr, flush=True)
    return new


def _body(supervised: bool, run_dir: Path, rank: int, launch: str | None) -> bytes:
    """The lock file's body: who holds it, for a refused trainer's message and same_job (its boot: _holder_gone)."""
    return (json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "boot": boot_id(), "supervised": supervised,
                        "run_dir": str(run_dir), "rank": rank, "launch": launch}) + "\n").encode()


def _wait_to_hold(fd: int, body: bytes) -> None:
    """Global rank 0 going on beside its job's holder (another node's local rank 0 on a shared scratch) blocks on
    the lock in a daemon thread, on its own descriptor (opened as hold() opens it), so that it holds the lock the
    moment that rank exits: ranks end at different times, and rank 0 may save for minutes after the others have
    gone, a `minilmd train` by hand refused all that time (review11a F2). Granted, it writes its own body (best
    effort: no room leaves the last holder's) and is kept with the held ones; after release_all it lets go at once."""
    waiter = _Waiter(fd)
    with _waiting_lock:
        _waiting.append(waiter)
    threading.Thread(target=waiter.take, args=(body,), name="trainer-lock-wait", daemon=True).start()


class _Waiter:
    """One blocked flock of rank 0's (_wait_to_hold); `released`: release_all ran meanwhile, the lock not wanted."""

    def __init__(self, fd: int):
        self.fd, self.released = fd, False

    def take(self, body: bytes) -> None:
        try:
            lockfile.block_flock(self.fd)
        except OSError:  # not granted (review11c F2): never recorded as held, the holder's body never overwritten
            with _waiting_lock:
                _waiting.remove(self)
                os.close(self.fd)
            return
        with _waiting_lock:
            _waiting.remove(self)
            if self.released:
                os.close(self.fd)
                return
            try:  # written before it is listed held: release_all never closes it under the write (review11c F3)
                lockfile.write_body(self.fd, body)
            except OSError:
                pass
            _held.append(self.fd)


def _taken_or_holder(dir_fd: int, fd: int, rank: int, launch: str | None) -> dict | None:
    """None once this process holds the lock; else what the holder's file says (holder). A torchrun rank reads it
    again for up to JOB_BODY_WAIT_S while it names another job, trying the lock again meanwhile: a rank of its own
    job on the same scratch writes its body only just after taking the flock, and until then the file is empty or
    still the last holder's. A trainer outside torchrun is answered at once, unless the holder the file names is
    gone (no pid, a dead pid of this host): then it tries again for up to GONE_HOLDER_WAIT_S, since a lock held
    by nobody alive is an instant's (review11a F3: left_unheld's probe refused a trainer for good, exit 2)."""
    deadline = time.monotonic() + JOB_BODY_WAIT_S
    gone_deadline = time.monotonic() + GONE_HOLDER_WAIT_S
    while True:
        if lockfile.try_flock(fd):
            if lockfile.still_named(dir_fd, names.TRAINER_LOCK, fd):
                return None
            raise TrainerLockRefused(f"{names.TRAINER_LOCK}: replaced while it was being locked (someone else "
                                     "writes this scratch); nothing was read or written, start again")
        body = holder(dir_fd)
        if launch is None and _holder_gone(body) and time.monotonic() < gone_deadline:
            time.sleep(0.05)  # a probe's instant (left_unheld) or a holder just exiting: tried again
            continue
        if launch is None or same_job(body, rank, launch) or time.monotonic() >= deadline:
            return body
        time.sleep(0.05)


def _holder_gone(body: dict) -> bool:
    """Whether the lock's body names no holder alive: no pid, or a pid of this host that is gone, or one of another
    boot (its lock then is a probe's shared one, left_unheld, or the kernel's still letting go; a body of another
    boot is one a holder of this boot has not written over yet)."""
    pid, host = body.get("pid"), body.get("host")
    if not isinstance(pid, int) or pid <= 0:
        return True
    if host != socket.gethostname():
        return False  # another node's pid: not ours to judge
    return not process_alive(pid, None, recorded_boot(body.get("boot")))  # a zombie too: its lock went with its fds


def left_unheld(scratch: Path) -> bool:
    """Whether <scratch>/trainer.lock is only what an ended trainer of this user left: a regular file of ours (no
    link followed, nothing waited on) that no process holds now. A trainer launched into a scratch with no owner
    marker (a by-hand launch, a test's) leaves it there, and the scratch's adoption (minilmd/scratch.py) must not
    take it for someone's file; one held, another user's, a link or anything else is still one. The probe is a
    shared flock taken and let go at once: a trainer taking the lock in that instant finds it held by a dead (or no)
    holder, and tries again (GONE_HOLDER_WAIT_S) before it is refused."""
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
        return lockfile.probe_free(fd)  # held: a trainer trains there now
    except OSError:
        return False
    finally:
        os.close(fd)


def release_all() -> None:
    """Let the locks this process holds go: a trainer run inside a longer-lived process (the tests' in-process
    trainer) releases it when it returns, as a trainer's own process does when it exits."""
    with _waiting_lock:
        for waiter in _waiting:  # still blocked: closes its descriptor itself once granted (never one reused)
            waiter.released = True
        while _held:
            os.close(_held.pop())


def holder(dir_fd: int) -> dict:
    """Who the lock file says holds it (its body, bounded, owner checked); {} when it cannot be read."""
    return lockfile.holder(dir_fd, names.TRAINER_LOCK)


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
