"""`minilmd tokenizer train` shows that it moves without a terminal too (found by a new user: 31 s of silence on
30 MB under nohup, tmux's log, a unit's journal: the tokenizers library's bars were its only progress, and they
draw on a terminal alone). Off a terminal it says, on stderr, what `prepare` says (one home:
minilmd/corpus/progress.py): its reading as prepare's plain progress line, every 10 s and at its end, then the
training phase, and how long it has run every 10 s after."""
from __future__ import annotations

import io
import re
import subprocess
import sys
import threading

from data_helpers import write_jsonl
from minilmd.corpus.progress import Progress
from minilmd.corpus.sources.train_texts import iter_texts
from waiting import wait_until

READ_TO_THE_END = re.compile(r"tokenizer train: 100\.0% [0-9.]+/[0-9.]+ MB .* 300 docs$", re.M)


def test_tokenizer_train_off_a_terminal_says_its_reading_and_its_training_on_stderr(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [f"line {i}: 一段文字 and some words {i * 7}" for i in range(300)])
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "tokenizer", "train", str(src), "--vocab-size",
                           "300", "--out", str(tmp_path / "tok.json")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert READ_TO_THE_END.search(done.stderr), done.stderr  # before: nothing at all on stderr
    assert "tokenizer train: training the BPE (--vocab-size 300)\n" in done.stderr, done.stderr
    assert done.stdout.strip() == f"wrote {tmp_path / 'tok.json'}: vocabulary of 300"  # no empty lines either


class _Lines(io.StringIO):
    """A stderr that a phase's thread writes to while the test reads it."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)

    def said(self) -> str:
        with self.lock:
            return self.getvalue()


def test_the_reading_is_said_as_prepare_says_it_with_documents_and_no_tokens(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [f"document {i}" for i in range(50)])
    err = _Lines()
    progress = Progress(0, stream=err, tty=False, interval=0, name="tokenizer train")
    assert len(list(iter_texts([str(src)], progress=progress))) == 50
    last = err.said().splitlines()[-1]
    assert last.startswith("tokenizer train: 100.0% ") and "MB/s" in last and last.endswith(" 50 docs"), last
    assert "tokens" not in err.said()


def test_a_phase_that_cannot_be_measured_says_how_long_it_has_run_until_it_ends():
    err = _Lines()
    progress = Progress(0, stream=err, tty=False, interval=0.05, name="tokenizer train")
    progress.phase("training the BPE")
    wait_until(lambda: "s so far" in err.said(), 60, "a line saying how long the phase has run")
    progress.close()
    lines = err.said().splitlines()
    assert lines[0] == "tokenizer train: training the BPE"
    assert all(re.fullmatch(r"tokenizer train: training the BPE: [0-9,]+ s so far", line) for line in lines[1:])
    assert not any(t.name == "tokenizer train progress" for t in threading.enumerate())  # close() ended it


def test_tokenizer_train_reads_more_sources_than_it_may_hold_open_at_once(tmp_path):
    """A corpus in many shards (`tokenizer train data/*.jsonl`) under the usual soft limit of open files (1024; 128
    here, on 200 shards). Before, every source was held open from the start so that the progress knew their bytes:
    "cannot open ([Errno 24] Too many open files)", exit 74, where the same command trained before this stop. Now
    each is opened, checked and measured up front, then read one at a time (a missing one still fails first)."""
    import resource

    shards = [write_jsonl(tmp_path / f"part-{i:04d}.jsonl", [f"shard {i}: some words {i * 7}"]) for i in range(200)]

    def few_open_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "tokenizer", "train", *map(str, shards),
                           "--vocab-size", "300", "--out", str(tmp_path / "tok.json")], capture_output=True, text=True,
                          timeout=120, preexec_fn=few_open_files)
    assert done.returncode == 0, done.stderr
    assert re.search(r"tokenizer train: 100\.0% .* 200 docs$", done.stderr, re.M), done.stderr
    missing = subprocess.run([sys.executable, "-m", "minilmd.cli", "tokenizer", "train", *map(str, shards),
                              str(tmp_path / "tpyo.jsonl"), "--out", str(tmp_path / "tok2.json")], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and "tpyo.jsonl: no such file" in missing.stderr, missing.stderr
    assert "tokenizer train: training" not in missing.stderr  # refused before any training
