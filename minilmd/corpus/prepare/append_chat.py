"""`prepare --append` on a chat corpus (data_format "chat"): what differs from a text corpus (append.py).

- The leak key of a chat document is a hash of its conversation's canonical JSON, which cannot be recovered from
  the rendered tokens; against the OLD documents the leak check therefore compares the documents' token ids
  exactly (blake2b-64 of them): a new conversation that renders to the same tokens as an old one. Among the new
  documents it is prepare's own (chat_encode.py).
- loss_mask.bin grows with tokens.bin, one byte per token.
- The per-split chat figures are sums over conversations (turns, replies, targets, cuts) and figures of the
  lengths: the sums are the old ones plus the new documents', the rest is computed over all lengths again.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from minilmd.corpus.analysis import scan
from minilmd.corpus.analysis import stats as corpus_stats
from minilmd.corpus.digest import digest64
from minilmd.names import SPLITS

ADDITIVE = ("turns", "assistant_turns", "target_tokens", "cut")
"""The figures of chat_split_stats that are sums over conversations."""


class DigestTask:
    """Per shard of a prepared corpus: the blake2b-64 of every document's token ids, in order."""

    def __init__(self) -> None:
        self.digests: list[np.ndarray] = []

    def fresh(self) -> DigestTask:
        return DigestTask()

    def add(self, batch: scan.Batch) -> None:
        self.digests.append(batch.digests)

    def result(self) -> np.ndarray:
        return np.concatenate(self.digests) if self.digests else np.zeros(0, dtype=np.uint64)


def old_digests(root: Path, workers: int) -> dict[str, np.ndarray]:
    """{split: the token digest of each of its documents}."""
    return scan.per_split(root, DigestTask(), workers)


def file_digests(tokens_path: Path, lengths: np.ndarray) -> np.ndarray:
    """The token digest of each document of a tokens file written by this append (its lengths given)."""
    out = np.zeros(lengths.size, dtype=np.uint64)
    if not lengths.size:
        return out
    tokens = np.memmap(tokens_path, dtype="<u2", mode="r", shape=(int(lengths.sum()),))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for d in range(lengths.size):
        out[d] = digest64(np.asarray(tokens[starts[d]:starts[d + 1]]).tobytes())
    return out


def merged_split_stats(old: dict, lengths: np.ndarray, new_facts: np.ndarray, seq_len: int,
                       batch_size: int) -> dict:
    """chat_split_stats over all lengths, its sums being the old split's plus the new documents'."""
    stats = corpus_stats.chat_split_stats(lengths, new_facts, seq_len, batch_size)
    for key in ADDITIVE:
        stats[key] += int(old.get(key, 0))
    stats["target_share"] = stats["target_tokens"] / stats["tokens"] if stats["tokens"] else 0.0
    return stats


def merge_chat_meta(m: dict, lengths: dict[str, np.ndarray], new_facts: dict[str, np.ndarray], counts: dict,
                    seq_len: int, batch_size: int) -> None:
    """The chat parts of the new meta.json `m` (a copy of the old one): stats per split, target tokens, counts."""
    for split in SPLITS:
        m["stats"][split] = merged_split_stats(m["stats"][split], lengths[split], new_facts[split], seq_len,
                                               batch_size)
        m["splits"][split]["target_tokens"] = m["stats"][split]["target_tokens"]
    c = m["chat"]
    c["cut"] = sum(m["stats"][split]["cut"] for split in SPLITS)
    for key, name in (("dropped_long", "dropped_long"), ("dropped_no_target", "dropped_no_target"),
                      ("conversations_with_special_text", "special_text"),
                      ("conversations_with_ignored_keys", "ignored_keys")):
        c[key] = c.get(key, 0) + counts.get(name, 0)
