"""How `minilmd prepare` and `prepare --append` (minilmd/corpus/prepare/pipeline.py, append.py) split, check and
report, each option the flag of the same name, and the tokenizer they encode with."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minilmd.corpus.prepare.badlines import longest_list_name
from minilmd.corpus.prepare.lock import lock_name
from minilmd.corpus.sources.jsonl import BAD_LINE_POLICIES
from minilmd.corpus.tokenizer import read_tokenizer_text, tokenizer_from_text
from minilmd.corpus_meta import DATA_FORMATS, MASKED_FORMATS
from minilmd.names import CORPUS_TOKENIZER, TOKENIZER_CONFIG

BLOCK_BYTES = 1 << 20
COMMON_NAME_MAX = 255  # bytes a name, where the file system cannot be asked (ext4, xfs, btrfs, NFS all say it)


@dataclass
class PrepareOptions:
    """How `prepare` splits, checks and reports; each field is the `minilmd prepare` flag of the same name."""

    val_fraction: float = 0.005
    """Share of documents for validation, by the hash rule of pipeline.py's docstring; in [0, 1)."""
    on_bad_line: str = "error"
    """"error": stop at the first bad line and write nothing; "skip": count it, keep a few examples, go on."""
    seq_len: int = 340
    """Sequence length of the padding/packing report (a text corpus does not depend on it); a chat corpus's
    conversations are cut at it (or dropped: on_long)."""
    batch_size: int = 32
    """Batch size of the steps-per-epoch report; a chat corpus's micro-batch of the bucketed PAD share."""
    workers: int | None = None
    """Encoding processes; None: one per core, 0: in this process."""
    block_bytes: int = BLOCK_BYTES
    """Input bytes per work item; a few blocks per worker are in flight, so memory is bounded by this."""
    data_format: str = "text"
    """"text": {"text": ...} lines, loss on every token; "chat": conversations and a loss mask; "dpo": preference
    pairs, each rendered as two chat documents (`--format`)."""
    on_long: str = "cut"
    """chat: a conversation longer than seq_len is cut to seq_len tokens ("cut") or dropped ("drop")."""
    drop_scripts: frozenset[str] = frozenset()
    """text: a document with any character of these scripts (minilmd/corpus/analysis/scripts.py) is dropped and
    counted."""

    def problems(self) -> list[str]:
        """Every invalid option at once, each naming its flag."""
        from minilmd.corpus.prepare.chat_encode import ON_LONG

        found = []
        if self.data_format not in DATA_FORMATS:
            found.append(f"--format {self.data_format!r}: choose one of {', '.join(DATA_FORMATS)}")
        if self.drop_scripts and self.data_format in MASKED_FORMATS:
            found.append("--drop-scripts: applies to text corpora (--format text) only")
        if self.on_long not in ON_LONG:
            found.append(f"--on-long {self.on_long!r}: choose one of {', '.join(ON_LONG)}")
        if self.on_bad_line not in BAD_LINE_POLICIES:
            found.append(f"--on-bad-line {self.on_bad_line!r}: choose one of {', '.join(BAD_LINE_POLICIES)}")
        if not 0 <= self.val_fraction < 1:
            found.append(f"--val-fraction {self.val_fraction}: must be in [0, 1)")
        if self.seq_len < 2 or self.batch_size < 1:
            found.append(f"--seq-len {self.seq_len} / --batch-size {self.batch_size}: need seq_len >= 2, "
                         f"batch_size >= 1")
        return found


def check_out_name(out: Path, temporary: Callable[[str], str]) -> None:
    """ValueError (exit 2) when a name prepare makes beside --out is longer than the file system there takes:
    `temporary(name)`, its temporary directory's (or `--force`'s aside: its maker's host, pid and start time add
    some 30 bytes), the lock file's, the bad-lines list's. Refused before anything is made, where the OS would
    stop it midway with a bare ENAMETOOLONG (the lock file made). The limit is on a name's bytes, not characters."""
    size = len(os.fsencode(out.name))
    made = [temporary, lock_name, longest_list_name]
    extra, longest = max((len(os.fsencode(f(out.name))) - size, f("NAME")) for f in made)
    limit = _name_max(out.parent)
    if size + extra <= limit:
        return
    raise ValueError(f"--out {out}: its name is {size} bytes, too long for the names prepare makes beside it: the "
                     f"longest, {longest}, adds {extra} bytes to it, and the file system there takes at most {limit} "
                     f"bytes a name. Choose an --out name of at most {max(limit - extra, 0)} bytes; nothing was made")


def _name_max(where: Path) -> int:
    """The longest name (bytes) of the file system where --out goes, asked of its nearest existing directory
    (nothing is made to ask)."""
    for directory in (where, *where.parents):
        try:
            return os.pathconf(directory, "PC_NAME_MAX")
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (OSError, ValueError):
            break
    return COMMON_NAME_MAX


@dataclass
class PrepareTokenizer:
    """The tokenizer, checked by load_tokenizer, with the JSON text it was built from: the workers build theirs from
    that text and prepare writes that text into the corpus (read once: a file swapped after cannot make a corpus
    encoded with one tokenizer ship another)."""

    path: Path
    json: str
    vocab_size: int
    chat_config: dict | None = None
    """chat: its tokenizer_config.json, the template resolved (chat_files.read_tokenizer_config)."""

    @classmethod
    def load(cls, tokenizer: str | Path, chat: bool = False, data_format: str = "chat") -> PrepareTokenizer:
        """The tokenizer the user named (a tokenizer.json or its directory; links followed: the user's choice);
        `data_format`: the --format that needs its template (named when it has none)."""
        from minilmd.corpus.chat_files import read_tokenizer_config

        path = Path(tokenizer)
        if path.is_dir():
            path = path / CORPUS_TOKENIZER
        return cls._of(path, read_tokenizer_text(path), read_tokenizer_config(path, data_format) if chat else None)

    @classmethod
    def of_corpus(cls, corpus, chat: bool = False) -> PrepareTokenizer:
        """A prepared corpus's own tokenizer (and chat template): the bytes its PreparedCorpus read once and checked
        against meta.json (an append's corpus, opened through the locked directory), never its files read again."""
        from minilmd.corpus.chat import ChatError
        from minilmd.corpus.chat_files import chat_config
        from minilmd.corpus.tokenizer import TokenizerError

        path = corpus.tokenizer_path
        try:
            text = corpus.tokenizer_json.decode("utf-8")
            config_text = corpus.tokenizer_files[TOKENIZER_CONFIG].decode("utf-8") if chat else None
        except UnicodeDecodeError:
            raise (ChatError if chat else TokenizerError)(f"{corpus.root}: its tokenizer is not UTF-8 text") from None
        config = chat_config(config_text, None, corpus.root) if chat else None
        return cls._of(path, text, config)

    @classmethod
    def _of(cls, path: Path, text: str, config: dict | None) -> PrepareTokenizer:
        from minilmd.corpus.chat import ChatTemplate

        tok = tokenizer_from_text(text, str(path))
        if config is not None:
            ChatTemplate.from_config(config)  # compiles: a broken template fails here, before any work
        return cls(path, text, tok.get_vocab_size(with_added_tokens=True), config)

    def chat_spec(self, opts: PrepareOptions):
        from minilmd.corpus.chat import ChatTemplate
        from minilmd.corpus.prepare.chat_encode import ChatSpec

        if self.chat_config is None:
            return None
        return ChatSpec(ChatTemplate.from_config(self.chat_config), opts.seq_len, opts.on_long,
                        pairs=opts.data_format == "dpo")
