"""`run --check` says what a resume does to the learning rate: the rate of the resumed step under the schedule its
checkpoint ran by, and under the new one (minilmd/plan/resume_rate.py), with the way to go on at the old rate when
it climbs. Before (user report 9, finding 4), raising a finished run's train.max_steps 200 -> 400 said only "their
learning rate change from step 200 on", and the trainer went on at 2.6e-04 from a floor of 5e-05."""
from __future__ import annotations

import pytest

from in_process import train_in_process
from minilmd.batch_stream import TRAINED
from minilmd.config import config_from_dict
from minilmd.plan.resume_rate import rate_change
from minilmd.plan.trainer_state import Trained
from supervisor_helpers import cli
from trainer_corpus import write_config

TEXT = {"data_format": "text", "splits": {"train": {"documents": 3_000, "tokens": 400_000}}}
RECORDED = {"train": {"lr": 5e-4, "min_lr_ratio": 0.1, "warmup_steps": 0, "seq_len": 128},
            TRAINED: {"step": 200, "rows_seen": 1_600, "global_batch": 8, "total_steps": 200}}
DONE = Trained(200, 1_600, 1_600 * 128)


def config(tmp_path, **train):
    return config_from_dict({"run": {"name": "r", "dir": str(tmp_path / "run")},
                             "data": {"prepared": str(tmp_path / "corpus")},
                             "train": {"device": "cpu", "seq_len": 128, "micro_batch_size": 8, "grad_accum": 1,
                                       "lr": 5e-4, **train}})


def test_a_raised_budget_says_the_rate_before_and_after_and_how_to_keep_the_floor(tmp_path):
    line = rate_change(config(tmp_path, max_steps=400), RECORDED, DONE, TEXT)
    # lr_at(200, 200) = the floor 5e-05; lr_at(200, 400) = 5e-05 + 0.5 x 4.5e-04 = 2.75e-04
    assert line.startswith("lr at step 200: 5e-05 (its checkpoint's schedule over 200 steps) -> 0.000275 (over 400 "
                           "steps now): the cosine is recomputed over the new total, so the rate climbs back up from "
                           "its floor; to go on at 5e-05 instead, set train.lr = 5e-05 and train.min_lr_ratio = 1"), \
        line
    # following that advice: the same rate, nothing more to say
    assert rate_change(config(tmp_path, max_steps=400, lr=5e-5, min_lr_ratio=1.0), RECORDED, DONE, TEXT) == ""


def test_an_unchanged_schedule_says_nothing_and_a_lowered_rate_no_advice(tmp_path):
    assert rate_change(config(tmp_path, max_steps=200), RECORDED, DONE, TEXT) == ""
    lower = rate_change(config(tmp_path, max_steps=200, lr=1e-4), RECORDED, DONE, TEXT)
    assert lower.startswith("lr at step 200: 5e-05 (") and "-> 1e-05 (over 200 steps now)" in lower
    assert "set train.lr" not in lower
    assert rate_change(config(tmp_path, max_steps=400), {"train": {}}, DONE, TEXT) == ""  # not recorded: not said


@pytest.mark.slow  # one tiny real trainer run
def test_run_check_says_the_rate_of_the_resumed_step(tmp_path, corpus):
    path = write_config(tmp_path, corpus, name="rate", train={"max_steps": 4, "checkpoint_every": 2,
                                                              "warmup_steps": 0, "lr": 1e-3})
    first = train_in_process(path)
    assert first.returncode == 0, first.stdout + first.stderr
    check = cli("run", "--check", str(path), "--set", "train.max_steps=8")
    # lr_at(4, 4) = 1e-04 (min_lr_ratio 0.1); lr_at(4, 8) = 1e-04 + 0.5 x 9e-04 = 5.5e-04
    assert check.returncode == 0 and "note: lr at step 4: 0.0001 (its checkpoint's schedule over 4 steps) -> " \
        "0.00055 (over 8 steps now)" in check.stdout, check.stdout + check.stderr
