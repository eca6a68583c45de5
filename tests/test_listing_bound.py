"""A directory another user may fill is listed to a bound (minilmd/untrusted.py MAX_DIR_ENTRIES, the real one:
10,000), never read whole: each test fills a real directory with one entry more than the bound and shows what its
reader does then, a refusal with the count said or the handling of a directory it cannot read, where the code
before read every entry and took the result for the whole listing (tests/test_listing_audit.py holds every other
listing to a review).

Checked on the code before: with checkpoint_dirs.py, resumefrom.py, scratch.py and leftovers.py as they were, the
crowded remote root listed its step (no refusal), the crowded scratch was refused only as "holds files (f00000,
..., f00004 and 9996 more)" after all of it was read, the sweep removed the dead writer's directory and status
listed the whole logs directory; a crowded checkpoint root in scratch was, and stays, one that holds checkpoints.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from minilmd import scratch as scratchmod
from minilmd import scratch_end
from minilmd.checkpoint_dirs import clean_stale_tmp, list_checkpoints, local_checkpoint_steps
from minilmd.daemon.jobs.resumefrom import _lists_steps
from minilmd.daemon.views.logs import _Logs
from minilmd.dirfd import Dir
from minilmd.names import ATTEMPT_LOGS, CHECKPOINTS, MANIFEST
from minilmd.tmpnames import save_tmp_name
from minilmd.untrusted import MAX_DIR_ENTRIES, TooManyEntries, holds_any, listed
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture

BOUND = f"holds over {MAX_DIR_ENTRIES:,} entries"


def crowd(folder: Path, n: int = MAX_DIR_ENTRIES + 1) -> Path:
    """`folder` made and filled with n empty files f00000... (what anyone who can write it may put there)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        os.close(os.open(folder / f"f{i:05d}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600))
    return folder


def uncrowd(folder: Path) -> None:
    for name in os.listdir(folder):
        if name.startswith("f"):
            os.unlink(folder / name)


def test_a_remote_checkpoint_root_past_the_bound_is_refused_as_an_unreadable_root(tmp_path):
    root = tmp_path / "remote" / "run"
    (root / "step-00000001").mkdir(parents=True)
    (root / "step-00000001" / MANIFEST).write_text("{}")
    crowd(root)
    with pytest.raises(TooManyEntries, match=BOUND) as refused:
        list_checkpoints(root)
    assert isinstance(refused.value, OSError) and str(root) in str(refused.value)
    assert local_checkpoint_steps(root) == []  # as a root that cannot be read: none known, no crash
    assert _lists_steps(str(root)) is None  # the resume's look: "cannot be listed now", never "holds none"
    uncrowd(root)
    assert [p.name for p in list_checkpoints(root)] == ["step-00000001"]
    assert _lists_steps(str(root)) is True


def test_a_scratch_past_the_bound_is_refused_saying_so(tmp_path):
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    scratch.mkdir(mode=0o700)
    crowd(scratch)
    (problem,) = scratchmod.problems(scratch, run_dir, False)
    assert f"run.scratch {scratch} already holds files ({BOUND}) and no owner.json" in problem, problem
    uncrowd(scratch)
    assert scratchmod.problems(scratch, run_dir, False) == []


def test_a_scratch_checkpoint_root_past_the_bound_is_kept_as_holding_checkpoints(tmp_path):
    scratch = tmp_path / "scratch"
    crowd(scratch / CHECKPOINTS)
    assert scratch_end.holds_checkpoints(scratch)


def test_the_leftover_sweep_of_a_root_past_the_bound_finds_nothing(tmp_path):
    """A dead writer's temporary directory in a crowded root is not found (an unlistable parent's rule): left, and
    removed by a later sweep once the root is listable."""
    root = tmp_path / "root"
    dead = root / save_tmp_name(3, 2 ** 22 + 1)  # above any pid_max: no such process
    dead.mkdir(parents=True)
    crowd(root)
    said: list[str] = []
    assert clean_stale_tmp(root, said.append) == [] and dead.is_dir()
    uncrowd(root)
    assert clean_stale_tmp(root, said.append) == [dead] and not dead.exists()


def _attempt_logs(run_dir: Path) -> list[str]:
    with Dir(os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY), run_dir) as run:
        logs = _Logs(run)
        try:
            return logs.attempts()
        finally:
            logs.close()


def test_logs_shows_no_attempt_logs_of_a_logs_directory_past_the_bound(tmp_path):
    logs = crowd(tmp_path / "run" / ATTEMPT_LOGS)
    (logs / "attempt-0001.log").write_text("a line\n")
    assert _attempt_logs(tmp_path / "run") == []
    uncrowd(logs)
    assert _attempt_logs(tmp_path / "run") == ["attempt-0001.log"]


def test_listed_raises_what_listing_raised_and_holds_any_reads_one_entry(tmp_path):
    """`listed` is dir_names for a caller of os.listdir's errors: the same OSError (missing, not a directory), and
    TooManyEntries past its bound; `holds_any` is whether one entry is there, whatever the bound."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError):
        listed(tmp_path / "nowhere")
    with pytest.raises(NotADirectoryError):
        listed(tmp_path / "file")
    with pytest.raises(TooManyEntries, match="holds over 0 entries"):
        listed(tmp_path, max_entries=0)
    assert listed(tmp_path) == ["file"] and holds_any(tmp_path)
    (tmp_path / "empty").mkdir()
    assert not holds_any(tmp_path / "empty")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert "file" in listed(fd) and holds_any(fd)
    finally:
        os.close(fd)


def test_a_sync_and_a_fetch_of_a_remote_root_past_the_bound_say_so_and_go_on_once_it_is_listable(tmp_path, weights):
    """A local run.remote filled past the bound by someone: the sync and the fetch list its root through the bounded
    lister (LocalRemote.names), fail as for a root that cannot be read now (retried: the SyncError the sync worker and
    staging retry) and say what it is, the bound and the directory. Before, the root was read whole through fsspec's
    ls, whatever it held."""
    from minilmd.daemon.jobs.sync import Syncer
    from minilmd.daemon.jobs.sync_errors import SyncError

    local, remote = tmp_path / "scratch", tmp_path / "remote"
    save(local, 10, weights)
    syncer = Syncer(local, str(remote), EXPECTED)
    assert syncer.sync_newest().step == 10
    crowd(remote)
    save(local, 20, weights)
    said = f"run.remote holds more than {MAX_DIR_ENTRIES:,} entries: {remote} not listed past that"
    with pytest.raises(SyncError, match=re.escape(said)):
        syncer.sync_newest()
    with pytest.raises(SyncError, match=re.escape(said)):
        Syncer(tmp_path / "elsewhere", str(remote), EXPECTED).fetch_latest()
    uncrowd(remote)
    assert syncer.sync_newest().step == 20  # the retry once the root is listable again
