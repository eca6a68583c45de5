"""`minilmd logs`: the supervisor's log and the current attempt's trainer output of a run directory, once or
followed (`-f`).

The run directory is the one daemon/views/runarg.py judged, held open for as long as it is followed: its logs and
state.json are read through that descriptor (Dir.inside), never by its path again, so a directory put at its path
meanwhile is never what is shown under its name. Each log is opened as a file others may have written (a regular
file, no link followed, read from its end, bounded: minilmd/fsio.py) and each line escaped (minilmd/untrusted.py
`printable`) and cut at LOG_LINE_SHOWN before it reaches the terminal.
"""
from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

from minilmd import names, protocol
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




def _attempt_logs(run_dir: Path) -> list[Path]:
    """The attempt logs of a run, from its logs/ directory itself: a link there (to another place's files) is not
    followed, as each log is opened without following one (tail_lines)."""
    folder = run_dir / names.ATTEMPT_LOGS
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
        return sorted(folder / n for n in listed(folder) if names.is_attempt_log(n))
    except OSError:  # gone meanwhile, unreadable, more entries than untrusted.listed reads: no logs to show
        return []


def _tail(path: Path, n: int) -> tuple[str, int]:
    """The last n lines of a file and the offset of its end (read from at most its last MiB, a regular file only:
    minilmd/logread.py tail_lines); a file that is not one is "unreadable (why)"."""
    try:
        lines, size = tail_lines(path, n)
    except Unreadable as e:
        return f"unreadable ({e.why})\n", 0
    return "".join(printable(clipped(line, LOG_LINE_SHOWN)) + "\n" for line in lines), size


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
    """logs of the run directory open in `run`: read in `run.inside` (through its descriptor), named by its path."""
    run_dir, inside = run.path, run.inside

    def shown(path: Path) -> str:
        return printable(run_dir / path.relative_to(inside))

    sup_path = inside / names.SUPERVISOR_LOG
    text, sup_off = _tail(sup_path, lines)
    out.write(f"==> {shown(sup_path)} <==\n{text}")
    attempts = _attempt_logs(inside)
    current = attempts[-1] if attempts else None
    cur_off = 0
    if current:
        text, cur_off = _tail(current, lines)
        out.write(f"==> {shown(current)} <==\n{text}")
    out.flush()
    if not follow:
        return 0
    if ended := _ended(run):
        print(f"{printable(run_dir)}: {ended}: following its logs until it starts again (Ctrl-C to quit)",
              file=sys.stderr, flush=True)
    try:
        while True:
            ended_before = _ended(run)  # before the last lines: an end's own lines are copied below
            sup_off = _copy_new(sup_path, sup_off, "supervisor", out)
            if current:
                cur_off = _copy_new(current, cur_off, current.stem, out)
            attempts = _attempt_logs(inside)
            if attempts and attempts[-1] != current:
                if current:
                    cur_off = _copy_new(current, cur_off, current.stem, out)
                current, cur_off = attempts[-1], 0
                out.write(f"==> {shown(current)} (new attempt) <==\n")
            out.flush()
            if ended_before and not ended:  # it ran while followed, and has ended: nothing more will come
                print(f"{printable(run_dir)}: {ended_before}", file=sys.stderr, flush=True)
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


def _copy_new(path: Path, offset: int, label: str, out) -> int:
    try:
        lines, offset = new_lines(path, offset)
    except Unreadable:
        return offset  # said once by _tail; a file that becomes one again is followed from where it was
    for line in lines:
        out.write(f"[{label}] {printable(clipped(line, LOG_LINE_SHOWN))}\n")
    return offset
