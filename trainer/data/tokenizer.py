"""Training a tokenizer: a byte-level BPE like MiniMind's, with the special ids minilmd relies on.

Loading and checking one (load_tokenizer, check_tokenizer) is torch-free and lives in `minilmd.tokenizer`, which
the supervisor's staging uses too; they are imported here so that a caller of this module finds both halves.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from minilmd.protocol import SPECIAL_TOKENS
from minilmd.tokenizer import MAX_VOCAB, TokenizerError, check_tokenizer, load_tokenizer  # noqa: F401


def train_tokenizer(texts: Iterable[str], vocab_size: int = 6400, out: str | Path | None = None,
                    show_progress: bool = False):
    """Train a byte-level BPE with MiniMind's special tokens at ids 0, 1, 2; save it to `out` when given.

    The same recipe as MiniMind's train_tokenizer.py: ByteLevel pre-tokenizer without a prefix space, the full
    256-byte initial alphabet (so that any text encodes without an unknown token), ByteLevel decoder.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = sorted(SPECIAL_TOKENS, key=SPECIAL_TOKENS.__getitem__)
    floor = len(specials) + 256
    if not floor <= vocab_size < MAX_VOCAB:
        raise TokenizerError(f"--vocab-size {vocab_size}: must be at least {floor} (256 bytes + 3 special tokens) "
                             f"and below {MAX_VOCAB}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=show_progress,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    check_tokenizer(tok, where="trained tokenizer")
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(out))
    return tok
