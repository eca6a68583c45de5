"""What a killed `prepare --append` leaves: its temporary directory beside the corpus
(`.CORPUS.append.prepare-HOST-PID-TICKS`, minilmd/corpus/prepare/append.py) is removed by the next append once its
maker is gone, by the leftovers rule (minilmd/leftovers.py): a live append's, a link and another host's are left
and said. The kill is a real SIGKILL of a real `minilmd prepare --append`, held where its temporary directory
exists by the test hook of lock.py (a FIFO source, once the hold, is refused now: a source's open never blocks)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from data_helpers import read_texts, write_jsonl
from minilmd.corpus.format import open_prepared
from minilmd.corpus.prepare.append import append
from minilmd.corpus.prepare.lock import HOLD_FOR_TEST
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.tmpnames import host_tag
from proc_fixtures import dead, sleeper  # noqa: F401 - fixtures
from waiting import wait_until


@pytest.fixture
def corpus(tmp_path, demo_jsonl, tokenizer) -> tuple[Path, Path]:
    """A prepared corpus of 200 demo documents, and a JSONL of 50 more to append."""
    texts = read_texts(demo_jsonl)
    old = write_jsonl(tmp_path / "old.jsonl", texts[:200])
    new = write_jsonl(tmp_path / "new.jsonl", texts[200:250])
    root = tmp_path / "c"
    prepare([str(old)], tokenizer, root, val_fraction=0.05, workers=0, progress=False, log=lambda m: None)
    return root, new


def _append(root: Path, new: Path) -> dict:
    return append([str(new)], root, workers=0, progress=False, log=lambda m: None)


def _temp_dirs(root: Path) -> list[Path]:
    return sorted(root.parent.glob(f".{root.name}.append.prepare-*"))


@pytest.mark.slow  # a whole `minilmd prepare --append` in a subprocess
def test_a_sigkilled_appends_temporary_directory_is_removed_by_the_next_append(corpus, tmp_path, capsys):
    """Before, an append killed by SIGKILL left `.c.append.prepare-HOST-PID-TICKS` (its new documents' tokens)
    for good: no append nor prepare ever looked at that name. Now the next append removes it and says so."""
    root, new = corpus
    hold = tmp_path / "hold.fifo"  # the test hook's FIFO, never written: the append waits there
    os.mkfifo(hold)
    child = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "prepare", str(new), "--append", "--out",
                              str(root), "--workers", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, HOLD_FOR_TEST: str(hold)})
    try:
        wait_until(lambda: _temp_dirs(root) or child.poll() is not None, 120,
                   "the append to make its temporary directory")
        assert child.poll() is None, child.communicate()
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    [left] = _temp_dirs(root)
    assert left.name.startswith(f".c.append.prepare-{host_tag()}-{child.pid}-"), left

    meta = _append(root, new)
    assert not os.path.lexists(left) and _temp_dirs(root) == []
    assert (f"minilmd prepare: removed {left}: the temporary directory of an append (pid {child.pid}) killed "
            "before it finished") in capsys.readouterr().err
    assert meta["versions"][-1]["documents_added"] > 0
    assert open_prepared(root, verify_hash=True).meta["versions"][-1]["version"] == 2


@pytest.mark.parametrize("theirs_is", ["a live append's", "another host's", "a link"])
def test_an_appends_leftover_not_ours_to_remove_is_left_and_said(corpus, tmp_path, theirs_is, dead, sleeper,
                                                                 capsys):
    """By an append's temporary name, but its process still runs (pid and start time), another host's (its pid
    says nothing here), or a symbolic link (never followed): left as it is, said, and the append goes on."""
    root, new = corpus
    host = "another-host" if theirs_is == "another host's" else host_tag()
    pid, ticks = sleeper if theirs_is == "a live append's" else dead
    theirs = tmp_path / f".c.append.prepare-{host}-{pid}-{ticks}"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "train").mkdir(parents=True)
    if theirs_is == "a link":
        theirs.symlink_to(elsewhere)
    else:
        (theirs / "train").mkdir(parents=True)
    said = {"a live append's": f"its process (pid {pid}) still runs",
            "another host's": "left as it is: an append's temporary directory on host another-host",
            "a link": "a symbolic link by an append's temporary name; left as it is"}[theirs_is]
    _append(root, new)
    err = capsys.readouterr().err
    assert f"minilmd prepare: {theirs}: " in err and said in err, err
    assert os.path.lexists(theirs) and (elsewhere / "train").is_dir()
