"""Deeply nested JSON in corpus lines (issue 21): json.loads recurses once per level, so a line of 100,000 `[`
raised RecursionError, which escaped every reader's `except ValueError` and gave a traceback even with
`--on-bad-line skip`. Every reader now parses with jsonl.loads_bounded: such a line is `invalid_json`, named (exit
65) or counted and skipped, in prepare (text and chat, whole lines and streamed long ones), `tokenizer train` and
`corpus report` / `corpus count`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.corpus.sources.jsonl import MAX_JSON_DEPTH, loads_bounded
from minilmd.corpus.sources.longdoc import parse_chunks

DEEP = {"list": "[" * 100_000, "object": '{"a":' * 100_000}
GOOD_TEXTS = [f"第{i}行 good line number {i}" for i in range(40)]


def text_corpus(path: Path, deep: str) -> Path:
    lines = [json.dumps({"text": t}, ensure_ascii=False) for t in GOOD_TEXTS]
    lines.insert(7, deep)  # line 8
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def chat_corpus(path: Path, deep: str) -> Path:
    lines = [json.dumps({"conversations": [{"role": "user", "content": f"问题 {i}"},
                                           {"role": "assistant", "content": f"回答 {i}"}]}, ensure_ascii=False)
             for i in range(40)]
    lines.insert(7, deep)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_loads_bounded_refuses_depth_beyond_the_bound_only():
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_bounded(ok) == json.loads(ok)
    with pytest.raises(ValueError, match="nested deeper"):
        loads_bounded("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    # brackets inside strings are text, not depth; bytes are decoded as json.loads does
    many = json.dumps({"text": "[{" * 10_000, "k": [[1]]})
    assert loads_bounded(many) == json.loads(many)
    assert loads_bounded(many.encode("utf-8")) == json.loads(many)
    with pytest.raises(ValueError):
        loads_bounded(DEEP["object"])


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_a_streamed_deep_line_is_invalid_json_as_a_whole_one(kind):
    verdict = parse_chunks([DEEP[kind].encode()[i:i + 4096] for i in range(0, 100_000 * 5, 4096)],
                           lambda _: None, lambda: None)
    assert verdict.bad is not None and verdict.bad[0] == "invalid_json" and "nested deeper" in verdict.bad[1]


def _prepare_names_or_skips_line_8(tmp_path: Path, base: list[str]) -> dict:
    """`prepare` (its command line `base`, without --out) of a corpus whose line 8 is nested too deep: it names the
    line (exit 65), and with --on-bad-line skip counts it as invalid_json; the skipping prepare's meta.json."""
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "a")])
    assert r.exit_code == 65, r.output
    assert "c.jsonl:8: invalid json (nested deeper" in r.output
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "b"), "--on-bad-line", "skip"])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta["bad_lines"]["by_reason"] == {"invalid_json": 1}
    return meta


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_prepare_text_names_or_skips_a_deep_line(tmp_path, tokenizer, kind):
    src = text_corpus(tmp_path / "c.jsonl", DEEP[kind])
    base = ["prepare", str(src), "--tokenizer", str(tokenizer), "--val-fraction", "0", "--workers", "0"]
    meta = _prepare_names_or_skips_line_8(tmp_path, base)
    assert meta["splits"]["train"]["documents"] == len(GOOD_TEXTS)


def test_prepare_text_skips_a_deep_line_streamed_as_a_long_line(tmp_path, tokenizer):
    src = text_corpus(tmp_path / "c.jsonl", DEEP["list"])  # longer than a block of 4 KiB: parsed as it streams
    meta = prepare([str(src)], tokenizer, tmp_path / "b", val_fraction=0, workers=0, on_bad_line="skip",
                   block_bytes=4096, progress=False)
    assert meta["bad_lines"]["by_reason"] == {"invalid_json": 1}


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_prepare_chat_names_or_skips_a_deep_line(tmp_path, chat_tokenizer, kind):
    src = chat_corpus(tmp_path / "c.jsonl", DEEP[kind])
    base = ["prepare", str(src), "--tokenizer", str(chat_tokenizer / "tokenizer.json"), "--format", "chat",
            "--val-fraction", "0", "--workers", "0"]
    _prepare_names_or_skips_line_8(tmp_path, base)


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_tokenizer_train_names_or_skips_a_deep_line(tmp_path, kind):
    src = text_corpus(tmp_path / "c.jsonl", DEEP[kind])
    r = CliRunner().invoke(app, ["tokenizer", "train", str(src), "--out", str(tmp_path / "a.json"),
                                 "--vocab-size", "300"])
    assert r.exit_code == 65, r.output
    assert "c.jsonl:8: invalid json (nested deeper" in r.output
    r = CliRunner().invoke(app, ["tokenizer", "train", str(src), "--out", str(tmp_path / "b.json"),
                                 "--vocab-size", "300", "--on-bad-line", "skip"])
    assert r.exit_code == 0, r.output
    assert "bad lines skipped by this run (invalid json: 1):" in r.output and (tmp_path / "b.json").is_file()


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_corpus_report_and_count_count_a_deep_line_as_bad(tmp_path, kind):
    src = text_corpus(tmp_path / "c.jsonl", DEEP[kind])
    r = CliRunner().invoke(app, ["corpus", "report", str(src), "--json", "--workers", "0"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["bad_lines"] == 1 and report["documents"] == len(GOOD_TEXTS)
    r = CliRunner().invoke(app, ["corpus", "count", "good", str(src), "--json", "--workers", "0"])
    assert r.exit_code == 0, r.output
    counts = json.loads(r.stdout)
    assert counts["bad_lines"] == 1 and counts["patterns"][0]["documents"] == len(GOOD_TEXTS)
