"""A disk that fills up under a command that writes an output (user walk 5, finding 7): `prepare` said
`error: prepare: No space left on device; nothing written` with no path at all (the OSError of a write carries no
file name); the commands that said their directory (tokenizer train, demo-corpus) did not say which file system was
full. Now every one ends through minilmd/corpus/exits.py `out_error_exit`: exit 74, the output as typed, the file
system's mount point and the room left there. Real tmpfs mounts (root; skipped elsewhere)."""
from __future__ import annotations

import subprocess
import sys

from data_helpers import no_leftovers, read_texts, write_jsonl
from filling import fill_leaving

CLI = [sys.executable, "-m", "minilmd.cli"]


def test_prepare_on_a_full_disk_names_its_out_the_file_system_and_the_room_left(tmp_path, small_tmpfs, demo_jsonl,
                                                                                 tokenizer):
    disk = small_tmpfs("1m")
    fill_leaving(disk, 16 << 10)  # another job's file: 16 KiB left, less than the corpus
    source = write_jsonl(tmp_path / "s.jsonl", read_texts(demo_jsonl) * 3)
    out = disk / "corpus"
    done = subprocess.run([*CLI, "prepare", str(source), "--tokenizer", str(tokenizer), "--out", str(out),
                           "--workers", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 74 and "Traceback" not in done.stderr, done.stderr
    assert f"prepare: cannot write in {out}: No space left on device (the file system mounted at {disk}: " \
           in done.stderr, done.stderr
    assert " MB free now" in done.stderr and "; nothing written; free some space there" in done.stderr, done.stderr
    assert ".prepare-" not in done.stderr  # never the temporary directory's name
    assert no_leftovers(out) and sorted(p.name for p in disk.iterdir()) == ["another-job"]


def test_tokenizer_train_on_a_full_disk_names_the_file_system_too(small_tmpfs, demo_jsonl):
    disk = small_tmpfs("1m")
    fill_leaving(disk, 0)
    out = disk / "tok.json"
    done = subprocess.run([*CLI, "tokenizer", "train", *demo_jsonl, "--vocab-size", "300", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 74 and "Traceback" not in done.stderr, done.stderr
    assert f"tokenizer train: cannot write in {disk}: No space left on device (the file system mounted at {disk}" \
           in done.stderr, done.stderr
    assert not out.exists()
