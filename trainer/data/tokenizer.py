"""Tokenizers: train a byte-level BPE like MiniMind's, and load any tokenizer.json with the ids minilmd relies on.

minilmd stores token ids as uint16 and wraps every document as `[BOS] ids [EOS]` with PAD never stored, so a
tokenizer is only usable when `<|endoftext|>` = 0 (PAD), `<|im_start|>` = 1 (BOS), `<|im_end|>` = 2 (EOS) and the
vocabulary has fewer than 65536 entries. load_tokenizer refuses anything else, naming what differs. Torch-free.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from minilmd.protocol import SPECIAL_TOKENS

MAX_VOCAB = 65536  # token ids are stored as uint16


class TokenizerError(ValueError):
    """A tokenizer file that minilmd cannot use; the message names the file and the mismatch."""



def check_tokenizer(tok, where: str = "tokenizer") -> None:
    """Raise TokenizerError unless PAD/BOS/EOS have MiniMind's ids and every id fits in uint16."""
    problems = []
    for token, want in SPECIAL_TOKENS.items():
        got = tok.token_to_id(token)
        if got is None:
            problems.append(f"{token!r} is missing (minilmd needs it as id {want})")
        elif got != want:
            problems.append(f"{token!r} has id {got}, minilmd needs id {want}")
        else:
            back = tok.id_to_token(want)
            if back != token:
                problems.append(f"id {want} decodes to {back!r}, expected {token!r}")
    size = tok.get_vocab_size(with_added_tokens=True)
    if size >= MAX_VOCAB:
        problems.append(f"vocabulary has {size} entries; ids are stored as uint16, so it must be < {MAX_VOCAB}")
    if problems:
        raise TokenizerError(
            f"{where}: not usable by minilmd (MiniMind's special ids are PAD <|endoftext|>=0, "
            f"BOS <|im_start|>=1, EOS <|im_end|>=2): " + "; ".join(problems)
        )


def load_tokenizer(path: str | Path):
    """Load a tokenizer.json (a file, or a directory holding one) and check it with check_tokenizer."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{path}: no such tokenizer file")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a plain Exception for malformed JSON
        raise TokenizerError(f"{path}: not a valid tokenizer.json ({e})") from e
    check_tokenizer(tok, where=str(path))
    return tok


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
