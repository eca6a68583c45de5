"""`minilmd prepare`: JSONL corpora -> a prepared corpus of packed uint16 token streams (format:
minilmd/corpus/format.py).

The pipeline streams (minilmd/corpus/prepare/stream.py): the main process reads blocks of whole lines and hands
them to worker processes (minilmd/corpus/prepare/encode.py), which parse, split, and encode them and send back uint16
arrays; a line longer than a block is parsed here as it is read (minilmd/corpus/sources/longdoc.py) and its text goes
to the workers in pieces. The results are collected in input order (minilmd/corpus/prepare/collect.py), so the output
does not depend on the number of workers or the block size. At most a few blocks or pieces are in flight: memory
stays bounded by the block and piece sizes, not by the corpus or a document. Everything is written into a temporary
directory beside DIR and published at the end (every file fsynced, then one rename): an interrupted or failed prepare
leaves nothing under DIR, and `--force` replaces only a prepared corpus or an empty directory, the one whose identity
it checked under the lock; it deletes that one only when, looked at again through its descriptor after the swap, it
still holds nothing else (a file put there while this ran: left whole as DIR.kept-by-prepare.XXXXXXXX, and said).
DIR's directory must be one no other user can rearrange (minilmd/dirfd.py's rule; a team
directory with `--group-share`), and everything made there goes through its descriptor: the temporary directory has
a random name, is 0700 and is used through its own descriptor (`Dir.inside`), never by its name. One writer of DIR at
a time (this, `--force`, `--append`): the flock on DIR.lock beside it (minilmd/corpus/prepare/lock.py). Every bad
line is named, the whole input read first (minilmd/corpus/prepare/badlines.py). meta.json and the report printed
from it: minilmd/corpus/prepare/meta.py; the options and the tokenizer: options.py.

Split: a document goes to val when the first 8 bytes of blake2b(text) read as an integer are below val_fraction *
2**64. The split of a document therefore depends on its text alone (stable when lines are appended), and exact
duplicates always share a split. Leak check: a val document whose text equals a train document's text once all
whitespace is removed is reported and removed from val. A corpus whose train or val split would be empty is
refused (`minilmd train` needs both), except for val with --val-fraction 0.

`--format chat` (data_format "chat"): each line is a conversation (minilmd/corpus/chat.py), rendered by the
tokenizer's chat template, encoded with its loss mask and cut at seq_len (minilmd/corpus/prepare/chat_encode.py); the
split rule and the leak key apply to its canonical JSON. A chat line is held whole (no streaming of long lines: a
conversation is bounded by what the template renders, and seq_len cuts it; chat_encode.py bounds its length). The
template travels with the corpus: its tokenizer_config.json is written beside tokenizer.json, listed in meta.json's
files.

`--format dpo` (data_format "dpo"): each line a preference pair, both sides rendered as `--format chat` renders a
conversation and kept as two adjacent documents of one split (minilmd/corpus/prepare/dpo_encode.py; meta.json's
`dpo`: dpo_meta.py).
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import numpy as np

from minilmd import leftovers, perms
from minilmd.corpus.analysis.report import add_report_meta, check_line_counts, duplicates_of
from minilmd.corpus.format import open_prepared
from minilmd.corpus.prepare.block import fraction_above
from minilmd.corpus.prepare.block import leak_key as leak_key  # the split rule: part of prepare's interface
from minilmd.corpus.prepare.block import split_is_val as split_is_val
from minilmd.corpus.prepare.collect import Collector, leak_check, write_splits
from minilmd.corpus.prepare.dpo_meta import add_pair_meta
from minilmd.corpus.prepare.lock import CorpusLock, check_out_place, hold_for_test, make_out_parent
from minilmd.corpus.prepare.meta import PREPARED_AT, add_chat_meta, build_meta, made_here, prepared_at, report
from minilmd.corpus.prepare.options import BLOCK_BYTES, PrepareOptions, PrepareTokenizer, check_out_name
from minilmd.corpus.prepare.stream import encode_all
from minilmd.corpus.progress import Progress
from minilmd.corpus.sources.jsonl import InputError, loads_bounded
from minilmd.corpus.sources.source_list import source_sizes
from minilmd.corpus.workers import default_workers
from minilmd.corpus_meta import FORMAT, MASKED_FORMATS
from minilmd.dirfd import Dir, Identity, Replaced, temp_name
from minilmd.dirpublish import publish
from minilmd.dirtree import mode_tree
from minilmd.fsio import atomic_write_text, out_taken
from minilmd.names import CORPUS_META as META
from minilmd.names import (
    CORPUS_META_MAX_BYTES,
    CORPUS_TOKENIZER,
    DOC_LENGTHS,
    LOSS_MASK,
    SPLITS,
    TOKENIZER_CONFIG,
    TOKENS,
    prepare_kept_prefix,
)
from minilmd.perms import owned_by_me, user_words
from minilmd.tmpnames import aside_name, prepare_tmp_maker, prepare_tmp_name
from minilmd.untrusted import TooManyEntries, Unreadable, holds_any, listed, printable, read_bytes

_WORDS = leftovers.Words(one="a prepare", tool="prepare", thing="temporary directory", files=False)


def _remove_stale_tmp(parent: Dir, out: Path, ours: str, say: leftovers.Say) -> None:
    """What killed prepares to `out` left beside it (a SIGKILL leaves no chance to clean up), by prepare's own names
    only (tmpnames.prepare_tmp_maker: never an export's `.OUT.tmp-HOST-PID-TICKS-bootTAG` to the same path, whose
    numbers are no prepare's). Removed once its maker is gone (a recycled pid has another start time, a process of a
    later boot another boot) when it is this user's own directory; a link, another user's entry, anything but a
    directory, another host's are left and said (minilmd/leftovers.py). A live maker's is left too: under the corpus
    lock it is no prepare of this host's to `out`, so only said. Runs under the lock, so no prepare of this `out` on
    this host starts meanwhile; `parent`: the lock's, the directory of `out` judged and opened once (looked at and
    removed through it)."""
    leftovers.sweep(parent, lambda name: prepare_tmp_maker(out.name, name), _WORDS, say, out=out, skip=ours,
                    on_running=leftovers.say_running(_WORDS, say))


def prepare(sources: list[str], tokenizer: str | Path, out: str | Path, *, val_fraction: float = 0.005,
            on_bad_line: str = "error", seq_len: int = 340, batch_size: int = 32, workers: int | None = None,
            block_bytes: int = BLOCK_BYTES, force: bool = False, progress: Progress | bool | None = None,
            log=None, data_format: str = "text", on_long: str = "cut",
            drop_scripts: frozenset[str] = frozenset(), group_share: bool = False) -> dict:
    """Prepare `sources` into `out`; returns meta.json's content. Raises InputError (bad input) or ValueError
    (chat.ChatError for a tokenizer without a chat template, with --format chat; a directory of --out others can
    rearrange, without `group_share`)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    opts = PrepareOptions(val_fraction, on_bad_line, seq_len, batch_size, workers, block_bytes, data_format,
                          on_long, frozenset(drop_scripts))
    problems = opts.problems() + ([] if sources else ["no corpus files given"])
    if problems:
        raise ValueError("; ".join(problems))
    out = Path(out)
    check_out_name(out, lambda name: aside_name(temp_name(prepare_tmp_name(name, *leftovers.me()), "0" * 8)))
    check_out_place(out, group_share)  # before anything is made or looked at there
    if taken := out_taken(out, force):
        raise ValueError(taken)
    if out.exists() or out.is_symlink():
        _check_replaceable(out)
    tok = PrepareTokenizer.load(tokenizer, opts.data_format in MASKED_FORMATS, data_format=opts.data_format)
    if opts.workers is None:
        opts.workers = default_workers()

    # the missing directories on the way to --out, CORPUS_DIR_MODE: never writable by others whatever the umask (a
    # group-writable one would be refused by the lock just after); made by the walk at each judged parent, never by
    # path: a link planted after check_out_place is refused there (PlaceRefused: a ValueError), nothing made
    make_out_parent(out, group_share, CORPUS_DIR_MODE)
    with CorpusLock(out, "prepare --force" if force else "prepare", group_share) as lock:  # one writer (lock.py)
        parent = lock.parent
        assert parent is not None
        # again, under the lock, through the locked directory: what --force may replace, by its identity
        replaces = _replaceable_at(parent, out, force, group_share)
        maker = leftovers.me()
        if not group_share:  # in a team directory a name proves nothing: leftovers are the user's to remove there
            _remove_stale_tmp(parent, out, "", leftovers.stderr_say("prepare"))
        hold_for_test()
        tmp, tmp_name = parent.make_temp(prepare_tmp_name(out.name, *maker))  # 0700, a random name
        try:
            meta = _prepare_into(tmp, parent, out, sources, tok, opts, progress, log)
            open_prepared(tmp.inside)  # the invariants, checked by the same code the trainer runs
            lock.check_parent()
            umask = perms.current_umask()
            mode_tree(tmp.fd, perms.published_file_mode(), CORPUS_DIR_MODE & ~umask)  # never others' to write
            tmp.mode_self(CORPUS_DIR_MODE & ~umask)
            # only the directory checked above is replaced (its identity), and `out` is never missing
            kept = publish(parent, tmp, tmp_name, out.name, replaces, aside=aside_name(tmp_name),
                           foreign=_foreign_now, keep_as=temp_name(prepare_kept_prefix(out.name)))
            if kept is not None:
                log(f"prepare: {out} is the new corpus; the directory it replaced was not deleted, since it "
                    f"changed while this ran ({kept.why}): it is at {kept.where}. Take what is yours from it, "
                    "then remove it yourself")
        except Replaced as e:
            raise ValueError(f"{e}; nothing was published. Check who moves things in {out.parent}") from None
        finally:
            parent.discard(tmp, tmp_name)
    return meta


CORPUS_DIR_MODE = 0o755
"""A prepared corpus's directories: for every reader (as its files), written by its owner alone (umask narrows it)."""
# A prepared corpus's files are perms.published_file_mode() whatever the umask made them (0644 less the umask): written
# by their owner alone, and `prepare --append` refuses to grow a corpus whose files another user can write
# (append_check.py).



def _replaceable_at(parent: Dir, out: Path, force: bool, group_share: bool) -> Identity | None:
    """Under the lock: the identity of the directory at --out that --force may replace (None: nothing there).
    ValueError when something is there without --force, or it is not replaceable (_check_replaceable's rule, read
    through the directory opened without following a link: what was checked is what is replaced). In a team
    directory (`group_share`) a corpus of this user's must also be the one prepare published at this name
    (meta.made_here): there a teammate may have renamed her other corpus to it."""
    st = parent.lstat(out.name)
    if st is None:
        return None
    if taken := out_taken(out, force, there=True):
        raise ValueError(taken)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        _check_replaceable(out)  # says what it is
        raise ValueError(f"{out}: not a directory; nothing was changed")
    try:
        opened = Dir.at(parent, out.name)
    except OSError as e:
        raise ValueError(f"{out}: cannot be opened ({e.strerror}); nothing was changed") from None
    with opened:
        what = _foreign_content(opened.inside, os.fstat(opened.fd))
        if what:
            raise ValueError(f"{out}: --force replaces only a prepared corpus or an empty directory, and this is "
                             f"{what}; nothing was changed. Choose another --out, or move it away yourself")
        if group_share and (why := _not_made_here(opened, out.name)):
            raise ValueError(f"{out}: in a team directory --force replaces only the corpus your own prepare "
                             f"published at this name, and this is a prepared corpus of yours, but {why} (others "
                             f"may rename in {out.parent}); nothing was changed. Choose another --out, or look at "
                             "it and move it away yourself")
        return opened.identity


def _not_made_here(opened: Dir, name: str) -> str:
    """Why the corpus `opened` (this user's, a prepared corpus holding only its own files) is not proven to be
    the one prepare published as `name` ("" when it is, or it is empty: nothing of it to lose)."""
    if not holds_any(opened.inside):
        return ""
    return made_here(_read_meta(opened.inside) or {}, opened.identity, name)


def _foreign_now(old: Dir) -> str:
    """Publish's look, after the swap, at the directory --force replaced (through its descriptor): why it is no
    longer only a prepared corpus ("" when it is). Checked once before the prepare, which may take hours: a file
    added to it meanwhile (her thesis.txt) is never deleted with it."""
    return _foreign_content(old.inside, os.fstat(old.fd))


CORPUS_ENTRIES = {META, CORPUS_TOKENIZER, TOKENIZER_CONFIG, *SPLITS}
"""What a prepared corpus holds at its top (TOKENIZER_CONFIG: chat only); each split directory holds SPLIT_FILES."""


SPLIT_FILES = {TOKENS, DOC_LENGTHS, LOSS_MASK}


def _check_replaceable(out: Path) -> None:
    """ValueError unless `--force` may replace `out`: an empty directory, or a prepared corpus holding nothing but
    its own files. Anything else may be somebody's work (a thesis.txt): replacing it would delete it."""
    if out.is_symlink():
        what = f"a symbolic link (to {printable(os.readlink(out))})"
    elif not out.is_dir():
        what = "not a directory"
    else:
        what = _foreign_content(out, out.lstat())
    if what:
        raise ValueError(f"{out}: --force replaces only a prepared corpus or an empty directory, and this is {what}; "
                         "nothing was changed. Choose another --out, or move it away yourself")


def _foreign_content(out: Path, st: os.stat_result) -> str:
    """Why the directory at `out` (lstat or fstat `st`) is not replaceable ("" when it is). Its own files must be
    regular files (a `tokens.bin` that is a directory of someone's files is not the corpus's) and its split
    directories real directories, not links. One of more entries than untrusted.listed reads is no corpus."""
    if not owned_by_me(st):
        return f"a directory of another user, {user_words(st.st_uid)}"
    try:
        return _foreign_entries(out, sorted(listed(out)))
    except TooManyEntries as e:
        return f"a directory that {e.strerror}"


def _foreign_entries(out: Path, entries: list[str]) -> str:
    """_foreign_content's look at the names `out` holds (at most untrusted.listed's bound)."""
    if not entries:
        return ""
    meta = _read_meta(out)
    if meta is None or meta.get("format") != FORMAT:
        return f"not a prepared corpus (no {META} of format {FORMAT!r}; it holds {_listing(entries)})"
    foreign = [name for name in entries if name not in CORPUS_ENTRIES or
               (name not in SPLITS and not _regular(out / name))]
    for split in SPLITS:
        if (out / split).is_symlink() or not (out / split).exists():
            foreign += [split] if (out / split).is_symlink() else []
        elif (out / split).is_dir():
            foreign += [f"{split}/{name}" for name in sorted(listed(out / split))
                        if name not in SPLIT_FILES or not _regular(out / split / name)]
        else:
            foreign.append(split)
    if foreign:
        return f"a prepared corpus with other files in it: {_listing(sorted(set(foreign)))}"
    return ""


def _read_meta(out: Path) -> dict | None:
    """The meta.json at `out` as a JSON object (no link followed, bounded), None when there is none such."""
    try:
        meta = loads_bounded(read_bytes(out / META, max_bytes=CORPUS_META_MAX_BYTES))
    except (Unreadable, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _regular(path: Path) -> bool:
    """A regular file, not a link, a directory or anything else."""
    return stat.S_ISREG(path.lstat().st_mode)


def _listing(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _prepare_into(tmp_dir: Dir, parent: Dir, out: Path, sources: list[str], tok: PrepareTokenizer,
                  opts: PrepareOptions, progress: Progress | bool | None, log) -> dict:
    """The whole pipeline into the temporary directory `tmp_dir` (0700, this process's: reached by its descriptor,
    whatever its name in `parent` leads to now): encode, leak check, splits, meta.json. The list of bad lines goes
    beside `out` (badlines.py); under --on-bad-line error a bad line ends it here (InputError)."""
    tmp = tmp_dir.inside
    for split in SPLITS:
        (tmp / split).mkdir(mode=CORPUS_DIR_MODE)
    (tmp / CORPUS_TOKENIZER).write_bytes(tok.json.encode("utf-8"))  # the text it encodes with, read once
    if tok.chat_config is not None:
        (tmp / TOKENIZER_CONFIG).write_text(json.dumps(tok.chat_config, indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
    sizes = source_sizes(sources)  # every source checked up front: a missing one fails here; none is held open
    found = Collector(tmp, sources, sizes, opts.on_bad_line, chat=tok.chat_config is not None)
    encode_all(found, tok, opts, progress)
    found.bad.publish(tmp_dir, parent, out.name)
    if note := found.bad.earlier_list_note():
        log(note)
    found.check_bad_lines()
    if found.documents == 0:
        dropped = sum(found.chat_counts.get(k, 0) for k in ("dropped_long", "dropped_no_target"))
        unit = "pairs" if opts.data_format == "dpo" else "conversations"  # the encoders count a pair once
        why = f"; {dropped:,} {unit} dropped for length at --seq-len {opts.seq_len}" if dropped else ""
        hint = found.format_hint()
        raise InputError(f"{', '.join(sources)}: no documents (every line was blank or bad{why})"
                         + f"; {hint}" * bool(hint))
    check_line_counts(found, 2 if opts.data_format == "dpo" else 1)
    duplicates = duplicates_of(tmp, found, 2 if opts.data_format == "dpo" else 1)  # before leak_check (deletes keys)
    leaked, leak_examples = leak_check(tmp, found)
    _check_splits(found, leaked, opts.val_fraction, 2 if opts.data_format == "dpo" else 1,
                  duplicates["largest_group"])
    train_lengths, val_lengths = write_splits(tmp, found, leaked)
    meta = build_meta(tmp, tok, opts, found, train_lengths, val_lengths, leaked, leak_examples)
    add_report_meta(meta, found, duplicates, train_lengths, val_lengths, opts.drop_scripts)
    if found.chat:
        add_chat_meta(meta, tok, opts, found, train_lengths, val_lengths, leaked)
    if opts.data_format == "dpo":
        add_pair_meta(meta, tmp, {"train": train_lengths, "val": val_lengths}, found.chat_counts)
    meta[PREPARED_AT] = prepared_at(tmp_dir.identity, out.name)  # what --force asks (meta.py)
    # atomic_write_text's temp file is private; the corpus is for every reader
    atomic_write_text(tmp / META, json.dumps(meta, indent=2, sort_keys=True) + "\n", mode=0o644)
    report(meta, log)
    found.bad.log_skipped(log, found.format_hint())
    return meta


def _check_splits(found: Collector, leaked: np.ndarray, val_fraction: float, per_item: int = 1,
                  largest_group: int = 0) -> None:
    """InputError (exit 65) when a split would be empty: `minilmd train` needs documents to train on and a val
    split for its validation loss. The message gives the smallest --val-fraction that puts a document into val
    (the split rule is a hash of each text: raising the fraction only moves documents from train to val).
    --val-fraction 0 asks for no val split: then only train must not be empty. `per_item`: documents an item of
    the split rule holds (a preference pair: 2), which the message counts. `largest_group`: the most copies of
    one text, whitespace aside (duplicate_stats, by leak key); when every item is that one text, no fraction splits
    them (the split hashes the exact text, so exact copies share a split, and the leak check removes a val variant
    of a train text), and the message says so instead of a fraction that would empty train (user7 #6)."""
    n, n_val = found.documents // per_item, int(leaked.size) // per_item
    unit = "pairs" if per_item == 2 else "documents"
    n_train = n - n_val
    if n > 1 and largest_group >= n and val_fraction > 0 and (n_train == 0 or int(leaked.size) == int(leaked.sum())):
        # one leak key for all (duplicate_stats counts by it): exact copies hash alike, and a variant in val is a leak
        here = f" (here all {n_val:,} that fell into val were)" if n_train and n_val else ""
        raise InputError(f"the {'train' if n_train == 0 else 'val'} split is empty: all {n:,} {unit} are the same "
                         f"text once whitespace is removed, so no --val-fraction splits them: exact copies fall "
                         f"into one split (the split is by a hash of each exact text), and a val {unit[:-1]} that "
                         f"equals a train one but for whitespace is removed by the leak check{here}; a train and a "
                         f"val split need at least two distinct {unit} (whitespace aside)")
    if n_train == 0:
        raise InputError(f"the train split is empty: all {n:,} {unit} fell into val at --val-fraction "
                         f"{val_fraction}; lower it (the split is by a hash of each text), or add {unit}")
    if val_fraction == 0 or int(leaked.size) - int(leaked.sum()) > 0:
        return
    if n_val:
        raise InputError(f"the val split is empty: all {n_val:,} val {unit[:-1]}(s) repeat train {unit} "
                         f"(whitespace aside) and were removed by the leak check; raise --val-fraction to draw others")
    need = fraction_above(found.train_min_digest / 2**64)
    raise InputError(f"the val split is empty: none of the {n:,} {unit} fell into val at --val-fraction "
                     f"{val_fraction} (about {n * val_fraction:.2f} expected; the split is by a hash of each text), "
                     f"and `minilmd train` needs a val split for its validation loss. --val-fraction {need} puts at "
                     f"least one {unit[:-1]} there")
