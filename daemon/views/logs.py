"""`minilmd logs`: the supervisor's log and the current attempt's trainer output of a run directory, once or
followed (`-f`).

The run directory is the one daemon/views/runarg.py judged, held open for as long as it is followed: its logs and
state.json are read through that descriptor and logs/ through its own, opened in it without following a link, never
by a path again (_Logs), so neither a directory put at the run's path nor a link put at logs/ meanwhile is what is
shown under its name. Each log is opened as a file others may have written (a regular file of the run's owner, no
link followed, read from its end, bounded: minilmd/logread.py) and each line escaped (minilmd/untrusted.py
`printable`) and cut at LOG_LINE_SHOWN before it reaches the terminal.
"""
from __future__ import annotations

import os
import sys
import time

from minilmd import names, protocol
from minilmd.daemon.base.runstate import state_owners
from minilmd.daemon.base.seen import supervisor_seen
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.liveness import load
from minilmd.daemon.views.runarg import NOT_A_RUN, RunProblem, open_run, real_path, run_problem
from minilmd.dirfd import Dir
from minilmd.logread import new_lines, tail_lines
from minilmd.untrusted import Unreadable, clipped, listed, printable

LOG_LINE_SHOWN = 16 << 10
"""The longest log line `logs` shows (and `-f` relays) whole: a longer one (no line of ours is; one planted in
another user's run directory was relayed whole, 8 MiB) is shown cut, saying how much was left out."""


class _Logs:
    """A run's logs as `logs` reads them: through the run directory judged (runarg.open_run) and its logs/ opened in
    it once, no link followed (the supervisor makes logs/ once and never replaces it), each file a regular file of the
    run's owner (or ours) read by its name in the directory it is in, so that no path is looked up again: a link put
    at logs/ or at a log meanwhile (the run's owner may write there) never leads the reader into a third user's
    files."""

    def __init__(self, run: Dir):
        self.run, self.owner = run, state_owners(run.path, run.fd)
        self.folder: Dir | None = None

    def close(self) -> None:
        if self.folder is not None:
            self.folder.close()

    def attempts(self) -> list[str]:
        """The attempt logs' names, from logs/ itself (opened once it is there: a link there is no logs/)."""
        if self.folder is None:
            try:
                self.folder = Dir.at(self.run, names.ATTEMPT_LOGS)
            except OSError:  # none yet, a link, not a directory
                return []
        try:
            return sorted(n for n in listed(self.folder.fd) if names.is_attempt_log(n))
        except OSError:  # unreadable, more entries than untrusted.listed reads: no logs to show
            return []

    def _where(self, name: str | None) -> tuple[str, int]:
        """(the name, the descriptor of the directory it is in): the supervisor's log (name None) or an attempt's."""
        if name is None:
            return names.SUPERVISOR_LOG, self.run.fd
        assert self.folder is not None  # an attempt's name comes from attempts()
        return name, self.folder.fd

    def shown(self, name: str | None) -> str:
        return printable(self.run.path / (names.SUPERVISOR_LOG if name is None else f"{names.ATTEMPT_LOGS}/{name}"))

    def tail(self, name: str | None, n: int) -> tuple[str, int]:
        """The last n lines of a log and the offset of its end (read from at most its last MiB: logread.tail_lines);
        a file that is not one of the run's regular files is "unreadable (why)"."""
        at, dir_fd = self._where(name)
        try:
            lines, size = tail_lines(at, n, owner=self.owner, dir_fd=dir_fd)
        except Unreadable as e:
            return f"unreadable ({e.why})\n", 0
        return "".join(printable(clipped(line, LOG_LINE_SHOWN)) + "\n" for line in lines), size

    def copy_new(self, name: str | None, offset: int, out) -> int:
        at, dir_fd = self._where(name)
        try:
            lines, offset = new_lines(at, offset, owner=self.owner, dir_fd=dir_fd)
        except Unreadable:
            return offset  # said once by tail; a file that becomes one again is followed from where it was
        label = "supervisor" if name is None else name.removesuffix(".log")
        for line in lines:
            out.write(f"[{label}] {printable(clipped(line, LOG_LINE_SHOWN))}\n")
        return offset


def logs(run_dir: str | os.PathLike = ".", follow: bool = False, lines: int = 20, out=None,
         poll_s: float = 0.3) -> int:
    """The last `lines` lines of the supervisor's log and as many of the current attempt's trainer output; with
    follow, new lines of both as they come, switching to the next attempt's log when the supervisor starts one,
    until the run it followed running ends (exit 0) or Ctrl-C (EXIT_INTERRUPTED). A run already ended is said and
    followed until it starts again (the tmux launcher starts `logs -f` beside `run`). The run directory is the one
    judged (runarg.open_run), its logs and state.json read through its descriptor for as long as it is followed."""
    out = out or sys.stdout
    try:
        run = open_run(run_dir, "logs")  # a run directory, or a config file naming one
    except RunProblem as problem:
        if not (follow and problem.exit == NOT_A_RUN and problem.run_dir):
            print(problem, file=sys.stderr)
            return problem.exit
        # `logs -f` started beside `run` (the tmux launcher) may come before the run directory: wait for it
        print(f"{problem}\nwaiting for it to become a run (Ctrl-C to quit)...", file=sys.stderr, flush=True)
        awaited = problem.run_dir
        try:
            while run_problem(awaited):
                time.sleep(poll_s)
            run = open_run(real_path(awaited, "logs"), "logs")  # a link on the way that came with it: the same rule
        except KeyboardInterrupt:
            return NOT_A_RUN
        except RunProblem as late:
            print(late, file=sys.stderr)
            return late.exit
    with run:
        return _logs(run, follow, lines, out, poll_s)


def _logs(run: Dir, follow: bool, lines: int, out, poll_s: float) -> int:
    """logs of the run directory open in `run`, read through its descriptor (_Logs), named by its path."""
    logs = _Logs(run)
    try:
        return _show(logs, follow, lines, out, poll_s)
    finally:
        logs.close()


def _show(logs: _Logs, follow: bool, lines: int, out, poll_s: float) -> int:
    text, sup_off = logs.tail(None, lines)
    out.write(f"==> {logs.shown(None)} <==\n{text}")
    attempts = logs.attempts()
    current = attempts[-1] if attempts else None
    cur_off = 0
    if current:
        text, cur_off = logs.tail(current, lines)
        out.write(f"==> {logs.shown(current)} <==\n{text}")
    out.flush()
    if not follow:
        return 0
    run = logs.run
    if ended := _ended(run):
        print(f"{printable(run.path)}: {ended}: following its logs until it starts again (Ctrl-C to quit)",
              file=sys.stderr, flush=True)
    try:
        while True:
            ended_before = _ended(run)  # before the last lines: an end's own lines are copied below
            sup_off = logs.copy_new(None, sup_off, out)
            if current:
                cur_off = logs.copy_new(current, cur_off, out)
            attempts = logs.attempts()
            if attempts and attempts[-1] != current:
                if current:
                    cur_off = logs.copy_new(current, cur_off, out)
                current, cur_off = attempts[-1], 0
                out.write(f"==> {logs.shown(current)} (new attempt) <==\n")
            out.flush()
            if ended_before and not ended:  # it ran while followed, and has ended: nothing more will come
                print(f"{printable(run.path)}: {ended_before}", file=sys.stderr, flush=True)
                return 0
            ended = ended_before
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return protocol.EXIT_INTERRUPTED


def _ended(run: Dir) -> str:
    """"the run has ended (PHASE, exit N)" once its supervisor recorded how it ended and no longer runs; "" while
    it runs, before it starts, or after a supervisor killed (no outcome: systemd may restart it). Whether it runs is
    status's rule (daemon/base/seen.py, its run lock looked at in the kernel's table): another host's, or one that
    another pid holding its run lock leaves unjudged (a supervisor started again), is followed on."""
    raw, _ = load(run.path, run.fd)
    state = StateJson.from_dict(raw) if raw is not None else None
    if state is None or state.outcome is None:
        return ""
    seen = supervisor_seen(state, run.path, run.fd, os.fstat(run.fd).st_uid)
    if seen.alive is not False:
        return ""
    return f"the run has ended ({state.outcome.phase or state.phase}, exit {state.outcome.exit})"
