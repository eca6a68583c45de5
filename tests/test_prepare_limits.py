"""`minilmd prepare` on documents too long to hold (a 50 MB book on one line): streamed in pieces, with memory
bounded whatever the document's size, and the same corpus as when each line is held whole.

Lines longer than a block (block_bytes) take the streamed path; a small block_bytes sends ordinary lines there
too, so the two paths can be compared on the same input. The memory bound is shown with a real memory cgroup
that the old whole-line path does not fit in (a real OOM kill), not with a timing.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from data_helpers import decoded_documents, read_texts, run_prepare, write_jsonl
from minilmd.corpus.format import open_prepared
from minilmd.corpus.prepare.pipeline import split_is_val
from minilmd.corpus.sources.jsonl import InputError
from minilmd.corpus.sources.longdoc import PIECE_CHARS, split_pieces
from minilmd.corpus.tokenizer_train import load_tokenizer

BLOCK = 4096  # a block smaller than many demo lines: those are streamed


def long_texts(demo_jsonl, n: int, chars: int) -> list[str]:
    """n documents of about `chars` characters of real text: demo documents joined by newlines."""
    texts, out = read_texts(demo_jsonl), []
    for k in range(n):
        parts, size, i = [], 0, k * 97
        while size < chars:
            parts.append(texts[i % len(texts)])
            size += len(parts[-1]) + 1
            i += 1
        out.append("\n".join(parts))
    return out


@pytest.mark.slow
def test_streamed_lines_give_the_corpus_of_whole_lines(tmp_path, demo_jsonl, tokenizer):
    texts = read_texts(demo_jsonl)[:400] + long_texts(demo_jsonl, 3, 20_000)  # 3 lines of ~60 kB
    src = write_jsonl(tmp_path / "c.jsonl", texts)
    whole, _ = run_prepare([src], tokenizer, tmp_path / "whole", val_fraction=0.1)
    streamed, _ = run_prepare([src], tokenizer, tmp_path / "streamed", val_fraction=0.1, block_bytes=BLOCK)
    pool, _ = run_prepare([src], tokenizer, tmp_path / "pool", val_fraction=0.1, block_bytes=BLOCK, workers=2)
    assert whole["files"] == streamed["files"] == pool["files"]
    assert whole["sources"] == streamed["sources"] and whole["stats"] == streamed["stats"]
    pc = open_prepared(tmp_path / "streamed", verify_hash=True)
    tok = load_tokenizer(pc.tokenizer_path)
    assert decoded_documents(pc.train, tok) == [t for t in texts if not split_is_val(t, 0.1)]
    assert decoded_documents(pc.val, tok) == [t for t in texts if split_is_val(t, 0.1)]
    assert not list((tmp_path / "streamed").rglob("long-document*"))


LONG_BAD = {  # each a line longer than BLOCK; reason as parse_block gives it for the same line
    "invalid_json": b'{"text": "' + "很长的一行".encode() * 2000 + b'"',
    "invalid_utf8": b'{"text": "' + b"x" * 9000 + b'\xff"}',
    "missing_text": b'{"content": "' + b"y" * 9000 + b'"}',
    "text_not_string": b'{"text": [' + b"1, " * 3000 + b'1]}',
    "empty_text": b'{"text": "' + b" " * 9000 + b'"}',
}


@pytest.mark.parametrize("reason", sorted(LONG_BAD))
def test_a_streamed_bad_line_is_named_or_skipped_like_any_other(tmp_path, tokenizer, reason):
    good = [json.dumps({"text": f"第{i}篇短文"}, ensure_ascii=False).encode() for i in range(40)]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(good[:3] + [LONG_BAD[reason]] + good[3:]) + b"\n")
    with pytest.raises(InputError, match=f"{src}:4: {reason.replace('_', ' ')}"):
        run_prepare([src], tokenizer, tmp_path / "out", block_bytes=BLOCK, val_fraction=0.2)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    meta, _ = run_prepare([src], tokenizer, tmp_path / "out", block_bytes=BLOCK, val_fraction=0.2,
                          on_bad_line="skip")
    assert meta["bad_lines"]["by_reason"] == {reason: 1}
    assert meta["sources"][0] | {"path": None} == {"path": None, "bytes": src.stat().st_size, "lines": 41,
                                                   "documents": 40, "blank_lines": 0, "bad_lines": 1}


def test_a_streamed_line_with_text_twice_keeps_the_last_as_json_does(tmp_path, tokenizer):
    first, last = "第一个文本。" * 2000, "最后的文本才算数。" * 2000
    line = json.dumps({"text": first, "meta": "x" * 5000, "text": last}, ensure_ascii=False)  # noqa: F601
    assert json.loads(line)["text"] == last
    fillers = [f"另一篇 {i}" for i in range(40)]
    src = tmp_path / "dup.jsonl"
    src.write_text("\n".join([line, " " * 9000] + [json.dumps({"text": t}, ensure_ascii=False) for t in fillers])
                   + "\n", encoding="utf-8")
    meta, _ = run_prepare([src], tokenizer, tmp_path / "out", block_bytes=BLOCK, val_fraction=0.2)
    pc = open_prepared(tmp_path / "out")
    docs = decoded_documents(pc.train, load_tokenizer(pc.tokenizer_path)) + decoded_documents(
        pc.val, load_tokenizer(pc.tokenizer_path))
    assert last in docs and first not in docs
    assert meta["sources"][0]["blank_lines"] == 1 and meta["sources"][0]["documents"] == 41


@pytest.mark.slow
def test_a_document_longer_than_a_piece_tokenizes_as_the_whole_text(tmp_path, demo_jsonl, tokenizer):
    (big,) = long_texts(demo_jsonl, 1, int(2.5 * PIECE_CHARS))
    pieces = split_pieces(big)
    assert len(pieces) == 3
    texts = read_texts(demo_jsonl)[:300] + [big]
    src = write_jsonl(tmp_path / "c.jsonl", texts)
    whole, _ = run_prepare([src], tokenizer, tmp_path / "whole", val_fraction=0.1)  # in a block, cut in pieces
    streamed, _ = run_prepare([src], tokenizer, tmp_path / "streamed", val_fraction=0.1, workers=2)  # streamed
    assert whole["files"] == streamed["files"]
    pc = open_prepared(tmp_path / "streamed")
    tok = load_tokenizer(pc.tokenizer_path)
    split = pc.val if split_is_val(big, 0.1) else pc.train
    doc = [int(i) for i in split.document(split.n_docs - 1)[1:-1]]  # big is the last text: its split's last one
    assert doc == tok.encode(big, add_special_tokens=False).ids  # the cuts are pre-tokenizer boundaries


# --- memory ------------------------------------------------------------------------------------------------------
LIMIT = 1 << 30
"""The memory cgroup's limit: ample for prepare's bounded pipeline, far below what holding a 24 MB line took (its
text, the tokenizer's working copy of it and its ids: about 100 bytes per byte of the line, 2.4 GB here)."""


def one_long_line_corpus(path: Path, demo_jsonl, mb: float) -> Path:
    texts = read_texts(demo_jsonl)
    (big,) = long_texts(demo_jsonl, 1, int(mb * 1e6 / 3))  # ~3 bytes per Chinese character
    return write_jsonl(path, texts[:300] + [big] + texts[300:600])


@pytest.mark.slow
@pytest.mark.root
def test_a_24_mb_document_fits_in_a_memory_cgroup_the_whole_line_path_would_not(tmp_path, demo_jsonl,
                                                                                   memory_cgroup):
    tokenizer = Path(__file__).resolve().parents[1] / ".." / "shared" / "minimind-tokenizer" / "tokenizer.json"
    if not tokenizer.is_file():
        pytest.skip(f"{tokenizer}: MiniMind's tokenizer is not there")
    src = one_long_line_corpus(tmp_path / "long.jsonl", demo_jsonl, 24)
    group = memory_cgroup(LIMIT)
    prepare_cmd = [sys.executable, "-m", "minilmd.cli", "prepare", str(src), "--tokenizer", str(tokenizer), "--out",
                   str(tmp_path / "out"), "--workers", "2", "--val-fraction", "0.05"]
    # a wrapper whose only child is prepare: its RUSAGE_CHILDREN maxrss is the largest of prepare and its workers
    wrapper = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", wrapper, *prepare_cmd], capture_output=True, text=True,
                          timeout=600, preexec_fn=group.preexec_fn)
    assert group.oom_kills() == 0 and done.returncode == 0, done.stderr[-3000:]
    largest_kib = int(done.stdout.split()[-1])
    assert largest_kib < 400 * 1024, f"a prepare process peaked at {largest_kib / 1024:.0f} MiB"
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["stats"]["train"]["lengths"]["max"] > 5_000_000 or meta["stats"]["val"]["lengths"]["max"] > 5_000_000
