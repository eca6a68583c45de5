"""Training a tokenizer: a byte-level BPE like MiniMind's, with the special ids minilmd relies on.

Loading and checking one (load_tokenizer, check_tokenizer) is torch-free and lives in `minilmd.corpus.tokenizer`, which
the supervisor's staging uses too; they are imported here so that a caller of this module finds both halves.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from minilmd.corpus.tokenizer import MAX_VOCAB, TokenizerError, check_tokenizer, load_tokenizer  # noqa: F401
from minilmd.protocol import SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int = 6400, out: str | Path | None = None,
                    show_progress: bool = False, warn=None):
    """Train a byte-level BPE with MiniMind's special tokens at ids 0, 1, 2; save it to `out` when given.

    The same recipe as MiniMind's train_tokenizer.py: ByteLevel pre-tokenizer without a prefix space, the full
    256-byte initial alphabet (so that any text encodes without an unknown token), ByteLevel decoder. BPE stops
    merging when no pair of tokens occurs twice: on a small corpus the vocabulary ends below vocab_size, and
    `warn` (default: a line on stderr) says so with both numbers.
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
    actual = tok.get_vocab_size(with_added_tokens=True)
    if actual < vocab_size:
        (warn or _warn_stderr)(vocab_shortfall(vocab_size, actual))
    if out is not None:
        from minilmd.fsio import atomic_write_text

        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        # a temp file renamed over `out`: a kill mid-write leaves the old file, and a link at `out` (planted in a
        # shared directory) is replaced, never followed into somebody's file
        atomic_write_text(out, tok.to_str(pretty=True))
    return tok


def vocab_shortfall(asked: int, actual: int) -> str:
    """The warning for a trained vocabulary smaller than asked for: both numbers, and what they mean for a run."""
    return (f"warning: asked for --vocab-size {asked} but the corpus gave only {actual} entries: BPE ran out of "
            f"pairs that occur more than once (too little or too repetitive text). The tokenizer has {actual} entries "
            f"(ids 0..{actual - 1}): a run on a corpus prepared with it needs model.vocab_size = {actual} (the trainer "
            f"refuses any other size), not {asked}; or train the tokenizer on more text")


def _warn_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
