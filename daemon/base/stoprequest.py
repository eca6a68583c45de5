"""`minilmd stop`'s request, left in the run directory for the starts a launcher makes by itself.

A stop that finds no supervisor cannot signal a start that is still to come: the tmux launcher's window "run" starts a
killed supervisor again after MINILMD_TMUX_RESTART_SEC, and a Slurm job may be requeued. So `stop` leaves
`stop-request.json` in the run directory (`leave`) before it looks for the supervisor, and `minilmd run` reads it once
it holds the run lock (`read`): a start a launcher made by itself (`automatic_restart`: names.AUTO_RESTART_ENV, which
the tmux window sets on its restarts only, or a requeued Slurm job) honours it (but an after_end one, below) and stops
before any trainer, exit 0; so does a start the stop came after (`asked_after_start`: a `minilmd run` process begun
before the stop wrote its request, its lock not yet taken, as it is for half a second after it starts; told in this
boot's clock, CLOCK_BOOTTIME, which no wall-clock step moves); any other start (a person's `minilmd run`, the tmux
launcher or `sbatch` run by hand, systemd, begun after the request) removes it (`clear`) and runs as asked. The order
keeps the promise: stop writes, then looks at the lock; run takes the lock, then reads. Either stop finds the new
supervisor (and signals it), or that supervisor finds the request, and a start by hand honours it when it began before
it. A start begun while `stop` writes (after its request's time, before its look at the lock: milliseconds) is judged
by its process's start, which the kernel keeps in ticks (10 ms, rounded down): in the tick of the request's time it
counts as begun before it and stops (what the stop asked); later, as a start after the stop: it trains, while that
stop says the run is not running.

A run that ended for good (protocol.restart_may_follow false: no launcher starts it by itself) gets a request
marked `after_end`: only a start already under way honours it, and any start (automatic ones too) removes it, once
read; `status` does not show it (a finished run's status would otherwise say a restart will not start it).

systemd's own restarts (Restart=on-failure) look to the started process like `systemctl start`: a start by systemd
clears the request, and a unit waiting to restart is stopped with `systemctl --user stop minilmd@NAME`, which `stop`
says (docs/operations.md "Stop").

The file is written at the run directory's descriptor (minilmd/dirfd.py Dir: the directory walked from "/" without
following a link, each one on the way root's or the run owner's; an O_EXCL temporary name, then a rename there), so
root stopping a user's run writes nowhere else; read as a file others may have written (minilmd/untrusted.py: a
regular file of this user's or root's, no link followed, at most names.STOP_REQUEST_MAX_BYTES); removed only when
it is such a file, at the run directory's descriptor.
Torch-free.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from minilmd import names
from minilmd.daemon.base.runstate import fmt_time
from minilmd.dirfd import Dir, Identity, PlaceRefused
from minilmd.perms import file_mode, own_uid, owned_by_me_or_root, run_dir_owner, signal_uid
from minilmd.proc_info import boot_id, since_boot, started_since_boot
from minilmd.untrusted import Unreadable, printable, read_json

HONOURED_UNPARSED = frozenset({"too_big", "not_utf8", "too_deep", "not_json", "wrong_type"})
"""What a regular file of this user's or root's may fail on and still be a request (its time unknown): the owner and
the type are checked before a byte is read, so such a file was put there by someone who may stop the run."""


@dataclass(frozen=True)
class StopRequest:
    path: Path
    time: float | None
    by: str
    """Who asked: "uid 1000 on host"; "" when the file did not say."""
    boot: str = ""
    """The boot `stop` wrote it in (proc_info.boot_id: of one host, one boot); "" when the file did not say."""
    since_boot: float | None = None
    """When, in seconds since that boot (proc_info.since_boot): what asked_after_start compares."""
    after_end: bool = False
    """Left by a stop that found the run ended for good and no supervisor: only for a start already under way."""

    def words(self) -> str:
        """'minilmd stop at 2026-12-05 05:01:02 by uid 1000 on gpu1', for the journal and the outcome."""
        return f"minilmd stop at {fmt_time(self.time)}" + (f" by {self.by}" if self.by else "")


def leave(run_dir: Path, owner: int, judged: Identity | None = None, after_end: bool = False) -> Path:
    """Write the request into run_dir (a run directory of `owner`'s): readable by its owner when root writes it.
    `after_end`: the run ended for good and no supervisor holds its lock (StopRequest.after_end), unless an ordinary
    request is there already: it is written again as one (its time this stop's).
    OSError when it cannot be written, PlaceRefused (a ValueError) when run_dir is in a place others can change, or
    when the directory the walk reaches is not `judged` ((device, inode): the one `stop` judged and read, moved
    aside since and another put in its place): never written into what stands there now."""
    with Dir.open(run_dir, "run.dir", owners={owner}) as where:
        if judged is not None and where.identity != judged:
            raise PlaceRefused(f"{printable(run_dir)}: not the run directory judged a moment ago (moved or replaced "
                               f"since): nothing written there")
        if after_end:  # an ordinary request there (a stop of the live supervisor) stays one: a second stop of the
            earlier, _ = read(run_dir, owner, where.fd)  # ended run never narrows it to a start under way
            after_end = earlier is None or earlier.after_end
        body = {"time": time.time(), "uid": signal_uid(), "host": socket.gethostname(), "pid": os.getpid(),
                "boot": boot_id(), "since_boot": since_boot()}  # as late as can be: a start before it is honoured
        if after_end:
            body["after_end"] = True
        where.write_atomic(names.STOP_REQUEST, (json.dumps(body, sort_keys=True) + "\n").encode(),
                           file_mode() if own_uid() == owner else 0o644)
        os.fsync(where.fd)  # a requeue after a node's reboot still finds it
    return run_dir / names.STOP_REQUEST


def read(run_dir: Path, owner: int | None = None, dir_fd: int | None = None) -> tuple[StopRequest | None, str | None]:
    """(the request, None); (None, None) when there is none; (None, why) for a file there that is no request of
    this user's or root's (a link, another user's, a FIFO): it is not honoured, nor removed. `owner`: the run's
    owner when another reads it (root's `status --all`): a request of that user's or root's. `dir_fd`: the run
    directory a view judged (daemon/views/runarg.py open_run), read through it (run_dir then names it in words)."""
    path = run_dir / names.STOP_REQUEST
    try:
        body = read_json(path if dir_fd is None else names.STOP_REQUEST, max_bytes=names.STOP_REQUEST_MAX_BYTES,
                         owner={own_uid() if owner is None else owner, 0}, dir_fd=dir_fd)
    except Unreadable as e:
        if e.kind == "missing":
            return None, None
        if e.kind in HONOURED_UNPARSED:
            return StopRequest(path, None, ""), None
        return None, f"{path} is no stop request of this user's ({e.why})"
    when, uid, host, boot, since = (body.get(key) for key in ("time", "uid", "host", "boot", "since_boot"))
    by = f"uid {uid} on {printable(host)}" if isinstance(uid, int) and isinstance(host, str) else ""
    return StopRequest(path, _number(when), by, boot if isinstance(boot, str) else "", _number(since),
                       body.get("after_end") is True), None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def asked_after_start(request: StopRequest, pid: int | None = None) -> bool:
    """Whether the stop was asked after process `pid` (this one) started: a `minilmd run` begun before the stop, whose
    run lock the stop found not yet taken. Told in this boot's own clock only (proc_info.since_boot against the
    process's start): a request of another boot (another host's, or before a reboot), or one without those, is not
    (another host's clock may be off by more than the half second this is about; a wall clock may step)."""
    this_boot = boot_id()
    if not this_boot or request.boot != this_boot or request.since_boot is None:
        return False
    started = started_since_boot(os.getpid() if pid is None else pid)
    return started is not None and request.since_boot >= started


def asked_now(run_dir: Path) -> bool:
    """Whether a SIGUSR2 that came to this supervisor now is `minilmd stop`'s: stop writes its request on this host
    just before it signals (it signals only a local lock holder), so one is in run_dir, written in this boot after
    this process's start (asked_after_start). In a Slurm job a SIGUSR2 without one is Slurm's own warning (`sbatch
    --signal=B:USR2@300`, a user who picked USR2): taken as its USR1, a preemption (daemon/supervisor.py,
    daemon/scratchclaim.py); before, it was taken as `minilmd stop`'s, and the job ended "stopped on request", never
    requeued. A request of another boot or host (left by an earlier stop, still there during the scratch wait, before
    at_start clears it), one without its boot's time, and a file there that is no request (a link, another user's)
    are none: before, another boot's counted as current, and turned Slurm's warning into a stop."""
    request, _ = read(run_dir)
    return request is not None and asked_after_start(request)


def status_line(run_dir: Path, systemd_unit: str = "", dir_fd: int | None = None) -> str | None:
    """What `minilmd status` says of a request left in run_dir (it stays after the stop it was left by, until a start
    by hand): None when there is none. `systemd_unit`: the unit the run's supervisor ran as (state.json), whose
    restarts do not read the request. Judged as the run's supervisor judges it (the run directory's owner's or
    root's is honoured), not by the reader: root's `status` of a user's run called her own request not honoured.
    `dir_fd`: read's."""
    request, problem = read(run_dir, run_dir_owner(run_dir, dir_fd), dir_fd)
    if problem:
        return f"  {problem}: not honoured"
    if request is None or request.after_end:
        return None
    when = f"at {fmt_time(request.time)}" if request.time is not None else "(when: unreadable)"
    by = f" by {request.by}" if request.by else ""
    unit = f"; systemd's restart of {systemd_unit} does not read it" if systemd_unit else ""
    return (f"  stop requested {when}{by} (an automatic restart will not start the run: the tmux window's, a Slurm "
            f"requeue{unit}; a start by hand clears it)")


def as_json(run_dir: Path, owner: int | None = None, dir_fd: int | None = None) -> dict | None:
    """The request as `status --json` and `status --all --json` give it ("stop_request"): None when there is none;
    {"path", "time", "by", "after_end"}; {"path", "problem"} for a file there that is not honoured (read's why).
    `owner`: the run's (None: the run directory's owner, as its supervisor judges the request). `dir_fd`: read's."""
    request, problem = read(run_dir, run_dir_owner(run_dir, dir_fd) if owner is None else owner, dir_fd)
    if problem:
        return {"path": str(run_dir / names.STOP_REQUEST), "problem": problem}
    if request is None:
        return None
    return {"path": str(request.path), "time": request.time, "by": request.by, "after_end": request.after_end}


def clear(run_dir: Path) -> str | None:
    """Remove the request; None when removed (or gone), else why it was left (not a regular file of this user's or
    root's: never ours to delete; a run directory the place rule refuses now, a link of another user's on its way).
    run_dir is opened as every removal of the request opens it (`_open_run_dir`)."""
    try:
        with _open_run_dir(run_dir) as where:
            return _remove_request(where, run_dir)
    except PlaceRefused as e:
        return f"{run_dir / names.STOP_REQUEST} left: {printable(str(e))}"


def _open_run_dir(run_dir: Path) -> Dir:
    """The run directory, for removing its request: Dir.open's walk (no link followed but one of this user's or
    root's, every directory on the way under the place rule), never a plain open of the path."""
    return Dir.open(run_dir, "run.dir", owners={own_uid()})


def _remove_request(where: Dir, run_dir: Path) -> str | None:
    """The request in `where` removed when it is a regular file of this user's or root's, only while its name still
    leads to the file judged (Dir.remove_file); None when removed or gone, else why it was left."""
    st = where.lstat(names.STOP_REQUEST)
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode) or not owned_by_me_or_root(st):
        return f"{run_dir / names.STOP_REQUEST} is no stop request of this user's: left"
    where.remove_file(names.STOP_REQUEST, (st.st_dev, st.st_ino))
    return None


def clear_at_a_done_start(run_dir: Path, environ: Mapping[str, str]) -> str | None:
    """A start by hand of a run already done (preflight's NothingToDo: no supervisor, no lock) clears the request too,
    as `status` promises ("a start by hand clears it"): a `stop` whose supervisor ended the run at its budget's end
    left one. run_dir is walked as `leave` walks it (no link followed); an automatic restart leaves the request (it
    is honoured, and the run is done anyway). What was done, in words for the start's output; None when nothing."""
    request, problem = read(run_dir)
    honoured = request is not None and _honours(request, automatic_restart(environ))
    if request is None or problem or (honoured and not request.after_end):
        return None  # honoured: the run is done, nothing to stop; an after_end one was for this start only (at_start)
    try:
        with _open_run_dir(run_dir) as where:
            if _remove_request(where, run_dir) is not None:
                return None
    except (OSError, ValueError) as e:  # PlaceRefused is a ValueError
        return f"{request.words()}: left ({printable(str(e))})"
    why = "the run is done, and it was for a start then under way: this one" if honoured else _why_cleared(request)
    return f"{request.words()}: cleared, {why}"


def automatic_restart(environ: Mapping[str, str]) -> str | None:
    """How this `minilmd run` was started when a launcher started it by itself, in words; None for any other start.
    The tmux window sets AUTO_RESTART_ENV on its restarts only; a Slurm job requeued (by itself after a preemption,
    by Slurm, by an admin) starts with SLURM_RESTART_COUNT above 0; a job as sbatch submitted it, with 0."""
    launcher = environ.get(names.AUTO_RESTART_ENV, "")
    if launcher == "tmux":
        return "the tmux launcher's automatic restart"
    if launcher:
        return f"an automatic restart ({names.AUTO_RESTART_ENV}={printable(launcher)})"
    count = environ.get(names.SLURM_RESTART_COUNT_ENV, "")
    if environ.get(names.SLURM_JOB_ENV) and count.isdigit() and int(count) > 0:
        return f"the requeue of Slurm job {printable(environ[names.SLURM_JOB_ENV])} (start {int(count) + 1})"
    return None


def honoured(run_dir: Path, environ: Mapping[str, str] = os.environ) -> StopRequest | None:
    """The request this start honours, by at_start's rule (a launcher's automatic restart, or a stop asked after this
    start began), for what reads it again later (a Slurm preemption's plan: a stop asked is not requeued); None when
    there is none, or when it is one a start by hand began after (at_start clears it; a scratch wait reads it
    before that)."""
    request, _ = read(run_dir)
    return request if request is not None and _honours(request, automatic_restart(environ)) else None


def _honours(request: StopRequest, how: str | None) -> bool:
    """The one rule of which start honours a request: one the stop was asked after (asked_after_start), and a
    launcher's automatic restart (`how`: automatic_restart's words, None for any other start) any but an after_end
    one (left at a run's end for a start then under way)."""
    return asked_after_start(request) or (how is not None and not request.after_end)


def _why_cleared(request: StopRequest) -> str:
    """Why a start that does not honour the request (_honours) clears it, in words."""
    if request.after_end:
        return "given after the run had ended, for a start then under way; this start began after it"
    return "this start is no launcher's automatic restart (by hand, or by systemd) and began after it"


def at_start(run_dir: Path, environ: MutableMapping[str, str], emit: Callable[..., None]) -> tuple[str, str] | None:
    """`minilmd stop`'s request left while no supervisor ran, at a supervisor's start, once it holds the run lock (a
    `stop` later than this finds the supervisor and signals it): a launcher's automatic restart honours it, and so
    does a start the stop came after (asked_after_start) (the supervisor then stops before any trainer: the last
    sync of what an orphan saved, then done, exit 0); any other start clears it and runs as asked. `environ` loses
    AUTO_RESTART_ENV (this start's, not the trainers'); `emit` says what is done. (the stop reason, the stopping's
    words) when the start stops; None when it runs."""
    how = automatic_restart(environ)
    environ.pop(names.AUTO_RESTART_ENV, None)
    request, problem = read(run_dir)
    if problem:
        emit("stop_request", f"{problem}: not honoured")
    if request is None:
        return None
    if not _honours(request, how):
        left = clear(run_dir)
        emit("stop_request", f"{request.words()}: cleared, {_why_cleared(request)}" + (f"; {left}" if left else ""))
        return None
    if asked_after_start(request):  # `stop` found no lock: this start had not taken it yet
        left = clear(run_dir) if request.after_end else None  # for this start only: honoured now
        emit("stop_request", f"{request.words()}: asked after this start began; stopping before any trainer"
             + (f"; {left}" if left else ""), request=str(request.path))
        return (f"stopped on request ({request.words()}, asked as this start began)",
                f"{request.words()}: asked as this start began")
    emit("stop_request", f"{request.words()}: {how} does not start the run; stopping before any trainer",
         request=str(request.path))
    return (f"stopped on request ({request.words()}; {how} does not start the run)",
            f"{request.words()}: not started by {how}")
