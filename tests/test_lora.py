"""LoRA ([lora] rank > 0): PEFT's math on a frozen base, only the adapters trained, held by the optimizer and
checkpointed (strictly validated against expected_adapter_shapes), the base's fingerprint checked at every start,
and a killed run resumed bit for bit. The PEFT round trip is tests/test_lora_export.py."""
from __future__ import annotations

import hashlib
import math
import signal

import pytest
import torch
from safetensors.torch import load_file

from in_process import train_in_process
from minilmd import checkpoint
from minilmd.config import ConfigError, LoraSection, config_from_dict, load_config
from minilmd.model_shapes import expected_adapter_shapes, expected_state_shapes
from minilmd.names import FAULT_ENV, MODEL_FILE, OPTIMIZER_FILE
from minilmd.protocol import EXIT_DONE
from minilmd.trainer.loop.train import Dist, Trainer
from minilmd.trainer.model.lora import (
    LoraLinear,
    adapter_state_dict,
    apply_lora,
    merged_state_dict,
    set_active,
)
from minilmd.trainer.model.minimind import MiniMindForCausalLM
from trainer_corpus import TINY_MODEL, train, write_config
from weights_helpers import save_checkpoint, tiny_config, tiny_model

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_lora_linear_is_peft_math_and_merges():
    torch.manual_seed(0)
    base = torch.nn.Linear(16, 24, bias=False)
    w = base.weight.detach().clone()
    layer = LoraLinear(base, rank=4, alpha=8.0, dropout=0.0)
    x = torch.randn(3, 16)
    assert torch.equal(layer(x), x @ w.T)  # B starts at zero: the base, exactly
    bound = 1 / math.sqrt(16)  # kaiming_uniform(a=sqrt(5)) on a (4, 16) matrix: U(-1/sqrt(16), 1/sqrt(16))
    assert layer.lora_A.weight.abs().max() <= bound and layer.lora_A.weight.std() > bound / 4
    torch.nn.init.normal_(layer.lora_B.weight)
    a, b = layer.lora_A.weight.detach(), layer.lora_B.weight.detach()
    want = x @ w.T + (x @ a.T @ b.T) * (8.0 / 4)
    assert torch.allclose(layer(x), want, atol=1e-5)
    assert torch.allclose(x @ layer.merged_weight().T, want, atol=1e-5)
    layer.active = False
    assert torch.equal(layer(x), x @ w.T)
    assert not layer.weight.requires_grad and layer.lora_A.weight.requires_grad


def test_adapter_shapes_are_the_models_and_only_adapters_train():
    cfg = tiny_config(vocab_size=64)
    model = MiniMindForCausalLM(cfg)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora = LoraSection(rank=4, targets=["q_proj", "v_proj", "down_proj"])
    n = apply_lora(model, lora)
    shapes = {k: tuple(v.shape) for k, v in adapter_state_dict(model).items()}
    assert shapes == expected_adapter_shapes(cfg, lora)
    assert set(shapes) == {f"model.layers.{i}.{m}.lora_{ab}.weight" for i in range(cfg.num_hidden_layers)
                           for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj") for ab in "AB"}
    assert n == sum(math.prod(s) for s in shapes.values())
    assert {k for k, p in model.named_parameters() if p.requires_grad} == set(shapes)
    ids = torch.randint(0, 64, (2, 12))
    before = model(ids).logits
    merged = merged_state_dict(model)
    assert set(merged) == set(base) and all(torch.equal(merged[k], base[k]) for k in base)  # B = 0
    for layer in (m for m in model.modules() if isinstance(m, LoraLinear)):
        torch.nn.init.normal_(layer.lora_B.weight, std=0.1)
    after = model(ids).logits
    assert not torch.allclose(before, after)
    plain = MiniMindForCausalLM(cfg)
    plain.load_state_dict(merged_state_dict(model), strict=True)
    assert torch.allclose(plain(ids).logits, after, atol=1e-4)
    set_active(model, False)
    assert torch.equal(model(ids).logits, before)


def test_rank_8_on_all_targets_of_minimind_3_is_the_documented_figure():
    """docs/training.md#lora and docs/formats.md: 958,464 adapter parameters against 63,912,192 (scripts/lora_size.py
    measures the checkpoint)."""
    from minilmd.config import ModelSection

    m = ModelSection()
    adapter = sum(math.prod(s) for s in expected_adapter_shapes(m, LoraSection(rank=8)).values())
    assert (adapter, sum(math.prod(s) for s in expected_state_shapes(m).values())) == (958_464, 63_912_192)


def test_lora_config_problems_are_reported_together(tmp_path):
    raw = {"run": {"name": "n", "dir": str(tmp_path / "run")}, "data": {"prepared": str(tmp_path / "p")},
           "train": {"max_steps": 1},
           "lora": {"rank": 8, "dropout": 1.0, "alpha": 0, "targets": ["q_proj", "wq", "q_proj"]}}
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    text = str(e.value)
    for fragment in ("lora.dropout = 1.0", "lora.alpha = 0", "'wq' is not a target", "named twice",
                     "init.from is empty"):
        assert fragment in text, text
    raw["lora"] = {"rank": 4, "targets": "q_proj"}
    with pytest.raises(ConfigError, match=r"lora\.targets = 'q_proj': expected a list of strings"):
        config_from_dict(raw)


def test_a_rank_above_the_target_layers_is_refused_with_the_numbers(tmp_path):
    """lora.rank above min(in, out) of a target layer adds parameters and no capacity: refused with the figures
    (user report 1: rank 100,000 passed --check and trained a 281M-parameter adapter on a 532k base). The tiny
    model's k_proj and v_proj are 32 x 64 (2 key/value heads of 16): rank 32 is their full rank."""
    def raw(rank: int, targets=None) -> dict:
        lora = {"rank": rank, **({"targets": targets} if targets else {})}
        return {"run": {"name": "n", "dir": str(tmp_path / "run")}, "data": {"prepared": str(tmp_path / "p")},
                "train": {"max_steps": 1, "seq_len": 64}, "model": {**TINY_MODEL, "vocab_size": 512},
                "init": {"from": str(tmp_path / "base")}, "lora": lora}

    assert config_from_dict(raw(32)).lora.rank == 32
    assert config_from_dict(raw(64, ["q_proj", "o_proj"])).lora.rank == 64  # 64 x 64 layers
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw(100_000))
    [problem] = e.value.problems
    adapter = sum(math.prod(s) for s in expected_adapter_shapes(raw(100_000)["model"], LoraSection(100_000)).values())
    base = sum(math.prod(s) for s in expected_state_shapes(raw(1)["model"]).values())
    assert problem.startswith("lora.rank = 100,000 is above 32, the rank of the narrowest target layer (k_proj, "
                              "v_proj: min(in, out) = 32)"), problem
    assert f"train {adapter:,} adapter parameters on a base of {base:,}" in problem and "at most 32" in problem
    with pytest.raises(ConfigError, match=r"lora\.rank = 65 is above 64"):
        config_from_dict(raw(65, ["q_proj"]))


def tree_digest(root) -> str:
    """sha256 over every file's relative path and bytes under root (the base must be read, never written)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def _file_sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_lora_run_trains_adapters_only_resumes_bit_exact_and_checks_its_base(tmp_path, corpus, capsys):
    _, vocab = corpus
    base_model = tiny_model(seed=5, vocab_size=vocab)
    base_ckpt = save_checkpoint(tmp_path / "base" / "checkpoints", base_model, step=2)
    base_digest = tree_digest(base_ckpt.parent)
    lora = {"rank": 4, "alpha": 8.0, "dropout": 0.1, "targets": ALL}  # dropout: the RNG must resume too
    common = {"init": {"from": str(base_ckpt.parent)}, "lora": lora,
              "train": {"max_steps": 8, "checkpoint_every": 3, "lr": 1e-2}}

    # In process, straight through: the optimizer holds the adapters and nothing else; the base is frozen.
    straight = write_config(tmp_path, corpus, name="straight", **common)
    cfg = load_config(straight)
    t = Trainer(cfg, Dist(0, 1, 0, torch.device("cpu")))
    held = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    adapters = {id(p) for k, p in t.model.named_parameters() if ".lora_" in k}
    assert held == adapters and len(adapters) == 2 * 7 * cfg.model.num_hidden_layers
    assert t.train() == EXIT_DONE
    final = cfg.checkpoint_dir / "step-00000008"
    state = checkpoint.validate(final, checkpoint.Expectation(model=cfg.model_dict(), lora=cfg.lora_dict()))
    adapter = load_file(final / MODEL_FILE)
    assert {k: tuple(v.shape) for k, v in adapter.items()} == expected_adapter_shapes(cfg.model, cfg.lora)
    full = sum(math.prod(s) for s in expected_state_shapes(cfg.model).values())
    trainable = sum(math.prod(s) for s in expected_adapter_shapes(cfg.model, cfg.lora).values())
    full_tied = sum(p.numel() for p in base_model.parameters())  # the tied head once, as the trainer counts
    # the adapters apart from the frozen base they ride on (issue 24: "training <the total> parameters")
    said = f"training {trainable:,} of {full_tied + trainable:,} parameters (LoRA) on cpu x 1"
    assert said in capsys.readouterr().out
    assert (final / MODEL_FILE).stat().st_size < 0.25 * 4 * full  # a fraction of the fp32 base
    assert state["init"]["manifest_sha256"] == _file_sha(base_ckpt / "manifest.json")
    assert any(float(v.abs().max()) > 0 for k, v in adapter.items() if "lora_B" in k)  # it did train
    assert tree_digest(base_ckpt.parent) == base_digest  # the base is read, never written

    # A full-weights expectation refuses the adapter checkpoint.
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"saved with \[lora\] alpha = 8.0"):
        checkpoint.validate(final, checkpoint.Expectation(model=cfg.model_dict()))

    # Killed between two steps after the step-6 save, resumed: the same adapters and optimizer, bit for bit.
    killed = write_config(tmp_path, corpus, name="killed", **common)
    out = train(killed, **{FAULT_ENV: "sigkill@7"})
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr
    out = train_in_process(killed)
    assert out.returncode == EXIT_DONE and "resumed from" in out.stdout, out.stdout + out.stderr
    resumed = load_config(killed).checkpoint_dir / "step-00000008"
    for name in (MODEL_FILE, OPTIMIZER_FILE):
        a, b = load_file(final / name), load_file(resumed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

    # The base moved on (its root's LATEST now names another checkpoint): resuming on it is refused.
    save_checkpoint(base_ckpt.parent, tiny_model(seed=6, vocab_size=vocab), step=4)
    with pytest.raises(checkpoint.CheckpointMismatch, match="were trained on the base .* init.from now gives"):
        Trainer(load_config(killed), Dist(0, 1, 0, torch.device("cpu")))


def test_a_missing_lora_base_is_named_not_blamed_on_the_model_or_optimizer(tmp_path, corpus):
    missing = tmp_path / "no-such-base" / "checkpoints"
    config = write_config(tmp_path, corpus, name="orphan", init={"from": str(missing)},
                          lora={"rank": 4, "alpha": 8.0, "targets": ["q_proj"]}, train={"max_steps": 2})
    with pytest.raises(ConfigError) as e:
        Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))
    assert e.value.problems == [f"init.from = '{missing}': no such file or directory (the base this LoRA run "
                                "trains its adapters on)"]
    assert "refused the config" not in str(e.value)  # issue 24: it once read as the model's or optimizer's doing
