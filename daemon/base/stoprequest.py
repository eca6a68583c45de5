"""`minilmd stop`'s request, left in the run directory for the starts a launcher makes by itself.

A stop that finds no supervisor cannot signal a start that is still to come: the tmux launcher's window "run" starts
a killed supervisor again after MINILMD_TMUX_RESTART_SEC, and a Slurm job may be requeued. So `stop` leaves
`stop-request.json` in the run directory (`leave`) before it looks for the supervisor (none for a run that ended
for good, protocol.restart_may_follow: no launcher starts it by itself), and `minilmd run` reads it
once it holds the run lock (`read`): a start a launcher made by itself (`automatic_restart`: names.AUTO_RESTART_ENV,
which the tmux window sets on its restarts only, or a requeued Slurm job) honours it and stops before any trainer,
exit 0; any other start (a person's `minilmd run`, the tmux launcher or `sbatch` run by hand, systemd) removes it
(`clear`) and runs as asked. The order keeps the promise without a timing: stop writes, then looks at the lock;
run takes the lock, then reads. Either stop finds the new supervisor (and signals it), or that supervisor finds
the request.

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

    def words(self) -> str:
        """'minilmd stop at 2026-12-05 05:01:02 by uid 1000 on gpu1', for the journal and the outcome."""
        return f"minilmd stop at {fmt_time(self.time)}" + (f" by {self.by}" if self.by else "")


def leave(run_dir: Path, owner: int, judged: Identity | None = None) -> Path:
    """Write the request into run_dir (a run directory of `owner`'s): readable by its owner when root writes it.
    OSError when it cannot be written, PlaceRefused (a ValueError) when run_dir is in a place others can change, or
    when the directory the walk reaches is not `judged` ((device, inode): the one `stop` judged and read, moved
    aside since and another put in its place): never written into what stands there now."""
    body = {"time": time.time(), "uid": signal_uid(), "host": socket.gethostname(), "pid": os.getpid()}
    with Dir.open(run_dir, "run.dir", owners={owner}) as where:
        if judged is not None and where.identity != judged:
            raise PlaceRefused(f"{printable(run_dir)}: not the run directory judged a moment ago (moved or replaced "
                               f"since): nothing written there")
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
    when = body.get("time")
    uid, host = body.get("uid"), body.get("host")
    by = f"uid {uid} on {printable(host)}" if isinstance(uid, int) and isinstance(host, str) else ""
    return StopRequest(path, float(when) if isinstance(when, (int, float)) else None, by), None


def status_line(run_dir: Path, systemd_unit: str = "", dir_fd: int | None = None) -> str | None:
    """What `minilmd status` says of a request left in run_dir (it stays after the stop it was left by, until a start
    by hand): None when there is none. `systemd_unit`: the unit the run's supervisor ran as (state.json), whose
    restarts do not read the request. Judged as the run's supervisor judges it (the run directory's owner's or
    root's is honoured), not by the reader: root's `status` of a user's run called her own request not honoured.
    `dir_fd`: read's."""
    request, problem = read(run_dir, run_dir_owner(run_dir, dir_fd), dir_fd)
    if problem:
        return f"  {problem}: not honoured"
    if request is None:
        return None
    when = f"at {fmt_time(request.time)}" if request.time is not None else "(when: unreadable)"
    by = f" by {request.by}" if request.by else ""
    unit = f"; systemd's restart of {systemd_unit} does not read it" if systemd_unit else ""
    return (f"  stop requested {when}{by} (an automatic restart will not start the run: the tmux window's, a Slurm "
            f"requeue{unit}; a start by hand clears it)")


def as_json(run_dir: Path, owner: int | None = None, dir_fd: int | None = None) -> dict | None:
    """The request as `status --json` and `status --all --json` give it ("stop_request"): None when there is none;
    {"path", "time", "by"}; {"path", "problem"} for a file there that is not honoured (read's why). `owner`: the
    run's (None: the run directory's owner, as its supervisor judges the request). `dir_fd`: read's."""
    request, problem = read(run_dir, run_dir_owner(run_dir, dir_fd) if owner is None else owner, dir_fd)
    if problem:
        return {"path": str(run_dir / names.STOP_REQUEST), "problem": problem}
    if request is None:
        return None
    return {"path": str(request.path), "time": request.time, "by": request.by}


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
    if automatic_restart(environ) is not None:
        return None
    request, problem = read(run_dir)
    if request is None or problem:
        return None
    try:
        with _open_run_dir(run_dir) as where:
            if _remove_request(where, run_dir) is not None:
                return None
    except (OSError, ValueError) as e:  # PlaceRefused is a ValueError
        return f"{request.words()}: left ({printable(str(e))})"
    return f"{request.words()}: cleared, this start is no launcher's automatic restart"


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


def at_start(run_dir: Path, environ: MutableMapping[str, str], emit: Callable[..., None]) -> tuple[str, str] | None:
    """`minilmd stop`'s request left while no supervisor ran, at a supervisor's start, once it holds the run lock (a
    `stop` later than this finds the supervisor and signals it): a launcher's automatic restart honours it (the
    supervisor then stops before any trainer: the last sync of what an orphan saved, then done, exit 0), any other
    start clears it and runs as asked. `environ` loses AUTO_RESTART_ENV (this start's, not the trainers'); `emit`
    says what is done. (the stop reason, the stopping's words) when the start stops; None when it runs."""
    how = automatic_restart(environ)
    environ.pop(names.AUTO_RESTART_ENV, None)
    request, problem = read(run_dir)
    if problem:
        emit("stop_request", f"{problem}: not honoured")
    if request is None:
        return None
    if how is None:
        left = clear(run_dir)
        emit("stop_request", f"{request.words()}: cleared, this start is no launcher's automatic restart (by hand, "
                             f"or by systemd)" + (f"; {left}" if left else ""))
        return None
    emit("stop_request", f"{request.words()}: {how} does not start the run; stopping before any trainer",
         request=str(request.path))
    return (f"stopped on request ({request.words()}; {how} does not start the run)",
            f"{request.words()}: not started by {how}")
