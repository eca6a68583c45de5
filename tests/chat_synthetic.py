"""Synthetic chat corpora in the prepared format (`prepare --format chat`'s layout, docs/formats.md), written
directly: for the trainer's SFT tests and for `bench sft` on the seed's length profile.

A conversation is BOS, a "user" part (mask 0), then an "assistant" reply ending in EOS (`<|im_end|>`, mask 1):
the invariants the corpus reader checks (BOS first and never a target, every target run ends with EOS, at least one
target per conversation). Lengths follow a lognormal, so that most conversations are far shorter than a long
seq_len and a few reach it (the seed's SFT corpus, section 2: static padding to 768 spent most of each row on PAD).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from minilmd.protocol import BOS_ID, EOS_ID

TEMPLATE_CONFIG = {"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                    "{% endfor %}", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}


def conversations(n: int, vocab_size: int, seed: int = 0, mean_len: float = 60.0, sigma: float = 0.8,
                  max_len: int = 256) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) of n conversations, lengths lognormal with that mean, cut at max_len."""
    rng = np.random.default_rng(seed)
    mu = np.log(mean_len) - sigma ** 2 / 2
    out = []
    for total in np.clip(rng.lognormal(mu, sigma, size=n).astype(int), 4, max_len):
        user = int(rng.integers(1, max(2, total // 2)))
        reply = int(total) - user - 2
        ids = [BOS_ID, *rng.integers(3, vocab_size, user + reply).tolist(), EOS_ID]
        out.append((ids, [0] * (1 + user) + [1] * (reply + 1)))
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_chat_prepared(root: Path, train: list, val: list, vocab_size: int, tokenizer_json: Path) -> Path:
    """A chat corpus from (ids, mask) conversations: meta.json data_format "chat" (version 2), loss_mask.bin in each
    split, tokenizer.json and tokenizer_config.json (a minimal template) beside them."""
    root = Path(root)
    files, splits = {}, {}
    for split, convs in (("train", train), ("val", val)):
        (root / split).mkdir(parents=True, exist_ok=True)
        np.asarray([t for ids, _ in convs for t in ids], dtype="<u2").tofile(root / split / "tokens.bin")
        mask = np.asarray([m for _, ms in convs for m in ms], dtype=np.uint8)
        mask.tofile(root / split / "loss_mask.bin")
        np.save(root / split / "doc_lengths.npy", np.asarray([len(ids) for ids, _ in convs], dtype=np.int32))
        splits[split] = {"documents": len(convs), "tokens": int(sum(len(ids) for ids, _ in convs)),
                         "target_tokens": int(mask.sum())}
    (root / "tokenizer.json").write_bytes(Path(tokenizer_json).read_bytes())
    (root / "tokenizer_config.json").write_text(json.dumps(TEMPLATE_CONFIG), encoding="utf-8")
    for rel in ("train/tokens.bin", "train/doc_lengths.npy", "train/loss_mask.bin", "val/tokens.bin",
                "val/doc_lengths.npy", "val/loss_mask.bin", "tokenizer.json", "tokenizer_config.json"):
        files[rel] = {"size": (root / rel).stat().st_size, "sha256": _sha256(root / rel)}
    meta = {"format": "minilmd-prepared", "version": 2, "data_format": "chat", "vocab_size": vocab_size,
            "special_ids": {"pad": 0, "bos": 1, "eos": 2}, "tokenizer_sha256": files["tokenizer.json"]["sha256"],
            "splits": splits, "files": files, "sources": [], "split_rule": "test fixture", "leak_check": {},
            "stats": {}, "bad_lines": 0}
    (root / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return root


def synthetic_chat_prepared(root: Path, tokenizer_json: Path, vocab_size: int, n: int = 96, seed: int = 0,
                            **profile) -> Path:
    """n training conversations and a few for validation; `profile`: conversations()' length parameters."""
    convs = conversations(n + max(n // 16, 4), vocab_size, seed, **profile)
    return write_chat_prepared(root, convs[:n], convs[n:], vocab_size, tokenizer_json)
