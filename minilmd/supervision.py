"""Whether this process is a trainer that a supervisor launched, and which supervisor: the one reader of
names.RUN_DIR_ENV and names.SUPERVISOR_PROCESS_ENV (tests/test_one_supervision_reader.py).

The supervisor sets both on every trainer it launches (daemon/child/process.py launch). Supervised, the trainer
leaves scratch's pruning, its claim, the remote and its threads to the supervisor, and stops once that supervisor is
gone (minilmd/supervisor_gone.py). The two come together or not at all: a run directory without a well-formed
identity would train "supervised", pruning nothing, with nobody watching it (house9 #4), and an identity without a
run directory names a supervisor that did not launch this process. Either is SupervisionRefused, which the trainer
says at its start (exit 2, protocol.EXIT_CONFIG: the environment it was started with will not change at a restart).
Torch-free; reads nothing but the environment given."""
from __future__ import annotations

import os
from dataclasses import dataclass

from minilmd.names import RUN_DIR_ENV, SUPERVISOR_PROCESS_ENV


class SupervisionRefused(ValueError):
    """One of the two variables without the other, or an identity that is not "PID START_TICKS HOST [PIDNS]"."""


@dataclass(frozen=True)
class Supervision:
    """What the supervisor told its trainer: the run directory it made (absolute, as it resolved it) and its own
    identity, by which the trainer sees it gone: its pid and start time (clock ticks since boot) on `host`, in pid
    namespace `pid_namespace` (the inode of its /proc/self/ns/pid; 0 from a supervisor that did not say)."""

    run_dir: str
    pid: int
    start_ticks: int
    host: str
    pid_namespace: int


def supervision(environ=os.environ) -> Supervision | None:
    """This process's supervision, None for a process no supervisor launched (`minilmd train` by hand, the
    supervisor itself, every other command). Raises SupervisionRefused when only one of the two variables is set
    (an empty value counts as unset), or the identity is malformed."""
    run_dir, identity = environ.get(RUN_DIR_ENV, ""), environ.get(SUPERVISOR_PROCESS_ENV, "")
    if not run_dir and not identity:
        return None
    parts = identity.split()
    numbers = parts[:2] + parts[3:]
    if not run_dir or len(parts) not in (3, 4) or not all(p.isdigit() for p in numbers):
        raise SupervisionRefused(
            f"{RUN_DIR_ENV}={run_dir!r} and {SUPERVISOR_PROCESS_ENV}={identity!r}: a supervised trainer needs both, "
            f"the second as \"PID START_TICKS HOST [PIDNS]\" (minilmd run sets them); refused, so that nothing "
            f"trains as supervised with no supervisor watching it: start it with `minilmd run`, or unset both to "
            f"train by hand (a `minilmd run` started before minilmd was upgraded sets only the first: stop it and "
            f"start it again)")
    return Supervision(run_dir, int(parts[0]), int(parts[1]), parts[2], int(parts[3]) if len(parts) == 4 else 0)
