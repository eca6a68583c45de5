"""A process's identity on this host, and the one way minilmd signals a process.

Identity: a pid alone is recycled; the pid and its start time (field 22 of /proc/PID/stat, in clock ticks since boot)
together name one process, so a record or a temporary name that outlives its process (trainer.json, state.json's
supervisor, an export's temporary copy) can tell its maker from a later process with that pid; with the boot it records
too (proc_info.process_alive), from a process of a later boot that got the same pid and start time (a service started at
boot gets much the same each boot). The readers of /proc (start time, state, group, uids, environment, caught signals)
are minilmd/proc_info.py's, asked here too.

Signalling: every signal minilmd sends goes through this module (tests/test_one_way_to_signal.py lists every
os.kill, os.killpg, pidfd_send_signal, send_signal, terminate and kill call in the source and fails on one outside
it). A process is signalled only when it is proven to be the run's, never because a file (state.json, trainer.json,
the lock's body: anyone who can write the run directory writes them) names its pid:
- the run directory belongs to the caller, or the caller is root (`scope_of`: another user's run directory is
  refused, its owner named); every uid of the process is the directory's owner (root never signals a process
  of another user than the run's, whatever a file of that user names);
- the supervisor holds the flock of <run dir>/supervisor.lock (its /proc/PID/fdinfo says so, not the lock's body)
  and its environment, as it was started (/proc/PID/environ), carries MINILMD_SUPERVISOR_RUN_DIR=<this run
  directory> and MINILMD_SUPERVISOR_ID=<the id in the lock's body>: `minilmd run` executes itself again once with
  both set (`carry_supervisor_identity`), its children inherit them;
- a trainer's process carries MINILMD_RUN_DIR=<this run directory> and MINILMD_LAUNCH_ID=<the id of its launch,
  trainer.json's> and started no earlier than the trainer (`Launch`);
- a process of the supervisor's own child's group: the kernel says the leader is our child, not yet reaped
  (waitid WNOWAIT), so its pid, the group's id, names no one else's group;
- and each is signalled through a pidfd opened before these checks: a pid recycled meanwhile is never hit;
- so a record written before the machine restarted reaches no process of this boot: a pid and start time it names
  only narrow a proof, never make one; the proofs are the kernel's (a flock held now, our unreaped child) or ids
  drawn at random in this boot and carried in the process's environment (a launch id, a supervisor id; trainer.json
  of another boot names no launch at all, daemon/child/orphans.py);
- a tracer (py-spy dump: ptrace stops the process while it reads it) is attached under the same proofs, made again
  right before it attaches and checked after it returns (`Launch.py_spy_dump`, `py_spy_dump_child`);
- a Slurm job's steps (`scancel --signal`, which Slurm delivers to every task of them) only when the job is the one
  this process runs in: its own SLURM_JOB_ID, never an id read from a file;
- a command bounded in time (`run_bounded`: py-spy, dmesg, scontrol) runs in a session of its own, whose whole group
  is killed past its bound while the command is our unreaped child (subprocess's timeout= kills the command alone).
Linux only, as all of minilmd. Torch-free, standard library only.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from minilmd import names
from minilmd.perms import owner_in, signal_uid, user_words
from minilmd.proc_info import (  # noqa: F401 - here too: the readers the proofs use, asked of procs by its callers
    GONE_STATES,
    catches_signal,
    flock_holders,
    group_members,
    process_alive,
    process_environ,
    process_start_ticks,
    process_state,
    process_uids,
    start_ticks_or_raise,
    stat_fields,
)
from minilmd.untrusted import printable

# --- whose run: the caller's, or root's to act on -----------------------------------------------------------

class Refused(Exception):
    """A run directory of another user: none of its processes is the caller's to signal."""


class LinkOnTheWay(Refused):
    """A symbolic link on a run directory's path that was real when it was named: nothing is proven the run's."""


@dataclass(frozen=True)
class RunScope:
    """A run directory (resolved) and its owner, whose processes alone may be signalled for it; `dir_fd`: the run
    directory a view judged (daemon/views/runarg.py open_run), whose lock and trainer record are looked at through
    it, never through what run_dir names now (the processes' environment is compared with run_dir, by path)."""

    run_dir: Path
    owner: int
    dir_fd: int | None = field(default=None, compare=False)

    def owns(self, pid: int) -> bool:
        """Every uid of the process is the run directory's owner (kill(2) checks the real and saved ones)."""
        uids = process_uids(pid)
        return uids is not None and set(uids) == {self.owner}

    def why_not_owned(self, pid: int) -> str | None:
        uids = process_uids(pid)
        if uids is None:
            return "it has ended"
        if set(uids) != {self.owner}:
            return (f"it runs as {user_words(uids[0])}, not as the run directory's owner, "
                    f"{user_words(self.owner)}")
        return None


def scope_of(run_dir: str | os.PathLike) -> RunScope:
    """The run directory and its owner, when the caller may signal the run's processes: it is the owner, or root.
    Refused (naming the owner) for another user's run directory; OSError when it cannot be looked at. Refused too
    when a link is on the way: every caller passes the run directory's real path (the supervisor's settled run.dir,
    the views' daemon/views/runarg.py real_path), so a link there now was put there since, by whoever owns a
    directory on the way (his own run directory, swapped for a link to hers while root's `stop` of his run ran),
    and would choose whose processes are signalled."""
    resolved = _no_link_on_the_way(run_dir)
    return _scope(resolved, os.stat(resolved).st_uid, run_dir)


def scope_at(run_dir: Path, dir_fd: int, moved: str | None) -> RunScope:
    """scope_of for the run directory a view judged and holds open (`dir_fd`; run_dir its real path): its owner the
    descriptor's. Refused when `moved` says run_dir no longer names it (daemon/views/runarg.py moved): the proofs
    compare a process's environment with run_dir, which leads to another directory now."""
    if moved:
        raise Refused(f"{printable(run_dir)}: {moved}")
    return _scope(_no_link_on_the_way(run_dir), os.fstat(dir_fd).st_uid, run_dir, dir_fd)


def _no_link_on_the_way(run_dir: str | os.PathLike) -> Path:
    given = Path(os.path.abspath(run_dir))
    resolved = given.resolve()
    if resolved != given:
        raise LinkOnTheWay(f"{printable(run_dir)}: a symbolic link on the way now leads to {printable(resolved)}: the "
                           f"run directory changed since it was named; nothing signalled")
    return resolved


def _scope(resolved: Path, owner: int, run_dir: str | os.PathLike, dir_fd: int | None = None) -> RunScope:
    me = signal_uid()  # the real uid: whom this process acts for (kill(2) compares it, not the effective one)
    if me not in (0, owner):
        raise Refused(f"{run_dir}: a run directory of {user_words(owner)}, not yours, {user_words(me)}: nothing "
                      f"signalled; {user_words(owner)} stops that run (`minilmd stop {run_dir}`)")
    return RunScope(resolved, owner, dir_fd)


_LINKS_SAID: set[str] = set()
"""The run directories whose link on the way scope_or_none said already (once each, per process)."""
_links_told: dict[str, Callable[[str], None]] = {}
"""Where scope_or_none also tells what it says of a link on a run directory's path (tell_links_to), by that run
directory: the supervisor's event writer of that run."""


def tell_links_to(run_dir: str | os.PathLike, listener: Callable[[str], None] | None) -> None:
    """What scope_or_none says of a link on `run_dir`'s path also goes to `listener` (None: stderr alone): the
    supervisor gives its run's one event writer (daemon/runfiles.py), so that `status` and `logs` show it later, not
    only the terminal or journal that had the supervisor's stderr then. Kept by run directory: a writer left behind
    (a supervisor in a test process that never closed its files) is never handed another run's link."""
    key = os.path.abspath(run_dir)
    if listener is None:
        _links_told.pop(key, None)
    else:
        _links_told[key] = listener


def scope_or_none(run_dir: str | os.PathLike) -> RunScope | None:
    """scope_of for the supervisor's and the orphan hunt's own checks, None when it refuses or cannot look. A link on
    the way is said once (an admin's compat link put on a running run's path, a /data migration): from then on no
    process can be proven the run's, so the trainer's rest and its orphans are left alone, and that should not go
    unsaid: a line on stderr, and an event of the run's when a supervisor asks (tell_links_to). Another user's run
    directory (not ours, nor are we root) is the views' to say."""
    try:
        return scope_of(run_dir)
    except LinkOnTheWay as e:
        if str(run_dir) not in _LINKS_SAID:
            _LINKS_SAID.add(str(run_dir))
            said = (f"{e}: the run directory's path now has a symbolic link on it, so no process can be proven to "
                    f"be this run's (its trainer's rest, its orphans): none is signalled")
            print(said, file=sys.stderr, flush=True)  # the supervisor's log (journal, tmux window, Slurm output)
            if (tell := _links_told.get(os.path.abspath(run_dir))) is not None:
                with contextlib.suppress(OSError):  # an event that cannot be written must not end the process check
                    tell(said)
        return None
    except (Refused, OSError):
        return None


# --- the one sending place ---------------------------------------------------------------------------------------

def _against(pid: int, ticks: int | None, proof: Callable[[], str | None]) -> tuple[int | None, str | None]:
    """(the start ticks `pid` has now, None) when it still started at `ticks` (None: whichever has the pid now) and
    `proof()` finds nothing against it; else (None, why not). The one check before a process is acted on."""
    now = process_start_ticks(pid)
    if now is None or (ticks is not None and now != ticks):
        return None, "it has ended"
    return now, proof()


def _send(pid: int, ticks: int | None, sig: int, proof: Callable[[], str | None]) -> str | None:
    """Send `sig` to `pid` when it still started at `ticks` (None: whichever has the pid now) and `proof()` finds
    nothing against it, through a pidfd opened before both checks. None when sent, else why not."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "it has ended"
    except OSError:
        fd = None  # no pidfd here (a kernel before 5.3): a check and a kill, with the tiny window that leaves
    try:
        if (why := _against(pid, ticks, proof)[1]) is not None:
            return why
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return None
    except ProcessLookupError:
        return "it has ended"
    except PermissionError:
        return "not permitted"
    finally:
        if fd is not None:
            os.close(fd)


def signal_self(sig: int) -> None:
    """The calling process signals itself (the trainer's injected faults: a real SIGKILL, a real SIGBUS)."""
    os.kill(os.getpid(), sig)


# --- a trainer's processes: its launch id --------------------------------------------------------------------

@dataclass(frozen=True)
class Launch:
    """A trainer launch of a run: every process it started carries the run directory and `launch_id` in its
    environment; `leader` (the trainer, started at `leader_ticks`) when known: nothing started before it is one."""

    scope: RunScope
    launch_id: str
    leader: int | None = None
    leader_ticks: int | None = None

    def _why_not(self, pid: int, ticks: int | None) -> str | None:
        if isinstance(self.leader_ticks, int) and ticks is not None and (
                ticks < self.leader_ticks or (pid == self.leader and ticks != self.leader_ticks)):
            return "it started before this run's trainer"
        why = self.scope.why_not_owned(pid)
        if why is not None:
            return why
        env = process_environ(pid)
        if env.get(names.RUN_DIR_ENV) != str(self.scope.run_dir) or env.get(names.LAUNCH_ID_ENV) != self.launch_id:
            return "its environment does not carry this run's directory and launch id"
        return None

    def processes(self) -> list[tuple[int, int]]:
        """(pid, start ticks) of each live process of this launch, other than the caller."""
        if not self.launch_id:
            return []
        me = os.getpid()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            pid = int(entry)
            ticks = process_start_ticks(pid)
            if ticks is None or self._why_not(pid, ticks) is not None:
                continue
            if process_start_ticks(pid) == ticks:  # still the process all of the above was read from
                found.append((pid, ticks))
        return sorted(found)

    def signal(self, pid: int, ticks: int | None, sig: int) -> bool:
        """`sig` to that process of this launch, proven again at the moment of sending. Whether it was sent."""
        return bool(self.launch_id) and _send(pid, ticks, sig, lambda: self._why_not(pid, ticks)) is None

    def py_spy_dump(self, py_spy: str, pid: int, ticks: int, run: Callable[[list[str]], Ran]) -> Ran | str:
        """`py_spy dump --pid PID` given to `run` for that process of this launch (a torchrun worker: not our child,
        so its pid may be recycled since the scan), proven again right before: `run`'s answer, else why not."""
        if not self.launch_id:
            return "no launch id to prove it by"
        return _py_spy_dump(py_spy, pid, ticks, lambda: self._why_not(pid, ticks), run)


# --- the supervisor's own child and its group ----------------------------------------------------------------

def _our_unreaped_child(pid: int) -> bool:
    """The kernel's word: `pid` is a child of this process that has not been reaped (running or a zombie), so the
    pid, and the group id it is as a group leader, can name nobody else."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def signal_child_group(leader: int, sig: int) -> bool:
    """`sig` to the process group our child `leader` leads (it was started in a session of its own), while that
    child is not reaped. Whether it was sent."""
    if not _our_unreaped_child(leader):
        return False
    try:
        if os.getpgid(leader) != leader:
            return False
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_child(pid: int, sig: int) -> bool:
    """`sig` to our own child `pid` while it is not reaped (a Popen the caller started). Whether it was sent."""
    return _send(pid, None, sig, lambda: None if _our_unreaped_child(pid) else "not our unreaped child") is None


def signal_group_member(leader: int, pid: int, ticks: int | None, sig: int) -> bool:
    """`sig` to one process of our child `leader`'s group (the child itself included), proven a member at the
    moment of sending. Whether it was sent."""
    def why_not() -> str | None:
        try:
            member = os.getpgid(pid) == leader
        except ProcessLookupError:
            return "it has ended"
        return None if member and _our_unreaped_child(leader) else "not in our child's process group"

    return _send(pid, ticks, sig, why_not) is None


def wait_gone(processes: Sequence[tuple[int, int | None]], seconds: float,
              while_waiting: Callable[[], object] | None = None, *, interval: float = 0.05,
              alive: Callable[[int, int | None], bool] = process_alive) -> list[int]:
    """Up to `seconds` for each (pid, start ticks) to be gone (process_alive: a recycled pid is gone); the pids still
    alive at the end. They need not be our children (an orphan's parent died): /proc is polled, never a wait.
    `while_waiting()` is called between looks (the supervisor pings the systemd watchdog there). The one such loop:
    the supervisor's reap after SIGKILL, the orphan hunt, `minilmd stop` (`seconds` math.inf: no bound)."""
    deadline = time.monotonic() + seconds
    while True:
        left = [pid for pid, ticks in processes if alive(pid, ticks)]
        if not left or time.monotonic() >= deadline:
            return left
        if while_waiting is not None:
            while_waiting()
        time.sleep(interval)


def run_bounded(argv: list[str], timeout: float, **popen: Any) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, timeout=timeout, **popen) that ends everything the command started:
    it runs in a session, so a process group, of its own, and past `timeout` (or on any exception: Ctrl-C) that
    whole group gets SIGKILL (signal_child_group: while the command is our unreaped child, its pid names that group
    and no other), the command is reaped and the exception raised (subprocess.TimeoutExpired). subprocess.run kills
    only the command itself: a process it started (a shell's, py-spy's) lived on, holding the pipes. A process that
    left the group (setsid) is not its to end. `popen` may give stderr=subprocess.STDOUT (one stream, in stdout).
    Raises OSError when the command cannot start."""
    with subprocess.Popen(argv, **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen},
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except BaseException:
            signal_child_group(proc.pid, signal.SIGKILL)
            proc.wait()  # not communicate: a process that left the group may hold the pipes open for good
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


# --- a tracer attached: ptrace stops the process and reads its memory, so only one proven the run's -------------

Ran = TypeVar("Ran")


def _py_spy_dump(py_spy: str, pid: int, ticks: int | None, proof: Callable[[], str | None],
                 run: Callable[[list[str]], Ran]) -> Ran | str:
    """`run([py_spy, "dump", "--pid", PID])` when `pid` still started at `ticks` (None: as it is now) and `proof()`
    finds nothing against it; `run`'s answer, else why not. py-spy attaches by pid (no pidfd to give it): a process
    that is not our child can still end and its pid be taken between the proof and the attach, a window this narrows
    but cannot close; a start time that changed by the end says so, and what py-spy read is not answered."""
    now, why = _against(pid, ticks, proof)
    if why is not None:
        return why
    ran = run([py_spy, "dump", "--pid", str(pid)])
    if process_start_ticks(pid) != now:
        return "it ended during the dump: what py-spy read may be another process's, so it is not kept"
    return ran


def py_spy_dump_child(py_spy: str, pid: int, run: Callable[[list[str]], Ran]) -> Ran | str:
    """`py_spy dump --pid PID` given to `run` for our own child `pid` while it is not reaped (so the pid names no
    one else): `run`'s answer, else why not."""
    return _py_spy_dump(py_spy, pid, None, lambda: None if _our_unreaped_child(pid) else "not our unreaped child",
                        run)


# --- the Slurm job this process runs in ---------------------------------------------------------------------

def signal_own_slurm_job(job_id: str, sig_name: str, run: Callable[[list[str]], object]) -> str | None:
    """`scancel --signal=SIG_NAME JOB_ID`: the signal to every task of the job's steps (the batch step left alone),
    only when `job_id` is the job this process runs in (its environment's SLURM_JOB_ID): an id read from state.json
    or another file could name another job of this user's, which scancel would not refuse. `run` runs the command
    (it raises OSError or subprocess.SubprocessError, for the caller to handle). None when asked, else why not."""
    own = os.environ.get(names.SLURM_JOB_ENV, "")
    if not job_id or job_id != own:
        return f"Slurm job {job_id or '?'} is not the job this process runs in ({own or 'none'})"
    run(["scancel", f"--signal={sig_name}", job_id])
    return None


# --- the supervisor: it holds the run lock and carries its identity ------------------------------------------

def _flock_line_on(line: str, inode: int) -> bool:
    """A /proc/PID/fdinfo line of an flock held on `inode`: "lock:\t1: FLOCK  ADVISORY  WRITE 9565 fe:00:2150043
    0 EOF" (a waiter's line has "->" before FLOCK)."""
    parts = line.split()
    return len(parts) >= 7 and parts[0] == "lock:" and parts[2] == "FLOCK" and \
        parts[6].rsplit(":", 1)[-1] == str(inode)


def holds_flock(pid: int, lock: os.stat_result) -> bool:
    """Whether the process holds an flock on the file `lock` (its stat), through one of its own descriptors: the
    kernel's record (/proc/PID/fdinfo), not what a file says."""
    fdinfo = f"/proc/{pid}/fdinfo"
    try:
        fds = os.listdir(fdinfo)
    except OSError:
        return False
    for fd in fds:
        try:
            lines = Path(f"{fdinfo}/{fd}").read_text().splitlines()
        except OSError:
            continue
        if not any(_flock_line_on(line, lock.st_ino) for line in lines):
            continue
        try:  # the inode number in the lock line is one device's: the descriptor's file itself must be the lock
            held = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (held.st_dev, held.st_ino) == (lock.st_dev, lock.st_ino):
            return True
    return False


def _why_not_supervisor(scope: RunScope, pid: int, launch_id: str | None) -> str | None:
    why = scope.why_not_owned(pid)
    if why is not None:
        return why
    try:
        lock = os.stat(scope.run_dir / names.LOCK if scope.dir_fd is None else names.LOCK, dir_fd=scope.dir_fd,
                       follow_symlinks=False)
    except OSError as e:
        return f"the run's {names.LOCK} cannot be looked at ({e.strerror or e})"
    if not stat.S_ISREG(lock.st_mode) or not owner_in(lock, (scope.owner,)):
        return f"the run's {names.LOCK} is not a regular file of the run directory's owner"
    if not holds_flock(pid, lock):
        return f"it does not hold the run's lock ({names.LOCK})"
    env = process_environ(pid)
    if not launch_id or env.get(names.SUPERVISOR_RUN_DIR_ENV) != str(scope.run_dir) or \
            env.get(names.SUPERVISOR_ID_ENV) != launch_id:
        return ("its environment does not carry this run's directory and the supervisor id of its lock (a "
                "supervisor of an older minilmd?)")
    return None


def signal_supervisor(scope: RunScope, pid: int, ticks: int | None, launch_id: str | None, sig: int) -> str | None:
    """`sig` to the run's supervisor `pid` (started at `ticks`), proven at the moment of sending: the owner's, it
    holds the run lock, its environment carries this run directory and `launch_id` (the lock body's). None when
    sent, else why not."""
    return _send(pid, ticks, sig, lambda: _why_not_supervisor(scope, pid, launch_id))


def supervisor_id() -> str:
    """This supervisor's id as its environment carries it ("" when it carries none)."""
    return os.environ.get(names.SUPERVISOR_ID_ENV, "")


def carry_supervisor_identity(run_dir: str | os.PathLike) -> None:
    """Make this process's own environment, as /proc shows it, carry the run directory and a fresh supervisor id:
    executes this same command again with both set (same pid; /proc/PID/environ is the block exec gave, so setting
    os.environ would not show there). Returns at once when it already carries them. Call it before any thread,
    lock or open file that matters: exec ends them."""
    target = str(Path(run_dir).resolve())
    started_with = process_environ(os.getpid())
    if started_with.get(names.SUPERVISOR_RUN_DIR_ENV) == target and started_with.get(names.SUPERVISOR_ID_ENV):
        return
    if os.environ.get(names.SUPERVISOR_RUN_DIR_ENV) == target and os.environ.get(names.SUPERVISOR_ID_ENV):
        return  # set here without an exec (a test calling in): go on; `stop` cannot prove this one, and says so
    env = {**os.environ, names.SUPERVISOR_RUN_DIR_ENV: target, names.SUPERVISOR_ID_ENV: secrets.token_hex(16)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

