"""`minilmd prepare --format dpo` (issue 42; minilmd/corpus/prepare/dpo_encode.py, dpo_meta.py): MiniMind's
preference lines rendered as `--format chat` renders a conversation, the loss mask on each side's final reply, the
two sides of a pair adjacent in one split, bad pairs named at once, the pair figures in meta.json and the report,
and `corpus report`/`corpus count` on the result. Test data: real dialogs of chatterbot-corpus made into pairs
(chat_helpers.preference_pairs)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from chat_helpers import a, preference_pairs, read_conversations, s, u, write_chat_jsonl, write_jsonl
from minilmd.cli import app
from minilmd.corpus.format import open_prepared, verify_prepared
from minilmd.corpus.prepare.append import append
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.corpus.sources.jsonl import InputError
from minilmd.corpus_meta import CorpusError
from minilmd.protocol import EOS_ID
from minilmd.untrusted import sha256_regular


def _prepare(sources, tok_dir, out, data_format="dpo", **kw):
    kw = {"val_fraction": 0.0, "seq_len": 4096, "batch_size": 4, "workers": 0, "log": lambda m: None, **kw}
    return prepare([str(p) for p in sources], tok_dir, out, data_format=data_format, progress=False, **kw)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(x), int(y)) for x, y in edges.reshape(-1, 2)]


@pytest.fixture(scope="module")
def pairs(chat_jsonl) -> list[dict]:
    return preference_pairs(read_conversations(chat_jsonl))[:200]


@pytest.mark.slow  # two prepares of 400 conversations
def test_each_side_is_rendered_as_chat_renders_it_with_the_mask_on_its_final_reply(pairs, chat_tokenizer, tmp_path):
    multi = [p for p in pairs if len(p["chosen"]) > 2]
    assert len(multi) >= 10  # multi-turn dialogs: earlier replies are in the prompt, not under the mask
    src = write_jsonl(tmp_path / "p.jsonl", pairs)
    meta = _prepare([src], chat_tokenizer, tmp_path / "dpo")
    sides = [side for p in pairs for side in (p["chosen"], p["rejected"])]
    _prepare([write_chat_jsonl(tmp_path / "c.jsonl", sides)], chat_tokenizer, tmp_path / "chat", data_format="chat")
    dpo, chat = open_prepared(tmp_path / "dpo", verify_hash=True), open_prepared(tmp_path / "chat")
    assert dpo.data_format == "dpo" and meta["version"] == 3
    assert dpo.train.n_docs == chat.train.n_docs == 2 * len(pairs) and meta["splits"]["train"]["pairs"] == len(pairs)
    for d in range(dpo.train.n_docs):
        ids, mask = np.asarray(dpo.train.document(d)), np.asarray(dpo.train.document_mask(d))
        assert ids.tolist() == np.asarray(chat.train.document(d)).tolist()
        chat_runs = _runs(np.asarray(chat.train.document_mask(d)))
        assert _runs(mask) == chat_runs[-1:]  # the final reply's run, and only it
        assert ids[_runs(mask)[0][1] - 1] == EOS_ID
    for i in range(len(pairs)):  # the prompt, shared: the same tokens up to the replies
        c, r = (np.asarray(dpo.train.document(2 * i + k)) for k in (0, 1))
        start = _runs(np.asarray(dpo.train.document_mask(2 * i)))[0][0]
        assert start == _runs(np.asarray(dpo.train.document_mask(2 * i + 1)))[0][0]
        assert c[:start].tolist() == r[:start].tolist()
        assert c.tolist() != r.tolist()


@pytest.mark.slow  # a prepare of the whole pair corpus
def test_pairs_stay_adjacent_in_one_split_and_the_figures_are_the_files(dpo_corpus, dpo_jsonl):
    root, _ = dpo_corpus
    pc = open_prepared(root, verify_hash=True)
    meta = pc.meta
    lines = dpo_jsonl.read_text(encoding="utf-8").splitlines()
    assert pc.val.n_docs >= 2 * 40 and pc.train.n_docs > 2 * 500
    tok_decode = __import__("tokenizers").Tokenizer.from_file(str(pc.tokenizer_path)).decode
    for split, stream in (("train", pc.train), ("val", pc.val)):
        assert stream.n_docs % 2 == 0 and meta["dpo"][split]["pairs"] == stream.n_docs // 2
        prompt_lengths, replies = [], []
        for i in range(stream.n_docs // 2):
            c, r = (np.asarray(stream.document(2 * i + k)) for k in (0, 1))
            mc, mr = (np.asarray(stream.document_mask(2 * i + k)) for k in (0, 1))
            start = int(np.argmax(mc))
            assert start == int(np.argmax(mr)) and c[:start].tolist() == r[:start].tolist()
            prompt_lengths.append(start)
            replies.append((int(mc.sum()), int(mr.sum())))
        figures = meta["dpo"][split]
        assert figures["prompt"]["max"] == max(prompt_lengths)
        assert figures["prompt"]["tokens"] == sum(prompt_lengths)
        assert figures["chosen_reply"]["tokens"] == sum(c for c, _ in replies)
        assert figures["rejected_reply"]["tokens"] == sum(r for _, r in replies)
    assert "<think>" in tok_decode(np.asarray(pc.train.document(0)).tolist(), skip_special_tokens=False)
    kept = meta["splits"]["train"]["pairs"] + meta["splits"]["val"]["pairs"]
    d = meta["dpo"]
    assert kept + d["pairs_dropped_no_target"] + d["pairs_dropped_long"] + meta["leak_check"]["leaked_documents"] // 2 \
        == len(lines)
    assert d["pairs_cut"] > 0  # at seq_len 128 some multi-turn dialogs are cut
    assert meta["stats"]["duplicates"]["copies"] < kept // 20  # a pair's sides share a key: counted once a pair


def test_bad_pairs_are_all_named_at_once_and_nothing_is_written(tmp_path, chat_tokenizer):
    good = {"chosen": [u("你好"), a("你好！")], "rejected": [u("你好"), a("走开")]}
    bad = [
        ({"chosen": [u("问一"), a("答")], "rejected": [u("问二"), a("答")]}, "dpo_prompt_differs"),
        ({"conversations": [u("q"), a("a")]}, "chat_line"),  # another format's line, named as one
        ({"prompt": "q", "chosen": [u("q"), a("a")]}, "missing_chosen_rejected"),
        ({"chosen": [u("q"), a("a")], "rejected": [u("q")]}, "no_assistant_turn"),
        ({"chosen": [u("q"), a("a"), u("and?")], "rejected": [u("q"), a("b")]}, "dpo_no_final_reply"),
        ({"chosen": [u("q"), a("a")], "rejected": [u("q"), {"role": "robot", "content": "x"}]}, "unknown_role"),
        ({"chosen": [s("sys"), u("q"), a("a")], "rejected": [u("q"), a("b")]}, "dpo_prompt_differs"),
    ]
    src = write_jsonl(tmp_path / "p.jsonl", [good] * 3 + [obj for obj, _ in bad] + [good])
    with pytest.raises(InputError) as e:
        _prepare([src], chat_tokenizer, tmp_path / "out")
    said = str(e.value)
    for line, (_, reason) in enumerate(bad, start=4):
        assert f"p.jsonl:{line}: {reason.replace('_', ' ')}" in said, said
    assert "rejected: " in said  # the side is named
    assert not (tmp_path / "out").exists()
    meta = _prepare([src], chat_tokenizer, tmp_path / "skip", on_bad_line="skip")
    assert meta["splits"]["train"]["pairs"] == 4 and meta["bad_lines"]["total"] == len(bad)


def test_a_pair_is_cut_or_dropped_whole_and_the_report_says_so(tmp_path, chat_tokenizer):
    said: list[str] = []
    pairs = [{"chosen": [u("问"), a("短")], "rejected": [u("问"), a("长" * 200)]},        # rejected longer: cut
             {"chosen": [u("长" * 300), a("答")], "rejected": [u("长" * 300), a("不答")]},  # replies past the cut
             {"chosen": [u("你好"), a("你好！")], "rejected": [u("你好"), a("走开")]}]
    src = write_jsonl(tmp_path / "p.jsonl", pairs)
    meta = _prepare([src], chat_tokenizer, tmp_path / "cut", seq_len=64, log=said.append)
    pc = open_prepared(tmp_path / "cut")
    assert pc.train.n_docs == 4 and meta["dpo"]["pairs_cut"] == 1 and meta["dpo"]["pairs_dropped_no_target"] == 1
    assert len(pc.train.document(1)) == 64 and pc.train.document_mask(1)[-1] == 1  # cut inside its reply
    text = "\n".join(said)
    assert "train: 2 pairs; prompt tokens" in text
    assert "pairs: 1 cut at seq_len 64, 0 dropped as longer than it, 1 dropped as their final reply fell past the " \
           "cut" in text
    meta = _prepare([src], chat_tokenizer, tmp_path / "drop", seq_len=64, on_long="drop")
    assert meta["splits"]["train"]["pairs"] == 1 and meta["dpo"]["pairs_dropped_long"] == 2


def test_the_reader_refuses_a_split_of_an_odd_number_of_documents(tmp_path, dpo_corpus):
    """val without its last document, every file and figure of meta.json made to agree: only the pairing is off."""
    root = shutil.copytree(dpo_corpus[0], tmp_path / "c")
    val = root / "val"
    lengths = np.load(val / "doc_lengths.npy")
    keep = int(lengths[:-1].sum())
    np.save(val / "doc_lengths.npy", lengths[:-1])
    (val / "tokens.bin").write_bytes((val / "tokens.bin").read_bytes()[:2 * keep])
    mask = (val / "loss_mask.bin").read_bytes()[:keep]
    (val / "loss_mask.bin").write_bytes(mask)
    meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
    for name in ("doc_lengths.npy", "tokens.bin", "loss_mask.bin"):
        meta["files"][f"val/{name}"] = {"size": (val / name).stat().st_size, "sha256": sha256_regular(val / name)}
    meta["splits"]["val"].update(documents=int(lengths.size - 1), tokens=keep, target_tokens=sum(mask))
    (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CorpusError, match="documents are pairs"):
        open_prepared(root, verify_hash=True)
    assert verify_prepared(dpo_corpus[0]) == []


def test_a_preference_corpus_is_not_appended_to(tmp_path, dpo_corpus, dpo_jsonl):
    root = shutil.copytree(dpo_corpus[0], tmp_path / "c")
    with pytest.raises(ValueError, match="preference corpus"):
        append([str(dpo_jsonl)], root, workers=0, progress=False, log=lambda m: None)


def test_corpus_report_and_count_read_pairs(dpo_corpus, dpo_jsonl):
    runner = CliRunner()
    r = runner.invoke(app, ["corpus", "report", str(dpo_corpus[0]), "--workers", "0", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    meta = json.loads((dpo_corpus[0] / "meta.json").read_text(encoding="utf-8"))
    assert report["data_format"] == "dpo" and report["pairs"] == {s: meta["splits"][s]["pairs"] for s in ("train",
                                                                                                          "val")}
    text = runner.invoke(app, ["corpus", "report", str(dpo_corpus[0]), "--workers", "0"]).output
    assert f"preference pairs: train {meta['splits']['train']['pairs']:,}" in text
    raw = runner.invoke(app, ["corpus", "report", str(dpo_jsonl), "--workers", "0", "--json"])
    raw_report = json.loads(raw.output)
    assert raw_report["documents"] == len(dpo_jsonl.read_text(encoding="utf-8").splitlines())
    assert raw_report["bad_lines"] == 0
    refused = runner.invoke(app, ["corpus", "report", str(dpo_jsonl), "--params", "1000000", "--workers", "0"])
    assert refused.exit_code == 2 and "--format dpo" in " ".join(refused.output.split()), refused.output
    counted = runner.invoke(app, ["corpus", "count", "--json", "--workers", "0", "你好", str(dpo_corpus[0])])
    assert counted.exit_code == 0, counted.output
    assert json.loads(counted.output)["patterns"][0]["documents"] > 0


@pytest.mark.slow  # imports torch and the trainer
def test_the_trainer_trains_dpo_on_a_preference_corpus_and_cross_entropy_on_the_others(tmp_path, dpo_corpus):
    from minilmd.config import load_config
    from minilmd.trainer.loop.objective import build_objective
    from trainer_corpus import write_config

    cfg = load_config(write_config(tmp_path, dpo_corpus))
    assert build_objective(cfg, open_prepared(dpo_corpus[0]).data_format).name == "dpo"
    assert build_objective(cfg, "chat").name == "cross_entropy"


def test_demo_corpus_dpo_writes_the_pairs_the_tests_use_from_the_demo_chat_corpus(tmp_path):
    # the demo's DPO step reads these: each dialog's real reply chosen, another dialog's rejected, one prompt
    got = CliRunner().invoke(app, ["demo-corpus", "--dpo", str(tmp_path / "dpo"), "--max-docs", "40"])
    assert got.exit_code == 0, got.output
    assert got.output.split() == [str(tmp_path / "dpo" / "dpo_pairs.jsonl")]
    written = [json.loads(line) for line in (tmp_path / "dpo" / "dpo_pairs.jsonl").read_text("utf-8").splitlines()]
    assert CliRunner().invoke(app, ["demo-corpus", "--chat", str(tmp_path / "chat"), "--max-docs", "40"]).exit_code == 0
    chats = read_conversations(sorted((tmp_path / "chat").glob("chat_*.jsonl")))
    assert written == preference_pairs(chats) and 70 <= len(written) <= 80  # 40 dialogs of each language
    for pair in written:
        assert pair["chosen"][:-1] == pair["rejected"][:-1] and pair["chosen"][-1] != pair["rejected"][-1]
        assert pair["chosen"] in chats
    both = CliRunner().invoke(app, ["demo-corpus", "--dpo", "--chat", str(tmp_path / "x")])
    assert both.exit_code == 2 and "give one" in both.output


def test_same_replies_and_a_side_not_a_list_are_bad_lines_named_as_pairs(tmp_path, chat_tokenizer):
    good = {"chosen": [u("你好"), a("你好！")], "rejected": [u("你好"), a("走开")]}
    same = {"chosen": [u("问"), a("答")], "rejected": [u("问"), a("答")]}  # margin 0: ln 2 and no gradient, always
    text = {"chosen": "答", "rejected": [u("问"), a("答")]}
    empty = {"chosen": [u("问"), a("答")], "rejected": []}
    src = write_jsonl(tmp_path / "p.jsonl", [good, same, text, empty, good])
    with pytest.raises(InputError) as e:
        _prepare([src], chat_tokenizer, tmp_path / "out")
    said = " ".join(str(e.value).split())
    assert "p.jsonl:2: dpo same replies" in said, said
    assert "p.jsonl:3: dpo side not messages (chosen is a JSON str; a side is a list of messages)" in said, said
    assert "p.jsonl:4: dpo side not messages (rejected is an empty list" in said, said
    assert '"conversations"' not in said  # a DPO line has no such key
    meta = _prepare([src], chat_tokenizer, tmp_path / "skip", on_bad_line="skip")
    assert meta["splits"]["train"]["pairs"] == 2
    assert meta["bad_lines"]["by_reason"] == {"dpo_same_replies": 1, "dpo_side_not_messages": 2}


def _pair(i: int, prompt: str = "问") -> dict:
    return {"chosen": [u(f"{prompt} {i}"), a(f"好 {i}")], "rejected": [u(f"{prompt} {i}"), a(f"坏 {i}")]}


def _in_val(pair: dict, fraction: float) -> bool:
    from minilmd.corpus.prepare.block import split_is_val
    from minilmd.corpus.prepare.dpo_encode import pair_canonical

    return split_is_val(pair_canonical(pair["chosen"], pair["rejected"]), fraction)


def test_prepare_counts_a_preference_corpus_in_pairs_and_suggests_what_it_can_give(tmp_path, chat_tokenizer):
    """Each pair is two documents: the messages count pairs, and a val fraction's promise is capped by the corpus."""
    said: list[str] = []
    long = [_pair(i, "长" * 100) for i in range(5)]
    short = [p for p in map(_pair, range(200)) if not _in_val(p, 0.3)][:2]
    val_one = next(p for p in map(_pair, range(200, 400)) if _in_val(p, 0.3))
    src = write_jsonl(tmp_path / "p.jsonl", [*long, *short, val_one])
    meta = _prepare([src], chat_tokenizer, tmp_path / "drop", seq_len=40, on_long="drop", val_fraction=0.3,
                    log=said.append)
    assert meta["splits"]["train"]["pairs"] == 2 and meta["splits"]["val"]["pairs"] == 1
    text = "\n".join(said)
    assert "dropped: 5 pairs longer than seq_len 40 (--on-long drop)" in text, text
    assert "warning: val holds only 1 of 3 pairs (val fraction 0.3)" in text, text
    assert "--val-fraction 0.5 gives about 2 (the corpus holds only 3 pairs)" in text, text
    none_in_val = [p for p in map(_pair, range(200)) if not _in_val(p, 0.05)][:3]
    with pytest.raises(InputError) as e:
        _prepare([write_jsonl(tmp_path / "n.jsonl", none_in_val)], chat_tokenizer, tmp_path / "n", val_fraction=0.05)
    assert "none of the 3 pairs fell into val at --val-fraction 0.05 (about 0.15 expected" in str(e.value), e.value
    assert "puts at least one pair there" in str(e.value)
    with pytest.raises(InputError) as e:
        _prepare([write_jsonl(tmp_path / "l.jsonl", long)], chat_tokenizer, tmp_path / "l", seq_len=40, on_long="drop")
    assert "5 pairs dropped for length at --seq-len 40" in str(e.value), e.value
