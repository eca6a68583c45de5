"""Tiny models, a tiny tokenizer and real checkpoints for the model, sample and export tests."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.config import ModelSection
from minilmd.trainer.model.minimind import MiniMindForCausalLM

TEXT = ["hello world, this is a tiny corpus", "the quick brown fox jumps over the lazy dog",
        "minilmd trains small language models", "a checkpoint is written atomically"]


def tiny_config(vocab_size: int = 320, **overrides) -> ModelSection:
    values = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=vocab_size, max_position_embeddings=128)
    values.update(overrides)
    return ModelSection(**values)


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
    """A real checkpoint (minilmd/checkpoint.py's save) of `model` after `step` AdamW steps on random tokens."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(step):
        ids = torch.randint(0, model.config.vocab_size, (2, 16))
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    state = {"step": step, "config": {"model": dataclasses.asdict(model.config), "data": {"prepared": ""}}}
    return ckpt_io.save(root, step, model.state_dict(), optimizer.state_dict(), state, tokenizer=tokenizer)
