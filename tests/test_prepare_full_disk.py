"""A disk that fills up under a command that writes an output (user walk 5, finding 7): `prepare` said
`error: prepare: No space left on device; nothing written` with no path at all (the OSError of a write carries no
file name); the commands that said their directory (tokenizer train, demo-corpus) did not say which file system was
full. Now every one ends through minilmd/corpus/exits.py `out_error_exit`: exit 74, the output as typed, the file
system's mount point and the room left there. Real tmpfs mounts (root; skipped elsewhere). Any other error (EIO,
ESTALE: a share that may have stopped answering) is said without a look at the file system, and the look at a full
one is bounded: faultfs mounts (tests/faultfs.py). The tests that expect the file system named wait for it far
longer than SHARED_STORAGE_PROBE_S (5 s), which a loaded machine can exceed (review 7 #8): in process by a
monkeypatch, in a command by PATIENT_CLI."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

import pytest

from data_helpers import no_leftovers, read_texts, write_jsonl
from filling import fill_leaving
from minilmd import bounded
from minilmd.corpus.exits import out_error_exit

PATIENT_CLI = [sys.executable, "-c", "from minilmd import bounded; bounded.SHARED_STORAGE_PROBE_S = 600.0; "
               "from minilmd.cli import main; main()"]
"""`minilmd` whose bounded look at a full file system waits 600 s: the tests are about what is said, not the bound."""


def test_prepare_on_a_full_disk_names_its_out_the_file_system_and_the_room_left(tmp_path, small_tmpfs, demo_jsonl,
                                                                                 tokenizer):
    disk = small_tmpfs("1m")
    fill_leaving(disk, 16 << 10)  # another job's file: 16 KiB left, less than the corpus
    source = write_jsonl(tmp_path / "s.jsonl", read_texts(demo_jsonl) * 3)
    out = disk / "corpus"
    done = subprocess.run([*PATIENT_CLI, "prepare", str(source), "--tokenizer", str(tokenizer), "--out", str(out),
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
    done = subprocess.run([*PATIENT_CLI, "tokenizer", "train", *demo_jsonl, "--vocab-size", "300", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 74 and "Traceback" not in done.stderr, done.stderr
    assert f"tokenizer train: cannot write in {disk}: No space left on device (the file system mounted at {disk}" \
           in done.stderr, done.stderr
    assert not out.exists()


def test_an_io_error_is_said_without_a_look_at_the_file_system(faultfs, capsys):
    """Found by a reviewer: on EIO or ESTALE the error path stat'ed each parent up to the mount point and resolved
    the path, unbounded: on a hard NFS mount that stopped answering, the command hung in its own error message
    instead of exiting 74. Every operation on this mount fails (EIO) and is recorded: none is made."""
    faultfs.add_rule("*", "*", "error", errno=errno.EIO)
    out = faultfs.root / "corpus"
    ended = out_error_exit(OSError(errno.EIO, os.strerror(errno.EIO)), "prepare", out, "nothing written")
    assert faultfs.hits() == []  # before: a getattr of the mount for each level looked at
    assert ended.exit_code == 74
    assert capsys.readouterr().err == (f"prepare: the disk (or share) under {out} failed while it was written to "
                                       f"({os.strerror(errno.EIO)}); nothing written; fix the disk or the share (the "
                                       f"system log says more), then run it again\n")


def test_a_full_disk_on_a_share_that_stalls_is_said_without_its_file_system(faultfs, capsys, monkeypatch):
    """The look at a full disk's file system is bounded (minilmd/bounded.py): a share whose every operation stalls
    (until the test's end) leaves the file system unnamed, never the error unsaid."""
    monkeypatch.setattr(bounded, "SHARED_STORAGE_PROBE_S", 0.1)
    faultfs.stall("*", 600, op="*")
    out, ended = faultfs.root / "corpus", []
    said = threading.Thread(target=lambda: ended.append(out_error_exit(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "prepare", out, "nothing written")), daemon=True)
    said.start()
    said.join(timeout=120)  # before: no end while the share stalls (600 s)
    assert ended and ended[0].exit_code == 74
    assert capsys.readouterr().err == (f"prepare: cannot write in {out}: {os.strerror(errno.ENOSPC)}; nothing "
                                       f"written; free some space there (or choose another directory), then run it "
                                       f"again\n")


@pytest.mark.parametrize("error, head, tail", [
    (errno.ENOSPC, "(the file system mounted at", " MB free now, with what was written removed); nothing written"),
    (errno.EDQUOT, "(on the file system mounted at", "); nothing written")])
def test_a_full_disk_or_quota_still_names_the_file_system(tmp_path, capsys, monkeypatch, error, head, tail):
    monkeypatch.setattr(bounded, "SHARED_STORAGE_PROBE_S", 600.0)
    out = tmp_path / "not-made-yet" / "corpus"  # the nearest directory there is tells the file system
    mount = tmp_path.resolve()
    while mount.parent != mount and mount.parent.stat().st_dev == mount.stat().st_dev:
        mount = mount.parent
    ended = out_error_exit(OSError(error, os.strerror(error)), "prepare", out, "nothing written")
    said = capsys.readouterr().err
    assert ended.exit_code == 74
    assert f"prepare: cannot write in {out}: {os.strerror(error)} {head} {mount}" in said and tail in said, said
