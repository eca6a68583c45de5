"""The rows a checkpoint trained on have one rule (minilmd/plan/trainer_state.py), read alike by the trainer's
resume (TrainState), a resume on a grown corpus (plan/growth.py) and `run --check`'s update share: for a checkpoint
from before `rows_seen`, its step times the global batch it recorded, whatever global batch the resume runs with.
Before, {"step": 10, "global_batch": 4} resumed at global batch 8 gave 80, 0 and 40 rows in those three places.
And the step has one writer, the checkpoint writer."""
from __future__ import annotations

import json
from types import SimpleNamespace

from minilmd.plan import growth
from minilmd.plan.trainer_state import STEP, rows_seen
from minilmd.trainer.loop.parts import TrainState
from trainer_corpus import write_config

OLD = {"step": 10, "global_batch": 4}  # a checkpoint from before rows_seen: 40 rows trained


def test_the_rule():
    assert rows_seen(OLD, global_batch_now=8) == 40
    assert rows_seen({**OLD, "rows_seen": 36}, 8) == 36  # recorded wins (a resume changed the global batch)
    assert rows_seen({"step": 3}, 8) == 24  # nothing recorded but the step: the batch it resumes with
    assert rows_seen({"step": 3}) is None and rows_seen({}) is None
    assert rows_seen({"step": True, "global_batch": 4}) is None and rows_seen({"rows_seen": -1}) is None


def test_a_resume_goes_on_from_the_rows_the_checkpoint_trained():
    state = TrainState(global_batch=8)
    state.load_state_dict(OLD)
    assert (state.first_row(10), state.first_row(11)) == (40, 48)


def test_a_grown_corpus_starts_its_new_documents_after_the_epoch_the_checkpoint_was_in():
    epoch_rows = 16  # rows 40..47 are in epoch 2: the new corpus starts at epoch 3, row 48
    old = {"first_row": 0, "first_epoch": 0, "data_fingerprint": "old", "train_documents": 5, "train_tokens": 50}
    corpus = SimpleNamespace(data_fingerprint="new", earlier_versions={},
                             meta={"splits": {"train": {"documents": 9, "tokens": 90}}})
    segments = growth.resumed_segments({**OLD, "data_segments": [old]}, corpus,
                                       lambda seg: SimpleNamespace(items_per_epoch=epoch_rows))
    assert segments is not None and (segments[-1]["first_row"], segments[-1]["first_epoch"]) == (48, 3)


def test_the_update_share_counts_the_same_rows(tmp_path, corpus):
    from minilmd.config import load_config
    from minilmd.plan.update_share import base_rows

    base = tmp_path / "base" / "step-00000010"
    base.mkdir(parents=True)
    (base / "manifest.json").write_text(json.dumps({"step": 10, "files": {}}), encoding="utf-8")
    (base / "trainer_state.json").write_text(json.dumps(OLD), encoding="utf-8")
    found = base_rows(load_config(write_config(tmp_path, corpus, init={"from": str(base)})))
    assert found is not None and found[1] == 40


def test_the_step_has_one_writer():
    assert STEP not in TrainState(global_batch=8, step=5).state_dict()  # trainer/checkpoint/save.py writes it
