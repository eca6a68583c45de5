"""MFU's FLOPs per token against torch.utils.flop_counter over one forward + backward of a tiny full model and a
tiny LoRA model, and the train line's intervals over training time only (eval, save and compile apart)."""
from __future__ import annotations

import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from minilmd.config import LoraSection, ModelSection
from minilmd.metrics import Throughput
from minilmd.plan.mfu import flops_per_token
from minilmd.trainer.loop.components import parameter_split
from minilmd.trainer.model.lora import apply_lora
from minilmd.trainer.model.minimind import MiniMindForCausalLM

CFG = ModelSection(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=512)
B, T = 2, 64


def counted_and_estimated(lora: bool) -> tuple[float, float, float]:
    """(FLOPs per token the counter saw, flops_per_token's, the old 6 x all parameters + attention)."""
    torch.manual_seed(0)
    model = MiniMindForCausalLM(CFG)
    if lora:
        apply_lora(model, LoraSection(rank=8))
    ids = torch.randint(0, CFG.vocab_size, (B, T))
    # The math backend: SDPA as matmuls the counter sees (on the CPU the fused kernel has no counter formula);
    # it computes the whole T x T matrix, masked entries included, as the convention counts it.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids).logits.float().sum().backward()
    trainable, frozen = parameter_split(model)
    attention_dim = CFG.num_attention_heads * CFG.head_dim
    estimate = flops_per_token(trainable, frozen, CFG.num_hidden_layers, attention_dim, T)
    old = 6.0 * (trainable + frozen) + 12.0 * CFG.num_hidden_layers * attention_dim * T / 2
    return counter.get_total_flops() / (B * T), estimate, old


def test_a_full_models_flops_per_token_match_the_counter_within_half_a_percent():
    counted, estimate, _ = counted_and_estimated(lora=False)
    # The estimate counts the norms' weights (0.25 % of this tiny model) as matrices; the counter does not.
    assert 0.995 * estimate <= counted <= estimate


def test_a_lora_models_frozen_base_costs_4_flops_per_parameter_not_6():
    counted, estimate, old = counted_and_estimated(lora=True)
    # Within 3 % below: the first block's q/k/v (base and adapter A) take no input gradient, since nothing
    # below them trains; in the 768 x 8 model that is 1 block of 8 (under 1 %).
    assert 0.97 * estimate <= counted <= estimate
    assert old / counted > 1.2  # what 6 x all parameters made of it: MFU that much too high


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tok_s_covers_training_time_only_and_reports_eval_save_and_compile_apart():
    clock, synced = Clock(), []
    meter = Throughput(clock=clock, sync=lambda: synced.append(clock.now))
    with meter.apart("compile_s"):  # the compiling step: 30 s, its 1000 tokens left out
        clock.now += 30
    meter.add(1000, timed=False)
    for _ in range(4):  # four steps of 0.5 s, 1000 tokens each
        with meter.apart(None):
            clock.now += 0.5
        meter.add(1000)
    with meter.apart("eval_s"):
        clock.now += 7
    with meter.apart("checkpoint_s"):
        clock.now += 3
    tok_s, step_time, apart = meter.report()
    assert tok_s == pytest.approx(2000) and step_time == pytest.approx(0.5)
    assert apart == {"eval_s": 7.0, "checkpoint_s": 3.0, "compile_s": 30.0}
    assert len(synced) == 6  # before and after each block apart, never around an ordinary step

    meter.add(1000)
    clock.now += 0.25
    assert meter.report() == (pytest.approx(4000), pytest.approx(0.25), dict.fromkeys(apart, 0.0))


def test_an_interval_of_only_the_compiling_step_reports_that_step_compile_included():
    clock = Clock()
    meter = Throughput(clock=clock)
    with meter.apart("compile_s"):
        clock.now += 20
    meter.add(500, timed=False)
    tok_s, step_time, apart = meter.report()
    assert tok_s == pytest.approx(25) and step_time == pytest.approx(20) and apart["compile_s"] == 20


def test_a_mig_instance_gets_no_mfu_rather_than_the_whole_cards_peak():
    from minilmd.plan.mfu import peak_flops

    assert peak_flops("NVIDIA H200", "bf16") == pytest.approx(989e12)
    assert peak_flops("NVIDIA H200 MIG 1g.18gb", "bf16") is None
    assert peak_flops("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "bf16") is None


def test_the_trainer_times_apart_only_its_evaluations_saves_and_compiling_step(tmp_path, corpus, monkeypatch):
    """The loop's call sites: a block is apart (and, on CUDA, synced) only when it evaluates, saves or compiles,
    never around an ordinary step (steps never sync). torch.compile stands in for itself (a real one takes
    minutes on the CPU)."""
    from minilmd.config import load_config
    from minilmd.trainer.loop import train as train_mod
    from minilmd.trainer.loop.distributed import init_distributed
    from trainer_corpus import write_config

    kinds: list[str | None] = []

    class Recording(Throughput):
        def apart(self, kind):
            kinds.append(kind)
            return super().apart(kind)

    def fake_compile(module, **kwargs):
        def call(*args, **kw):
            return module(*args, **kw)
        call.no_sync = getattr(module, "no_sync", None)
        return call

    monkeypatch.setattr(train_mod, "Throughput", Recording)
    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = load_config(write_config(tmp_path, corpus, train={"max_steps": 6, "compile": True, "log_every": 1,
                                                            "eval_every": 3, "checkpoint_every": 4}))
    assert train_mod.Trainer(cfg, init_distributed(cfg)).train() == 0
    assert [k for k in kinds if k] == ["compile_s", "eval_s", "checkpoint_s"]  # step 1; after step 3; before 5
    lines = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = {m["step"]: m for m in lines if m["kind"] == "train"}
    assert train[1]["compile_s"] > 0 and train[4]["eval_s"] > 0 and train[5]["checkpoint_s"] > 0
    assert all(train[s][k] == 0 for s in (2, 3, 6) for k in ("eval_s", "checkpoint_s", "compile_s"))
