"""The SFT loss, in process on a tiny model: padding changes only how fast, never what is learnt.

For the same conversations in one global batch, static padding to seq_len and length bucketing give the same loss
and the same gradients (CPU fp32, <= 1e-6 relative), through the trainer's own step (Trainer.accumulate_gradients),
although bucketing trains far fewer PAD positions. The labels come from one copy of the ids on the device, shifted;
on a text corpus the loss is still the mean over every next-token prediction.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from chat_synthetic import synthetic_chat_prepared
from minilmd.config import load_config
from minilmd.trainer.loop.train import Dist, Trainer
from minilmd.trainer.model.minimind import IGNORE_INDEX
from trainer_corpus import write_config

N_CONVERSATIONS = 96  # one global batch: 8 rows x 12 micro-batches


def trainer(tmp_path, corpus, mode: str, **train) -> Trainer:
    config = write_config(tmp_path, corpus, name=mode, data={"mode": mode},
                          train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 12, "max_steps": 1, **train})
    return Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))


def gradients(t: Trainer) -> tuple[float, dict[str, torch.Tensor]]:
    loss, _ = t.accumulate_gradients(0)
    return float(loss), {n: p.grad.clone() for n, p in t.model.named_parameters()}


@pytest.fixture(scope="module")
def chat(tmp_path_factory, corpus):
    prepared, vocab = corpus
    root = tmp_path_factory.mktemp("chat")
    return synthetic_chat_prepared(root / "prepared", prepared / "tokenizer.json", vocab, n=N_CONVERSATIONS,
                                   mean_len=40.0, max_len=128), vocab


@pytest.mark.slow
def test_bucketed_and_static_padding_give_the_same_loss_and_gradients(tmp_path, chat):
    static, bucketed = trainer(tmp_path, chat, "padded"), trainer(tmp_path, chat, "bucketed")
    assert static.sampler.items_per_epoch == bucketed.sampler.items_per_epoch == N_CONVERSATIONS
    assert static.sampler.global_counts(0, 96) == bucketed.sampler.global_counts(0, 96)  # the same targets
    pad_static = static.sampler.pad_share(micro_batch_size=8)
    pad_bucketed = bucketed.sampler.pad_share(micro_batch_size=8)
    assert pad_static > 0.5 and pad_bucketed < pad_static / 3, (pad_static, pad_bucketed)  # the rows differ

    loss_s, grads_s = gradients(static)
    loss_b, grads_b = gradients(bucketed)
    assert loss_s == pytest.approx(loss_b, rel=1e-6, abs=0)
    assert grads_s.keys() == grads_b.keys()
    worst = max(float((grads_s[n] - grads_b[n]).norm() / grads_s[n].norm()) for n in grads_s)
    assert worst <= 1e-6, f"gradients differ by {worst:.2e} relative"


def test_labels_are_the_ids_shifted_and_masked_from_one_copy(tmp_path, chat):
    t = trainer(tmp_path, chat, "bucketed")
    batch = t.sampler.batch(0, 96, micro=0, micro_batch_size=8)
    ids, labels, positions, _ = t.to_device(batch)  # no DPO reference
    assert positions is None  # a chat corpus: one conversation per row
    assert ids.dtype == torch.int32 and labels.dtype == torch.int64
    assert torch.equal(ids, torch.from_numpy(batch.input_ids.astype(np.int32)))
    want = np.full(batch.input_ids.shape, IGNORE_INDEX, np.int64)
    hit = batch.targets[:, 1:] == 1
    want[:, :-1][hit] = batch.input_ids[:, 1:][hit]
    assert torch.equal(labels, torch.from_numpy(want))
    assert int((labels != IGNORE_INDEX).sum()) == batch.n_targets


def test_on_text_the_loss_is_still_the_mean_over_every_prediction(tmp_path, corpus):
    t = trainer(tmp_path, corpus, "packed", seq_len=64, micro_batch_size=4, grad_accum=2)
    loss, _ = t.accumulate_gradients(0)
    with torch.no_grad():
        parts = []
        for micro in range(2):
            x = torch.from_numpy(t.sampler.batch(0, 8, micro=micro, micro_batch_size=4).input_ids.astype(np.int64))
            logits = t.model(x).logits
            parts.append(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)))
    # The previous formulation (mean per micro-batch over logits[:, :-1], equal weights here): the same number up to
    # float rounding, which is what shifting the labels instead of the logits changes.
    assert float(loss) == pytest.approx(float(sum(parts) / 2), rel=1e-6)


@pytest.mark.slow
def test_bench_sft_measures_the_three_modes_on_the_same_model(tmp_path, chat):
    from minilmd.trainer.bench.sft import compare, report

    cfg = load_config(write_config(tmp_path, chat, name="bench",
                                   train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1}))
    results, threads_line = compare(cfg, steps=3, warmup=0)
    static, bucketed, packed = results["padded"], results["bucketed"], results["packed"]
    assert all(r.steps == 3 and r.seconds > 0 for r in results.values())
    # Bucketed rows rounded up to a multiple of 8 (width_class): on these ~20-token rows that is most of its PAD.
    assert packed.pad_share == 0.0 and bucketed.pad_share < 0.3 < 0.5 < static.pad_share
    assert all(0 < r.target_tokens < r.real_tokens for r in results.values())  # user turns are context only
    text = report(results, threads_line, cfg)
    limit = (1 - bucketed.pad_share) / (1 - static.pad_share)
    assert f"limit (1 - PAD_bucketed)/(1 - PAD_static) = {limit:.2f}x" in text
    assert {line.split()[0] for line in text.splitlines()[2:6]} == {"static", "bucketed", "packed", "padfree"}
    assert results["masked"].pad_share < static.pad_share  # padding-free: whole conversations, PAD only at row ends


def test_sft_defaults_fill_only_what_the_config_leaves_out_and_epochs_are_a_budget(tmp_path, chat):
    from minilmd.config import SFT_DEFAULTS, apply_sft_defaults
    from minilmd.plan.budget import total_steps_for_budget

    cfg = load_config(write_config(tmp_path, chat, name="defaults", train={"max_steps": 0, "max_epochs": 1.5}),
                      ["train.min_lr_ratio=0.5"])
    assert cfg.is_set("train.lr") and not cfg.is_set("data.mode")  # write_config writes lr, not the mode
    assert apply_sft_defaults(cfg) == {"data.mode": SFT_DEFAULTS["data.mode"]}
    assert (cfg.data.mode, cfg.train.lr, cfg.train.min_lr_ratio) == ("bucketed", 3e-3, 0.5)
    assert total_steps_for_budget(cfg, 96, 96) == 2  # ceil(1.5 x 96 rows / 96 rows per step)
    cfg.train.max_steps = 1
    assert total_steps_for_budget(cfg, 96, 96) == 1  # several budgets: whichever ends first
