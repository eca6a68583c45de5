"""`minilmd prepare --append NEW.jsonl --out EXISTING`: grow a prepared corpus without re-tokenising it.

Only the new lines are read and encoded, by prepare's own pipeline (the same workers, split rule, bad-line
policy and --drop-scripts rule as the corpus was prepared with, from its meta.json), into a temporary directory
beside the corpus. Their documents are then appended, whole, to the ends of train/ and val/:

1. each split's tokens.bin is cut back to the size meta.json lists (a tail left by an interrupted append), then
   the new documents' tokens are appended to it and fsynced. Old bytes are never rewritten: a trainer that has
   the corpus open keeps reading the same prefix.
2. doc_lengths.npy (old lengths + new: 4 bytes per document) is written to a temporary name beside it;
3. the two doc_lengths.npy are renamed into place, then meta.json (Dir.write_atomic: temp, fsync, rename).
A reader takes meta.json as the truth: it reads the first `splits.<split>.documents` lengths and the tokens they
sum to, and accepts files longer than that (minilmd/corpus/format.py). So a reader that opens at any moment sees the old
version or the new one, never a half: before step 3 it reads the old meta and the old prefix, and between the
renames of step 3 the new doc_lengths.npy's prefix is the old one. Disk: the new data, nothing copied. One writer at a
time: the lock of every prepare of this --out (lock.py); the corpus directory and its split directories are opened
under it, read and written through those open directories (never through the name --out, which a teammate could
point at his own corpus meanwhile; each file opened without following a link, a regular file of this user's, the
new doc_lengths.npy made O_EXCL), and the append refuses (exit 2) when the name no longer leads
there, or when the corpus or a split directory is another user's or others can write it.
What a killed append left (its temporary directory beside the corpus, its temporary
doc_lengths.npy) is removed by the next one, under the lock.

Leak check against the old documents: their leak keys are recomputed by decoding the old documents with the
corpus's tokenizer (decode(encode(text)) == text for a byte-level BPE; minilmd/corpus/analysis/scan.py, in parallel). A
new val document that equals (whitespace aside) a train document, old or new, is removed from the new val; a new
train document that equals an old val document is dropped (the old val cannot change without a rewrite), and
counted. A full prepare of the concatenated input would instead remove that old val document: this is the one
way an appended corpus differs from the full prepare (docs/formats.md, "Growing a corpus"). A chat corpus
(append_chat.py) grows its loss_mask.bin with tokens.bin, and compares with its old documents by their tokens.

meta.json gains `versions`: one entry per version, {version, documents, tokens, splits, data_fingerprint,
previous_meta_sha256, created, sources, and what was added and left out}; the statistics are recomputed over all
documents' lengths. A run resumed on the grown corpus finds the corpus it started on among `versions` by its data
fingerprint and reads that version's prefix of train until its epoch ends (minilmd/plan/growth.py).
"""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import stat
import sys
import time
from pathlib import Path

import numpy as np

from minilmd import leftovers
from minilmd.corpus.analysis import scan
from minilmd.corpus.analysis import stats as corpus_stats
from minilmd.corpus.analysis.report import check_line_counts, duplicate_stats, length_stats
from minilmd.corpus.format import RefusedFile, open_prepared
from minilmd.corpus.prepare import append_chat
from minilmd.corpus.prepare.append_check import check_old_files
from minilmd.corpus.prepare.block import leak_key
from minilmd.corpus.prepare.collect import MAX_EXAMPLES, Collector, copy_kept
from minilmd.corpus.prepare.lock import CorpusLock, check_out_place, check_same_dir, hold_for_test, open_locked_dir
from minilmd.corpus.prepare.options import check_out_name
from minilmd.corpus.sources.jsonl import InputError
from minilmd.corpus_meta import CorpusError, data_fingerprint
from minilmd.dirfd import Dir, temp_name
from minilmd.doc_index import index_header, read_prefix
from minilmd.names import CORPUS_META as META
from minilmd.names import CORPUS_META_MAX_BYTES, DOC_LENGTHS, LEAK_KEYS, LOSS_MASK, SPLITS, TOKENS
from minilmd.perms import others_can_rearrange, owned_by_me
from minilmd.tmpnames import prepare_tmp_maker, prepare_tmp_name
from minilmd.untrusted import listed, sha256_open, sha256_regular

STALE_PARTS = DOC_LENGTHS + ".append-*.npy"  # a killed append's part, in a split directory
APPEND_SUFFIX = ".append"  # the temporary directory's name is prepare's, for "<corpus>.append"
_WORDS = leftovers.Words(one="an append", tool="prepare --append", thing="temporary directory", files=False)


class LeakKeyTask:
    """Per shard of a prepared text corpus: the leak key of every document, in order."""

    def __init__(self) -> None:
        self.keys: list[np.ndarray] = []

    def fresh(self) -> LeakKeyTask:
        return LeakKeyTask()

    def add(self, batch: scan.Batch) -> None:
        self.keys.append(np.fromiter(map(leak_key, batch.texts), dtype=np.uint64, count=len(batch.texts)))

    def result(self) -> np.ndarray:
        return np.concatenate(self.keys) if self.keys else np.zeros(0, dtype=np.uint64)


def old_leak_keys(root: Path, workers: int) -> dict[str, np.ndarray]:
    """{split: the leak key of each of its documents}, from the documents decoded by the corpus's tokenizer."""
    return scan.per_split(root, LeakKeyTask(), workers)


def append(sources: list[str], out: str | Path, *, workers: int | None = None, progress=None, log=None,
           on_bad_line: str | None = None, block_bytes: int | None = None, group_share: bool = False) -> dict:
    """Append `sources` to the prepared corpus `out`; returns the new meta.json. InputError (bad input, exit 65),
    CorpusError (the corpus), ValueError (bad arguments, another user's corpus, another prepare writing it, the
    directory replaced meanwhile, a directory others can rearrange without `group_share`: exit 2)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    root = Path(out)
    check_out_name(root, lambda name: temp_name(prepare_tmp_name(name + APPEND_SUFFIX, *leftovers.me()), "0" * 8))
    check_out_place(root, group_share)  # before anything is made or looked at there
    try:
        _check_owner(root, os.lstat(root))
    except OSError as e:
        raise CorpusError(f"{root}: cannot open ({e.strerror}); is it a prepared corpus?") from None
    with CorpusLock(root, "prepare --append", group_share) as lock:  # the one writer of this corpus (lock.py)
        with open_locked_dir(lock) as corpus_dir:  # the directory that was locked, whatever its name leads to now
            identity = corpus_dir.identity
            _check_owner(root, os.fstat(corpus_dir.fd))
            splits = _open_splits(corpus_dir)
            try:
                _remove_stale_parts(splits)
                assert lock.parent is not None
                if not group_share:  # in a team directory a name proves nothing: leftovers are the user's
                    _remove_stale_tmp(lock.parent, root)
                return _append(sources, root, corpus_dir, splits, lock.parent,
                               lambda: check_same_dir(lock, identity), workers, progress, log, on_bad_line,
                               block_bytes)
            except PermissionError as e:
                raise ValueError(f"{root}: cannot write {e.filename or 'a file'} ({e.strerror}); nothing was "
                                 "appended") from None
            finally:
                for split_dir in splits.values():
                    split_dir.close()


def _check_owner(root: Path, st: os.stat_result, what: str = "the corpus") -> None:
    """ValueError (exit 2) for a corpus (or a split directory of it: `what`) of another user: an append changes it
    in place, and only its owner may; and for one others can rearrange (its files are written inside it)."""
    owner = st.st_uid
    if not owned_by_me(st):
        raise ValueError(f"{root}: {what} belongs to another user (uid {owner}); `prepare --append` changes a "
                         "corpus in place, which only its owner may do. Prepare a corpus of your own (--out "
                         "elsewhere)")
    if stat.S_ISDIR(st.st_mode) and others_can_rearrange(st):
        raise ValueError(f"{root}: {what} directory can be written by other users (mode "
                         f"{stat.S_IMODE(st.st_mode):o}), who could swap its files while this appends; chmod go-w "
                         f"{root}, then run this again; nothing was changed")


def _open_splits(corpus: Dir) -> dict[str, Dir]:
    """Each split directory, opened through the corpus's descriptor (a link there is not followed), refused as the
    corpus is when another user's or others can rearrange it: the append writes its files in place."""
    opened: dict[str, Dir] = {}
    try:
        for split in SPLITS:
            try:
                opened[split] = Dir.at(corpus, split)
            except OSError as e:
                raise CorpusError(f"{corpus.path / split}: cannot be opened as the corpus's own split directory "
                                  f"({e.strerror}; a link is not followed)") from None
            _check_owner(corpus.path / split, os.fstat(opened[split].fd), "the split")
    except BaseException:
        for split_dir in opened.values():
            split_dir.close()
        raise
    return opened


def _remove_stale_parts(splits: dict[str, Dir]) -> None:
    """Leftovers of an append that was killed (its temporary doc_lengths.npy), removed under the lock: only a
    regular file of this user's, by its name in the split's descriptor."""
    for split_dir in splits.values():
        for name in listed(split_dir.fd):  # TooManyEntries (an OSError) past its bound
            if fnmatch.fnmatchcase(name, STALE_PARTS):
                st = split_dir.lstat(name)
                if st is not None and stat.S_ISREG(st.st_mode) and owned_by_me(st):
                    split_dir.remove_file(name, (st.st_dev, st.st_ino))  # only the very file judged


def _remove_stale_tmp(parent: Dir, root: Path) -> None:
    """The temporary directories of appends to `root` that were killed (a SIGKILL leaves its new documents' tokens
    there; nothing else ever removes them), by the leftovers rule: removed once the maker is gone, when this user's
    own directory; a live one's, a link, another user's or host's are left and said. Under the lock: no append of
    this corpus on this host runs meanwhile, and this one has made none yet. `parent`: the lock's, the directory of
    `root` judged and opened once (looked at and removed through it)."""
    say = leftovers.stderr_say("prepare")
    leftovers.sweep(parent, lambda name: prepare_tmp_maker(root.name + APPEND_SUFFIX, name), _WORDS, say,
                    out=root, on_running=leftovers.say_running(_WORDS, say))


def _append(sources: list[str], root: Path, corpus_dir: Dir, splits: dict[str, Dir], parent: Dir, check_same,
            workers: int | None, progress, log, on_bad_line: str | None, block_bytes: int | None) -> dict:
    """The append; `corpus_dir` is the corpus directory opened under the lock and `splits` its split directories
    opened through it (every write goes there, by descriptor), `root` its name as the user gave it (for messages
    and the readers); check_same() refuses when the two part. `parent`: the locked directory of the corpus, where
    the temporary directory is made (0700, a random name) and used through its own descriptor."""
    locked = corpus_dir.inside
    from minilmd.corpus.prepare.meta import report
    from minilmd.corpus.prepare.options import BLOCK_BYTES, PrepareOptions, PrepareTokenizer
    from minilmd.corpus.prepare.stream import encode_all
    from minilmd.corpus.sources.source_list import source_sizes
    from minilmd.corpus.workers import default_workers

    # Everything of the corpus is read through the locked directory (its descriptor; _check_owner made sure no one
    # else can rearrange it), never by the name `root`, which a teammate could point at his own corpus meanwhile.
    with _named_as(root, locked):
        corpus = open_prepared(locked)
    check_same()
    meta = corpus.meta
    chat = corpus.data_format == "chat"
    if corpus.data_format == "dpo":
        raise ValueError(f"{root}: a preference corpus (--format dpo) is not appended to; prepare it again from all "
                         "its pairs")
    if not sources:
        raise ValueError("no corpus files given")
    check_old_files(corpus_dir, root, meta["files"], log)  # hers alone, as meta.json lists them (append_check.py)
    old_meta_sha = corpus.meta_sha256  # of the very bytes parsed into `meta`
    opts = PrepareOptions(
        val_fraction=float(meta["split_rule"]["val_fraction"]),
        on_bad_line=on_bad_line or meta["bad_lines"]["policy"],
        seq_len=int(meta["chat"]["seq_len"] if chat else meta["stats"]["train"].get("seq_len", 340)),
        batch_size=int(meta["stats"]["train"].get("batch_size", 32)),
        workers=default_workers() if workers is None else workers,
        block_bytes=block_bytes or BLOCK_BYTES,
        data_format=corpus.data_format,
        on_long=meta["chat"]["on_long"] if chat else "cut",
        drop_scripts=frozenset(meta.get("dropped_scripts", {}).get("scripts", [])),
    )
    problems = opts.problems()
    if problems:
        raise ValueError("; ".join(problems))
    assert opts.workers is not None
    tok = PrepareTokenizer.of_corpus(corpus, chat)  # the bytes checked against meta.json, not read again
    if chat and tok.chat_config is not None:
        template = hashlib.sha256(tok.chat_config["chat_template"].encode("utf-8")).hexdigest()
        if template != meta["chat"]["template_sha256"]:
            raise CorpusError(f"{root}: its tokenizer_config.json's chat template is not the one it was rendered "
                              "with (meta.json chat.template_sha256)")
    tmp_dir, tmp_name = parent.make_temp(prepare_tmp_name(root.name + APPEND_SUFFIX, *leftovers.me()))
    tmp = tmp_dir.inside  # this process's 0700 directory, whatever its name in the parent leads to now
    for split in SPLITS:
        (tmp / split).mkdir()
    try:
        hold_for_test()  # holding the lock, its temporary directory made (tests/test_prepare_append_leftovers.py)
        sizes = source_sizes(sources)  # every source checked up front, as prepare's; none is held open
        found = Collector(tmp, sources, sizes, opts.on_bad_line, chat=chat)
        found.appending_to = (str(root), corpus.data_format)  # format_hint: a corpus of their own
        encode_all(found, tok, opts, progress)
        found.bad.publish(tmp_dir, parent, root.name)
        found.check_bad_lines()
        check_line_counts(found)
        if found.documents == 0:
            hint = found.format_hint()
            raise InputError(f"{', '.join(sources)}: no documents to append (every line was blank, bad or "
                             "dropped); the corpus is unchanged" + f"; {hint}" * bool(hint))
        # the locked directory as a path the scan's worker processes can use too (/proc/self is theirs)
        shared = Path(f"/proc/{os.getpid()}/fd/{corpus_dir.fd}")
        with _named_as(root, shared):
            old_keys = append_chat.old_digests(shared, opts.workers) if chat else old_leak_keys(shared, opts.workers)
        new = _new_documents(tmp, found, old_keys)
        if not sum(int(x.size) for x in new.lengths.values()):
            raise InputError(f"{', '.join(sources)}: no documents to append: all {found.documents:,} repeat "
                             "documents of the corpus (whitespace aside) across train and val; the corpus is "
                             "unchanged")
        check_same()
        if sha256_regular(locked / META, max_bytes=CORPUS_META_MAX_BYTES) != old_meta_sha:
            raise CorpusError(f"{root / META}: changed while this append ran; nothing was appended")
        new_meta = _publish(corpus_dir, splits, meta, tmp, new, found, opts, old_meta_sha)
    finally:
        parent.discard(tmp_dir, tmp_name)
    v = new_meta["versions"][-1]
    log(f"append: version {v['version']}: +{v['documents_added']:,} documents, +{v['tokens_added']:,} tokens "
        f"(train +{new.lengths['train'].size:,}, val +{new.lengths['val'].size:,}); "
        f"{v['leaked_val_removed']:,} new val documents repeat train ones, "
        f"{v['train_repeating_old_val_dropped']:,} new train documents repeat old val ones: left out")
    report(new_meta, log)
    found.bad.log_skipped(log, found.format_hint())
    return new_meta


@contextlib.contextmanager
def _named_as(root: Path, inside: Path):
    """A CorpusError about the corpus read through its descriptor (`inside`: /proc/.../fd/N) names it as the user
    did (`root`); a file of it refused unread (a link, a FIFO: RefusedFile) ends the append as a link at a file it
    writes does (ValueError, exit 2)."""
    try:
        yield
    except CorpusError as e:
        why = str(e).replace(str(inside), str(root))
        if isinstance(e, RefusedFile):
            raise ValueError(f"{why}: a file of the corpus is not its own regular file; nothing was appended") from None
        raise CorpusError(why) from None


class _New:
    """The new documents kept per split (their tokens in tmp/<split>/tokens.bin, a chat corpus's mask beside):
    lengths, the keys they are compared by with the old documents' (old_keys), the keep flags over what the
    workers sent (the counts of what was left out), and a chat corpus's per-conversation facts."""

    def __init__(self, lengths: dict, keys: dict, keep: dict, old_keys: dict, facts: dict | None = None):
        self.lengths, self.keys, self.keep, self.old_keys = lengths, keys, keep, old_keys
        self.facts = facts


def _new_documents(tmp: Path, found: Collector, old_keys: dict[str, np.ndarray]) -> _New:
    """New val documents not in any train, new train documents not in the old val (the module docstring; a chat
    corpus compares with the old documents by their tokens, append_chat.py)."""
    train_keys = np.fromfile(tmp / SPLITS[0] / LEAK_KEYS, dtype=np.uint64)
    val_keys = np.concatenate(found.val_keys) if found.val_keys else np.zeros(0, dtype=np.uint64)
    train_lengths = found.train.all_lengths().astype(np.int64)
    val_lengths = found.val_raw.all_lengths().astype(np.int64)
    keep_val = ~np.isin(val_keys, train_keys)
    if found.chat:  # against the old documents: their token digests
        train_cmp = append_chat.file_digests(found.train.path, train_lengths)
        val_cmp = append_chat.file_digests(found.val_raw.path, val_lengths)
    else:
        train_cmp, val_cmp = train_keys, val_keys
    keep_val &= ~np.isin(val_cmp, old_keys["train"])
    keep_train = ~np.isin(train_cmp, old_keys["val"])
    for raw, lengths, keep, split, names in ((found.train, train_lengths, keep_train, SPLITS[0], (TOKENS, LOSS_MASK)),
                                             (found.val_raw, val_lengths, keep_val, SPLITS[1], (TOKENS, LOSS_MASK))):
        kept = tmp / split / (TOKENS + ".kept")
        copy_kept(raw.path, lengths, keep, kept)
        raw.path.unlink()
        os.replace(kept, tmp / split / names[0])
        if raw.mask_path is not None:
            kept = tmp / split / (LOSS_MASK + ".kept")
            copy_kept(raw.mask_path, lengths, keep, kept, itemsize=1)
            raw.mask_path.unlink()
            os.replace(kept, tmp / split / names[1])
    facts = ({"train": found.train.all_facts()[keep_train], "val": found.val_raw.all_facts()[keep_val]}
             if found.chat else None)
    return _New({"train": train_lengths[keep_train].astype(np.int32), "val": val_lengths[keep_val].astype(np.int32)},
                {"train": train_cmp[keep_train], "val": val_cmp[keep_val]},
                {"train": keep_train, "val": keep_val}, old_keys, facts)


def _append_bytes(src: Path, dst: int, keep_size: int, chunk: int = 8 << 20) -> None:
    """The file open at `dst` cut back to keep_size bytes (an interrupted append's tail), then src's bytes after
    it, fsynced."""
    os.ftruncate(dst, keep_size)
    os.lseek(dst, keep_size, os.SEEK_SET)
    with open(src, "rb") as fin:
        while data := fin.read(chunk):
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view):]
    os.fsync(dst)


def _sha256_fd(fd: int) -> str:
    return sha256_open(fd, f"/proc/self/fd/{fd}")  # the file open at fd, whatever its name leads to now


def _open_split_files(splits: dict[str, Dir], chat: bool) -> dict[tuple[str, str], int]:
    """{(split, name): a read-write descriptor} of every file the append grows, each a regular file of this
    user's opened without following a link (Dir.open_own), all before a byte is written: a link or a stranger's
    file there is refused (PermissionError) with the corpus unchanged."""
    names = (TOKENS, LOSS_MASK) if chat else (TOKENS,)
    opened: dict[tuple[str, str], int] = {}
    try:
        for split, split_dir in splits.items():
            for name in names:
                opened[split, name] = split_dir.open_own(name, os.O_RDWR)
    except BaseException:
        for fd in opened.values():
            os.close(fd)
        raise
    return opened


def _old_lengths(split_dir: Dir, documents: int) -> np.ndarray:
    """The split's first `documents` lengths (those its meta.json counts), read by the one reader of the index
    (minilmd/doc_index.py: int32 as prepare writes it, the header checked, nothing beyond them read). Whole, not in
    chunks: the new index and meta.json's counts are made from the old lengths and the new ones together."""
    fd = split_dir.open_own(DOC_LENGTHS)
    try:
        offset, _ = index_header(fd, split_dir.path / DOC_LENGTHS, documents)
        return read_prefix(fd, split_dir.path / DOC_LENGTHS, offset, documents)
    finally:
        os.close(fd)


def _publish(corpus_dir: Dir, splits: dict[str, Dir], meta: dict, tmp: Path, new: _New, found: Collector, opts,
             old_meta_sha: str) -> dict:
    """Steps 1-3 of the module docstring, in the corpus directory and its splits (by their descriptors); returns
    the new meta.json."""
    files = dict(meta["files"])
    lengths = {}
    staged = []
    grown = _open_split_files(splits, found.chat)
    try:
        for split, split_dir in splits.items():
            for (of, name), fd in grown.items():
                if of == split:
                    _append_bytes(tmp / split / name, fd, int(files[f"{split}/{name}"]["size"]))
                    files[f"{split}/{name}"] = {"size": os.fstat(fd).st_size, "sha256": _sha256_fd(fd)}
            lengths[split] = np.concatenate([_old_lengths(split_dir, int(meta["splits"][split]["documents"])),
                                             new.lengths[split]])
            part_fd, part = split_dir.create_new(DOC_LENGTHS + ".append-", ".npy", 0o644)  # STALE_PARTS
            with os.fdopen(part_fd, "wb") as f:
                np.save(f, lengths[split])
                f.flush()
                os.fsync(f.fileno())
                files[f"{split}/{DOC_LENGTHS}"] = {"size": os.fstat(f.fileno()).st_size,
                                                   "sha256": _sha256_fd(f.fileno())}
            staged.append((split_dir, part))
    finally:
        for fd in grown.values():
            os.close(fd)
    new_meta = _new_meta(meta, files, lengths, new, found, opts, old_meta_sha)
    for split_dir, part in staged:
        split_dir.rename(part, split_dir, DOC_LENGTHS)
    for split_dir in splits.values():
        os.fsync(split_dir.fd)
    corpus_dir.write_atomic(META, (json.dumps(new_meta, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    os.fsync(corpus_dir.fd)
    return new_meta


def _new_meta(meta: dict, files: dict, lengths: dict[str, np.ndarray], new: _New, found: Collector, opts,
              old_meta_sha: str) -> dict:
    """The old meta.json with the new version's splits, files, sources, statistics, counts and `versions`."""
    m = json.loads(json.dumps(meta))  # a deep copy
    versions = m.get("versions") or [{"version": 1, "documents": sum(meta["splits"][s]["documents"] for s in SPLITS),
                                      "tokens": sum(meta["splits"][s]["tokens"] for s in SPLITS),
                                      "splits": meta["splits"], "data_fingerprint": data_fingerprint(meta),
                                      "created": meta.get("created"), "sources": [s["path"] for s in
                                                                                  meta["sources"]]}]
    keep = new.keep
    versions.append({
        "version": versions[-1]["version"] + 1,
        "documents": sum(int(lengths[s].size) for s in SPLITS),
        "tokens": sum(int(lengths[s].sum()) for s in SPLITS),
        "documents_added": sum(int(new.lengths[s].size) for s in SPLITS),
        "tokens_added": sum(int(new.lengths[s].sum()) for s in SPLITS),
        "leaked_val_removed": int((~keep["val"]).sum()),
        "train_repeating_old_val_dropped": int((~keep["train"]).sum()),
        "previous_meta_sha256": old_meta_sha,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sources": list(found.paths),
    })
    m["versions"] = versions
    m["created"] = versions[-1]["created"]
    m["files"] = files
    m["splits"] = {s: {"documents": int(lengths[s].size), "tokens": int(lengths[s].sum())} for s in SPLITS}
    stats = m["stats"]
    if found.chat:
        assert new.facts is not None
        append_chat.merge_chat_meta(m, lengths, new.facts, found.chat_counts, opts.seq_len, opts.batch_size)
        m["chat"]["ignored_keys_examples"] = (m["chat"].get("ignored_keys_examples", [])
                                              + found.ignored_examples)[:MAX_EXAMPLES]
    else:
        for split in SPLITS:
            stats[split] = corpus_stats.split_stats(lengths[split], opts.seq_len, opts.batch_size)
    versions[-1]["splits"] = m["splits"]
    versions[-1]["data_fingerprint"] = data_fingerprint(m)
    m["sources"] = meta["sources"] + found.sources
    stats["lengths"] = length_stats(np.concatenate([lengths[s] for s in SPLITS]).astype(np.int64))
    all_keys = np.concatenate([new.old_keys["train"], new.old_keys["val"], new.keys["train"], new.keys["val"]])
    key = "the token ids, exactly" if found.chat else "the leak key: exact after removing all whitespace"
    stats["duplicates"] = {**duplicate_stats(all_keys), "key": key}
    stats["documents_with_special_ids_inside"] += found.special_docs
    stats["special_ids_inside_examples"] = (stats["special_ids_inside_examples"] + found.special_examples)[:20]
    stats["input_text_bytes"] += found.text_bytes
    if "scripts" in stats:
        mine = found.scripts.as_dict()
        merged = stats["scripts"]
        merged["documents"] += mine["documents"]
        for kind in ("dominant", "contains"):
            for name, n in mine[kind].items():
                merged[kind][name] = merged[kind].get(name, 0) + n
    if "dropped_scripts" in m:
        m["dropped_scripts"]["documents"] += sum(s.get("dropped", 0) for s in found.sources)
    lc = m["leak_check"]
    lc["val_documents_checked"] += int(keep["val"].size)
    lc["leaked_documents"] += int((~keep["val"]).sum())
    lc["removed_from_val"] += int((~keep["val"]).sum())
    lc["train_documents_dropped_for_old_val"] = lc.get("train_documents_dropped_for_old_val", 0) + \
        int((~keep["train"]).sum())
    bad = m["bad_lines"]
    bad["total"] += sum(found.bad_counts.values())
    for reason, n in found.bad_counts.items():
        bad["by_reason"][reason] = bad["by_reason"].get(reason, 0) + n
    bad["examples"] = (bad["examples"] + found.bad_examples)[:20]
    return m
