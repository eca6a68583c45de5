"""Reading a prepared corpus (or a tokenizer) that someone else can swap: `prepare --append` into a team directory
(--group-share), `prepare --tokenizer` from elsewhere, `corpus report` and the trainer on a corpus in a shared
place. Each file is read once, through what was checked (the locked directory's descriptor; the bytes checked
against meta.json), never again by its name; no link followed, no FIFO opened.

A swap between two steps is played in this process: a step of the code is wrapped (monkeypatch, a fake around
the real function) so that a teammate's rename happens exactly while it runs, and is undone after it, so that the
name leads back to the locked directory when it is checked again (as the audit's attack did)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_helpers import read_texts, run_prepare, write_jsonl
from minilmd.corpus import format as format_mod
from minilmd.corpus.analysis.report import report
from minilmd.corpus.format import RefusedFile, TokenStream, open_prepared, verify_prepared
from minilmd.corpus.prepare import append as append_mod
from minilmd.corpus.prepare import pipeline
from minilmd.corpus.prepare.append import append
from minilmd.corpus.prepare.options import PrepareTokenizer
from minilmd.corpus.prepare.pipeline import split_is_val
from minilmd.corpus_meta import CorpusError

VF = 0.05
SPLIT_FILES = ("train/tokens.bin", "train/doc_lengths.npy", "val/tokens.bin", "val/doc_lengths.npy")


def _swapping(real, victim: Path, his: Path):
    """`real`, wrapped: while it runs, the teammate's corpus `his` stands at the victim's name (the victim's
    renamed away), and the two are put back when it returns: the name leads to the locked directory again."""
    away = victim.with_name(victim.name + ".away")

    def swapped(*args, **kwargs):
        os.rename(victim, away)
        os.rename(his, victim)
        try:
            return real(*args, **kwargs)
        finally:
            os.rename(victim, his)
            os.rename(away, victim)
    return swapped


@pytest.mark.slow  # three prepares and two appends
@pytest.mark.parametrize("step", ["meta.json (open_prepared)", "the tokenizer", "the old documents' leak keys"])
def test_append_reads_the_locked_corpus_never_one_put_at_its_name(tmp_path, demo_jsonl, tokenizer, chat_tokenizer,
                                                                 monkeypatch, step):
    """A teammate renames the victim's corpus away, puts his own (smaller, another tokenizer) at its name while the
    append reads it, and puts the victim's back: the append must still be the one of the victim's corpus, byte for
    byte (before, his meta.json set where the victim's tokens.bin was cut: 208,310 -> 20,232 bytes, exit 0)."""
    texts = read_texts(demo_jsonl)[:300]
    old, new = texts[:200], texts[200:260]
    old_train = next(t for t in old if not split_is_val(t, VF))
    leak = next(v for v in (old_train + " " * k for k in range(1, 400)) if split_is_val(v, VF))
    a = write_jsonl(tmp_path / "a.jsonl", old)
    b = write_jsonl(tmp_path / "b.jsonl", [*new, leak])  # a new val document repeating an old train one
    victim, reference, his = tmp_path / "corpus", tmp_path / "reference", tmp_path / "his"
    run_prepare([a], tokenizer, victim, val_fraction=VF)
    shutil.copytree(victim, reference)
    run_prepare([write_jsonl(tmp_path / "h.jsonl", texts[260:300])], chat_tokenizer, his, val_fraction=0.2)
    before = (victim / "meta.json").read_bytes()
    undisturbed = append([str(b)], reference, workers=0, progress=False, log=lambda m: None)

    if step == "the tokenizer":
        real_load = PrepareTokenizer.load.__func__
        monkeypatch.setattr(PrepareTokenizer, "load", classmethod(_swapping(real_load, victim, his)))
    elif step == "the old documents' leak keys":
        monkeypatch.setattr(append_mod, "old_leak_keys", _swapping(append_mod.old_leak_keys, victim, his))
    else:
        monkeypatch.setattr(append_mod, "open_prepared", _swapping(append_mod.open_prepared, victim, his))
    meta = append([str(b)], victim, workers=0, progress=False, log=lambda m: None)

    assert [f for f in SPLIT_FILES if (victim / f).read_bytes() != (reference / f).read_bytes()] == []
    assert meta["splits"] == undisturbed["splits"] and meta["versions"][-1]["leaked_val_removed"] == 1
    assert meta["versions"][-1]["previous_meta_sha256"] == hashlib.sha256(before).hexdigest()
    assert verify_prepared(victim) == []


@pytest.mark.slow  # a prepare
def test_prepare_ships_the_tokenizer_it_encoded_with_even_when_the_file_is_swapped(tmp_path, demo_jsonl, tokenizer,
                                                                                  chat_tokenizer, monkeypatch):
    """`prepare --tokenizer T`: T is read once. Swapped for another tokenizer after it was loaded (before, the
    corpus was encoded with the first and shipped the second, and verify_prepared found nothing wrong), the corpus
    holds the very bytes its documents were encoded with."""
    mine = tmp_path / "tok" / "tokenizer.json"
    mine.parent.mkdir()
    shutil.copyfile(tokenizer, mine)
    first = mine.read_bytes()
    real_load = PrepareTokenizer.load.__func__

    def load_then_swap(cls, path, chat=False, **how):
        loaded = real_load(cls, path, chat, **how)
        mine.write_bytes((chat_tokenizer / "tokenizer.json").read_bytes())  # the file changes after the load
        return loaded

    monkeypatch.setattr(pipeline.PrepareTokenizer, "load", classmethod(load_then_swap))
    out = tmp_path / "corpus"
    run_prepare(demo_jsonl[:1], mine, out, val_fraction=0.1)
    assert (out / "tokenizer.json").read_bytes() == first
    assert open_prepared(out).tokenizer_fingerprint == hashlib.sha256(first).hexdigest()


def _fifo_holding(path: Path, data: bytes) -> int:
    """A FIFO at path with `data` waiting in it (a reader that opens it gets them, then would wait for more); the
    write end, which the caller closes."""
    path.unlink()
    os.mkfifo(path)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # a FIFO opened read-write never blocks (Linux)
    os.write(fd, data)
    return fd


def _planted(path, kind: str, fifo_holds: bytes, link_leads_to: bytes) -> int:
    """`path` replaced by `kind`: a FIFO holding `fifo_holds` (its writer's descriptor returned, for the caller to
    close), or a link to a file beside the corpus holding `link_leads_to` (-1 returned)."""
    if kind == "a FIFO":
        return _fifo_holding(path, fifo_holds)
    elsewhere = path.parent.parent.parent / "elsewhere.bin"
    elsewhere.write_bytes(link_leads_to)
    path.unlink()
    path.symlink_to(elsewhere)
    return -1


@pytest.mark.parametrize("name,kind", [("train/doc_lengths.npy", "a symbolic link"),
                                       ("train/doc_lengths.npy", "a FIFO"), ("val/tokens.bin", "a symbolic link")])
def test_report_reads_no_split_file_through_a_link_or_a_fifo(tmp_path, corpus, name, kind):
    """`corpus report` of a prepared corpus in a shared place: a split file that is a link (to anyone's file) or a
    FIFO (a report waited on it for ever) is refused, named, never opened. Here the link leads to the same bytes
    and the FIFO holds them, so only the refusal tells them apart from the real file."""
    damaged = tmp_path / "corpus"
    shutil.copytree(corpus[0], damaged)
    data = (damaged / name).read_bytes()
    fd = _planted(damaged / name, kind, data, data)
    try:
        with pytest.raises(CorpusError, match=f"{name}: unreadable \\({kind}\\)"):
            report(str(damaged), workers=0)
    finally:
        if fd >= 0:
            os.close(fd)


def test_prepared_corpus_reads_its_tokenizer_once_bounded_and_never_through_a_link(tmp_path, corpus):
    """The trainer's PreparedCorpus: tokenizer.json a link (to the same bytes elsewhere: before, followed and
    hashed, and read again by its name at every checkpoint) is refused, named."""
    damaged = tmp_path / "corpus"
    shutil.copytree(corpus[0], damaged)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes((damaged / "tokenizer.json").read_bytes())
    (damaged / "tokenizer.json").unlink()
    (damaged / "tokenizer.json").symlink_to(elsewhere)
    with pytest.raises(CorpusError, match="tokenizer.json: unreadable \\(a symbolic link\\)"):
        open_prepared(damaged)


@pytest.mark.slow  # the real trainer, 3 steps on CPU
def test_a_checkpoint_carries_the_tokenizer_checked_at_open_not_what_its_name_holds_later(tmp_path, corpus,
                                                                                        chat_tokenizer):
    """The standalone trainer on a corpus in a shared directory: the tokenizer every checkpoint carries is the one
    checked against meta.json's tokenizer_sha256 when the corpus was opened; the file swapped after (before: read
    again by its name at every save, never compared) changes nothing in it."""
    from minilmd.config import load_config
    from minilmd.trainer.loop import train as train_mod
    from minilmd.trainer.loop.distributed import init_distributed
    from trainer_corpus import write_config

    copy = tmp_path / "corpus"
    shutil.copytree(corpus[0], copy)
    checked = (copy / "tokenizer.json").read_bytes()
    cfg = load_config(write_config(tmp_path, (copy, corpus[1]), train={"max_steps": 3, "checkpoint_every": 3}))
    trainer = train_mod.Trainer(cfg, init_distributed(cfg))
    (copy / "tokenizer.json").write_bytes((chat_tokenizer / "tokenizer.json").read_bytes())  # once it is open
    assert trainer.train() == 0
    saved = sorted(Path(cfg.checkpoint_dir).glob("step-*/tokenizer.json"))
    assert saved and all(path.read_bytes() == checked for path in saved), saved


@pytest.mark.parametrize("name", ["train/doc_lengths.npy", "val/tokens.bin"])
def test_the_trainers_corpus_opens_no_split_file_through_a_link(tmp_path, corpus, name):
    """The standalone trainer (and `corpus verify`) on a corpus in a shared directory: a split file that is a link
    (here to the same bytes, so its size and contents pass) is refused, named, never followed."""
    damaged = tmp_path / "corpus"
    shutil.copytree(corpus[0], damaged)
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes((damaged / name).read_bytes())
    (damaged / name).unlink()
    (damaged / name).symlink_to(elsewhere)
    with pytest.raises(CorpusError, match=f"{name}: unreadable \\(a symbolic link\\)"):
        open_prepared(damaged)


# --- TokenStream: a split file's size and sha256 are those of the descriptor then read ----------------------------

def _his_version(name: str, mine: Path) -> bytes:
    """Another split file by `name`, of the same size, that every invariant of a split passes: a token inside
    document 0 changed (tokens.bin), documents 0 and 1 made one (doc_lengths.npy, the same tokens in all)."""
    if name.endswith("tokens.bin"):
        tokens = np.fromfile(mine, dtype="<u2")
        tokens[1] = 5 if tokens[1] != 5 else 6
        return tokens.tobytes()
    lengths = np.load(mine)
    merged = np.concatenate([[lengths[0] + lengths[1]], lengths[2:], [0]]).astype(lengths.dtype)
    buf = io.BytesIO()
    np.save(buf, merged[:-1])
    return buf.getvalue()


@pytest.mark.parametrize("name", ["train/tokens.bin", "train/doc_lengths.npy"])
def test_a_split_file_swapped_after_its_check_is_not_what_the_stream_reads(tmp_path, corpus, monkeypatch, name):
    """The trainer's TokenStream with verify_hash on a corpus in a shared place: a teammate swaps a split file for
    his own (valid) version the moment meta.json's sizes and sha256s were checked. Before, the check hashed the
    file by its name and the stream then opened the name again: it read his file, checked against nothing. Now
    the file is opened once and checked, read and mapped through that descriptor: the stream holds the bytes
    meta.json lists."""
    damaged = tmp_path / "corpus"
    shutil.copytree(corpus[0], damaged)
    mine = (damaged / name).read_bytes()
    his = tmp_path / "his"
    his.write_bytes(_his_version(name, damaged / name))
    checked = []
    real_check = format_mod.table_problems

    def check_then_swap(*args, **kwargs):
        problems = real_check(*args, **kwargs)
        checked.append(problems)
        os.replace(his, damaged / name)  # his file at the name, once it was checked
        return problems

    monkeypatch.setattr(format_mod, "table_problems", check_then_swap)
    stream = TokenStream(damaged / "train", verify_hash=True)
    assert checked == [[]] and (damaged / name).read_bytes() != mine  # checked whole, then swapped
    assert hashlib.sha256(mine).hexdigest() == json.loads((damaged / "meta.json").read_text())["files"][name]["sha256"]
    if name.endswith("tokens.bin"):
        assert np.asarray(stream.tokens).tobytes() == mine
    else:
        assert stream.doc_lengths.tobytes() == np.load(io.BytesIO(mine)).astype(np.int64).tobytes()


@pytest.mark.parametrize("name,kind", [("train/doc_lengths.npy", "a FIFO"), ("val/loss_mask.bin", "a FIFO"),
                                       ("val/loss_mask.bin", "a symbolic link"),
                                       ("train/tokens.bin", "a symbolic link")])
def test_a_link_or_a_fifo_at_a_split_name_is_refused_at_the_check_never_hashed(tmp_path, corpus, chat_corpus,
                                                                                name, kind):
    """A split file that is a FIFO (holding the file's bytes) or a link (to a file of the listed size but other
    bytes) is refused at meta.json's check as what it is, named: before, the check sized and hashed it by its name,
    through the link (a `sha256 mismatch` of the file it leads to), and a FIFO was `missing` (doc_lengths.npy) or
    `size 0` (loss_mask.bin)."""
    damaged = tmp_path / "corpus"
    shutil.copytree((chat_corpus if "loss_mask" in name else corpus)[0], damaged)
    data = (damaged / name).read_bytes()
    fd = _planted(damaged / name, kind, data, bytes(len(data)))  # a link leads to the listed size, other bytes
    try:
        with pytest.raises(RefusedFile, match=f"{name}: unreadable \\({kind}\\)"):
            TokenStream(damaged / name.split("/")[0], verify_hash=True)
    finally:
        if fd >= 0:
            os.close(fd)


# --- TokenStream: doc_lengths.npy read as prepare writes it, no further than meta.json lists (hostile8 F3) --------

def _grown_index(tmp_path: Path, corpus, extra: np.ndarray) -> Path:
    """A copy of the corpus whose train/doc_lengths.npy holds its true lengths then `extra` (in extra's dtype): longer
    than meta.json lists, as an append being published leaves it, which the reader reads the prefix of."""
    damaged = tmp_path / "corpus"
    shutil.copytree(corpus[0], damaged)
    index = damaged / "train" / "doc_lengths.npy"
    np.save(index, np.concatenate([np.load(index).astype(extra.dtype), extra]))
    return damaged


@pytest.mark.parametrize("dtype", ["int64", "int8", "uint32"])
def test_the_trainers_index_of_another_dtype_is_refused_naming_it(tmp_path, corpus, dtype):
    """An index of another dtype, longer than meta.json lists (so no size check caught it): before, read whole by
    np.load, whatever its size, and widened; now refused before a length is read, naming the file and its dtype."""
    damaged = _grown_index(tmp_path, corpus, np.full(100_000, 7, dtype))
    with pytest.raises(CorpusError, match=rf"train/doc_lengths.npy: holds {dtype} of shape .*not the 1-D int32"):
        TokenStream(damaged / "train")


def test_the_trainers_truncated_index_is_a_copy_to_finish_not_a_corpus_to_prepare_again(tmp_path, corpus):
    """An index grown by an append, its copy not finished: longer than meta.json lists (so meta.json's size check
    passes it on to the index's own), shorter than its header says. Before, "prepare it again" as for one of another
    dtype; now the copy is said incomplete, to wait for or copy again, as the reply count says it."""
    damaged = _grown_index(tmp_path, corpus, np.full(1000, 7, np.int32))
    index = damaged / "train" / "doc_lengths.npy"
    os.truncate(index, index.stat().st_size - 4)
    with pytest.raises(CorpusError, match="copy is incomplete") as refused:
        TokenStream(damaged / "train")
    assert "prepare it again" not in str(refused.value)


def _peak_of_opening(split: Path) -> tuple[TokenStream, int]:
    import tracemalloc

    tracemalloc.start()
    try:
        return TokenStream(split), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_trainers_index_is_read_no_further_than_meta_json_lists(tmp_path, corpus):
    """An index grown by 4 M lengths (16 MiB) past what meta.json lists: the stream reads the listed prefix only
    (before, np.load read the whole file first): opening it costs what opening the corpus as listed costs (meta.json
    read into a bounded buffer, ...), give or take an eighth of the index's size (a generous margin)."""
    _, listed_peak = _peak_of_opening(corpus[0] / "train")
    damaged = _grown_index(tmp_path, corpus, np.full(4 << 20, 7, np.int32))
    stream, peak = _peak_of_opening(damaged / "train")
    assert stream.n_docs == json.loads((damaged / "meta.json").read_text())["splits"]["train"]["documents"]
    assert peak < listed_peak + (damaged / "train" / "doc_lengths.npy").stat().st_size // 8, (peak, listed_peak)
