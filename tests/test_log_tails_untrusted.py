"""The supervisor's reads of a dead trainer's last words open a log as every untrusted file is opened.

daemon/child/death.py (a death's detail, a torchrun worker's signal, an injected fault) and
daemon/child/compilecache.py (the loader's complaint of a damaged kernel) read the end of an attempt log or of
faults-fired, files of a run directory that the trainer and anyone the directory lets in can replace. They read
through a second, weaker copy of tail_lines (minilmd/fsio.py) that followed a link and opened a FIFO, which blocks
the supervisor's loop until someone writes it; now the one tail_lines (logread, opened as untrusted.open_regular
opens a file) serves them and the views alike. Each test puts the hostile file there after a real trainer ended.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

from minilmd import names
from minilmd.daemon.child import compilecache
from minilmd.daemon.child.death import classify
from minilmd.daemon.child.process import launch


@contextlib.contextmanager
def watched_fifo(path: Path):
    """A FIFO at path, and a list that gets an entry when a reader opens it. The reader is let through at once (a
    writer opens and closes it), so that the code before, whose open blocked there, fails this test instead of
    hanging it. Opening a FIFO for writing without blocking succeeds only while a reader has it open."""
    os.mkfifo(path)
    opened: list[bool] = []
    done = threading.Event()

    def let_through() -> None:
        while not done.wait(0.05):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: nobody is reading it
                continue
            opened.append(True)
            os.close(fd)

    watcher = threading.Thread(target=let_through, daemon=True)
    watcher.start()
    try:
        yield opened
    finally:
        done.set()
        watcher.join()


def ended_trainer(run_dir: Path, code: str):
    child = launch([sys.executable, "-c", code], run_dir, 1, devices="")
    return child, child.popen.wait(30)


def test_a_crashed_trainers_log_swapped_for_a_fifo_is_never_opened(tmp_path):
    child, rc = ended_trainer(tmp_path, "raise SystemExit(1)")
    child.log_path.unlink()
    with watched_fifo(child.log_path) as opened:
        death = classify(child, rc, tmp_path, stop_requested=False)
    assert (death.cause, death.detail, opened) == ("crash", "exit status 1", [])


def test_a_crashed_trainers_log_swapped_for_a_link_is_not_followed(tmp_path):
    """A link to a file the run's user may read and the one who made it may not: its lines are not the trainer's
    last words (they would go to events.jsonl and `minilmd status`, for anyone the run directory lets in)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the run user's private words\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child, rc = ended_trainer(run_dir, "raise SystemExit(1)")
    child.log_path.unlink()
    child.log_path.symlink_to(secret)
    death = classify(child, rc, run_dir, stop_requested=False)
    assert (death.cause, death.detail) == ("crash", "exit status 1")


def test_faults_fired_swapped_for_a_fifo_is_never_opened(tmp_path):
    child, rc = ended_trainer(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGBUS)")
    with watched_fifo(tmp_path / names.FAULTS_FIRED) as opened:
        death = classify(child, rc, tmp_path, stop_requested=False)
    assert (death.cause, opened) == ("sigbus", [])
    assert names.FAULT_ENV not in death.detail


def test_the_loaders_complaint_is_not_read_from_a_fifo_or_through_a_link(tmp_path):
    complaint = tmp_path / "other.log"
    complaint.write_text(f"ImportError: {tmp_path}/cache/inductor/k.so: file too short\n")
    assert compilecache.loader_complaint(complaint) is not None  # the same words in a log of its own are read
    linked = tmp_path / "attempt-0002.log"
    linked.symlink_to(complaint)
    assert compilecache.loader_complaint(linked) is None
    with watched_fifo(tmp_path / "attempt-0003.log") as opened:
        assert compilecache.loader_complaint(tmp_path / "attempt-0003.log") is None
    assert opened == []
