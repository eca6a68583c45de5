"""Loading a tokenizer.json and checking it has the ids minilmd relies on. Torch-free (the `tokenizers` library):
the supervisor's staging checks a staged corpus's tokenizer with it.

minilmd stores token ids as uint16 and wraps every document as `[BOS] ids [EOS]` with PAD never stored, so a
tokenizer is only usable when `<|endoftext|>` = 0 (PAD), `<|im_start|>` = 1 (BOS), `<|im_end|>` = 2 (EOS) and the
vocabulary has fewer than 65536 entries. load_tokenizer refuses anything else, naming what differs. Training one
is `minilmd.corpus.tokenizer_train.train_tokenizer`.
"""
from __future__ import annotations

from pathlib import Path

from minilmd.names import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG, TOKENIZER_FILE, TOKENIZER_MAX_BYTES
from minilmd.protocol import SPECIAL_TOKENS
from minilmd.untrusted import DEFAULT_MAX_DEPTH, Unreadable, read_bytes, too_deep

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



def read_tokenizer_text(path: str | Path, *, follow_links: bool = True) -> str:
    """The text of a tokenizer.json, read once as untrusted (minilmd/untrusted.py: a regular file only, so a FIFO
    never blocks and /dev/zero is never read; at most TOKENIZER_MAX_BYTES; nesting bounded, so no reader of the text
    meets a RecursionError). `follow_links`: a tokenizer the user named has its links followed by the one link rule
    of the sources (minilmd/corpus/sources/local.py read_source: a Hugging Face cache is links into its blobs, but
    a teammate's link in a team directory to her private file is refused, never read with her rights); a corpus's
    own file, which another user may have changed, is read without following one. Whoever loads it, encodes with
    it and copies it uses this one text (a file swapped after the read changes nothing). TokenizerError for
    anything else (a refused link too: exit 2)."""
    from minilmd.corpus.sources.local import LinkRefused, read_source

    path = Path(path)
    if why := beside_not_tokenizer(path):
        raise TokenizerError(why)
    try:
        if follow_links:
            data, _ = read_source(path, max_bytes=TOKENIZER_MAX_BYTES)
        else:
            data = read_bytes(path, max_bytes=TOKENIZER_MAX_BYTES)
        text = data.decode("utf-8")
    except LinkRefused as e:
        raise TokenizerError(str(e)) from None
    except Unreadable as e:
        if e.missing:
            raise TokenizerError(f"{path}: no such tokenizer file") from None
        if e.kind == "too_big":
            raise TokenizerError(f"{path}: larger than {TOKENIZER_MAX_BYTES >> 20} MiB; "
                                 "not a tokenizer.json") from None
        raise TokenizerError(f"{path}: not a readable tokenizer.json ({e.why})") from None
    except UnicodeDecodeError:
        raise TokenizerError(f"{path}: not a valid tokenizer.json (not UTF-8)") from None
    if too_deep(text, DEFAULT_MAX_DEPTH):
        raise TokenizerError(f"{path}: not a valid tokenizer.json (nested deeper than {DEFAULT_MAX_DEPTH})")
    return text


FILES_BESIDE = (TOKENIZER_CONFIG, CHAT_TEMPLATE_FILE, "special_tokens_map.json")
"""The files a Hugging Face tokenizer directory holds beside its tokenizer.json, which a user may name by a slip."""


def beside_not_tokenizer(path: str | Path) -> str:
    """Why `path`, a file named as one of FILES_BESIDE, is not the tokenizer a --tokenizer asks for, and what to
    give instead; "" for any other path. Said before it is read (read_tokenizer_text; chat_files.py before it
    looks for a template beside it: a tokenizer_config.json holding one was said to have none)."""
    path = Path(path)
    if path.name not in FILES_BESIDE or path.is_dir():
        return ""
    return (f"{path} is the {path.name} beside a tokenizer, not the tokenizer: give its tokenizer.json "
            f"({path.parent / TOKENIZER_FILE}) or its directory ({path.parent}); the {TOKENIZER_CONFIG} and "
            f"{CHAT_TEMPLATE_FILE} beside it are read from there")


def tokenizer_from_text(text: str, where: str):
    """The tokenizer of a tokenizer.json's text (read_tokenizer_text), checked with check_tokenizer; `where` names
    it in a TokenizerError."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # the Rust side raises a plain Exception for malformed JSON
        raise TokenizerError(f"{where}: not a valid tokenizer.json ({e})") from e
    check_tokenizer(tok, where=where)
    return tok


def load_tokenizer(path: str | Path, *, follow_links: bool = True):
    """Load a tokenizer.json (a file, or a directory holding one) and check it with check_tokenizer: read once
    (read_tokenizer_text)."""
    path = Path(path)
    if follow_links and path.is_dir():
        path = path / TOKENIZER_FILE
    return tokenizer_from_text(read_tokenizer_text(path, follow_links=follow_links), str(path))
