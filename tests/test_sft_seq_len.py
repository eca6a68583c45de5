"""An SFT run whose train.seq_len is shorter than the corpus was prepared at (minilmd/replycut.py, rowcount.py
replies_fit): a row keeps a conversation's first seq_len tokens, so the replies past them train nothing, and a
conversation whose replies all lie past them (a long system prompt: MiniMind's tool-call lines) trains nothing at
all. `run --check` and the trainer count it (exact; `run --check` samples the long conversations past a bound), warn
of any, and refuse (exit 2) past half of the reply tokens lost, naming the prepared --seq-len. The counts match a
count by hand over the corpus's masks. Before: `run --check` said OK and the trainer nothing (user7 #1)."""
from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from chat_helpers import prepared_chat, read_conversations, write_jsonl
from in_process import train_in_process
from minilmd import reply_check
from minilmd.cli import app
from minilmd.config import ConfigError, load_config
from minilmd.corpus.format import open_prepared
from minilmd.plan.bucketing import DocumentRows, check_replies_fit
from minilmd.plan.sampler_base import DataError
from minilmd.plan.samplers import make_sampler
from minilmd.probes import corpus_out_of_reach, load_checked, path_problems
from minilmd.protocol import EXIT_CONFIG
from minilmd.reply_check import replies_cut_warning
from minilmd.replycut import CorpusLies, chat_replies_cut, replies_cut, row_targets
from minilmd.rowcount import RepliesCut, replies_fit
from trainer_corpus import write_config

PREPARED_AT = 96
SYSTEM = "工具清单：" + "，".join(str(i) for i in range(1000, 1010))  # a long system prompt: its replies lie late


@pytest.fixture(scope="module")
def corpus(chat_jsonl, chat_tokenizer, tmp_path_factory) -> tuple:
    """(root, vocabulary) of 120 real conversations, a third of them behind a long system prompt, prepared at
    --seq-len 96."""
    out = tmp_path_factory.mktemp("sft96")
    conversations = read_conversations(chat_jsonl)[:120]
    lines = [{"conversations": ([{"role": "system", "content": SYSTEM}] if i % 3 == 0 else []) + c}
             for i, c in enumerate(conversations)]
    root = prepared_chat([write_jsonl(out / "c.jsonl", lines)], chat_tokenizer, out / "corpus", seq_len=PREPARED_AT,
                         val_fraction=0.1)
    return root, json.loads((root / "meta.json").read_text(encoding="utf-8"))["vocab_size"]


def _by_hand(root, seq_len: int) -> dict[str, tuple[int, int, int, int]]:
    """Per split: (conversations keeping no target in their first seq_len tokens, conversations, targets past them,
    targets)."""
    pc, out = open_prepared(root), {}
    for split, stream in (("train", pc.train), ("val", pc.val)):
        masks = [np.asarray(stream.document_mask(d)) for d in range(stream.n_docs)]
        out[split] = (sum(not m[1:seq_len].any() for m in masks), len(masks),
                      sum(int(m[seq_len:].sum()) for m in masks), sum(int(m.sum()) for m in masks))
    return out


def _listed(root, split: str) -> dict:
    """The split's table in the corpus's meta.json (its documents, tokens and target_tokens)."""
    return json.loads((root / "meta.json").read_text(encoding="utf-8"))["splits"][split]


def _config(tmp_path, corpus, name, seq_len):
    return write_config(tmp_path, corpus, name=name, train={"seq_len": seq_len, "micro_batch_size": 4,
                                                           "grad_accum": 1, "max_steps": 2})


def _refused_and_warned(root) -> tuple[int, int]:
    """A seq_len that loses more than half the train split's reply tokens, and one that leaves some conversation
    without any but loses less than half."""
    counts = {t: _by_hand(root, t) for t in range(8, PREPARED_AT, 4)}

    def share(t):
        return counts[t]["train"][2] / counts[t]["train"][3]
    refused = max(t for t in counts if share(t) > 0.5)
    warned = min(t for t in counts if share(t) < 0.5 and counts[t]["train"][0])
    return refused, warned


def test_the_count_matches_a_hand_count_and_the_trainer_refuses_or_warns(tmp_path, corpus, capsys):
    root = corpus[0]
    pc = open_prepared(root)
    refused, warned = _refused_and_warned(root)
    for seq_len in (refused, warned, PREPARED_AT):
        hand = _by_hand(root, seq_len)
        for split in ("train", "val"):
            cut = chat_replies_cut(root / split, seq_len, _listed(root, split), PREPARED_AT)  # run --check's: long ones
            assert (cut.without_reply, cut.items, cut.targets_lost, cut.targets) == hand[split]
            assert not cut.sampled
    assert _by_hand(root, warned)["train"][0] > 0  # the observation: conversations that train nothing
    sampled = chat_replies_cut(root / "train", warned, _listed(root, "train"), PREPARED_AT, limit=3)
    assert sampled.sampled and sampled.targets_lost > 0  # a bound on what is read: an estimate, said to be one

    def trainer_check(seq_len):  # what the trainer runs at its start, over its own rows
        cfg = load_config(_config(tmp_path, corpus, f"t{seq_len}", seq_len))
        sampler = make_sampler("bucketed", pc.train.tokens, pc.train.doc_starts, seq_len, 0, pc.train.loss_mask, 4)
        check_replies_fit(sampler, pc.val, pc.meta, cfg, warn=True)

    with pytest.raises(ConfigError) as e:
        trainer_check(refused)
    said = " ".join(str(e.value).split())
    assert f"train.seq_len = {refused} cuts" in said and f"raise train.seq_len to {PREPARED_AT}" in said, said
    train = _by_hand(root, refused)["train"]
    assert f"train: {train[0]:,} of {train[1]:,} conversations keep no reply token, {train[2]:,} of {train[3]:,}" \
        in said, said
    trainer_check(warned)
    out = " ".join(capsys.readouterr().out.split())
    assert f"minilmd train: warning: train.seq_len = {warned} cuts" in out, out
    trainer_check(PREPARED_AT)
    assert capsys.readouterr().out == ""


def test_the_rule_refuses_past_half_of_the_reply_tokens_and_warns_of_any():
    def fit(lost, total, without=0):
        return replies_fit({"train": RepliesCut(without, 100, lost, total)}, 64, 256)
    assert fit(0, 1000) == ("", "")
    assert fit(1, 1000)[1] and not fit(1, 1000)[0]
    assert fit(0, 1000, without=1)[1]  # a conversation left without a reply, however few tokens
    assert fit(500, 1000)[1] and not fit(500, 1000)[0]
    assert fit(501, 1000)[0] and "raise train.seq_len to 256, the --seq-len the corpus was prepared at" in \
        fit(501, 1000)[0]


@pytest.mark.slow  # two config checks with their storage probes, and a trainer process
def test_run_check_and_the_trainer_say_it(tmp_path, corpus):
    refused, warned = _refused_and_warned(corpus[0])
    runner = CliRunner()
    r = runner.invoke(app, ["run", "--check", str(_config(tmp_path, corpus, "short", refused))])
    assert r.exit_code == 2 and f"train.seq_len = {refused} cuts" in " ".join(r.output.split()), r.output
    w = runner.invoke(app, ["run", "--check", str(_config(tmp_path, corpus, "some", warned))])
    assert w.exit_code == 0 and f"note: train.seq_len = {warned} cuts" in " ".join(w.output.split()), w.output
    p = train_in_process(_config(tmp_path, corpus, "short", refused))
    assert p.returncode == EXIT_CONFIG and f"train.seq_len = {refused} cuts" in " ".join(p.stderr.split()), p.stderr


def test_the_rows_keep_each_documents_lost_targets_counted_as_by_hand(corpus):
    """The trainer's count comes from DocumentRows' one pass (targets_lost), not a second loop over the documents;
    row_targets, the one home of the rule, matches a per-document count, empty and exactly-seq_len documents too."""
    root = corpus[0]
    pc = open_prepared(root)
    for seq_len in (12, 40, PREPARED_AT):
        rows = DocumentRows(pc.train.tokens, pc.train.doc_starts, seq_len, pc.train.loss_mask)
        masks = [np.asarray(pc.train.document_mask(d)) for d in range(pc.train.n_docs)]
        assert rows.targets_lost.tolist() == [int(m[seq_len:].sum()) for m in masks]
        assert rows.n_targets.tolist() == [int(m[1:seq_len].sum()) for m in masks]
        hand = _by_hand(root, seq_len)["train"]
        cut = rows.replies_cut()
        assert (cut.without_reply, cut.items, cut.targets_lost, cut.targets) == hand and not cut.sampled
    rng = np.random.default_rng(0)
    lengths = np.array([0, 5, 8, 9, 0, 1, 30, 8, 0], np.int64)  # empty ones, at seq_len, past it, last one empty
    starts = np.concatenate([[0], np.cumsum(lengths)])
    mask = rng.integers(0, 2, int(starts[-1]), dtype=np.uint8)
    kept, lost = row_targets(mask, starts, 8)
    docs = [mask[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert kept.tolist() == [int(m[1:8].sum()) for m in docs] and lost.tolist() == [int(m[8:].sum()) for m in docs]


def test_val_cuts_alone_warn_and_the_train_split_decides():
    cut_val = {"train": RepliesCut(0, 100, 0, 1000), "val": RepliesCut(5, 10, 90, 100)}
    problem, warning = replies_fit(cut_val, 64, 256)
    assert not problem and "val: 5 of 10 conversations keep no reply token" in warning  # val only measures
    problem, _ = replies_fit({"train": RepliesCut(0, 100, 501, 1000), "val": RepliesCut(0, 10, 0, 100)}, 64, 256)
    assert problem  # 501 of train's 1000 lost: refused, though 501 of both splits' 1100 is less than half


def test_a_malformed_meta_is_said_not_an_attribute_error(tmp_path, corpus):
    pc = open_prepared(corpus[0])
    cfg = load_config(_config(tmp_path, corpus, "m", 40))
    sampler = make_sampler("bucketed", pc.train.tokens, pc.train.doc_starts, 40, 0, pc.train.loss_mask, 4)
    for chat in ("x", {"seq_len": "96"}, {"seq_len": 0}):
        with pytest.raises(DataError, match=r"gives chat.*not the positive --seq-len"):
            check_replies_fit(sampler, pc.val, {**pc.meta, "chat": chat}, cfg, warn=False)
        problem, _ = replies_cut(cfg, {**pc.meta, "chat": chat})
        assert "not the positive --seq-len" in problem, problem


def _lying_copy(tmp_path, root, lengths_of) -> Path:
    """A copy of the corpus whose train/doc_lengths.npy is lengths_of(the true lengths)."""
    copy = tmp_path / "lying"
    shutil.copytree(root, copy)
    index = copy / "train" / "doc_lengths.npy"
    np.save(index, lengths_of(np.load(index)))
    return copy


@pytest.mark.parametrize("lie", ["huge", "negative", "past_prepared", "short_sum"])
def test_an_index_that_lies_is_refused_with_words_never_read_by_it(tmp_path, corpus, monkeypatch, lie):
    """A damaged or hostile doc_lengths.npy sizes no read: before, 2**40 asked for a 1 TiB buffer (MemoryError,
    a thread traceback and a corpus "stalled")."""
    monkeypatch.setattr(reply_check, "_verdicts", {})
    def lengths_of(true):
        lied = true.copy()  # int32, as prepare writes it: a lie in its values, not in its dtype
        if lie == "huge":
            lied[-1] = 2 ** 31 - 1
        elif lie == "negative":
            lied[0] = -lied[0]
        elif lie == "past_prepared":
            lied[0], lied[1] = lied[:2].sum(), 0
        else:
            lied[-1] -= 1
        return lied
    root = _lying_copy(tmp_path, corpus[0], lengths_of)
    words = {"huge": "longer than the --seq-len 96", "negative": "tokens long", "past_prepared": "tokens long",
             "short_sum": "counts .* tokens in the train documents"}[lie]
    with pytest.raises(CorpusLies, match=words):
        chat_replies_cut(root / "train", 40, _listed(root, "train"), PREPARED_AT)
    cfg = load_config(_config(tmp_path, (root, corpus[1]), "lie", 40))
    problems = path_problems(cfg)
    assert any("doc_lengths.npy" in p and "not a corpus the trainer can read" in p for p in problems), problems


def test_a_slow_count_hides_no_other_corpus_problem(tmp_path, corpus, monkeypatch):
    """The count has its own bound: a count that does not answer leaves the vocabulary mismatch said, the corpus
    reachable, and ends in a note that the trainer counts at its start."""
    import minilmd.replycut as replycut

    release = threading.Event()
    monkeypatch.setattr(reply_check, "_verdicts", {})
    monkeypatch.setattr(reply_check, "COUNT_BOUND_S", 0.2)  # the count never answers: no wait of 5 s
    monkeypatch.setattr(replycut, "replies_cut", lambda cfg, meta, seen: (release.wait(120), ("", ""))[1])
    try:
        cfg = load_config(write_config(tmp_path, corpus, name="slow", train={"seq_len": 40},
                                       model={"vocab_size": corpus[1] + 1}))
        problems = path_problems(cfg)
        assert any("model.vocab_size" in p for p in problems), problems
        assert corpus_out_of_reach(cfg) == ""
        assert replies_cut_warning(cfg) == reply_check.not_counted()
    finally:
        release.set()


def test_a_count_that_fails_says_why_never_that_it_did_not_answer(tmp_path, corpus, monkeypatch):
    """A count that raises (a defect, a corpus no check foresaw) is a note naming the error, and the run starts; before,
    its thread died with a traceback and the note said the count had not answered within its bound."""
    import minilmd.replycut as replycut

    def broken(cfg, meta, seen):
        raise ValueError("a doc length of -3")
    monkeypatch.setattr(reply_check, "_verdicts", {})
    monkeypatch.setattr(reply_check, "_counts", {})
    monkeypatch.setattr(replycut, "replies_cut", broken)
    cfg = load_config(_config(tmp_path, corpus, "broken", 40))
    meta = json.loads((corpus[0] / "meta.json").read_text(encoding="utf-8"))
    problem, warning = reply_check.replies_verdict(cfg, meta)
    assert problem == "" and warning != reply_check.not_counted()
    assert "ValueError: a doc length of -3" in warning and reply_check.TRAINER_COUNTS in warning


def test_a_slow_count_is_waited_on_and_its_answer_kept_never_started_again(tmp_path, corpus, monkeypatch):
    """A count slower than its bound (slow, not stalled) is kept, its thread and its answer: the next ask (`run
    --check` asks for the problem, then for the note) waits on it, an ask at other settings starts no count beside it
    (one thread reads a corpus), and its answer, once come, is the verdict. Before: every ask after the bound started
    a count of its own, one more thread reading the share and one more bound waited."""
    import minilmd.replycut as replycut

    release, entered, started = threading.Event(), threading.Event(), []

    def slow(cfg, meta, seen):
        started.append(cfg.train.seq_len)
        entered.set()
        release.wait(120)
        return (f"refused at {cfg.train.seq_len}", "") if cfg.train.seq_len == 48 else ("", "counted")
    monkeypatch.setattr(reply_check, "_verdicts", {})
    monkeypatch.setattr(reply_check, "_counts", {})
    monkeypatch.setattr(reply_check, "COUNT_BOUND_S", 0.2)  # no answer before release
    monkeypatch.setattr(replycut, "replies_cut", slow)
    cfg, other = (load_config(_config(tmp_path, corpus, name, seq_len)) for name, seq_len in (("a", 40), ("b", 48)))
    meta = json.loads((corpus[0] / "meta.json").read_text(encoding="utf-8"))
    not_counted = ("", reply_check.not_counted())
    try:
        assert reply_check.replies_verdict(cfg, meta) == not_counted
        assert reply_check.replies_verdict(cfg, meta) == not_counted
        assert reply_check.replies_verdict(other, meta) == not_counted
        assert entered.wait(60) and started == [40]
    finally:
        release.set()
    (count,) = reply_check._counts.values()
    count.thread.join(60)
    monkeypatch.setattr(reply_check, "COUNT_BOUND_S", 60.0)  # the counts below answer: never a bound reached
    assert reply_check.replies_verdict(cfg, meta) == ("", "counted") and started == [40]
    # a count answering with a problem after the check's ask said "not counted" (the check passed): the note says
    # it was not counted, never nothing
    assert replies_cut_warning(other) == reply_check.not_counted() and started == [40, 48]


def test_run_check_counts_each_split_once_and_the_trainer_none(tmp_path, corpus, monkeypatch):
    """`run --check` asks for the problem and then the note: one count per split. The trainer's load counts no
    sample (its start counts exactly: DocumentRows)."""
    import minilmd.replycut as replycut

    counted, real = [], replycut.chat_replies_cut
    monkeypatch.setattr(reply_check, "_verdicts", {})
    monkeypatch.setattr(replycut, "chat_replies_cut", lambda split, *a, **k: (counted.append(Path(split).name),
                                                                              real(split, *a, **k))[1])
    warned = _refused_and_warned(corpus[0])[1]
    path = _config(tmp_path, corpus, "once", warned)
    r = CliRunner().invoke(app, ["run", "--check", str(path)])
    assert r.exit_code == 0 and f"note: train.seq_len = {warned} cuts" in " ".join(r.output.split()), r.output
    assert sorted(counted) == ["train", "val"]
    counted.clear()
    monkeypatch.setattr(reply_check, "_verdicts", {})
    load_checked(path, count_replies=False)
    assert counted == []


def _copy_of(tmp_path, corpus, name) -> tuple[Path, int]:
    copy = tmp_path / name
    shutil.copytree(corpus[0], copy)
    return copy, corpus[1]


def _after_the_clock_moves_past(path: Path, tmp_path: Path) -> None:
    """Return once a file written now gets a later ctime than `path`'s: a rewrite then changes its ctime, whatever
    the clock's granularity (an event waited on, not a sleep)."""
    tick = tmp_path / "tick"
    while True:
        tick.write_bytes(b"")
        if tick.stat().st_ctime_ns > path.stat().st_ctime_ns:
            return


@pytest.mark.parametrize("how", ["in_place_same_size_and_mtime", "renamed_over"])
def test_a_corpus_rewritten_under_the_same_meta_is_counted_again(tmp_path, corpus, monkeypatch, how):
    """The count is kept once a process (`run --check` asks twice) for the same meta.json and the same
    files: shards rewritten under an unchanged meta.json get a fresh count. Before, the cache was keyed on meta.json
    alone and gave the old corpus's count."""
    monkeypatch.setattr(reply_check, "_verdicts", {})
    root, vocab = _copy_of(tmp_path, corpus, "rewritten")
    warned = _refused_and_warned(root)[1]
    cfg = load_config(_config(tmp_path, (root, vocab), "rewritten", warned))
    meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
    before = reply_check.replies_verdict(cfg, meta)
    assert f"train.seq_len = {warned} cuts" in before[1] and reply_check.replies_verdict(cfg, meta) == before
    mask_path = root / "train" / "loss_mask.bin"
    mask = np.fromfile(mask_path, np.uint8)
    starts = np.concatenate([[0], np.cumsum(np.load(root / "train" / "doc_lengths.npy"))])
    other = np.ones_like(mask)
    other[starts[:-1]] = 0  # every token a target but each document's first: the same size, refused now
    assert not np.array_equal(other, mask)
    _after_the_clock_moves_past(mask_path, tmp_path)
    if how == "renamed_over":
        other.tofile(root / "train" / "loss_mask.new")
        os.replace(root / "train" / "loss_mask.new", mask_path)
    else:
        old = mask_path.stat()
        with open(mask_path, "r+b") as f:
            f.write(other.tobytes())
        os.utime(mask_path, ns=(old.st_atime_ns, old.st_mtime_ns))  # only ctime tells
        assert mask_path.stat().st_size == old.st_size and mask_path.stat().st_mtime_ns == old.st_mtime_ns
    assert json.loads((root / "meta.json").read_text(encoding="utf-8")) == meta
    after = reply_check.replies_verdict(cfg, meta)
    assert after == replies_cut(cfg, meta) and f"train.seq_len = {warned} cuts" in after[0], (before, after)


def _truncated(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


@pytest.mark.parametrize("damaged", ["loss_mask.bin", "doc_lengths.npy"])
def test_a_count_that_cannot_read_a_file_says_so_and_the_run_still_starts(tmp_path, corpus, monkeypatch, damaged):
    """A truncated file (a copy not finished, one being rewritten): `run --check` says in one line what it could not
    read and that the trainer counts exactly at its start, and passes; the launch's check passes too. Before: a
    truncated index said nothing, a truncated mask refused the run as a corpus whose files lie."""
    monkeypatch.setattr(reply_check, "_verdicts", {})
    root, vocab = _copy_of(tmp_path, corpus, "truncated")
    refused = _refused_and_warned(root)[0]  # counted, it would refuse: unread, the trainer decides
    _truncated(root / "train" / damaged)
    path = _config(tmp_path, (root, vocab), "truncated", refused)
    r = CliRunner().invoke(app, ["run", "--check", str(path)])
    said = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    notes = [line for line in r.output.splitlines() if "were not counted here" in line]
    assert len(notes) == 1 and f"train/{damaged}" in notes[0], r.output
    assert "the trainer counts them exactly at its start" in said, said
    load_checked(path)  # the launch's check: no ConfigError


@pytest.mark.fuse
def test_a_count_failing_with_eio_says_so_and_the_run_still_starts(faultfs, tmp_path, corpus, monkeypatch):
    """A share that fails reads (EIO, tests/faultfs.py): the count names the file and the error, never refuses."""
    monkeypatch.setattr(reply_check, "_verdicts", {})
    root = faultfs.root / "nfs" / "corpus"
    shutil.copytree(corpus[0], root)
    faultfs.fail_reads("*train/loss_mask.bin")
    path = _config(tmp_path, (root, corpus[1]), "eio", _refused_and_warned(corpus[0])[0])
    r = CliRunner().invoke(app, ["run", "--check", str(path)])
    said = " ".join(r.output.split())
    assert r.exit_code == 0 and "train/loss_mask.bin: Input/output error" in said, r.output
    assert faultfs.hits("error", "read")
    load_checked(path)
