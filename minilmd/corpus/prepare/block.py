"""What prepare's encoders share (encode.py for text, chat_encode.py for chat): the split rule and the EncodedBlock
a worker sends back for one block of lines.

Split rule: a document goes to val when the first 8 bytes of blake2b(text), read as a little-endian integer, are
below val_fraction * 2**64; its leak key is the same hash of its text with all whitespace removed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minilmd.corpus.analysis.scripts import ScriptTally
from minilmd.corpus.digest import digest64

NO_DIGEST = 2**64  # above every split digest


def split_is_val(text: str, val_fraction: float) -> bool:
    return digest64(text.encode("utf-8")) < int(val_fraction * 2**64)


def fraction_above(x: float) -> float:
    """x rounded up to two significant digits, strictly above x: the --val-fraction a suggestion prints, which
    takes the document whose digest is at x (and, suggested for more val, never rounds below the estimate)."""
    digits = 1 - int(np.floor(np.log10(x))) if x > 0 else 2
    up = float(np.ceil(x * 10**digits) / 10**digits)
    return up if up > x else up + 10.0**-digits


def leak_key(text: str) -> int:
    """Texts equal once all whitespace is removed share a key."""
    return digest64("".join(text.split()).encode("utf-8"))


def leak_key_given(text: str, digest: int) -> int:
    """leak_key(text), reusing the text's own digest when it has no whitespace (most Chinese documents)."""
    squeezed = "".join(text.split())
    return digest if len(squeezed) == len(text) else digest64(squeezed.encode("utf-8"))


@dataclass
class EncodedBlock:
    """What a worker sends back for one block: tokens and per-document facts for each split."""
    n_lines: int
    blank: int
    bad: list
    text_bytes: int
    special_inside: list  # line numbers of documents whose text encodes to a PAD/BOS/EOS id inside
    train_tokens: np.ndarray
    train_lengths: np.ndarray
    train_keys: np.ndarray
    val_tokens: np.ndarray
    val_lengths: np.ndarray
    val_keys: np.ndarray
    val_lines: np.ndarray
    train_min_digest: int  # the smallest split digest of the block's train documents (2**64 when none)
    # A chat block's (chat_encode.ChatBlockEncoder) extras; None for text.
    train_mask: np.ndarray | None = None  # uint8, one per token of train_tokens
    val_mask: np.ndarray | None = None
    train_facts: np.ndarray | None = None  # (documents, len(analysis.stats.FACTS)) int64
    val_facts: np.ndarray | None = None
    chat_counts: dict | None = None  # chat_encode.COUNTS
    ignored_keys: list | None = None  # (line, what) of each conversation kept without keys (chat_tools.py)
    # Text blocks: the kept documents by script (scripts.ScriptTally), and the lines --drop-scripts dropped.
    scripts: ScriptTally | None = None
    dropped: int = 0
