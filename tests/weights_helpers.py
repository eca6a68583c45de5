"""Tiny models, a tiny tokenizer and real checkpoints for the model, sample, export and checkpoint tests (in
process; test_checkpoint's kill-inside-save child process imports make_run and save_run from here)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from minilmd.config import ModelSection, RunConfig
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.model.minimind import MiniMindForCausalLM
from trainer_corpus import TINY_MODEL

TEXT = ["hello world, this is a tiny corpus", "the quick brown fox jumps over the lazy dog",
        "minilmd trains small language models", "a checkpoint is written atomically"]


def tiny_config(vocab_size: int = 320, **overrides) -> ModelSection:
    return ModelSection(**{**TINY_MODEL, "vocab_size": vocab_size, **overrides})


def tiny_model(seed: int = 0, **overrides) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    return MiniMindForCausalLM(tiny_config(**overrides))


def train_tokenizer(path: Path, vocab_size: int = 320) -> Path:
    """A byte-level BPE with MiniMind's special tokens at ids 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 20, trainer)
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert tok.get_vocab_size() <= vocab_size
    tok.save(str(path))
    return path


def save_checkpoint(root: Path, model: MiniMindForCausalLM, step: int = 1, tokenizer: Path | None = None) -> Path:
    """A real checkpoint (trainer/checkpoint/save.py) of `model` after `step` AdamW steps on random tokens."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(step):
        ids = torch.randint(0, model.config.vocab_size, (2, 16))
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    state = {"step": step, "config": {"model": dataclasses.asdict(model.config), "data": {"prepared": ""}}}
    return ckpt_io.save(root, step, model.state_dict(), optimizer.state_dict(), state, tokenizer=tokenizer)


def export_checkpoint(root: Path, seed: int) -> Path:
    """A tiny model's checkpoint of step 1 with its tokenizer, under root (ckpt/, tok.json): what the export tests
    export (tests/test_export_hostile_out.py, test_export_way_out.py: one per module)."""
    return save_checkpoint(root / "ckpt", tiny_model(seed=seed), step=1, tokenizer=train_tokenizer(root / "tok.json"))


# --- checkpoints as the trainer writes them (test_checkpoint) -----------------------------------------------------
CHECKPOINT_MODEL = {**TINY_MODEL, "vocab_size": 256, "intermediate_size": 0, "rope_theta": 1e6, "rms_norm_eps": 1e-6}
"""The model config of make_run's model, as a checkpoint records it."""


def make_run(steps: int = 3, seed: int = 0):
    """A CHECKPOINT_MODEL model and its AdamW after `steps` steps on random tokens."""
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(CHECKPOINT_MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randint(0, 256, (2, 16))
        model(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


def saved_steps(root: Path, steps: int) -> dict[int, Path]:
    """A fresh make_run model trained on one batch, a checkpoint saved in `root` after each of steps 1..steps:
    {step: its checkpoint}."""
    model, opt = make_run(0)
    x = torch.randint(0, 256, (2, 16))
    paths = {}
    for step in range(1, steps + 1):
        model(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
        paths[step] = ckpt_io.save(root, step, model.state_dict(), opt.state_dict(), trainer_state(step))
    return paths


def trainer_state(step: int, data="d" * 64, tok="t" * 64) -> dict:
    cfg = RunConfig().to_dict()
    cfg["model"] = dict(CHECKPOINT_MODEL)
    return {"step": step, "tokens_seen": step * 32, "epoch": 0, "config": cfg,
            "fingerprints": {"data": data, "tokenizer": tok}, "rng": ckpt_io.capture_rng()}


def save_run(root: Path, step: int = 3, model=None, opt=None, **kw) -> Path:
    """A checkpoint of make_run's model (or of model and opt) saved as the trainer saves it."""
    if model is None:
        model, opt = make_run(step)
    return ckpt_io.save(root, step, model.state_dict(), opt.state_dict(), trainer_state(step, **kw),
                        param_names=ckpt_io.optimizer_param_names(model, opt))


def assert_same_weights_and_optimizer(expected_dir: Path, actual_dir: Path) -> None:
    """Two checkpoints' model and optimizer tensors are bit for bit the same (a resumed run against the run
    undisturbed); names the first tensors that differ."""
    from safetensors.torch import load_file

    from minilmd import checkpoint as ck

    for name in (ck.MODEL_FILE, ck.OPTIMIZER_FILE):
        a, b = load_file(expected_dir / name), load_file(actual_dir / name)
        diff = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
        assert a.keys() == b.keys() and not diff, f"{name} differs in {diff[:5]}"
