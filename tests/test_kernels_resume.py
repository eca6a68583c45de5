"""The kernels a run trains with, through `minilmd train` on the CPU (killed in a process of its own, the rest in the
test's): recorded in every checkpoint (trainer_state "kernels", the config's train.deterministic), kept by a resume
with model.attention = "auto", refused with the reason when a resume forces another attention kernel or flips
train.deterministic; nothing lost (trainer/model/attention_choice.py, trainer/loop/determinism.py,
minilmd/checkpoint.py)."""
from __future__ import annotations

import json

import pytest

from minilmd.checkpoint_select import find_latest
from minilmd.config import load_config
from minilmd.names import FAULT_ENV, TRAINER_STATE
from minilmd.protocol import EXIT_CONFIG, EXIT_DONE
from resume_helpers import attempt, attempt_here

pytestmark = pytest.mark.slow


def kernels_of(checkpoint) -> tuple[dict, dict]:
    state = json.loads((checkpoint / TRAINER_STATE).read_text())
    return state["kernels"], state["config"]


def test_the_undisturbed_cpu_run_records_torchs_own_attention_and_determinism(undisturbed):
    kernels, config = kernels_of(undisturbed().checkpoint)
    assert kernels["attention"] == "default" and kernels["device_type"] == "cpu"
    assert kernels["deterministic"] is True and config["train"]["deterministic"] is True
    assert config["model"]["attention"] == "auto"


def test_a_forced_kernel_is_kept_on_resume_and_a_change_is_refused(tmp_path, undisturbed):
    straight = undisturbed()
    train = {"max_steps": 8, "checkpoint_every": 2}
    forced = straight.config_like(tmp_path, "forced", model={"attention": "math"}, train=train)
    code, out = attempt(forced, **{FAULT_ENV: "sigkill@7"})
    assert code != EXIT_DONE and "attention kernel math (forced)" in out, out
    cfg = load_config(forced)
    saved = find_latest([cfg.checkpoint_dir])  # step 6, or an earlier one when a save was still being written
    assert saved is not None and kernels_of(saved)[0]["attention"] == "math"

    other = straight.config_like(tmp_path, "forced", model={"attention": "flash"}, train=train)
    code, out = attempt_here(other)
    assert code == EXIT_CONFIG, out
    assert "trained with attention kernel 'math' (forced), the run forces model.attention = 'flash'" in out

    flipped = straight.config_like(tmp_path, "forced", model={"attention": "math"},
                                   train={**train, "deterministic": False})
    code, out = attempt_here(flipped)
    assert code == EXIT_CONFIG, out
    assert "saved with train.deterministic = true, the run has false" in out
    assert saved.is_dir()  # refused, nothing moved or lost

    auto = straight.config_like(tmp_path, "forced", train=train)
    code, out = attempt_here(auto)
    assert code == EXIT_DONE, out
    assert "resumed from" in out and "attention kernel math (forced)" in out
    assert kernels_of(cfg.checkpoint_dir / "step-00000008")[0]["attention"] == "math"
