"""What the Slurm tests share: the run config a SlurmJob launches with, as far as its command reads it; a fake
`scontrol` on PATH for a real supervisor in a Slurm job (`fake_scontrol`; `slurm_env`, whose job line a test sets
and whose requeue it records)."""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace

from minilmd import names

FAKE_SCONTROL = """#!/bin/sh
case "$1 $2" in
  "show hostnames") echo node01 ;;
  "show job") echo "JobId=$4 $(cat "$FAKE_SLURM_JOB_FILE")" ;;
  "requeue "*) echo "requeue $2" >> "$FAKE_SLURM_CALLS"
              if [ -n "$FAKE_SLURM_STATE" ]; then cp "$FAKE_SLURM_STATE" "$FAKE_SLURM_CALLS.state"; fi ;;
esac
"""


def launch_cfg(tmp_path: Path, scratch_is_default: bool = True) -> SimpleNamespace:
    """The parts of a run config SlurmJob.command reads (daemon/slurm/job.py): scratch and run directory under
    tmp_path, the corpus at /nfs/corpus, the run named "r"."""
    return SimpleNamespace(scratch_dir=tmp_path / "s", run_dir=tmp_path / "r", scratch_is_default=scratch_is_default,
                           data=SimpleNamespace(prepared="/nfs/corpus"), run=SimpleNamespace(name="r"))


def fake_scontrol(tmp_path: Path, job: str) -> tuple[dict, Path]:
    """A Slurm job's environment, its `scontrol` a fake on PATH that records each call (in the file returned) and
    says the job runs."""
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


def slurm_env(tmp: Path, restarts: int) -> dict:
    """Job 42 on node01, its node-local TMPDIR under tmp, FAKE_SCONTROL on PATH: `show job` answers the line in
    tmp/job-line (`job_line`), `requeue` is recorded in tmp/scontrol-calls (with a copy of FAKE_SLURM_STATE's file,
    when the test sets it, as it was then)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(stat.S_IRWXU)
    (tmp / "node-tmp").mkdir(exist_ok=True)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", names.SLURM_JOB_ENV: "42", "SLURM_JOB_NODELIST": "node01",
            "SLURM_RESTART_COUNT": str(restarts), "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp / "node-tmp"),
            "FAKE_SLURM_JOB_FILE": str(tmp / "job-line"), "FAKE_SLURM_CALLS": str(tmp / "scontrol-calls"),
            "FAKE_STEP_S": "0.05"}


def job_line(tmp: Path, restarts: int, end: float, extra: str = "") -> None:
    """What the fake `scontrol show job` answers: running, requeued `restarts` times, ending at `end`; `extra`
    fields after it ("Requeue=0")."""
    (tmp / "job-line").write_text(f"JobState=RUNNING Reason=None Restarts={restarts} "
                                  f"EndTime={time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(end))} {extra}\n")


