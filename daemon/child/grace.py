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
TimeoutStopSec (deploy/minilmd@.service: the default grace and the last sync, tests/test_deploy.py) and, in a Slurm
job, the time limit (`--signal=B:USR1@300` warns 300 s before it; Slurm's KillWait follows its SIGTERM). Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from minilmd import names
from minilmd.config import ConfigError, RestartSection, RunConfig, load_config

DEFAULT_SAVE_GRACE_S = RestartSection().hang_timeout_s
"""The grace of a config that leaves restart.hang_timeout unset (10 min)."""


def save_grace(cfg: RunConfig) -> float:
    """Seconds a trainer of this run gets between SIGTERM and SIGKILL, on every path (restart.hang_timeout)."""
    return cfg.restart.hang_timeout_s


def orphan_save_grace(run_dir: Path) -> float:
    """save_grace of the run's config copy, for a trainer whose supervisor is gone (`minilmd stop`): the grace that
    supervisor would have given. The copy is read as the other views read it (load_config's untrusted read: bounded,
    no link followed); DEFAULT_SAVE_GRACE_S when it cannot be read."""
    try:
        return save_grace(load_config(run_dir / names.RUN_CONFIG_COPY, untrusted=True))
    except (ConfigError, OSError):
        return DEFAULT_SAVE_GRACE_S
