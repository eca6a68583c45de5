"""How long a trainer gets to save after SIGTERM before SIGKILL: one rule for every path that stops a trainer.

On SIGTERM the trainer saves at its next step boundary and exits: the rest of one step and one checkpoint write.
`restart.hang_timeout` is the config's own bound on that very work (while it trains, a trainer silent longer than it
is killed as hung), so every path gives the trainer that long, whoever asks it to stop:
- the supervisor's stopping phase (a stop request, a preemption, a full run.dir: daemon/ending.py);
- the orphan hunt at start (a trainer left by a killed supervisor: daemon/child/trainerwatch.py);
- `minilmd stop` of a run whose supervisor was killed (daemon/views/stop.py): the grace of the run's config copy, the
  one its supervisor would have given; the default when the copy cannot be read;
- the supervisor's own exit on a crash, or with a trainer still running (daemon/supervisor.py, daemon/ending.py).
A shorter grace on any of these paths would only lose the step a slow save (a large model, scratch on NFS) was
writing, where another path would have kept it (before: `minilmd stop` gave an orphan 120 s, the orphan hunt at most
300 s, a crashing supervisor 60 s, while a stop gives it restart.hang_timeout, 10 min by default). The wait ends as
soon as the trainer exits: a long grace costs time only for a trainer that is hung anyway.

Outside minilmd two bounds come first, and the deployment files are sized against this grace: systemd's
TimeoutStopSec (deploy/minilmd@.service: the default grace and the last sync, tests/test_save_grace.py) and, in a
Slurm job, the time limit (`--signal=B:USR1@300` warns 300 s before it; Slurm's KillWait follows its SIGTERM).
Torch-free.
"""
from __future__ import annotations

from math import ceil
from pathlib import Path

from minilmd import names
from minilmd.config import ConfigError, RestartSection, RunConfig

DEFAULT_SAVE_GRACE_S = RestartSection().hang_timeout_s
"""The grace of a config that leaves restart.hang_timeout unset (10 min)."""
STOP_WAITS_FOR_STAGING_S = 30.0
"""On stop, a staging copy or remote fetch still running is waited for this long (a stalled NFS may hold it;
daemon/ending.py)."""
LAST_SYNC_MARGIN_S = 60.0
"""What a stop leaves for the last sync at least, after the trainer's save."""
SYSTEMD_STOP_TIMEOUT_S = 15 * 60.0
"""deploy/minilmd@.service's TimeoutStopSec, the truth of this figure (tests/test_save_grace.py reads the unit and
holds the two equal): how long systemd lets a stop take before its SIGKILL."""


def save_grace(cfg: RunConfig) -> float:
    """Seconds a trainer of this run gets between SIGTERM and SIGKILL, on every path (restart.hang_timeout)."""
    return cfg.restart.hang_timeout_s


def torchrun_grace_env(cfg: RunConfig) -> dict[str, str]:
    """The environment that gives a torchrun group's ranks this grace too (names.TORCHRUN_GRACE_ENV): a stop's
    SIGTERM reaches them through torch's agent, whose own wait before SIGKILL is 30 s unless told. Whole seconds,
    rounded up: never less than the supervisor's own wait."""
    return {names.TORCHRUN_GRACE_ENV: str(ceil(save_grace(cfg)))}


def orphan_save_grace(run_dir: Path, dir_fd: int | None = None) -> float:
    """save_grace of the run's config copy, for a trainer whose supervisor is gone (`minilmd stop`): the grace that
    supervisor would have given, root's stop of a user's run included (minilmd/run_config_copy.py: the run's user's
    copy; through `dir_fd`, the run directory `stop` judged, when given); DEFAULT_SAVE_GRACE_S when it cannot be
    read."""
    from minilmd.run_config_copy import run_config_of

    try:
        return save_grace(run_config_of(run_dir, dir_fd))
    except (ConfigError, OSError, ValueError):  # ValueError: init_place.Refused (a link, a FIFO, a third user's)
        return DEFAULT_SAVE_GRACE_S


def stop_takes_s(cfg: RunConfig) -> float:
    """The longest a stop of this run may take: the trainer's save grace, a staging copy still running, the last
    sync. What a launcher's stop timeout must allow (`run --check` compares it with the unit's: daemon/preflight.py)."""
    return save_grace(cfg) + STOP_WAITS_FOR_STAGING_S + LAST_SYNC_MARGIN_S
