"""What the Slurm tests share: the run config a SlurmJob launches with, as far as its command reads it; a fake
`scontrol` on PATH for a real supervisor in a Slurm job."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace


def launch_cfg(tmp_path: Path, scratch_is_default: bool = True) -> SimpleNamespace:
    """The parts of a run config SlurmJob.command reads (daemon/slurm/job.py): scratch and run directory under
    tmp_path, the corpus at /nfs/corpus, the run named "r"."""
    return SimpleNamespace(scratch_dir=tmp_path / "s", run_dir=tmp_path / "r", scratch_is_default=scratch_is_default,
                           data=SimpleNamespace(prepared="/nfs/corpus"), run=SimpleNamespace(name="r"))


def fake_scontrol(tmp_path: Path, job: str) -> tuple[dict, Path]:
    """A Slurm job's environment, its `scontrol` a fake on PATH that records each call (in the file returned) and
    says the job runs."""
    from minilmd import names

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                    f"case \"$*\" in *'show job'*) echo 'JobId={job} JobState=RUNNING Restarts=0 Reason=None';; "
                    f"esac\nexit 0\n")
    fake.chmod(0o755)
    env = {names.SLURM_JOB_ENV: job, names.SLURM_RESTART_COUNT_ENV: "0", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return env, calls
