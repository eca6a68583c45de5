"""The scratch wait's record and lock after review10a (findings 2, 3, 6, 8): an early exit of the supervisor it
handed over to ends its record; the record stays fresh for the runs waiting on this one (daemon/phases/initwait.py
calls a state.json older than STALE_S a dead run's); the full place is measured without following a link; the
handed lock must be the re-settled run directory's. In this process; the full base a real tmpfs of few inodes
(skipped where mounting is refused).
"""
from __future__ import annotations

import errno
import functools
import json
import signal

import pytest

from minilmd import names
from minilmd.daemon import preflight, scratchclaim, waitrecord
from minilmd.daemon.base.runstate import load_state
from minilmd.daemon.host.lock import LockUnsafe, RunLock
from minilmd.daemon.host.signals import Signals
from minilmd.daemon.supervisor import Supervisor
from supervisor_helpers import write_config
from tmpfs_helpers import base, fill_inodes  # noqa: F401 - base: the tmpfs fixture


def launch_after_a_wait(config, files, monkeypatch, slept: list | None = None):
    """preflight.launch whose wait finds room at its second try (the inodes freed during the first wait)."""
    def room_again(wait: float) -> None:
        if slept is not None:
            slept.append(json.loads((config.parent / "s" / "run" / names.STATE).read_text())["updated"])
        if slept is None or len(slept) >= 4:
            for path in files:
                path.unlink(missing_ok=True)

    monkeypatch.setattr(preflight, "claim_scratch", functools.partial(preflight.claim_scratch, sleep=room_again))
    return preflight.launch(str(config))


def test_a_supervisor_that_exits_before_its_start_ends_the_waits_record(base, tmp_path, corpus, monkeypatch):
    """The supervisor handed the wait's lock cannot set up run.dir (its attempt-log directory is a file): exit 1,
    and state.json says so (failed, exit 1). Before: left `waiting_scratch` with no outcome, which `status` calls
    a killed supervisor."""
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    cfg, resumes, held = launch_after_a_wait(config, fill_inodes(base), monkeypatch)
    assert held is not None and load_state(cfg.run_dir)["phase"] == "waiting_scratch"
    (cfg.run_dir / names.ATTEMPT_LOGS).write_text("in the way")
    try:
        assert Supervisor(cfg, str(config), resumes=resumes, held=held, echo=False).run() == 1
    finally:
        for sig, handler in held.before.items():
            signal.signal(sig, handler)
    after = load_state(cfg.run_dir)
    assert (after["phase"], after["outcome"]["exit"], after["outcome"]["ended"]) == ("failed", 1, "failed"), after
    assert "after the wait for room for scratch" in after["outcome"]["reason"], after


def test_the_waiting_record_is_rewritten_while_one_try_waits(base, tmp_path, corpus, monkeypatch):
    """Within one backoff wait (5 s here, up to restart.backoff_max in a run) state.json is re-saved (every BEAT_S:
    0 here), so a run whose init.from names this one does not call it "not running" (initwait.STALE_S). Before: once
    per try only."""
    monkeypatch.setattr(waitrecord, "BEAT_S", 0.0)
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""},
                          restart={"backoff_initial": "5s", "backoff_max": "5s", "hang_timeout": "30s"})
    slept: list[float] = []
    held = launch_after_a_wait(config, fill_inodes(base), monkeypatch, slept)[2]
    assert held is not None
    held.give_back()
    assert len(slept) >= 4 and len(set(slept[:4])) == 4, slept  # each slice of the first try saw a newer record


def test_the_full_place_is_measured_without_following_a_link(tmp_path):
    """A link where the full place was: said as not measured, never the numbers and owners of where it leads."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "place").symlink_to(tmp_path / "elsewhere")
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "place" / "scratch"))
    assert scratchclaim._no_room(full, tmp_path) == f"No space left on device ({tmp_path / 'place'})"
    real = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "elsewhere" / "scratch"))
    assert "MB free" in scratchclaim._no_room(real, tmp_path)


def test_the_handed_lock_must_be_the_settled_run_directorys(tmp_path):
    """The lock the wait holds is refused for another run directory than its own (the supervisor's re-settled one),
    never used as if it held that one."""
    ours, other = tmp_path / "ours", tmp_path / "other"
    ours.mkdir()
    other.mkdir()
    lock = RunLock(ours)
    lock.acquire()
    try:
        held = scratchclaim.Held(lock, Signals(), {})
        with pytest.raises(LockUnsafe):
            preflight.run_lock(held, other)
        assert preflight.run_lock(held, ours) is lock
    finally:
        lock.release()
