"""Bucketed SFT under torch.compile and at its widest micro-batch, in process on a tiny model (trainer/loop/warmup.py).

- Compiled, a bucketed run of micro-batches of several widths compiles one graph (the width is marked dynamic),
  and every heartbeat interval in which a graph was compiled began with a "compiling" heartbeat: the supervisor
  never judges a compile by hang_timeout. Counted with dynamo's own counters; the backend is aot_eager, which
  traces, partitions and recompiles exactly as inductor does, without inductor's C++ build (minutes on 2 CPUs).
- Before the first optimizer step, one forward+backward at the run's widest width class with the real micro-batch
  size: an OOM comes at start, not hours in. It leaves the weights, the gradients (None), the optimizer and the RNG
  as they were.
- Bucketed widths are width classes (minilmd/corpus/analysis/stats.py), and prepare's PAD figure counts them so.
- PYTORCH_CUDA_ALLOC_CONF: expandable segments unless the user set it.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from chat_synthetic import synthetic_chat_prepared
from minilmd.config import load_config
from minilmd.trainer.loop.train import Dist, Trainer
from trainer_corpus import write_config

MICRO_BATCH = 4


@pytest.fixture(scope="module")
def chat(tmp_path_factory, corpus):
    prepared, vocab = corpus
    root = tmp_path_factory.mktemp("chat")
    return synthetic_chat_prepared(root / "prepared", prepared / "tokenizer.json", vocab, n=96, mean_len=40.0,
                                   max_len=128), vocab


def make_trainer(tmp_path, chat, name: str, **train) -> Trainer:
    config = write_config(tmp_path, chat, name=name, data={"mode": "bucketed"},
                          train={"seq_len": 128, "micro_batch_size": MICRO_BATCH, "grad_accum": 1, "max_steps": 6,
                                 "checkpoint_every": 100, **train})
    return Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))


def step_width(t: Trainer, step: int) -> int:
    return t.sampler.batch(step, t.global_batch, micro=0, micro_batch_size=MICRO_BATCH,
                           first_row=t.first_row(step)).input_ids.shape[1]


@pytest.mark.slow  # ~10 s: a real dynamo trace and its backward
def test_a_compiled_bucketed_run_compiles_one_graph_and_only_under_a_compiling_heartbeat(tmp_path, chat,
                                                                                          monkeypatch):
    # torch._dynamo here, not at the module's top: imported there, it cost every pytest worker about a CPU-second of
    # its collection, also the workers that never run this test.
    import torch._dynamo
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend="aot_eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    t = make_trainer(tmp_path, chat, "compiled", compile=True)
    assert t.compiled
    widths = {step_width(t, s) for s in range(t.total_steps)}
    assert len(widths) >= 3, widths  # the run meets several widths

    beats: list[tuple[int, str, int]] = []  # (step, phase, graphs compiled so far) of each heartbeat written
    real_beat = t.log.heartbeat

    def beat(step: int, phase: str = "", force: bool = False) -> bool:
        written = real_beat(step, phase, force)
        if written:
            beats.append((step, phase, counters["stats"]["unique_graphs"]))
        return written

    t.log.heartbeat = beat  # type: ignore[method-assign]
    assert t.train() == 0 and t.step == 6
    beats.append((t.step, "end", counters["stats"]["unique_graphs"]))
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1, f"{graphs} graphs for widths {sorted(widths)}"  # the width is dynamic: one graph
    for (step, phase, before), (_, _, after) in zip(beats, beats[1:], strict=False):
        assert after == before or phase == "compiling", f"a graph compiled after the heartbeat {step} {phase!r}"
    assert sum(1 for _, phase, _ in beats if phase == "compiling") >= 1


@pytest.mark.slow
def test_the_first_forward_is_the_widest_micro_batch_and_leaves_no_trace(tmp_path, chat):
    t = make_trainer(tmp_path, chat, "widest")
    widest = t.sampler.widest()
    assert widest == 128 > step_width(t, 0)  # this seed's first step is narrower: the check below means something
    calls: list[tuple[str, tuple[int, ...]]] = []
    model = t.step_setup.forward

    def forward(batch):
        calls.append(("forward", tuple(batch.ids.shape)))
        torch.rand(1)  # as LoRA dropout would: the warm-up must put the RNG back
        return model(batch)

    real_step = t.optimizer.step

    def optimizer_step(*args, **kwargs):
        calls.append(("step", ()))
        return real_step(*args, **kwargs)

    t.step_setup = dataclasses.replace(t.step_setup, forward=forward)
    t.optimizer.step = optimizer_step  # type: ignore[method-assign]
    weights = {k: v.clone() for k, v in t.model.state_dict().items()}
    rng = torch.get_rng_state()
    from minilmd.trainer.loop import warmup

    watch = warmup.WidthWatch(t.sampler, t.compiled, MICRO_BATCH, t.global_batch)
    warmup.widest_micro_batch(t.step_setup, t.sampler, watch, t.log.heartbeat, t.step, t.total_steps)
    assert calls == [("forward", (MICRO_BATCH, widest))]  # the real micro-batch size, the widest width class
    assert all(p.grad is None for p in t.model.parameters()) and not t.optimizer.state
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, weights[k]) for k, v in t.model.state_dict().items())

    calls.clear()
    t.total_steps = t.reports.total_steps = 1  # the budget as the loop and its metrics lines see it
    assert t.train() == 0
    assert calls[0] == ("forward", (MICRO_BATCH, widest)) and calls.index(("step", ())) > 0  # before any step


@pytest.mark.slow
def test_the_warm_up_changes_nothing_the_run_learns(tmp_path, chat, monkeypatch):
    from minilmd.trainer.loop import warmup

    warmed = make_trainer(tmp_path, chat, "warmed", max_steps=3)
    assert warmed.train() == 0
    monkeypatch.setattr(warmup, "widest_micro_batch", lambda *args: None)
    cold = make_trainer(tmp_path, chat, "cold", max_steps=3)
    assert cold.train() == 0
    for (name, a), (_, b) in zip(warmed.model.state_dict().items(), cold.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_bucketed_widths_are_width_classes_and_prepare_counts_their_pad(tmp_path, chat):
    from minilmd.corpus.analysis.stats import bucketed_pad_share, width_class, width_step

    assert [width_step(n) for n in (64, 128, 256, 512, 768, 2048)] == [8, 8, 8, 16, 24, 64]  # <= 32 classes
    t = make_trainer(tmp_path, chat, "classes")
    seen = {step_width(t, s) for s in range(40)}
    assert all(w % 8 == 0 or w == 128 for w in seen) and len(seen) <= 128 // 8
    lengths = t.sampler.docs.lengths
    # 96 conversations in buckets of 4: no one left out, so an epoch's buckets are the sorted lengths cut in 4s,
    # the very buckets prepare's figure counts.
    assert len(lengths) % MICRO_BATCH == 0
    trained = t.sampler.pad_share(n_rows=len(lengths), micro_batch_size=MICRO_BATCH)
    assert trained == pytest.approx(bucketed_pad_share(lengths, MICRO_BATCH, 128), rel=1e-12)
    unrounded = 1 - lengths.sum() / sum(int(b.max()) * b.size for b in np.sort(lengths).reshape(-1, MICRO_BATCH))
    assert trained > unrounded  # the rounding's PAD is in the figure
    assert width_class(int(lengths.max()), 128) == t.sampler.widest()


def test_expandable_segments_unless_the_user_set_the_allocator(monkeypatch):
    from minilmd.trainer.loop.warmup import cuda_alloc_conf, set_cuda_alloc_conf

    assert cuda_alloc_conf("auto", {}) == cuda_alloc_conf("cuda", {}) == "expandable_segments:True"
    assert cuda_alloc_conf("cpu", {}) is None
    assert cuda_alloc_conf("cuda", {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}) is None
    assert cuda_alloc_conf("cuda", {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}) is None
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    set_cuda_alloc_conf("auto")
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    set_cuda_alloc_conf("cuda")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.6"
