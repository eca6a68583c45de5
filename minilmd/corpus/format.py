"""Reading a prepared corpus: the token stream the trainer samples windows from, checked on every open.

A prepared corpus (the output of `minilmd prepare`, format in docs/formats.md) is a directory:
    meta.json  tokenizer.json  train/{tokens.bin,doc_lengths.npy}  val/{tokens.bin,doc_lengths.npy}
tokens.bin is a raw little-endian uint16 stream `[BOS] doc [EOS] [BOS] doc [EOS] ...`; doc_lengths.npy holds the
length of each document including its BOS and EOS. A tokens.bin and a doc_lengths.npy that disagree did not come
from the same run, and every window cut from them would be silently misaligned: TokenStream refuses them.

A chat corpus (`prepare --format chat`, meta.json `"data_format": "chat"`, version 2) has one conversation per
document, as its chat template rendered it, beside it a tokenizer_config.json holding that template, and in each
split a loss_mask.bin: one uint8 per token, 1 on the target tokens (every assistant reply after its
`<|im_start|>assistant\n` header, up to and including its `<|im_end|>`). A chat document starts with BOS
(`<|im_start|>`) but need not end with EOS: the template's text after the last `<|im_end|>` (MiniMind's "\n") is
kept, and a conversation cut at seq_len ends where it was cut.
A preference corpus (`prepare --format dpo`, `"data_format": "dpo"`, version 3) is a chat corpus whose documents
are pairs: documents 2i and 2i + 1 of a split are pair i's chosen and rejected sides, the loss mask on each side's
final reply (minilmd/corpus/prepare/dpo_encode.py); a split of an odd number of documents is refused.
Torch-free (numpy only): the supervisor verifies staged corpora with verify_prepared.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from minilmd.corpus.tokenizer import TokenizerError, tokenizer_from_text
from minilmd.corpus_meta import (
    MASKED_FORMATS,
    CorpusError,
    data_fingerprint,
    data_format_of,
    earlier_versions,
    read_meta,
    read_meta_hashed,
)
from minilmd.doc_index import IndexLies, chunks, index_header, read_prefix
from minilmd.fsio import dir_table_problems, table_problems
from minilmd.names import CORPUS_META as META
from minilmd.names import (
    CORPUS_TOKENIZER,
    DOC_LENGTHS,
    LOSS_MASK,
    SPLITS,
    TOKENIZER_CONFIG,
    TOKENIZER_CONFIG_MAX_BYTES,
    TOKENIZER_FILE,
    TOKENIZER_MAX_BYTES,
    TOKENS,
    split_file,
)
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID
from minilmd.untrusted import Unreadable, open_regular, read_bytes, sha256_open

_SCAN = 1 << 24  # tokens per block when scanning for the largest id: bounded temporaries
class TokenStream:
    """One split of a prepared corpus: `tokens` (uint16 memmap), `doc_lengths`, `doc_starts`, counts, and
    `loss_mask` (uint8 memmap of the same length, 1 on target tokens) for a chat corpus, None for a text one.

    Document d occupies tokens[doc_starts[d]:doc_starts[d + 1]]. On open it checks, always: tokens.bin size ==
    2 * doc_lengths.sum(), every document starts with BOS and (text) ends with EOS, every id < vocab_size, and the
    file sizes recorded in ../meta.json when there is one; with verify_hash also their sha256. For a chat split
    also: loss_mask.bin holds one byte per token, each 0 or 1; every document has a target token and its BOS is
    not one; every run of targets ends with EOS (`<|im_end|>`) unless it reaches its document's end (a cut).
    `data_format` comes from ../meta.json; a split directory without one is "chat" when it holds a loss_mask.bin.
    """

    def __init__(self, split_dir: str | Path, vocab_size: int | None = None, verify_hash: bool = False):
        self.dir = Path(split_dir)
        tokens_path, lengths_path = self.dir / TOKENS, self.dir / DOC_LENGTHS
        # Each split file is opened once, as untrusted (a corpus may sit in a shared directory: no link followed, no
        # FIFO opened), and its size, its sha256 and its contents all come from that one descriptor: a file swapped
        # at its name after the check is never the one read.
        files: dict[str, int] = {}
        try:
            for path in (tokens_path, lengths_path):
                files[path.name] = _open_split_file(path)
            self._read(files, vocab_size, verify_hash)
        finally:
            for fd in files.values():
                os.close(fd)

    def _read(self, files: dict[str, int], vocab_size: int | None, verify_hash: bool) -> None:
        """__init__'s reading, of the split files open in `files` ({name: descriptor}; the mask's added here)."""
        tokens_path, lengths_path = self.dir / TOKENS, self.dir / DOC_LENGTHS
        meta = None
        self.data_format = "chat" if (self.dir / LOSS_MASK).is_file() else "text"
        listed_docs = None  # meta.json's documents of this split: the prefix of the files to read (appends)
        if (self.dir.parent / META).is_file():
            meta = read_meta(self.dir.parent)
            self.data_format = data_format_of(meta)
            if vocab_size is None:
                vocab_size = meta.get("vocab_size")
            listed_docs = meta.get("splits", {}).get(self.dir.name, {}).get("documents")
        if self.data_format in MASKED_FORMATS:
            files[LOSS_MASK] = _open_split_file(self.dir / LOSS_MASK, f" (a chat corpus has one beside {tokens_path})")
        if meta is not None:
            self._check_files(meta, verify_hash, files)
        # Only the lengths meta.json lists are read (an append being published renames a longer index in before
        # meta.json: its prefix), after the header says they are there, in the dtype prepare writes: a hostile index
        # of any size or dtype costs no more memory than the corpus meta.json describes (doc_index.py).
        documents = listed_docs if isinstance(listed_docs, int) and listed_docs >= 0 else None
        lengths = _read_index(files[DOC_LENGTHS], lengths_path, documents)
        self.doc_lengths = lengths.astype(np.int64)
        if self.doc_lengths.size and self.doc_lengths.min() < 2:
            d = int(np.argmin(self.doc_lengths))
            raise CorpusError(f"{lengths_path}: document {d} has length {int(self.doc_lengths[d])}; every document "
                              "holds at least its BOS and EOS (2)")
        self.doc_starts = np.zeros(self.doc_lengths.size + 1, dtype=np.int64)
        np.cumsum(self.doc_lengths, out=self.doc_starts[1:])
        self.n_docs = int(self.doc_lengths.size)

        size = os.fstat(files[TOKENS]).st_size
        expected = int(self.doc_starts[-1])
        self._grown = listed_docs is not None  # with meta.json, a longer file is an append's tail: read the prefix
        if (size % 2 or size // 2 != expected) and not (self._grown and size // 2 >= expected):
            raise CorpusError(
                f"{tokens_path} holds {size / 2:g} tokens ({size} bytes) but {lengths_path} sums to {expected} "
                f"tokens over {self.n_docs} documents: they did not come from the same run"
            )
        self.n_tokens = expected
        if self.n_tokens:
            self.tokens: np.ndarray = map_fd(files[TOKENS], tokens_path, "<u2", self.n_tokens)
        else:  # numpy cannot map an empty file
            self.tokens = np.zeros(0, dtype="<u2")
        self.loss_mask: np.ndarray | None = None
        self.target_tokens: int | None = None  # chat: the number of target tokens (set by _check_mask)
        if self.data_format in MASKED_FORMATS:
            self.loss_mask = self._open_mask(files[LOSS_MASK], self.dir / LOSS_MASK, tokens_path)
        self._check_boundaries(tokens_path, lengths_path)
        if self.data_format == "dpo" and self.n_docs % 2:
            raise CorpusError(f"{lengths_path}: {self.n_docs} documents in a preference corpus, whose documents are "
                              "pairs (chosen, rejected): they did not come from the same run")
        self.vocab_size = vocab_size
        self._check_ids(tokens_path, vocab_size)
        if self.loss_mask is not None:
            self._check_mask(self.dir / LOSS_MASK)

    def _open_mask(self, fd: int, mask_path: Path, tokens_path: Path) -> np.ndarray:
        size = os.fstat(fd).st_size
        if size != self.n_tokens and not (self._grown and size > self.n_tokens):
            raise CorpusError(f"{mask_path} holds {size} bytes but {tokens_path} holds {self.n_tokens} tokens (one "
                              "mask byte per token): they did not come from the same run")
        if not self.n_tokens:
            return np.zeros(0, dtype=np.uint8)
        return map_fd(fd, mask_path, np.uint8, self.n_tokens)

    def _check_mask(self, mask_path: Path) -> None:
        """The chat invariants of the class docstring, in blocks of _SCAN tokens (bounded temporaries)."""
        assert self.loss_mask is not None
        mask, n = self.loss_mask, self.n_tokens
        before = np.zeros(self.n_docs + 1, dtype=np.int64)  # target tokens before each document boundary
        total = 0
        ends = self.doc_starts[1:]
        for lo in range(0, n, _SCAN):
            hi = min(lo + _SCAN, n)
            block = np.asarray(mask[lo:hi])
            if int(block.max(initial=0)) > 1:
                at = lo + int(np.argmax(block > 1))
                raise CorpusError(f"{mask_path}: value {int(mask[at])} at token {at}; a loss mask holds 0 or 1")
            nxt = np.zeros(hi - lo, dtype=bool)  # is the next token a target? (past the end: no)
            nxt[:-1] = block[1:] == 1
            if hi < n:
                nxt[-1] = mask[hi] == 1
            run_ends = lo + np.flatnonzero((block == 1) & ~nxt)
            at_doc_end = np.isin(run_ends + 1, ends)
            bad = run_ends[~at_doc_end & (self.tokens[run_ends] != EOS_ID)]
            if bad.size:
                t = int(bad[0])
                d = int(np.searchsorted(ends, t, side="right"))
                raise CorpusError(f"{mask_path}: a run of target tokens in document {d} ends at token {t} with id "
                                  f"{int(self.tokens[t])}, not EOS {EOS_ID} (<|im_end|>), inside the document: the "
                                  "mask and the tokens did not come from the same run")
            # The targets before each boundary by a search among the targets' positions (numpy's cumsum of the
            # uint8 mask into a wider type cost 0.3 CPU s per 10 M tokens).
            targets_at = np.flatnonzero(block)
            i, j = np.searchsorted(self.doc_starts, [lo, hi], side="right")  # the boundaries in (lo, hi]
            before[i:j] = total + np.searchsorted(targets_at, self.doc_starts[i:j] - lo, side="left")
            total += int(targets_at.size)
        targets = np.diff(before)
        if self.n_docs:
            heads = np.asarray(mask[self.doc_starts[:-1]])
            if heads.any():
                d = int(np.argmax(heads))
                raise CorpusError(f"{mask_path}: document {d} starts with a target token; its BOS (<|im_start|>) "
                                  "opens a header, which is never a target")
        if (targets == 0).any():
            d = int(np.argmax(targets == 0))
            raise CorpusError(f"{mask_path}: document {d} has no target token (every conversation has an assistant "
                              "reply): the mask and the tokens did not come from the same run")
        self.target_tokens = int(targets.sum())

    def _check_files(self, meta: dict, verify_hash: bool, opened: dict[str, int]) -> None:
        """The split files open in `opened` ({name: descriptor}) against meta.json's sizes (and sha256s): of those
        very descriptors, the ones then read and mapped, never of whatever their names lead to by then."""
        files = meta.get("files", {})
        # A split dir outside its corpus layout is not listed: only the invariants apply then.
        names = (TOKENS, DOC_LENGTHS, LOSS_MASK) if self.data_format in MASKED_FORMATS else (TOKENS, DOC_LENGTHS)
        keys = {name: split_file(self.dir.name, name) for name in names}
        table = {name: files[key] for name, key in keys.items() if key in files}

        def size_of(name: str) -> int | None:
            # An append writes the new tail of tokens.bin (loss_mask.bin) before meta.json and renames a longer
            # doc_lengths.npy in just before it: the prefix meta.json lists is this version (docs/formats.md).
            size = os.fstat(opened[name]).st_size
            grown = name in table and size > table[name]["size"]
            if grown and name == DOC_LENGTHS:
                table.pop(name)  # checked by its prefix: the lengths sum to meta.json's tokens (PreparedCorpus)
            return table[name]["size"] if grown and name in table else size

        def sha256_of(name: str) -> str:
            # The file open at the descriptor, whatever its name leads to now (a regular file: open_regular's).
            return sha256_open(opened[name], self.dir / name, first=table[name]["size"])

        for name in list(table):
            size_of(name)
        problems = table_problems(table, size_of, sha256_of if verify_hash else None,
                                  listed_in=META, label=lambda name: str(self.dir / name))
        if problems:
            raise CorpusError(f"{problems[0]}: they did not come from the same run (or the copy is incomplete)")

    def _check_boundaries(self, tokens_path: Path, lengths_path: Path) -> None:
        if not self.n_docs:
            return
        firsts = self.tokens[self.doc_starts[:-1]]
        lasts = self.tokens[self.doc_starts[1:] - 1]
        chat = self.data_format in MASKED_FORMATS  # a chat document need not end with EOS (the class docstring)
        bad = np.flatnonzero((firsts != BOS_ID) if chat else (firsts != BOS_ID) | (lasts != EOS_ID))
        if bad.size:
            d = int(bad[0])
            expected = f"BOS {BOS_ID} first (a chat document)" if chat else f"BOS {BOS_ID} ... EOS {EOS_ID}"
            raise CorpusError(
                f"{tokens_path}: document {d} (of {self.n_docs}, per {lengths_path}) spans tokens "
                f"[{self.doc_starts[d]}, {self.doc_starts[d + 1]}) and starts with id {int(firsts[d])}, ends with "
                f"id {int(lasts[d])}; expected {expected}: they did not come from the same run"
            )

    def _check_ids(self, tokens_path: Path, vocab_size: int | None) -> None:
        if vocab_size is None or not self.n_tokens:
            return
        top = max(int(self.tokens[i:i + _SCAN].max()) for i in range(0, self.n_tokens, _SCAN))
        if top >= vocab_size:
            raise CorpusError(f"{tokens_path}: holds token id {top} but the vocabulary has {vocab_size} ids: "
                              "the stream and the tokenizer did not come from the same run")

    def document(self, d: int) -> np.ndarray:
        """Document d with its BOS and EOS."""
        return self.tokens[self.doc_starts[d]:self.doc_starts[d + 1]]

    def document_mask(self, d: int) -> np.ndarray:
        """The loss mask of document d (chat corpora only)."""
        if self.loss_mask is None:
            raise CorpusError(f"{self.dir}: a text corpus has no loss mask")
        return self.loss_mask[self.doc_starts[d]:self.doc_starts[d + 1]]

    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        return f"TokenStream({str(self.dir)!r}, n_docs={self.n_docs}, n_tokens={self.n_tokens})"


class PreparedCorpus:
    """An opened prepared corpus: `.root`, `.meta`, `.data_format` ("text" | "chat" | "dpo"), `.train`, `.val`,
    `.vocab_size`, fingerprints, tokenizer (`.tokenizer_config_path`: the chat template's file, None for text)."""

    def __init__(self, root: str | Path, verify_hash: bool = False):
        self.root = Path(root)
        self.meta, self.meta_sha256 = read_meta_hashed(self.root)  # the sha256 of the very bytes parsed
        self.data_format = data_format_of(self.meta)
        self.vocab_size = int(self.meta["vocab_size"])
        if self.meta.get("special_ids") != {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID}:
            raise CorpusError(f"{self.root / META}: special_ids {self.meta.get('special_ids')} differ from "
                              f"minilmd's pad {PAD_ID}, bos {BOS_ID}, eos {EOS_ID}")
        self.tokenizer_path = self.root / CORPUS_TOKENIZER
        self.tokenizer_fingerprint = self.meta["tokenizer_sha256"]
        self.tokenizer_json = _read_small(self.tokenizer_path, TOKENIZER_MAX_BYTES)
        """tokenizer.json's bytes, read once (bounded, no link followed) and checked against tokenizer_sha256: what
        the checkpoints carry (tokenizer_files), never the file read again by its name."""
        tok_sha = hashlib.sha256(self.tokenizer_json).hexdigest()
        if tok_sha != self.tokenizer_fingerprint:
            raise CorpusError(f"{self.tokenizer_path}: sha256 {tok_sha} but meta.json records "
                              f"{self.tokenizer_fingerprint}: the tokenizer and the tokens did not come from the "
                              "same run")
        self.tokenizer_files = {TOKENIZER_FILE: self.tokenizer_json}
        """{name: bytes} of the tokenizer's files a checkpoint carries (a chat corpus's template too), as read here."""
        self.tokenizer_config_path: Path | None = None
        if self.data_format in MASKED_FORMATS:
            self.tokenizer_config_path = self.root / TOKENIZER_CONFIG
            listed = self.meta.get("files", {}).get(TOKENIZER_CONFIG)
            if not isinstance(listed, dict):
                raise CorpusError(f"{self.root / META}: a chat corpus lists its {TOKENIZER_CONFIG} (the chat "
                                  "template) under \"files\"; this one does not")
            config = _read_small(self.tokenizer_config_path, TOKENIZER_CONFIG_MAX_BYTES)
            problems = table_problems({TOKENIZER_CONFIG: listed}, lambda name: len(config),
                                      lambda name: hashlib.sha256(config).hexdigest(),
                                      listed_in=META, label=lambda name: str(self.root / name))
            if problems:
                raise CorpusError(f"{problems[0]}: a chat corpus keeps the chat template it was rendered with")
            self.tokenizer_files[TOKENIZER_CONFIG] = config
        self.train = TokenStream(self.root / SPLITS[0], self.vocab_size, verify_hash)
        self.val = TokenStream(self.root / SPLITS[1], self.vocab_size, verify_hash)
        for name, stream in zip(SPLITS, (self.train, self.val), strict=True):
            want = self.meta.get("splits", {}).get(name, {})
            if want.get("tokens") != stream.n_tokens or want.get("documents") != stream.n_docs:
                raise CorpusError(f"{stream.dir}: {stream.n_docs} documents / {stream.n_tokens} tokens but meta.json "
                                  f"records {want.get('documents')} / {want.get('tokens')}")
            if stream.target_tokens is not None and want.get("target_tokens") != stream.target_tokens:
                raise CorpusError(f"{stream.dir}: {stream.target_tokens} target tokens but meta.json records "
                                  f"{want.get('target_tokens')}")
        self.data_fingerprint = data_fingerprint(self.meta)
        self.earlier_versions = earlier_versions(self.meta)

    def __repr__(self) -> str:
        return f"PreparedCorpus({str(self.root)!r}, train={self.train.n_tokens}, val={self.val.n_tokens} tokens)"


def _read_small(path: Path, max_bytes: int) -> bytes:
    """A small file of the corpus (its tokenizer's), read once as untrusted: a regular file of at most max_bytes, no
    link followed, no FIFO opened. CorpusError for anything else; an OSError of a failing mount as it is (the
    caller's retry), as read_meta does."""
    try:
        return read_bytes(path, max_bytes=max_bytes)
    except Unreadable as e:
        raise _corpus_error(path, e) from None


def read_doc_lengths(path: Path, documents: int) -> np.ndarray:
    """The first `documents` lengths (int64) of a split's doc_lengths.npy, read as untrusted (the corpus may sit in
    a team directory, another user's): a regular file only (no link followed, no FIFO opened), the int32 index
    prepare writes, and of it only the header and those lengths, whatever its size says (an append being published
    makes it longer). CorpusError for a file that is not that; an OSError of a failing mount as it is."""
    fd = _open_split_file(path)
    try:
        return _read_index(fd, path, max(documents, 0)).astype(np.int64)
    finally:
        os.close(fd)


def doc_length_counts(path: Path, documents: int, longest: int) -> np.ndarray:
    """How many of the first `documents` lengths of a split's doc_lengths.npy (opened and checked as
    read_doc_lengths does) are each length, one over `longest` counted as `longest` (a row's cut): int64 counts,
    longest + 1 of them. Read doc_index.CHUNK_DOCS lengths at a time: its memory is a chunk's and the counts',
    whatever meta.json says the index holds (padding-free SFT's epoch, minilmd/plan/epoch.py: before, every length
    was read and widened at once, about 65 bytes a document of a teammate's index; hostile audit 9 F3). CorpusError
    for an index that is not one, or a length under 1."""
    fd = _open_split_file(path)
    try:
        counts = np.zeros(longest + 1, np.int64)
        with _index_errors():
            offset, _ = index_header(fd, path, max(documents, 0))
            for chunk in chunks(fd, path, offset, max(documents, 0)):
                if int(chunk.min()) < 1:
                    raise CorpusError(f"{path}: a document of {int(chunk.min())} tokens: not a prepared corpus's index "
                                      f"(prepare it again)")
                counts += np.bincount(np.minimum(chunk, longest), minlength=longest + 1)
        return counts
    finally:
        os.close(fd)


def _read_index(fd: int, path: Path, documents: int | None) -> np.ndarray:
    """The first `documents` lengths (int32; None: all there are, for a split without meta.json) of the index open
    at `fd` (minilmd/doc_index.py's checks); CorpusError for an index that is not one prepare wrote, or one shorter
    than its own header says: a copy not finished, whose advice is to copy it again, not to prepare it again (the
    reply count tells the two apart too: replycut.py)."""
    with _index_errors():
        offset, held = index_header(fd, path, documents)
        return read_prefix(fd, path, offset, held if documents is None else documents)


@contextlib.contextmanager
def _index_errors() -> Iterator[None]:
    """IndexLies as the CorpusError a reader of the index raises, with what to do."""
    try:
        yield
    except IndexLies as e:
        if e.truncated:
            raise CorpusError(f"{e}: the copy is incomplete: wait for it to finish, or copy (stage) it again") from None
        raise CorpusError(f"{e}: not a prepared corpus's index (prepare it again)") from None


def map_regular(path: Path, dtype, count: int) -> np.ndarray:
    """The first `count` items of a split's tokens.bin (loss_mask.bin), mapped read-only from a descriptor opened as
    untrusted (a regular file only: no link followed, no FIFO opened); CorpusError when it is shorter or is not
    one."""
    fd = _open_split_file(path)
    try:
        return map_fd(fd, path, dtype, count)
    finally:
        os.close(fd)  # the mapping keeps its own reference to the file


def map_fd(fd: int, path: Path, dtype, count: int) -> np.ndarray:
    """map_regular of a split file already open at `fd` (open_regular's; the caller closes it): `path` names it."""
    with open(fd, "rb", closefd=False) as f:
        need = count * np.dtype(dtype).itemsize
        if os.fstat(fd).st_size < need:
            raise CorpusError(f"{path}: shorter than the {count} items its doc_lengths.npy and meta.json list")
        return np.memmap(f, dtype=dtype, mode="r", shape=(count,))


def _open_split_file(path: Path, where: str = "") -> int:
    """A descriptor of a split file, opened as untrusted (open_regular); CorpusError (RefusedFile) for anything
    but a regular file, its `missing` message followed by `where`; an OSError of a failing mount as it is."""
    try:
        return open_regular(path)
    except Unreadable as e:
        if e.missing and where:
            raise CorpusError(f"{path}: missing{where}") from None
        raise _corpus_error(path, e) from None


class RefusedFile(CorpusError):
    """A file of the corpus refused unread: a symbolic link, a FIFO, a device, a directory, or one replaced while it
    was opened (someone else's doing, or a mistake: `prepare --append` refuses to go on, exit 2)."""


def _corpus_error(path: Path, e: Unreadable) -> Exception:
    if e.os_error is not None:
        return e.os_error
    why = f"{path}: {'missing' if e.missing else f'unreadable ({e.why})'}"
    if e.kind == "link":  # a corpus assembled with links (a dedup store): its files are read, never followed
        why += ": minilmd follows no link inside a prepared corpus (it may sit where others write); copy the file in"
    return RefusedFile(why) if e.kind in ("link", "not_regular", "changed") else CorpusError(why)


def open_prepared(root: str | Path, verify_hash: bool = False) -> PreparedCorpus:
    return PreparedCorpus(root, verify_hash=verify_hash)


def verify_prepared(root: str | Path) -> list[str]:
    """Every problem found in a prepared corpus (full sha256 of every file, invariants); empty means good."""
    root = Path(root)
    try:
        meta = read_meta(root)
    except CorpusError as e:
        return [str(e)]
    problems = dir_table_problems(root, dict(sorted(meta.get("files", {}).items())), listed_in=META)
    if problems:
        return problems
    try:
        corpus = PreparedCorpus(root)
    except (CorpusError, KeyError) as e:
        return [str(e) if isinstance(e, CorpusError) else f"{root / META}: missing key {e}"]
    try:
        tok = tokenizer_from_text(corpus.tokenizer_json.decode("utf-8", "replace"), str(corpus.tokenizer_path))
        if tok.get_vocab_size(with_added_tokens=True) != corpus.vocab_size:
            problems.append(f"{corpus.tokenizer_path}: vocabulary of {tok.get_vocab_size(with_added_tokens=True)} "
                            f"but meta.json records vocab_size {corpus.vocab_size}")
    except TokenizerError as e:
        problems.append(str(e))
    return problems
