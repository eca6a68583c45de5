"""`minilmd corpus report`, `minilmd corpus count` and `prepare --drop-scripts` (minilmd/corpus/analysis/scripts.py,
scan.py,
report.py, count.py): scripts by code point, shards that read every line exactly once, counts and reports that
agree between a JSONL file and the corpus prepared from it, and the line accounting of prepare."""
from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from data_helpers import read_texts, write_jsonl
from minilmd.cli import app
from minilmd.corpus.analysis import scan
from minilmd.corpus.analysis.count import count
from minilmd.corpus.analysis.report import CHINCHILLA_TOKENS_PER_PARAM, format_report, report
from minilmd.corpus.analysis.scripts import containing, dominant_of, parse_scripts, script_counts, script_matrix
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.corpus_meta import CorpusError
from minilmd.plan.model_budget import report_model
from trainer_corpus import write_config

EXTRA = ["Привет мир, это тест", "Γειά σου κόσμε", "我是阿里云开发的助手。", "我是阿里云开发的助手。",
         "こんにちは世界", "Hello world, plain Latin", "안녕하세요 세계", "مرحبا بالعالم", "ภาษาไทย ok", "12345 !!!"]
FOREIGN = re.compile("[\u0370-\u03ff\u0400-\u04ff]")  # Greek and Cyrillic, written out independently


def test_scripts_by_code_point():
    assert script_counts("Hello 世界 こんにちは 안녕 Привет Γειά مرحبا ภาษา 123 ,.;") == {
        "han": 2, "latin": 5, "kana": 5, "hangul": 2, "cyrillic": 6, "greek": 4, "arabic": 5, "other": 4}
    m = script_matrix(["中文 and more English words", "abc中", "中a", "!!! 123", "ภาษา"])
    # dominant: most characters; a tie goes to the first in SCRIPTS order (han before latin); -1: no letter
    assert dominant_of(m).tolist() == [1, 1, 0, -1, 7]
    assert containing(m, frozenset({"han"})).tolist() == [True, True, True, False, False]
    assert containing(m, frozenset()).tolist() == [False] * 5
    with pytest.raises(ValueError, match="unknown script.*klingon"):
        parse_scripts("greek,klingon")


def test_jsonl_shards_read_every_line_once(tmp_path):
    texts = [f"第{i}行 " + "字" * (i % 37) for i in range(500)]
    path = write_jsonl(tmp_path / "c.jsonl", texts)
    corpus = scan.open_corpus(str(path), parts=7, min_bytes=1)
    assert len(corpus.shards) == 7
    # shard edges fall inside lines: each line is read by the shard its first byte is in
    seen = [t for shard in corpus.shards for b in scan._jsonl_batches(shard) for t in b.texts]
    assert seen == texts


def test_byte_ranges_after_a_long_line_read_each_line_once(tmp_path):
    """jsonl.Source.items over byte ranges, with blocks smaller than some lines: a long line (read through in
    chunks) followed by short ones to the end of the file handed the short lines of the next range to this one too
    (a review's randomized check: lines read twice). Every cut of the file into two ranges reads each line once."""
    from minilmd.corpus.sources.jsonl import LongLine, Source

    lines = [b"x" * 40, b"a", b"b", b"c"]  # the long line's last chunk holds every line after it, to the end
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "c.jsonl"
    path.write_bytes(data)

    def read(start: int, end: int | None) -> list[bytes]:
        src = Source(str(path))
        try:
            out = []
            for item in src.items(8, start, end):
                out += [b"".join(item.chunks())] if isinstance(item, LongLine) else item[1].splitlines()
            return out
        finally:
            src.close()

    for cut in range(1, len(data)):
        assert read(0, cut) + read(cut, None) == lines, cut


def test_report_count_and_drop_scripts(tmp_path, demo_jsonl, tokenizer):
    texts = read_texts(demo_jsonl)[:200] + EXTRA
    src = write_jsonl(tmp_path / "mix.jsonl", texts)
    with open(src, "a", encoding="utf-8") as f:  # one long line (a block of 4 KiB below): streamed in pieces
        f.write(json.dumps({"text": "長" * 3000 + " Кириллица"}, ensure_ascii=False) + "\n\nnot json\n")
    long_text = "長" * 3000 + " Кириллица"
    all_texts = texts + [long_text]

    # count: literal and regex, JSONL against an independent loop over the texts
    r = count(str(src), ["阿里云", "我是"], workers=0)
    for p in r["patterns"]:
        assert p["occurrences"] == sum(t.count(p["pattern"]) for t in all_texts)
        assert p["documents"] == sum(p["pattern"] in t for t in all_texts) > 0
    assert r["documents"] == len(all_texts) and r["bad_lines"] == 1
    gz = tmp_path / "mix.jsonl.gz"  # a compressed file: one stream, the same counts
    gz.write_bytes(gzip.compress(src.read_bytes()))
    assert count(str(gz), ["阿里云", "我是"], workers=0)["patterns"] == r["patterns"]
    rx = count(str(src), ["我是.{0,3}阿里", "Привет|Γειά"], regex=True, workers=0)
    assert [p["occurrences"] for p in rx["patterns"]] == [2, 2]

    # prepare drops every document with a Greek or Cyrillic character, the long one too, and counts them
    out = tmp_path / "prep"
    meta = prepare([str(src)], tokenizer, out, val_fraction=0.05, workers=0, progress=False, block_bytes=4096,
                   on_bad_line="skip", drop_scripts=frozenset({"greek", "cyrillic"}), log=lambda m: None)
    dropped = sum(bool(FOREIGN.search(t)) for t in all_texts)
    assert dropped == 3 and meta["dropped_scripts"] == {"scripts": ["cyrillic", "greek"], "documents": 3}
    src_meta = meta["sources"][0]
    assert src_meta["lines"] == src_meta["documents"] + src_meta["blank_lines"] + src_meta["bad_lines"] + 3
    assert src_meta["documents"] == len(all_texts) - 3
    kept = [t for t in all_texts if not FOREIGN.search(t)]
    assert meta["stats"]["scripts"]["contains"].get("hangul") == 1
    assert "cyrillic" not in meta["stats"]["scripts"]["contains"]
    assert meta["stats"]["duplicates"]["copies"] == len(kept) - len({"".join(t.split()) for t in kept})

    # the prepared corpus reports and counts the same as the JSONL it holds (decoded by its own tokenizer)
    kept_src = write_jsonl(tmp_path / "kept.jsonl", kept)
    from_jsonl = report(str(kept_src), tokenizer=str(tokenizer), workers=0)
    from_prep = report(str(out), workers=0)
    for key in ("documents", "tokens", "lengths", "scripts", "duplicates"):
        assert from_jsonl[key] == from_prep[key], key
    assert from_prep["documents"] == len(kept)
    assert from_prep["duplicates"]["copies"] == len(kept) - len(set(kept)) == 1
    assert from_prep["scripts"]["dominant"]["none"] == 1  # "12345 !!!"
    model = report_model(from_prep, params=1000, config=None, budget_tokens=None)
    assert model["tokens_per_parameter"] == from_prep["train_tokens"] / 1000
    assert "dropped by --drop-scripts cyrillic,greek: 3 documents" in format_report(from_prep)
    assert count(str(out), ["阿里云"], workers=0)["patterns"][0]["occurrences"] == 2


@pytest.mark.slow  # builds the model (torch) to count its parameters independently of model_shapes
def test_cli_and_chinchilla(tmp_path, corpus):
    from minilmd.config import load_config
    from minilmd.trainer.model.minimind import MiniMindForCausalLM

    config = write_config(tmp_path, corpus, train={"max_steps": 100})
    cfg = load_config(config)
    params = sum(p.numel() for p in MiniMindForCausalLM(cfg.model).parameters())  # tied head: counted once
    runner = CliRunner()
    res = runner.invoke(app, ["corpus", "report", str(corpus[0]), "--config", str(config), "--json",
                              "--workers", "0"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)["model"]
    per_step = 64 * 4 * 2
    train_tokens = json.loads((Path(corpus[0]) / "meta.json").read_text())["splits"]["train"]["tokens"]
    assert m["parameters"] == params and m["chinchilla_tokens"] == CHINCHILLA_TOKENS_PER_PARAM * params
    assert m["budget_tokens"] == 100 * per_step and m["epochs"] == pytest.approx(100 * per_step / train_tokens)

    src = write_jsonl(tmp_path / "c.jsonl", ["我是OpenAI训练的", "干净的句子"])
    gate = runner.invoke(app, ["corpus", "count", "我是OpenAI", "我是通义", str(src), "--fail-if-found",
                               "--workers", "2"])  # worker processes (one shard here: a small file)
    assert gate.exit_code == 1 and re.search(r"我是OpenAI\s+1\s+1", gate.output), gate.output
    assert runner.invoke(app, ["corpus", "count", "--regex", "(", str(src)]).exit_code == 2
    assert runner.invoke(app, ["corpus", "count", "x", str(tmp_path / "missing.jsonl")]).exit_code == 2  # no data
    assert runner.invoke(app, ["corpus", "count", str(src)]).exit_code == 2

    # the worker pool: 7 shards over 2 processes, every occurrence counted once
    from minilmd.corpus.analysis.count import CountTask

    texts = [f"第{i}行 " + "字" * (i % 37) for i in range(500)]
    corpus7 = scan.open_corpus(str(write_jsonl(tmp_path / "s.jsonl", texts)), parts=7, min_bytes=1)
    parts = scan.run(corpus7, CountTask(["字", "行"]), workers=2)
    assert len(parts) == 7
    assert [sum(p.occurrences[i] for p in parts) for i in (0, 1)] == [sum(i % 37 for i in range(500)), 500]



def test_a_prepared_corpus_whose_tokenizer_is_a_fifo_is_refused_without_blocking(tmp_path, corpus):
    """`corpus report` of another user's prepared corpus: its tokenizer.json is read bounded, never opened if it
    is a FIFO nobody writes (the report blocked for ever) or a link (to /dev/zero: read until memory ran out)."""
    import shutil

    damaged = tmp_path / "corpus"
    shutil.copytree(corpus[0], damaged)
    (damaged / "tokenizer.json").unlink()
    os.mkfifo(damaged / "tokenizer.json")
    with pytest.raises(CorpusError, match="tokenizer.json cannot be read: a FIFO"):
        scan.open_corpus(str(damaged), parts=2)
    (damaged / "tokenizer.json").unlink()
    (damaged / "tokenizer.json").symlink_to("/dev/zero")
    with pytest.raises(CorpusError, match="tokenizer.json cannot be read: a symbolic link"):
        scan.open_corpus(str(damaged), parts=2)


def test_count_table_columns_align_by_display_width_with_cjk_patterns():
    from minilmd.corpus.analysis.count import display_width, format_count

    patterns = [{"pattern": p, "occurrences": o, "documents": d, "examples": []}
                for p, o, d in [("我是阿里云", 3, 2), ("ab", 12, 5), ("Ｆｕｌｌ", 1, 1)]]
    table = format_count({"corpus": "c.jsonl", "kind": "jsonl", "documents": 10, "bad_lines": 0,
                          "patterns": patterns}).splitlines()[1:]
    assert display_width("我是a") == 5 and display_width("Ｆ") == 2 and display_width("é") == 1
    # a terminal shows a CJK character two columns wide: every row is as wide, every number column starts at the
    # same column, the one after the widest pattern (10: "我是阿里云") and two spaces (issue 24)
    assert {display_width(row) for row in table} == {display_width(table[0])}
    for row, first in zip(table, ["pattern", "我是阿里云", "ab", "Ｆｕｌｌ"], strict=True):
        assert row.startswith(first)
        rest = row[len(first):]
        assert display_width(first) + len(rest) - len(rest.lstrip(" ")) == 10 + 2 + 12 - len(rest.split()[0]), row
