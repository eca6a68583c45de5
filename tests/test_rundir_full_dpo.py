"""A DPO stage meets a full run.dir (a real small tmpfs holds run.dir; scratch elsewhere), with the real trainer.

Before, only the pieces were tested (tests/test_rundir_full_trainer.py: StopFlag, the reference pass's stop status).
Here the whole stage: another user's file fills run.dir at step 3 (the trainer's own process writes it, at the step
boundary, so the moment does not depend on the machine's speed); the trainer's next write there that needs room (a
heartbeat, forced at the evaluation of step 8 at the latest) is dropped, it saves at the next step boundary and exits
73. The save holds the DPO reference as computed at step 0; once the file is gone, the same command (what the
supervisor relaunches once run.dir has room, tests/test_rundir_full_restart.py) resumes from that save, reads the
reference back rather than computing it again, and ends bit for bit as an undisturbed run.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from in_process import train_in_process
from minilmd.names import DPO_REFERENCE
from minilmd.protocol import EXIT_DONE, EXIT_RUN_DIR_FULL
from trainer_corpus import child_env, read_metrics, resumed_step, run_paths, write_config

FILLS_RUN_DIR = """
import os, sys
from pathlib import Path
sys.path.insert(0, os.environ["TESTS_DIR"])
from filling import fill
from minilmd.trainer.loop import faults
_maybe_fire = faults.FaultInjector.maybe_fire
def maybe_fire(self, step):  # called at each step boundary, before the step
    if step == int(os.environ["FILL_AT_STEP"]):
        filler = Path(os.environ["FILLER"])
        fill(filler.parent, filler.name)
    return _maybe_fire(self, step)
faults.FaultInjector.maybe_fire = maybe_fire
from minilmd.cli import main
sys.argv[0] = "minilmd"
main()
"""
"""`python -m minilmd.cli` whose trainer fills FILLER's file system at the boundary before step FILL_AT_STEP + 1."""

VALUES = {"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "log_every": 1, "lr": 1e-3, "max_steps": 16,
          "checkpoint_every": 1000, "eval_every": 8}
"""test_dpo_train.py's resumed run's, but no periodic save before the end: the only one in between is the stop's."""


@pytest.mark.slow  # three short DPO runs on the small preference corpus
def test_a_dpo_stage_on_a_full_run_dir_exits_73_with_its_save_and_resumes_bit_identical(tmp_path, small_dpo_corpus,
                                                                                      small_tmpfs):
    disk = small_tmpfs("4m")
    straight = write_config(tmp_path, small_dpo_corpus, name="straight", data={"val_windows": 64}, train=VALUES)
    assert train_in_process(straight).returncode == EXIT_DONE
    full = write_config(tmp_path, small_dpo_corpus, name="full", data={"val_windows": 64}, train=VALUES,
                        run={"dir": str(disk / "run")})
    run_dir, ckpt_dir = run_paths(full)
    wrapper = tmp_path / "fills_run_dir.py"
    wrapper.write_text(FILLS_RUN_DIR)
    filler = disk / "another-job"
    first = subprocess.run([sys.executable, str(wrapper), "train", str(full)], capture_output=True, text=True,
                           timeout=600, env=child_env(TESTS_DIR=str(Path(__file__).parent), FILL_AT_STEP="3",
                                                      FILLER=str(filler)))
    assert first.returncode == EXIT_RUN_DIR_FULL, first.stdout[-3000:] + first.stderr[-3000:]
    assert "minilmd: run.dir is full (no room to write " in first.stdout, first.stdout[-3000:]
    saves = sorted(p.name for p in ckpt_dir.glob("step-*"))
    assert saves[0] == "step-00000000" and len(saves) == 2, saves  # the reference's save, and the stop's
    stopped_at = int(saves[1].removeprefix("step-"))
    assert 4 <= stopped_at <= 8, saves
    reference = (ckpt_dir / saves[0] / DPO_REFERENCE).read_bytes()
    assert (ckpt_dir / saves[1] / DPO_REFERENCE).read_bytes() == reference  # the stop's save holds it whole

    filler.unlink()  # room again
    second = train_in_process(full)  # the resume: what it computes, no process of its own needed
    assert second.returncode == EXIT_DONE, second.stdout[-3000:] + second.stderr[-3000:]
    assert resumed_step(second.stdout) == stopped_at, second.stdout[-3000:]
    assert [m["source"] for m in read_metrics(run_dir, "dpo_reference")] == ["computed", "checkpoint"]
    final = "step-00000016"
    a_dir, b_dir = run_paths(straight)[1] / final, ckpt_dir / final
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(a_dir / name), load_file(b_dir / name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}:{k} differs after the stop for a full run.dir and the resume"
    assert (b_dir / DPO_REFERENCE).read_bytes() == (a_dir / DPO_REFERENCE).read_bytes() == reference
