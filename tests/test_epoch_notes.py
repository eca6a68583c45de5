"""`run --check` notes a pretraining budget of many epochs and a val split shorter than one window (user9 F11:
154.84 epochs of train and a 19-token val split at seq_len 64 went by without a word): minilmd/plan/epoch_notes.py.
Figures as tests/test_check_budget_line.py counts them."""
from __future__ import annotations

from minilmd.config import config_from_dict
from minilmd.plan.budget import planned
from minilmd.plan.epoch_notes import epoch_notes
from supervisor_helpers import cli, write_config

TEXT = {"data_format": "text", "splits": {"train": {"documents": 1_000, "tokens": 1_000_000},
                                          "val": {"documents": 10, "tokens": 10_000}}}
"""1,952 windows of 512 tokens an epoch, 30.5 steps of 64 rows; a val split of 19 windows."""


def config(tmp_path, **train):
    return config_from_dict({
        "run": {"name": "b", "dir": str(tmp_path / "run")},
        "data": {"prepared": str(tmp_path / "corpus")},
        "train": {"device": "cpu", "seq_len": 512, "micro_batch_size": 16, "grad_accum": 4, **train},
    })


def test_a_pretraining_budget_of_many_epochs_is_noted_and_one_of_two_is_not(tmp_path):
    few = config(tmp_path, max_epochs=2.0)
    assert epoch_notes(few, planned(few, TEXT), TEXT) == []
    many = config(tmp_path, max_steps=1_000)  # 64,000 rows of 1,952 an epoch
    [note] = epoch_notes(many, planned(many, TEXT), TEXT)
    assert note.startswith("the budget is 32.8 epochs of a pretraining corpus: the corpus is seen 33 times "
                           "(MiniMind pretrains 1-2 epochs)"), note
    chat = {**TEXT, "data_format": "chat"}  # SFT's many epochs are another matter (the seed's style SFT: 6)
    assert not any("epochs of a pretraining" in n for n in epoch_notes(many, planned(many, chat), chat))


def test_a_val_split_shorter_than_one_window_is_noted(tmp_path):
    cfg = config(tmp_path, max_steps=10)
    short = {**TEXT, "splits": {**TEXT["splits"], "val": {"documents": 1, "tokens": 19}}}
    [note] = epoch_notes(cfg, planned(cfg, short), short)
    assert note.startswith("the val split holds 19 tokens, shorter than one window (train.seq_len = 512): the "
                           "validation loss is one row of 19 tokens"), note
    assert "--val-fraction" in note
    assert epoch_notes(cfg, planned(cfg, TEXT), TEXT) == []
    assert epoch_notes(cfg, None, None) == []  # a corpus that does not say its size


def test_run_check_says_the_epochs_note(tmp_path, corpus):
    config_path = write_config(tmp_path, corpus, train={"max_steps": 0, "max_epochs": 100.0})
    out = cli("run", "--check", str(config_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "note: the budget is 100.0 epochs of a pretraining corpus: the corpus is seen 100 times" in out.stdout, \
        out.stdout
