"""An audit of corpus preparation for the two promises: it finishes unattended (a clear error on a failed read or
write, nothing lost, a re-run that works) and it harms no one (no blocking open of a FIFO source, no link followed
into somebody's file, no line held whole however long). Each test failed before its fix."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from data_helpers import no_leftovers, read_texts, run_prepare, write_jsonl
from minilmd.corpus.format import open_prepared
from minilmd.corpus.sources import jsonl, train_texts

CLI = [sys.executable, "-m", "minilmd.cli"]


@pytest.mark.parametrize("command", ["prepare", "corpus report", "tokenizer train"])
def test_a_fifo_named_as_a_source_is_refused_not_waited_on(tmp_path, tokenizer, command):
    """Before, the open of a FIFO nobody writes (planted in a shared directory, or named by mistake) blocked for
    good: the prepare hung with its lock held. Now it is refused at once, exit 2 (a bad argument, as a source that
    is not there: tests/test_source_not_opened.py), naming what it is."""
    fifo = tmp_path / "planted.jsonl"
    os.mkfifo(fifo)
    argv = {"prepare": ["prepare", str(fifo), "--tokenizer", str(tokenizer), "--out", str(tmp_path / "c"),
                        "--workers", "0"],
            "corpus report": ["corpus", "report", str(fifo), "--workers", "0"],
            "tokenizer train": ["tokenizer", "train", str(fifo), "--out", str(tmp_path / "t" / "tokenizer.json")],
            }[command]
    done = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"{fifo}: cannot open (a FIFO, not a regular file" in done.stderr
    assert no_leftovers(tmp_path / "c")


def _file_size_limit(limit: int):
    def apply() -> None:  # in the child: a write past `limit` bytes fails with EFBIG, as a full disk fails one
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_write_error_on_the_output_is_one_line_exit_74_and_a_rerun_works(tmp_path, demo_jsonl, tokenizer):
    """Before, a write that failed (here EFBIG from a file size limit, as ENOSPC on a full disk) ended in a
    traceback with exit 1. Now: one line naming the error, exit 74, nothing left beside --out, and the same
    command run again (the disk freed) makes the corpus."""
    source = write_jsonl(tmp_path / "s.jsonl", read_texts(demo_jsonl) * 3)
    out = tmp_path / "c"
    argv = [*CLI, "prepare", str(source), "--tokenizer", str(tokenizer), "--out", str(out), "--workers", "0",
            "--val-fraction", "0.1"]
    failed = subprocess.run(argv, capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit(50_000))
    assert failed.returncode == 74, failed.stderr
    assert f"prepare: cannot write in {out}: File too large" in failed.stderr and "nothing written" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert no_leftovers(out)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    open_prepared(out, verify_hash=True)


@pytest.mark.parametrize("swap", ["a file system that swaps", "one that cannot (NFS)"])
def test_force_whose_final_rename_fails_keeps_the_old_corpus_in_place(tmp_path, demo_jsonl, tokenizer, monkeypatch,
                                                                      swap):
    """Before, `--force` moved the old corpus aside, then renamed the new one in: a failure (or a SIGTERM, or a
    SIGKILL) between the two left --out missing, and the next prepare deleted the aside as a dead prepare's
    leftover. Now the two are swapped in one step, or the old one is put back."""
    from minilmd.dirfd import Dir

    out = tmp_path / "c"
    run_prepare(demo_jsonl[:1], tokenizer, out, val_fraction=0.1)
    before = (out / "meta.json").read_text()
    real_rename = os.rename

    def rename(src, dst, **kw):
        # renames in --out's directory go through its descriptor (minilmd/dirfd.py): names relative to it
        if Path(dst).name == out.name and Path(src).name.startswith(".c.prepare-") and \
                not Path(src).name.endswith(".old"):
            raise OSError(5, "Input/output error")  # the new corpus's rename into place fails
        return real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "rename", rename)
    if swap != "a file system that swaps":
        monkeypatch.setattr(Dir, "exchange", lambda self, a, b: False)
        with pytest.raises(OSError, match="Input/output error"):
            run_prepare(demo_jsonl[1:], tokenizer, out, val_fraction=0.1, force=True)
        assert (out / "meta.json").read_text() == before
    else:
        run_prepare(demo_jsonl[1:], tokenizer, out, val_fraction=0.1, force=True)
        assert json.loads((out / "meta.json").read_text())["sources"][0]["path"] == demo_jsonl[1]
    open_prepared(out, verify_hash=True)
    assert not list(tmp_path.glob(".c.*"))


def test_tokenizer_training_holds_only_the_beginning_of_a_huge_line(tmp_path, monkeypatch):
    """Before, `tokenizer train` joined a line longer than a block into one string: a 2 GB line held whole (and
    copied again by the tokenizers library). Now it takes the first TRAIN_TEXT_CHARS characters of it; the line
    is still judged whole (a bad one is still bad)."""
    monkeypatch.setattr(train_texts, "TRAIN_TEXT_CHARS", 1000)
    huge = "字 " * 800_000  # 2.4 MB of UTF-8: longer than a block, so streamed as a LongLine
    source = write_jsonl(tmp_path / "s.jsonl", ["short one", huge, "short two"])
    texts = list(train_texts.iter_texts([str(source)]))
    assert texts[0] == "short one" and texts[2] == "short two"
    assert texts[1] == huge[:1000]
    with open(source, "a", encoding="utf-8") as f:
        f.write('{"text": "' + "x" * 2_000_000 + '"\n')  # unterminated: still a bad line
    with pytest.raises(jsonl.InputError, match=":4: invalid json"):
        list(train_texts.iter_texts([str(source)]))


def test_tokenizer_train_replaces_a_link_at_out_and_never_writes_through_it(tmp_path, demo_jsonl):
    """Before, the tokenizer (and its tokenizer_config.json) were written through a link at --out into the file it
    leads to (another user's, planted in a shared directory). Now a temporary file is renamed over the link."""
    victim = tmp_path / "victims-notes.txt"
    victim.write_text("not yours\n")
    outdir = tmp_path / "shared"
    outdir.mkdir()
    (outdir / "tokenizer.json").symlink_to(victim)
    (outdir / "tokenizer_config.json").symlink_to(victim)
    done = subprocess.run([*CLI, "tokenizer", "train", demo_jsonl[0], "--out", str(outdir / "tokenizer.json"),
                           "--vocab-size", "300", "--chat-template", "minimind", "--force"],
                          capture_output=True, text=True, timeout=300)  # without --force: refused, exit 2
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "not yours\n"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert not (outdir / name).is_symlink() and json.loads((outdir / name).read_text())
    assert sorted(p.name for p in outdir.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
