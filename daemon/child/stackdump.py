"""A hung trainer's Python stacks, put into its attempt log before it is killed, and an honest account of what got
there: py-spy if installed, else SIGUSR1 to the processes that registered faulthandler for it; for a process in
uninterruptible I/O, its state and kernel stack instead. Torch-free."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from minilmd import procs
from minilmd.daemon.child.process import SUPERVISOR_LINE
from minilmd.jsonlines import append_whole, open_log
from minilmd.proc_info import signal_masks
from minilmd.untrusted import Unreadable, dir_names, printable

# --- the dump -----------------------------------------------------------------------------------------

DUMP_WAIT_S = 3.0
"""After SIGUSR1, how long dump_stack waits at most for the faulthandler's dump to reach the attempt log and its
handlers to return (_wait_for_dump)."""
_DUMP_MARK = b"(most recent call first):"  # faulthandler's line above each thread's stack


def dump_stack(pid: int, log_path: Path, timeout: float = 20.0, torchrun: bool = False,
               wait_s: float = DUMP_WAIT_S, others: tuple[tuple[int, int], ...] = (),
               launch: procs.Launch | None = None) -> str:
    """Put the hung child's Python stacks into its attempt log and say what actually got there: with py-spy if
    installed, else SIGUSR1 to each process of the child's group that catches it (`minilmd train` registers its
    faulthandler for SIGUSR1, writing to stderr, which is this log; torchrun does not catch it and is left alone, its
    workers are dumped). A process that does not catch SIGUSR1 yet (still importing) would die of it, so it is not
    sent; one in uninterruptible I/O (state D, a stalled mount) runs no handler until the I/O returns, nor does one
    stopped (state T: SIGSTOP, SIGTSTP; t: a debugger), so nothing may come: the answer then says so, with the
    process state, why that state runs no handler, and where the kernel holds it. `others`: the launch's
    processes outside the child's group (torchrun's workers: each in a session of its own), (pid, start ticks): each
    signalled, or py-spy attached to it, only while `launch` (minilmd/procs.py) proves it is still that process of the
    launch; the group's members only while the child is ours and unreaped (procs.signal_group_member,
    procs.py_spy_dump_child)."""
    py_spy = shutil.which("py-spy")
    if py_spy:
        failed = ""

        def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
            # past the timeout py-spy's whole process group is killed, through procs (its one way to signal)
            return procs.run_bounded(argv, timeout, text=True, errors="replace")

        # torchrun's workers too (py-spy of the agent shows only it), each proven the launch's right before the
        # attach as a signal would be (minilmd/procs.py): a worker is not our child, its pid may be someone's by now
        targets = [(pid, None), *((p, ticks) for p, ticks in others if launch is not None)]
        for target, ticks in targets:
            try:
                out = (procs.py_spy_dump_child(py_spy, target, run) if ticks is None or launch is None
                       else launch.py_spy_dump(py_spy, target, ticks, run))
            except (OSError, subprocess.SubprocessError) as e:
                failed = f"py-spy failed: {e}"
                break
            if isinstance(out, str):
                said = f"py-spy dump --pid {target} not run: {out}"
                text = ""
            else:
                said = f"py-spy dump --pid {target} (hang detected by the supervisor)"
                text = out.stdout + out.stderr
            # py-spy names each frame's file and function, which someone else may have named with a terminal's
            # escapes: written as printable writes them, as the trainer's own output is (minilmd/terminal.py)
            if problem := _append(log_path, f"\n{SUPERVISOR_LINE}{said}\n{printable(text, lines=True)}\n"):
                failed = problem
                break
            if target == pid and (isinstance(out, str) or out.returncode != 0):
                failed = f"py-spy: {out}" if isinstance(out, str) else f"py-spy exit {out.returncode}"
                break
        if not failed:
            return "py-spy dumped the stacks into the attempt log"
        return f"{failed}; {_dump_by_sigusr1(pid, log_path, wait_s, torchrun, others, launch)}"
    return _dump_by_sigusr1(pid, log_path, wait_s, torchrun, others, launch)


def _dump_by_sigusr1(pid: int, log_path: Path, wait_s: float, torchrun: bool,
                     others: tuple[tuple[int, int], ...] = (), launch: procs.Launch | None = None) -> str:
    group = procs.group_members(pid)
    started = {p: ticks for p, ticks in others
               if p not in group and procs.process_state(p) not in (None, *procs.GONE_STATES)}
    group += list(started)
    targets = [p for p in group if procs.catches_signal(p, signal.SIGUSR1)]
    if not targets:
        who = "its torchrun workers do" if torchrun else "it does"
        return (f"no stack dump: {who} not catch SIGUSR1 yet (the faulthandler is registered when training starts; "
                f"a hang in imports or start-up comes before), so SIGUSR1 would only kill {_states(group or [pid])}")
    if problem := _append(log_path, f"\n{SUPERVISOR_LINE}hang: SIGUSR1 to pid {', '.join(map(str, targets))}: "
                                    f"their faulthandler dumps every thread's stack below\n"):
        return f"no stack dump: {problem}, so no SIGUSR1 was sent"
    start = _size(log_path)
    before = {target: _handling(target) for target in targets}  # threads that blocked SIGUSR1 before: no handler's
    for target in targets:
        if target not in started:
            procs.signal_group_member(pid, target, None, signal.SIGUSR1)
        elif launch is not None:  # outside the group: a pid that may have been recycled since the scan
            launch.signal(target, started[target], signal.SIGUSR1)
    dumped = _wait_for_dump(log_path, start, wait_s, lambda: _handlers_running(before))
    if dumped:
        threads, lines = dumped.count(_DUMP_MARK), dumped.count(b"\n")
        return f"SIGUSR1: the faulthandler dumped {threads} thread stack(s) ({lines} lines) into the attempt log"
    states = _states(targets)
    kernels = "".join(f"{SUPERVISOR_LINE}kernel stack of pid {target} (/proc/{target}/stack):\n{kernel}"
                      for target in targets if (kernel := _kernel_stack(target)))
    _append(log_path, f"{SUPERVISOR_LINE}hang: no stack dump within {wait_s:g}s of SIGUSR1; {states}\n{kernels}")
    return (f"SIGUSR1 sent but no stack dump reached the attempt log within {wait_s:g}s: {states} "
            f"({_why_no_handler(targets)})")


def _append(log_path: Path, text: str) -> str:
    """`text` appended whole to the attempt log through minilmd/jsonlines.py (the one way to append into run.dir: a
    link at its name is not written through, a FIFO not waited on); "" when it was, else why not, said."""
    try:
        fd = open_log(log_path)
    except OSError as e:
        return f"the attempt log {log_path} cannot be appended to ({e.strerror or e})"
    try:
        append_whole(fd, text.encode())
    except OSError as e:
        return f"the attempt log {log_path} cannot be appended to ({e.strerror or e})"
    finally:
        os.close(fd)
    return ""


NO_HANDLER_BECAUSE = {
    "D": "a process in uninterruptible I/O (state D, a stalled mount) runs no handler until the I/O returns",
    "T": "a stopped process (state T: SIGSTOP, SIGTSTP or Ctrl-Z) runs no handler until it gets SIGCONT",
    "t": "a process stopped by a debugger or tracer (state t) runs no handler until the tracer lets it go on",
}
"""Why a process in each state that lets no signal handler run sent no dump, by its /proc state letter."""


def _why_no_handler(pids: list[int]) -> str:
    """Why the states of `pids` let no handler run, one clause per state found (in the order of the pids); for
    others (running, sleeping), that the handler did not run in time, with no reason the state gives."""
    found = dict.fromkeys(procs.process_state(pid) or "gone" for pid in pids)
    why = [NO_HANDLER_BECAUSE[state] for state in found if state in NO_HANDLER_BECAUSE]
    return "; ".join(why) or "no state here keeps a handler from running: the dump may come late, or not at all"


def _wait_for_dump(log_path: Path, start: int, wait_s: float, running: Callable[[], bool] = lambda: False,
                   interval: float = 0.05) -> bytes:
    """What the log gained after `start` once it holds a stack, has stopped growing and no handler is `running`
    (asked before the read: a handler that had returned by then had written all it writes), or what it holds after
    wait_s (b"" without a stack). The log's quiet alone ended it before: a trainer paused within its dump for one
    poll (a loaded machine) had its dump counted short."""
    deadline = time.monotonic() + wait_s
    seen = b""
    while time.monotonic() < deadline:
        time.sleep(interval)
        busy = running()
        with open(log_path, "rb") as log:
            log.seek(start)
            now_seen = log.read(1 << 20)
        if _DUMP_MARK in now_seen and now_seen == seen and not busy:
            return now_seen
        seen = now_seen
    return seen if _DUMP_MARK in seen else b""


Handling = tuple[int, bool, frozenset[int]]
"""A target's start ticks, whether SIGUSR1 is pending in it, and the threads that block it."""


def _handling(pid: int) -> Handling | None:
    """Where SIGUSR1 stands in process `pid` (/proc/PID/task/*/status, through minilmd/proc_info.py); None when it is
    gone or cannot be read: its dump is then judged by the log's quiet alone."""
    ticks = procs.process_start_ticks(pid)
    try:
        tids = [int(name) for name in dir_names(f"/proc/{pid}/task") if name.isdigit()]
    except Unreadable:
        return None
    pending, blocked = False, set()
    for tid in tids:
        masks = signal_masks(pid, tid)
        if masks is None:  # the thread has ended since the listing
            continue
        pending |= masks.pending(signal.SIGUSR1)
        if masks.blocks(signal.SIGUSR1):
            blocked.add(tid)
    return (ticks, pending, frozenset(blocked)) if ticks is not None else None


def _handlers_running(before: dict[int, Handling | None]) -> bool:
    """Whether a target's handler may still be writing its dump: SIGUSR1 pending (not yet taken), or blocked in a
    thread that did not block it before it was sent (faulthandler's handler runs with it blocked until it returns).
    A target gone, not known, or its pid another process's now (another start time) is not waited for."""
    for pid, then in before.items():
        now = _handling(pid) if then is not None else None
        if then is None or now is None or now[0] != then[0]:
            continue
        if (now[1] and not then[1]) or now[2] - then[2]:
            return True
    return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _states(pids: list[int]) -> str:
    """"pid 12 state D (waiting in nfs_wait_on_request)" for each pid: where each one is."""
    parts = []
    for pid in pids:
        state = procs.process_state(pid)
        if state is None:
            parts.append(f"pid {pid} gone")
            continue
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        where = f" (waiting in {wchan})" if wchan and wchan != "0" else ""
        parts.append(f"pid {pid} state {state}{where}")
    return ", ".join(parts)


def _kernel_stack(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stack").read_text()
    except OSError:
        return ""
