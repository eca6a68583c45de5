"""Every bad line named at once (issue 24; minilmd/corpus/prepare/badlines.py): `prepare` reads the whole input and,
with the default `--on-bad-line error`, exits 65 listing every bad line as `file:line: reason (detail)`, the first
20 on the screen and all of them in `<out>.bad-lines.txt` beside --out when there are more, publishing nothing;
with `skip` it names them the same way and goes on. Checked against a hand-made corpus whose bad lines are known
by number and reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_helpers import read_texts
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.corpus.sources.jsonl import InputError

pytestmark = pytest.mark.slow  # every test runs a real prepare over its input

BAD = {  # a bad line of each reason: what it holds
    "invalid_json": b'{"text": "unterminated',
    "missing_text": b'{"title": "no text"}',
    "text_not_string": b'{"text": 42}',
    "empty_text": b'{"text": "   "}',
    "invalid_utf8": b'{"text": "\xff\xfe"}',
}
REASONS = sorted(BAD)


def hand_made(path: Path, texts: list[str], bad_every: int, n_lines: int, long_bad_at: int = 0) -> list[tuple]:
    """A JSONL of n_lines: a bad line (reasons in turn) at every bad_every-th line, good ones otherwise, and a bad
    line longer than a block at line long_bad_at; returns the hand list of (line, reason)."""
    expected = []
    with open(path, "wb") as f:
        for line in range(1, n_lines + 1):
            if line == long_bad_at:
                f.write(b'{"text": 7, "pad": "' + b"x" * 300_000 + b'"}\n')
                expected.append((line, "text_not_string"))
            elif line % bad_every == 0:
                reason = REASONS[len(expected) % len(REASONS)]
                f.write(BAD[reason] + b"\n")
                expected.append((line, reason))
            else:
                f.write(json.dumps({"text": texts[line % len(texts)]}, ensure_ascii=False).encode() + b"\n")
    return expected


def named(stream: str, source: Path) -> list[tuple[int, str]]:
    """(line, reason) of every `source:line: reason (...)` in a text, in order."""
    out = []
    for text in stream.splitlines():
        text = text.strip()
        if text.startswith(f"{source}:"):
            line, reason = text[len(f"{source}:"):].split(": ", 1)
            out.append((int(line), reason.split(" (", 1)[0].replace(" ", "_")))
    return out


@pytest.fixture(scope="module")
def texts(demo_jsonl) -> list[str]:
    return read_texts(demo_jsonl[:1])


def prepare_cli(src: Path, tokenizer: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "prepare", str(src), "--tokenizer", str(tokenizer),
                           "--out", str(out), "--workers", "0", "--val-fraction", "0.1", *extra],
                          capture_output=True, text=True, timeout=300)


def test_every_bad_line_is_named_at_once_and_nothing_is_published(tmp_path, texts, tokenizer):
    src = tmp_path / "corpus.jsonl"
    expected = hand_made(src, texts, bad_every=7, n_lines=250)  # 35 bad lines
    assert len(expected) == 35
    out = tmp_path / "out"
    done = prepare_cli(src, tokenizer, out)
    assert done.returncode == 65, done.stderr
    assert "35 bad lines" in done.stderr and "nothing was written" in done.stderr
    assert named(done.stderr, src) == expected[:20]  # the first 20 on the screen
    listing = tmp_path / "out.bad-lines.txt"
    assert f"and 15 more: all 35 in {listing}" in done.stderr
    assert named(listing.read_text(encoding="utf-8"), src) == expected  # every one, in the file
    # nothing beside the listing: the lock file this prepare made is gone with it (minilmd/corpus/prepare/lock.py)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "out.bad-lines.txt"]
    # and --help says that file is the one thing a failed prepare leaves (user10 #8: "nothing is written unless 0")
    helped = subprocess.run([sys.executable, "-m", "minilmd.cli", "prepare", "--help"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert "no corpus is written unless 0 (OUT.bad-lines.txt aside" in " ".join(helped.stdout.split()), helped.stdout


def test_skip_names_them_too_and_counts_them_by_reason(tmp_path, texts, tokenizer):
    src = tmp_path / "corpus.jsonl"
    expected = hand_made(src, texts, bad_every=9, n_lines=300)
    out = tmp_path / "out"
    done = prepare_cli(src, tokenizer, out, "--on-bad-line", "skip")
    assert done.returncode == 0, done.stderr
    assert named(done.stderr, src) == expected[:20]
    assert named((tmp_path / "out.bad-lines.txt").read_text(encoding="utf-8"), src) == expected
    bad = json.loads((out / "meta.json").read_text())["bad_lines"]
    by_hand = {reason: sum(1 for _, r in expected if r == reason) for reason in REASONS}
    assert bad["total"] == len(expected) and bad["by_reason"] == by_hand
    assert [e.split(": ")[0] for e in bad["examples"]] == [f"{src}:{line}" for line, _ in expected[:20]]
    assert not (out / "bad-lines.txt").exists()  # never published inside the corpus


def test_a_few_bad_lines_are_all_on_the_screen_without_a_file(tmp_path, texts, tokenizer):
    src = tmp_path / "corpus.jsonl"
    expected = hand_made(src, texts, bad_every=40, n_lines=200)  # 5
    done = prepare_cli(src, tokenizer, tmp_path / "out")
    assert done.returncode == 65 and named(done.stderr, src) == expected, done.stderr
    assert "more:" not in done.stderr and not (tmp_path / "out.bad-lines.txt").exists()


def test_a_prepare_that_fixed_the_lines_says_the_list_beside_it_is_an_earlier_ones(tmp_path, texts, tokenizer):
    """Found by a new user: a prepare of chat lines without --format chat exited 65 and left chat.bad-lines.txt; the
    next one, fixed, published prep/chat beside that list, unsaid, where it reads as the new corpus's. Now said (a
    list written by that earlier prepare is never removed by this one)."""
    src = tmp_path / "corpus.jsonl"
    hand_made(src, texts, bad_every=7, n_lines=250)
    out = tmp_path / "out"
    assert prepare_cli(src, tokenizer, out).returncode == 65
    listing = tmp_path / "out.bad-lines.txt"
    written = listing.read_bytes()
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts[:200]),
                     encoding="utf-8")
    done = prepare_cli(fixed, tokenizer, out)
    assert done.returncode == 0, done.stderr
    assert (f"note: {listing} is an earlier prepare's list of bad lines, not this one's (this one had none): remove "
            f"it") in done.stderr, done.stderr
    assert listing.read_bytes() == written  # left as it was
    listing.unlink()
    again = prepare_cli(fixed, tokenizer, out, "--force")
    assert again.returncode == 0 and "bad lines" not in again.stderr, again.stderr


def test_one_bad_line_keeps_its_message(tmp_path, texts, tokenizer):
    src = tmp_path / "corpus.jsonl"
    [(line, reason)] = hand_made(src, texts, bad_every=1000, n_lines=1500)
    assert reason == "empty_text"
    with pytest.raises(InputError) as e:
        prepare([str(src)], tokenizer, tmp_path / "out", workers=0, val_fraction=0.1, progress=False,
                log=lambda m: None)
    assert str(e.value) == (f'{src}:{line}: empty text ("text" is empty or whitespace); nothing was written. '
                            "Fix the line or pass --on-bad-line skip to skip bad lines and "
                            "count them")


@pytest.mark.parametrize("workers", [0, 2])
def test_across_blocks_workers_and_long_lines(tmp_path, texts, tokenizer, workers):
    """Small blocks (many per run), a bad line longer than a block (streamed, not held), worker processes: the
    same list, in input order."""
    src = tmp_path / "corpus.jsonl"
    expected = hand_made(src, texts, bad_every=6, n_lines=200, long_bad_at=100)
    with pytest.raises(InputError) as e:
        prepare([str(src)], tokenizer, tmp_path / "out", workers=workers, block_bytes=16 << 10, val_fraction=0.1,
                progress=False, log=lambda m: None)
    assert named(str(e.value), src) == expected[:20]
    assert named((tmp_path / "out.bad-lines.txt").read_text(encoding="utf-8"), src) == expected
    assert not (tmp_path / "out").exists()
