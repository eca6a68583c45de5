"""The pipeline soak's fault scheduler (pure: no processes, no files): which fault kinds a stage can take at this
moment, and a random pick among them. tests/test_soak_schedule.py tests it; tests/soak/pipeline.py uses it."""
from __future__ import annotations

import random
from dataclasses import dataclass

TRAINER_KINDS = ("trainer_sigkill", "trainer_sigbus", "trainer_hang", "trainer_oom_kill")
"""Faults to a running trainer: SIGKILL, SIGBUS, SIGSTOP (a hang: its heartbeat stops), a memory cgroup limit
that makes the kernel OOM-kill it."""
OUTAGE_KINDS = ("init_source_unreachable", "probe_unreachable")
"""A stage's init.from source or eval.probe corpus made unreachable (FUSE EIO, or renamed away), then its trainer
killed so that the restart meets the outage."""
REMOTE_KINDS = ("remote_eio", "remote_stall")
"""The stage's own run.remote failing (EIO) or stalling for a few seconds."""
SUPERVISOR_KINDS = ("supervisor_sigkill", "predecessor_sigkill")
"""SIGKILL of a stage's supervisor (restarted as systemd would); predecessor_sigkill: of a stage whose successor
waits for it in waiting_init."""
INJECTED = TRAINER_KINDS + OUTAGE_KINDS + REMOTE_KINDS + SUPERVISOR_KINDS
OBSERVED = ("slow_exit", "planned_hang", "planned_oom", "planned_exception", "planned_sigbus", "planned_sigkill")
"""Faults the soak does not pick here: slow_exit (a trainer SIGSTOPped once its heartbeat says `exiting`, longer
than restart.hang_timeout) is caught by a watcher; planned_* fire from MINILMD_FAULT inside the trainer."""


@dataclass
class StageView:
    """What the scheduler needs to know of one stage right now."""

    name: str
    phase: str  # state.json's phase ("" before the supervisor wrote it)
    trainer_alive: bool  # a trainer pid in state.json that exists
    supervisor_alive: bool
    has_init: bool  # its [init] from names an earlier stage (that has finished: it trains)
    has_probe: bool
    successor_waiting: bool  # the next stage is in waiting_init
    settled: bool  # every fault injected into it has recovered


def eligible(kind: str, stage: StageView) -> bool:
    """Whether `kind` can be injected into `stage` now (a fault that cannot happen is not counted)."""
    if not stage.settled or not stage.supervisor_alive or stage.phase in ("done", "failed"):
        return False
    training = stage.phase == "training" and stage.trainer_alive
    if kind in TRAINER_KINDS or kind in REMOTE_KINDS:
        return training
    if kind == "init_source_unreachable":
        return training and stage.has_init
    if kind == "probe_unreachable":
        return training and stage.has_probe
    if kind == "supervisor_sigkill":
        return stage.phase in ("training", "waiting_init")
    if kind == "predecessor_sigkill":
        return training and stage.successor_waiting
    raise ValueError(f"unknown fault kind {kind!r}")


def pick(kinds: list[str], stages: list[StageView], rng: random.Random,
         injected: dict[str, int] | None = None) -> tuple[str, str] | None:
    """A random (kind, stage name) among those eligible now, each kind equally likely whatever the number of
    stages that can take it, except that a kind not injected yet (`injected`: counts so far) comes first: the
    faults that a stage allows only for a while (an outage needs the SFT or LoRA stage training) are not missed by
    chance. None when nothing can be injected at this moment."""
    choices = {kind: [s.name for s in stages if eligible(kind, s)] for kind in kinds}
    open_kinds = [kind for kind in kinds if choices[kind]]
    if not open_kinds:
        return None
    fresh = [kind for kind in open_kinds if not (injected or {}).get(kind)]
    open_kinds = fresh or open_kinds
    kind = rng.choice(open_kinds)
    return kind, rng.choice(choices[kind])
