"""What the Slurm tests share: the run config a SlurmJob launches with, as far as its command reads it."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace


def launch_cfg(tmp_path: Path, scratch_is_default: bool = True) -> SimpleNamespace:
    """The parts of a run config SlurmJob.command reads (daemon/slurm/job.py): scratch and run directory under
    tmp_path, the corpus at /nfs/corpus, the run named "r"."""
    return SimpleNamespace(scratch_dir=tmp_path / "s", run_dir=tmp_path / "r", scratch_is_default=scratch_is_default,
                           data=SimpleNamespace(prepared="/nfs/corpus"), run=SimpleNamespace(name="r"))
