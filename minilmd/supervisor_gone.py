"""A supervised trainer notices that its supervisor is gone, and stops as a SIGTERM stops it (it saves, exits 75):
nothing trains unsupervised. Before, a trainer whose supervisor was SIGKILLed trained on with nobody pruning its
scratch (/dev/shm filled: 66 -> 119 MB in a minute at a tiny model) nor syncing it, until a supervisor started again
hunted it down, and a restart that ended at once on a config error never did (user8 #2).

How: the supervisor puts its own identity in every trainer's environment (names.SUPERVISOR_PROCESS_ENV: pid, start
time, host, pid namespace; read by minilmd/supervision.py, which refuses a trainer with a run directory and no such
identity), and the trainer looks at it when the loop asks whether to stop (StopFlag.requested, at every step
boundary and DPO reference batch), at most once a second: one read of /proc/PID/stat. Not PR_SET_PDEATHSIG: the
supervisor launches torchrun or srun as often as the trainer itself, and a rank's parent is torchrun, which sets no
death signal for its ranks; a death signal fires when the parent *thread* ends, not the process; and setting it in
the child needs a preexec_fn, unsafe in the supervisor, which runs threads. The environment reaches every rank on
the supervisor's host, and each one stops by itself (the ranks agree on a stop: trainer/loop/guards.py agree); ranks
on other hosts stop with them. A `minilmd train` by hand carries no such identity, and is not affected.
Torch-free."""
from __future__ import annotations

import os
import socket
import sys
import time

from minilmd.procs import start_ticks_or_raise
from minilmd.supervision import supervision

CHECK_EVERY_S = 1.0


def pid_namespace() -> int:
    """This process's pid namespace (the inode of /proc/self/ns/pid); 0 when it cannot be read. The supervisor puts
    it beside its identity: a trainer in the same namespace watches from its first look, even when the supervisor
    has died before that look (review10e F2); one in another namespace never sees it, and does not watch."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _say(line: str) -> None:
    print(f"minilmd: note: {line}", file=sys.stderr, flush=True)


class SupervisorWatch:
    """Whether the supervisor that launched this trainer has ended (never, for a trainer without one, or one whose
    supervisor runs on another host: its ranks there learn of the stop from this host's).

    Gone means proven gone: no /proc entry, a zombie, or another process under its pid (another start time). A read
    that fails otherwise (EMFILE, ENOMEM: review10d F2) is "not known", looked at again a second later, never kept.
    The supervisor's pid namespace comes with its identity: in the same one the watch is armed from the start (a
    supervisor killed before the trainer's first look is still seen gone); in another (`apptainer exec
    --containall` on the same host) its pid means nothing here, and the watch is off, said once in the attempt log.
    Where a namespace is not known, the watch is armed once a look has found the supervisor alive (F3)."""

    def __init__(self, environ=os.environ, read=None, say=_say):
        self.pid: int | None = None
        self.ticks: int | None = None
        self.next_check = 0.0
        self.ended = False
        self.seen = False
        self.read = read
        self.say = say
        supervisor = supervision(environ)
        if supervisor is not None and supervisor.host == socket.gethostname():
            self.pid, self.ticks = supervisor.pid, supervisor.start_ticks
            theirs, ours = supervisor.pid_namespace, pid_namespace()
            if theirs and ours and theirs != ours:
                self._off()
            elif theirs and theirs == ours:
                self.seen = True  # the same namespace: its pid is its own here, armed before the first look

    def gone(self) -> bool:
        if self.pid is None or self.ended:
            return self.ended
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + CHECK_EVERY_S
            self._look()
        return self.ended

    def _look(self) -> None:
        assert self.pid is not None  # gone() looks only while armed
        try:
            ticks = start_ticks_or_raise(self.pid, self.read) if self.read else start_ticks_or_raise(self.pid)
        except (OSError, ValueError, IndexError):
            return  # not known: the next look decides
        if ticks is not None and ticks == self.ticks:
            self.seen = True
        elif self.seen:
            self.ended = True
        else:
            self._off()

    def _off(self) -> None:
        self.say(f"the supervisor that launched this trainer (pid {self.pid}) is not seen from here (another pid "
                 "namespace?): this trainer does not watch for its end")
        self.pid = None

    def why(self) -> str:
        return (f"its supervisor (pid {self.pid}) has ended: stopping as a SIGTERM would, so that nothing trains "
                "unsupervised")
