"""A scratch's owner marker removed (no link left) while a process of ours holds it, just after this hold opened it
(minilmd/scratch_hold.py). Whoever holds a marker no longer named holds nothing the scratch's name leads to: the hold
opens the name again, and the marker there decides, as it does for a hold that opens a moment later. Before, the hold
waited on the holder of the removed file (PROBE_WAIT_S) and refused, ScratchInUse, naming it a supervisor that
still held the scratch's marker, though a start a moment later took the scratch (the marker there free). The name's
marker held by a live supervisor still refuses: two runs never share one scratch.

The holders are real processes of this user (a claim and a hold of their own, as a supervisor's); the removal runs
inside this hold's window (between its open and its flock) by patching the step between them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from held_process import HeldProcess
from minilmd import lockfile, scratch, scratch_hold
from minilmd.names import SCRATCH_OWNER

HOLDER = """import sys
from pathlib import Path
from minilmd import scratch, scratch_hold
scratch.claim(Path(sys.argv[1]), Path(sys.argv[2]), "s", False)
scratch_hold.hold(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""
"""A supervisor of ours, as far as the scratch goes: claims it and holds its marker until stdin closes."""


def hold_scratch(scratch_dir: Path, run_dir: Path) -> HeldProcess:
    return HeldProcess(HOLDER, str(scratch_dir), str(run_dir))


@pytest.fixture
def place(tmp_path, monkeypatch):
    scratch_dir, run_dir = tmp_path / "scratch", tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(scratch_hold, "PROBE_WAIT_S", 0.2)  # the refusal below need not wait 2 s
    yield scratch_dir, run_dir
    scratch_hold.let_go(scratch_dir)


def _after_the_open(monkeypatch, then) -> None:
    """`then()` run once, right after the hold's open of the marker (in its first step, lockfile.private)."""
    real = lockfile.private

    def removed_meanwhile(*args, **kwargs):
        monkeypatch.setattr(lockfile, "private", real)
        then()
        return real(*args, **kwargs)

    monkeypatch.setattr(lockfile, "private", removed_meanwhile)


def _remark(scratch_dir: Path) -> None:
    """The marker removed (its holder keeps a file of no link) and a fresh one of the same words put in its place."""
    marker = scratch_dir / SCRATCH_OWNER
    body = marker.read_bytes()
    os.unlink(marker)
    fresh = scratch_dir / "fresh-marker"
    fresh.write_bytes(body)
    os.chmod(fresh, lockfile.LOCK_FILE_MODE)
    os.rename(fresh, marker)


def test_a_marker_removed_under_a_holder_of_ours_is_left_and_the_fresh_one_at_the_name_taken(place, monkeypatch):
    scratch_dir, run_dir = place
    first = hold_scratch(scratch_dir, run_dir)
    try:
        old = os.lstat(scratch_dir / SCRATCH_OWNER)
        _after_the_open(monkeypatch, lambda: _remark(scratch_dir))
        scratch_hold.hold(scratch_dir)  # before: ScratchInUse, "still held by another supervisor (pid <first>...)"
        held = scratch_hold._holds[os.path.abspath(scratch_dir)]
        assert held[2] == os.lstat(scratch_dir / SCRATCH_OWNER).st_ino != old.st_ino
        assert first.proc.poll() is None  # its hold, of a file with no name, was waited on for nothing
    finally:
        first.end()


def test_a_marker_removed_and_put_back_under_another_live_holder_of_ours_is_still_refused(place, monkeypatch):
    """The hold opens the name again and finds the fresh marker held by a live supervisor: refused, naming it (not
    the holder of the removed file)."""
    scratch_dir, run_dir = place
    first, second = hold_scratch(scratch_dir, run_dir), []

    def remarked_and_held() -> None:
        _remark(scratch_dir)
        second.append(hold_scratch(scratch_dir, run_dir))

    _after_the_open(monkeypatch, remarked_and_held)
    try:
        with pytest.raises(scratch_hold.ScratchInUse) as refused:
            scratch_hold.hold(scratch_dir)
        assert f"pid {second[0].pid}," in str(refused.value) and f"pid {first.pid}," not in str(refused.value)
        assert os.path.abspath(scratch_dir) not in scratch_hold._holds
    finally:
        first.end()
        for holder in second:
            holder.end()


def test_a_marker_removed_under_a_holder_of_ours_and_not_put_back_is_left_to_the_next_claim(place, monkeypatch):
    """No marker at the name: the hold holds nothing now (a marker missing is the claim's, as before the open), and
    the next claim marks the scratch again and its hold takes it: the run is not refused for a file gone."""
    scratch_dir, run_dir = place
    first = hold_scratch(scratch_dir, run_dir)
    try:
        _after_the_open(monkeypatch, lambda: os.unlink(scratch_dir / SCRATCH_OWNER))
        scratch_hold.hold(scratch_dir)  # before: ScratchInUse
        assert os.path.abspath(scratch_dir) not in scratch_hold._holds
        scratch.claim(scratch_dir, run_dir, "s", False)
        scratch_hold.hold(scratch_dir)
        held = scratch_hold._holds[os.path.abspath(scratch_dir)]
        assert held[2] == os.lstat(scratch_dir / SCRATCH_OWNER).st_ino
    finally:
        first.end()
