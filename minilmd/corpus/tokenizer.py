"""Loading a tokenizer.json and checking it has the ids minilmd relies on. Torch-free (the `tokenizers` library):
the supervisor's staging checks a staged corpus's tokenizer with it.

minilmd stores token ids as uint16 and wraps every document as `[BOS] ids [EOS]` with PAD never stored, so a
tokenizer is only usable when `<|endoftext|>` = 0 (PAD), `<|im_start|>` = 1 (BOS), `<|im_end|>` = 2 (EOS) and the
vocabulary has fewer than 65536 entries. load_tokenizer refuses anything else, naming what differs. Training one
is `minilmd.corpus.tokenizer_train.train_tokenizer`.
"""
from __future__ import annotations

from pathlib import Path

from minilmd.names import TOKENIZER_FILE, TOKENIZER_MAX_BYTES
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
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise TokenizerError(f"{path}: no such tokenizer file")
    if path.stat().st_size > TOKENIZER_MAX_BYTES:  # a tokenizer from elsewhere: never a gigabyte read whole
        raise TokenizerError(f"{path}: larger than {TOKENIZER_MAX_BYTES >> 20} MiB; not a tokenizer.json")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a plain Exception for malformed JSON
        raise TokenizerError(f"{path}: not a valid tokenizer.json ({e})") from e
    check_tokenizer(tok, where=str(path))
    return tok
