"""A full run.dir: say so once, launch no trainer into it, stop after the last sync with exit 73 (final).

`RunState.save` and `EventLog.emit` (daemon/base/runstate.py) never raise on a full disk; they say why in their
`unwritten`. `RunDirWatch` writes state.json for the supervisor (`save()` at each transition, `tick()` every
STATE_EVERY_S) and reads those `unwritten` after each write: it says once on stdout (the journal keeps what run.dir
cannot) that run.dir is full, and once in the events that it has room again (RESTART_ROOM, a trainer's: less is
said as the few KiB it is, never "room again" before a stop for a full run.dir). A live trainer goes on until its own
writes there find it full (it then saves to scratch at the next step boundary and exits 73, trainer/loop/guards.py);
no trainer can run without its run directory (heartbeat, metrics, log), so the supervisor asks `still_full()` before
it launches one and when one has ended (room is tested: a trainer's exit 73 is not believed alone, with room, at
least RESTART_ROOM free, it is restarted), and when it is full stops after the last sync (`stop()` is the phase's
reason, `outcome()` the final message with exit 73). The reserve file (names.RUN_DIR_RESERVE) is made at start
and given up when run.dir is full: the room the final state.json and the last events need, so that `minilmd
status` says what happened.
`full_at_start()` is the one line for a run.dir already full when the supervisor starts.
A run.dir removed while the run runs (an `rm -r` of old runs, a tmp cleaner) is the same case (its writes fail with
ENOENT, fsio.dir_removed, never a traceback), said once as removed; the supervisor stops the live trainer at
once (`removed`: SIGTERM, it saves to scratch if it can), launches none, and stops after the last sync, exit 73.
Its run lock went with run.dir: a new start meanwhile is refused by the supervisor's hold on its scratch
(minilmd/scratch_hold.py), and both messages name this supervisor's pid, to wait for.
Torch-free.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from minilmd import lockfile, names, protocol
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.runstate import RunState, now
from minilmd.daemon.base.states import FINAL_PHASES, Cause
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.fsio import dir_removed, is_disk_full
from minilmd.openflags import NO_FOLLOW_NO_BLOCK
from minilmd.perms import owned_by_me
from minilmd.untrusted import size_text

STATE_EVERY_S = 1.0
"""state.json is rewritten at most this often between transitions (the trainer's progress)."""
RESERVE_BYTES = 256 * 1024
"""Size of the reserve file the supervisor keeps in run.dir and deletes when run.dir is full: room for the final
state.json and the last events, so that `minilmd status` says what happened."""


RESTART_ROOM = 1 << 20
"""The free space run.dir needs before a trainer that exited 73 (run.dir full) is restarted: less is no room
returned, and the run stays stopped for a full run.dir. A fixed floor, not the size of the last writes: what a
restarted trainer writes there first is known in kind, not in size from its last attempt (the attempt log's header
and start lines, torch's warnings, a few KiB; a heartbeat through a temp file, a block each; a metrics line of about
300 bytes and a log line per step). 1 MiB holds the start and thousands of steps' lines; the few KiB another user's
removed file may leave would be taken by the start alone, the trainer's restart (a staging check, a resume from its
save) ending in a sure exit 73 again, the loop bounded only by restart.no_progress_limit."""


ROOM_NOTED_BELOW = 4 << 20
"""`run --check` notes a run.dir whose file system has less free than this (room_note): the reserve, state.json,
events.jsonl, supervisor.log and the first lines of metrics.jsonl and the trainers' logs fit in it, with room over."""


RESERVE_OPEN = os.O_WRONLY | NO_FOLLOW_NO_BLOCK
"""How the reserve is opened (made O_EXCL when missing: Dir.open_or_make): never through a link, never blocking on a
FIFO (run.dir is held to the place rule, minilmd/place_rule.py run_dir_problem; this is the second guard: the
reserve truncates what it opens)."""


def make_reserve(run_dir: Path) -> bool:
    """Write the reserve file (real zeros: a sparse file frees nothing) in run.dir, opened as a checked descriptor
    (minilmd/dirfd.py Dir, run.dir's place rule). False when there is no room for it: a reserve cut by a full disk
    is removed, through that descriptor and only while its name still leads to the file written (Dir.remove_file;
    before, its name was unlinked by path, whatever it led to by then). An OSError when the name is a link, a FIFO,
    or anything but a regular file of one link (lockfile.problem): never written through; or when run.dir no longer
    passes its place rule (nothing written). A regular file there that is not ours (an admin's; another user's made
    while run.dir was open to others, before the chmod go-w its place rule asks for) is left as it is: True, and the
    run goes without a reserve. Neither written nor a refusal: it is not the run's to zero or remove
    (release_reserve), and no reason to crash the supervisor's start with exit 1, which every restart would meet
    again (review2 F5)."""
    try:
        where = Dir.open(run_dir, "run.dir")
    except PlaceRefused as e:
        raise OSError(errno.EPERM, str(e), str(run_dir)) from None
    with where:
        try:
            fd, _ = where.open_or_make(names.RUN_DIR_RESERVE, RESERVE_OPEN, 0o666)
        except PermissionError:
            if where.lstat(names.RUN_DIR_RESERVE) is not None:
                return True  # a file there this user may not write: another's, left as it is
            raise  # run.dir itself not writable: its own error, as before
        except OSError as e:
            if not is_disk_full(e):
                raise
            return False
        try:
            return _fill(where, fd)
        finally:
            os.close(fd)


def _fill(where: Dir, fd: int) -> bool:
    """The reserve open at `fd` in `where` checked and written whole (True), or removed when the disk is full
    (False). Another user's file there is left as it is (True)."""
    st = os.fstat(fd)
    # any owner's; one removed as it was made (no link) passes: its zeros test the room all the same
    if why := lockfile.problem(st, owner=lockfile.Whose.ANYONE):
        raise OSError(errno.EINVAL, f"{why}: never written", str(where.path / names.RUN_DIR_RESERVE))
    if not owned_by_me(st) or st.st_size >= RESERVE_BYTES:  # another's: not the run's to write
        return True
    try:
        os.ftruncate(fd, 0)
        _write_zeros(fd, RESERVE_BYTES)
    except OSError as e:
        if not is_disk_full(e):
            raise
        where.remove_file(names.RUN_DIR_RESERVE, (st.st_dev, st.st_ino))  # the half-written reserve, if named
        return False
    return True


def _write_zeros(fd: int, size: int) -> None:
    zeros = bytes(size)
    while zeros:
        zeros = zeros[os.write(fd, zeros):]


def release_reserve(run_dir: Path) -> bool:
    """Give the reserve's room to the writes that follow. True when there was one: a regular file of ours (another's
    at its name, which make_reserve left as it is, is never removed), removed as make_reserve removes a reserve cut
    by a full disk: through run.dir's checked descriptor and only while its name still leads to the file looked at
    (Dir.remove_file; before, its name was looked at and then unlinked by path, whatever it led to by then). False
    when run.dir is gone or no longer passes its place rule: nothing of the run's to free there."""
    try:
        where = Dir.open(run_dir, "run.dir")
    except (PlaceRefused, OSError):
        return False
    with where:
        st = where.lstat(names.RUN_DIR_RESERVE)
        if st is None or not stat.S_ISREG(st.st_mode) or not owned_by_me(st):
            return False
        return where.remove_file(names.RUN_DIR_RESERVE, (st.st_dev, st.st_ino))


def full_at_start(run_dir: Path, e: OSError) -> bool:
    """A run.dir full before the loop starts: one line on stdout, no traceback (the caller exits 73). False when e
    is another error."""
    if not is_disk_full(e):
        return False
    writing = f" writing {e.filename}" if e.filename else ""
    print(f"minilmd run: run.dir {run_dir} is full ({e.strerror}{writing}): not started (exit "
          f"{protocol.SUPERVISOR_RUN_DIR_FULL}, final); free space there, then start the run again", flush=True)
    return True


class RunDirWatch:
    """`cfg` the run's config, `run_dir` its resolved run.dir, `state` the RunState it writes, `events` the EventLog
    whose writes it watches. Making it makes the reserve."""

    def __init__(self, cfg, run_dir: Path, state: RunState, events):
        self.cfg = cfg
        self.run_dir = run_dir
        self.state = state
        self.events = events
        self.full: str | None = None  # why run.dir cannot be written, while it cannot
        self.stopping = False  # the trainer ended while run.dir was full: stop, exit 73
        self.short: str | None = None  # why run.dir, written again, has no room for a restarted trainer (still_full)
        self.why: str | None = None  # the full run.dir the run stops for, as stop() said it
        self.removed = False  # run.dir itself was removed while the run ran: stop now, whatever else
        self.room_since_stop = False  # room for a trainer came back while the stop for a full run.dir went on
        self.tight = False  # written again after it was full, without a trainer's room yet: "room again" still to say
        self.last_save = 0.0
        make_reserve(run_dir)  # no room for it: the run starts all the same, its last words may be lost

    def save(self) -> None:
        self.last_save = now()
        self.state.save()

    def tick(self, phase) -> None:
        """Each tick of the loop: state.json when it is due, then whether run.dir took the writes."""
        if now() - self.last_save >= STATE_EVERY_S:
            self.save()
        self.watch(phase)

    def watch(self, phase) -> None:
        """Say once that run.dir is full (on stdout: the journal keeps it), and once that it takes the writes again:
        "room again" where a trainer has room there (RESTART_ROOM free), else how little is free."""
        if phase in FINAL_PHASES:
            return  # its last words were written with the reserve's room: there is none again
        problem = self.state.unwritten or self.events.unwritten
        if problem and self.full is None and not self.run_dir.is_dir():
            self.full, self.removed = problem, True
            print(f"minilmd run: run.dir {self.run_dir} was removed while the run ran ({problem}): the trainer is "
                  f"stopped (it saves to scratch if it can), no other is started, and the run stops after its last "
                  f"sync (exit {protocol.SUPERVISOR_RUN_DIR_FULL}, final)", flush=True)
        elif problem and self.full is None:
            self.full = problem
            print(f"minilmd run: run.dir {self.run_dir} is full ({problem}): state.json, events.jsonl and "
                  f"supervisor.log are not written while it is; the trainer goes on while it can, and once it has "
                  f"ended the run stops after its last sync (exit {protocol.SUPERVISOR_RUN_DIR_FULL}, final)",
                  flush=True)
        elif self.full is not None and self.state.unwritten is None and not self.removed:
            # "room again" only where a trainer has room (RESTART_ROOM): the few KiB a trainer's exit frees take
            # state.json, and then still_full stops the run for a full run.dir; saying room first misled
            short = restart_room_short(self.run_dir)
            if short:
                self.events.emit("disk", f"run.dir {self.run_dir}: state.json and events are written again, but "
                                         f"{short}")
            self.full, self.tight = self.events.unwritten, True
            if not short:
                self._room_again()
        elif self.tight and not self.removed and not restart_room_short(self.run_dir):
            self._room_again()  # the trainer's room came back after the few KiB: said now, once

    def _room_again(self) -> None:
        self.tight = False
        self.events.emit("disk", f"run.dir {self.run_dir} has room again: state.json and events are written")
        self.room_since_stop = self.stopping  # the stop goes on: outcome says the room came back

    def still_full(self, phase, ended: Cause | None = None) -> bool:
        """Whether run.dir is full now, tested for real: state.json is written once more, and the reserve is made
        whole again where it is not (written: RESERVE_BYTES of room). A trainer that `ended` for a full run.dir
        (exit 73, saved first) is not believed alone: another user's file removed since gives the room back, and
        the trainer is restarted once RESTART_ROOM is free (restart.no_progress_limit bounds a run.dir that fills
        again at each launch). A trainer that finished needs no relaunch: False."""
        self.save()
        self.watch(phase)
        if self.full is None and not self._reserve_whole():
            self.full = f"no room for the {size_text(RESERVE_BYTES)} reserve"
        self.short = restart_room_short(self.run_dir) if self.full is None and ended == Cause.RUN_DIR_FULL else None
        return (self.full is not None or self.short is not None) and ended != Cause.DONE

    def _reserve_whole(self) -> bool:
        """The reserve made (again) when it was given up or never made. True also when its name holds something
        not ours to write (make_reserve refuses it): the state write alone then says whether there is room."""
        try:
            return make_reserve(self.run_dir)
        except OSError:
            return True

    def stop(self, what: str, error: OSError | None = None) -> str:
        """No trainer can run without its run directory (heartbeat, metrics, log): the reason to stop after the last
        sync. `error` is the write that found run.dir full, when the watch had not seen it yet."""
        if error is not None:
            self.full = self.full or f"{error.filename}: {error.strerror}"
        self.stopping = True
        self.why = self.full or self.short  # kept: a state.json written meanwhile clears `full` (watch)
        if self.removed:
            return (f"{what}: run.dir {self.run_dir} was removed ({self.why}): no new trainer; the last sync, then "
                    f"stop; start the run again only once this supervisor (pid {os.getpid()}) has ended: a start "
                    f"before is refused, since it still syncs from the run's scratch")
        return f"{what} while run.dir is full ({self.why}): no new trainer; the last sync, then stop"

    def outcome(self, sync_problem: str) -> str:
        """The run's last words after a stop for a full run.dir (exit 73); the reserve's room is given to them."""
        release_reserve(self.run_dir)  # room for the final state.json and events: status can tell it
        steps = local_checkpoint_steps(self.cfg.checkpoint_dir)
        where = f"the newest checkpoint {names.step_name(steps[-1])} is in {self.cfg.checkpoint_dir}" if steps \
            else "no checkpoint yet"
        if steps and self.cfg.run.remote:
            where += f" ({sync_problem})" if sync_problem else f" and synced to {self.cfg.run.remote}"
        if self.removed:
            return (f"stopped because run.dir {self.run_dir} was removed while the run ran: not restarted (exit "
                    f"{protocol.SUPERVISOR_RUN_DIR_FULL}, final); {where}; its state.json, events, metrics and logs "
                    f"went with it. Once this supervisor (pid {os.getpid()}) has ended (it ends now; a start while "
                    f"it lives is refused: it holds the run's scratch), start the run again to make run.dir anew and "
                    f"resume from that checkpoint, or remove scratch too to end the run")
        if self.room_since_stop:  # said in the events as it came: the stop was decided, and is not undone
            return (f"stopped because run.dir was full ({self.why}), though it has room again since (the stop was "
                    f"under way): not restarted (exit {protocol.SUPERVISOR_RUN_DIR_FULL}, final); {where}; start the "
                    f"run again")
        return (f"stopped because run.dir is full ({self.why or self.full}): not restarted (exit "
                f"{protocol.SUPERVISOR_RUN_DIR_FULL}, final); {where}; free space in {self.run_dir}, then start the "
                f"run again")

    def crashed(self, e: Exception) -> str | None:
        """A write the loop does not expect to fail (a stack dump) found the disk full: the message, said in the
        events with the reserve's room (exit 73). None for any other error."""
        if isinstance(e, OSError) and dir_removed(e, self.run_dir):  # a write the watch did not guard
            message = (f"stopped: run.dir {self.run_dir} was removed while the run ran ({e.filename or 'a file'}: "
                       f"{e.strerror}); not restarted (exit {protocol.SUPERVISOR_RUN_DIR_FULL})")
            print(f"minilmd run: {message}", flush=True)
            return message
        if not (isinstance(e, OSError) and is_disk_full(e)):
            return None
        release_reserve(self.run_dir)
        message = f"stopped: no room to write {e.filename or 'a file'} ({e.strerror}); not restarted " \
                  f"(exit {protocol.SUPERVISOR_RUN_DIR_FULL}); free space there, then start the run again"
        self.events.emit("disk", message)
        return message

    def at_exit(self) -> None:
        """Before the final state.json and exit event: a full run.dir gives them the reserve's room."""
        if self.full:
            release_reserve(self.run_dir)


def restart_room_short(run_dir: Path) -> str | None:
    """Why run.dir has no room for a restarted trainer (under RESTART_ROOM free), or None. Asked of the directory
    the supervisor has just written state.json in: a file system that does not answer would have hung that write."""
    free = _free_bytes(run_dir)
    if free is None or free >= RESTART_ROOM:
        return None
    return f"{size_text(free)} free, under the {size_text(RESTART_ROOM)} a restarted trainer needs there"


def room_note(run_dir: Path) -> str | None:
    """A `run --check` note when run.dir's file system (of its nearest existing directory: --check makes nothing)
    has less than ROOM_NOTED_BELOW free: a launch there stops with exit 73 once it is full, before training when it
    is full at once. Asked in a bounded thread: a mount that does not answer is left unsaid."""
    from minilmd.bounded import bounded_probe

    answered, free, _ = bounded_probe(_free_bytes, run_dir)
    if not answered or free is None or free >= ROOM_NOTED_BELOW:
        return None
    return (f"run.dir {run_dir}: its file system has {size_text(free)} free, under the {size_text(ROOM_NOTED_BELOW)} "
            f"the run's own files there need (state.json, events.jsonl, supervisor.log, metrics.jsonl, the "
            f"trainers' logs, a {size_text(RESERVE_BYTES)} reserve): a run whose run.dir is full stops (exit "
            f"{protocol.SUPERVISOR_RUN_DIR_FULL}, final), at once when it is full at the start; free space there, or "
            f"set run.dir on another file system")


def _free_bytes(path: Path) -> int | None:
    """The bytes free to this user in the file system of path, or of its nearest existing parent."""
    for place in (path, *path.parents):
        try:
            st = os.statvfs(place)
        except (FileNotFoundError, NotADirectoryError):
            continue
        return st.f_bavail * st.f_frsize
    return None
