"""One count of an epoch and of a budget (minilmd/plan/): the trainer's sampler and the figure `run --check` and
`corpus report --config` print (from meta.json, and for padding-free SFT from train's doc_lengths.npy) agree, data
mode by data mode. Issue 43: for padding-free SFT the sampler cut 1,127 rows an epoch where `run --check` counted
1,096 packed windows, from a copy of the rule that no test tied to the sampler."""
from __future__ import annotations

import pytest
import torch

from minilmd.config import load_config
from minilmd.plan.budget import planned
from minilmd.trainer.loop.train import Dist, Trainer
from trainer_corpus import write_config

TEXT_MODES = [("packed", False), ("packed", True), ("padded", False), ("bucketed", False)]
CHAT_MODES = [("bucketed", False), ("padded", False), ("packed", False), ("packed", True)]


def mode_id(mode: str, doc_mask: bool) -> str:
    return mode + ("+doc_mask" if doc_mask else "")


def assert_one_count(tmp_path, corpus, mode: str, doc_mask: bool, kind: str) -> None:
    data = {"mode": mode, "doc_mask": True} if doc_mask else {"mode": mode}
    config = write_config(tmp_path, corpus, data=data,
                          train={"seq_len": 128, "micro_batch_size": 3, "grad_accum": 2, "max_steps": 0,
                                 "max_epochs": 2})
    plan = planned(load_config(config))  # what run --check and corpus report count, before any trainer runs
    trainer = Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))
    assert plan is not None and plan.epoch is not None and plan.epoch.kind == kind
    assert (plan.epoch.rows, plan.steps) == (trainer.sampler.items_per_epoch, trainer.total_steps)
    assert plan.steps == -(-2 * plan.epoch.rows // 6) and plan.epochs == pytest.approx(plan.rows / plan.epoch.rows)


@pytest.mark.parametrize(("mode", "doc_mask"), TEXT_MODES, ids=[mode_id(*m) for m in TEXT_MODES])
def test_a_text_corpus_is_counted_as_its_sampler_cuts_it(tmp_path, corpus, mode, doc_mask):
    assert_one_count(tmp_path, corpus, mode, doc_mask, "windows" if mode == "packed" else mode)


@pytest.mark.parametrize(("mode", "doc_mask"), CHAT_MODES, ids=[mode_id(*m) for m in CHAT_MODES])
def test_a_chat_corpus_is_counted_as_its_sampler_cuts_it(tmp_path, chat_corpus, mode, doc_mask):
    """Packed with doc_mask: padding-free SFT, whole conversations packed into rows (the count reads their
    lengths); packed without: windows across conversations; bucketed: the last partial bucket left out."""
    kind = ("conversations" if doc_mask else "windows") if mode == "packed" else mode
    assert_one_count(tmp_path, chat_corpus, mode, doc_mask, kind)
