"""The removal of a Slurm job's kept copy once run.remote holds its step (daemon/aftersync.py) runs in a thread of
its own, never on the supervisor's loop. Before, the loop's tick made it: run.dir on a share that hangs held the
loop there, a stop unanswered, only systemd's watchdog noticed. Here the share's hang is a fake: the listing of
`<run.dir>/unsynced/` (untrusted.listed, the removal's first touch of run.dir, where a stalled NFS or FUSE mount
blocks) held on an Event. The tick returns, the silence is said once, no second removal is begun beside the first,
the run's end does not wait for it, and once the share answers the copy goes. A removal that failed is tried again,
its failure said once: run.dir's listing, or the removal itself, raising EIO where they run (before, both were taken
in keptcopy as "nothing kept" or a result in words, the retry never made). The same hang on a real FUSE share
(tests/faultfs.py, every operation under unsynced/ stalled) catches what the fake cannot: a touch of that directory
on the loop's own thread (an `exists()` added to `tick` fails it, and not the fake's test). The real Slurm job's copy
and removal: tests/test_slurm_unsynced_kept.py."""
from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from faults_fixtures import faultfs_dirs, mounted_faultfs
from minilmd import untrusted
from minilmd.daemon.aftersync import AfterSync
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.daemon.jobs import keptcopy
from minilmd.daemon.jobs.keptremote import KeptRemote
from minilmd.names import KEPT_DIR, step_name
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - the fixture
from waiting import wait_until

GENEROUS_S = 60.0
"""What `_returns` waits for a call that does not touch the share: a loaded machine's worst, not a timing asked."""


def _kept_run(tmp_path, weights, run_dir: Path | None = None):
    """A run whose step 30 is kept in run.dir (`run_dir`, default tmp_path/run), run.remote at step 10: (cfg, state,
    events, AfterSync)."""
    run_dir = run_dir or tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    cfg = SimpleNamespace(checkpoint_dir=tmp_path / "scratch" / "checkpoints", run_dir=run_dir)
    save(cfg.checkpoint_dir, 30, weights)
    assert keptcopy.keep(cfg, EXPECTED, 10).step == 30
    state = SimpleNamespace(remote_checkpoint=RemoteCheckpoint(step=10), slurm={})
    events: list[tuple] = []
    return cfg, state, events, AfterSync(cfg, state, lambda *a, **k: events.append(a))


def _returns(call: Callable[[], object]) -> bool:
    """Whether `call` returned (in a thread, so that a call held by the share cannot hold the test)."""
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    return done.wait(GENEROUS_S)


def _at_listing_of_kept(monkeypatch, cfg, fake: Callable[[Callable[[], list[str]]], list[str]]) -> None:
    """`fake(listing)` answers the listing of `<run.dir>/unsynced/` (listing: the real one); any other as it is."""
    real, kept = untrusted.listed, str(keptcopy.place(cfg))
    monkeypatch.setattr(untrusted, "listed", lambda folder, **kw: fake(lambda: real(folder, **kw))
                        if str(folder) == kept else real(folder, **kw))


def _said(events: list[tuple], words: str) -> list[str]:
    return [e[1] for e in events if words in e[1]]


def test_a_removal_held_by_a_hung_run_dir_leaves_the_loop_ticking_and_ends_once_the_share_answers(
        tmp_path, weights, monkeypatch):
    cfg, state, events, after = _kept_run(tmp_path, weights)
    release, entered, calls = threading.Event(), threading.Event(), []

    def hung(listing):
        calls.append(listing)
        entered.set()
        release.wait(10 * GENEROUS_S)  # the share stalls until the test lets it answer
        return listing()

    _at_listing_of_kept(monkeypatch, cfg, hung)
    after.silent_say_s = 0.0  # its silence said at the next tick
    state.remote_checkpoint = RemoteCheckpoint(step=30)  # a sync put the kept step on run.remote
    try:
        assert _returns(lambda: after.tick(False)), "the loop's tick waited on run.dir's hung share"
        assert entered.wait(GENEROUS_S), "the removal never began"
        for _ in range(3):
            assert _returns(lambda: after.tick(False)), "a later tick waited on the share"
        assert len(calls) == 1, calls  # no second removal begun beside the held one
        assert len(_said(events, "has not answered")) == 1, events  # said once
        ended: list[str] = []
        assert _returns(lambda: ended.append(after.at_end(30))), "the run's end waited on the share"
        assert "left for the next start" in ended[0], ended
        assert (keptcopy.place(cfg) / step_name(30)).is_dir()  # nothing removed while it hangs
    finally:
        release.set()
    assert after.removal is not None and after.removal.wait(10 * GENEROUS_S)
    after.tick(False)
    assert _said(events, "removed step 30"), events
    assert not keptcopy.place(cfg).exists()  # the copy, and its empty directory with it


@pytest.mark.slow
def test_on_a_real_fuse_share_that_hangs_the_removal_holds_no_tick_and_ends_once_it_answers(tmp_path, weights):
    """The test above on a real FUSE share (tests/faultfs.py) in place of the fake listing: every operation under
    `<run.dir>/unsynced` stalls, as on a hung NFS or FUSE mount. So whatever of the removal touches that directory,
    and anything the loop's tick would touch there itself, blocks where it runs, not where a fake was put."""
    backing, mount_point = faultfs_dirs(tmp_path)
    with mounted_faultfs(backing, mount_point) as share:
        cfg, state, events, after = _kept_run(tmp_path, weights, mount_point / "run")
        share.stall("run/unsynced*", 10 * GENEROUS_S, op="*")  # until cleared
        after.silent_say_s = 0.0
        state.remote_checkpoint = RemoteCheckpoint(step=30)
        try:
            for _ in range(3):
                assert _returns(lambda: after.tick(False)), "the loop's tick waited on run.dir's hung share"
            wait_until(lambda: share.hits("stall"), GENEROUS_S, "the removal to reach the hung share")
            assert after.removal is not None and not after.removal.wait(0.5)  # held there, one removal only
            assert len(_said(events, "has not answered")) == 1, events
            ended: list[str] = []
            assert _returns(lambda: ended.append(after.at_end(30))), "the run's end waited on the share"
            assert "left for the next start" in ended[0], ended
            assert (backing / "run" / KEPT_DIR / step_name(30)).is_dir()  # nothing removed while it hangs
        finally:
            share.clear()
        assert after.removal.wait(10 * GENEROUS_S)
        after.tick(False)
        assert _said(events, "removed step 30"), events
        assert not (backing / "run" / KEPT_DIR).exists()


def _tried_until_removed(cfg, state, after, events) -> list[str]:
    """Ticks until the copy goes (each collects the try before it and begins the next): the failures said."""
    after.retry_s = 0.0  # tried again at the next tick (60 s in a run)
    state.remote_checkpoint = RemoteCheckpoint(step=30)  # a sync put the kept step on run.remote
    for _ in range(4):
        after.tick(False)
        if (removal := after.removal) is not None:
            assert removal.wait(10 * GENEROUS_S)
    after.tick(False)
    assert not keptcopy.place(cfg).exists(), events  # the third try removed it
    assert _said(events, "removed step 30"), events
    return _said(events, "tried again in")


def test_a_removal_whose_listing_of_run_dir_failed_is_tried_again_and_its_failure_said_once(
        tmp_path, weights, monkeypatch):
    cfg, state, events, after = _kept_run(tmp_path, weights)
    failures = [OSError(errno.EIO, "Input/output error")] * 2

    def flaky(listing):
        if failures:
            raise failures.pop()
        return listing()

    _at_listing_of_kept(monkeypatch, cfg, flaky)
    failed = _tried_until_removed(cfg, state, after, events)
    assert not failures, events
    assert len(failed) == 1 and "Input/output error" in failed[0], events  # the same failure: said once


def test_a_removal_that_run_dir_failed_is_tried_again_and_its_failure_said_once(tmp_path, weights, monkeypatch):
    cfg, state, events, after = _kept_run(tmp_path, weights)
    failures, rm = [OSError(errno.EIO, "Input/output error")] * 2, KeptRemote.rm

    def flaky(self, name, *args, **kwargs):
        if failures:
            raise failures.pop()
        return rm(self, name, *args, **kwargs)

    monkeypatch.setattr(KeptRemote, "rm", flaky)
    failed = _tried_until_removed(cfg, state, after, events)
    assert not failures, events
    assert len(failed) == 1 and "Input/output error" in failed[0] and "left there" in failed[0], events


def test_a_failed_removals_retry_waits_its_time_whatever_the_wall_clock_does(tmp_path, weights, monkeypatch):
    """retry_at is on time.monotonic(): the wall clock stepped two hours forward (NTP, a suspended VM) does not make
    the hour's wait pass at once (before: runstate.now(), time.time()); stepped back, it would have held it longer."""
    cfg, state, events, after = _kept_run(tmp_path, weights)
    failures = [OSError(errno.EIO, "Input/output error")]

    def flaky(listing):
        if failures:
            raise failures.pop()
        return listing()

    _at_listing_of_kept(monkeypatch, cfg, flaky)
    after.retry_s = 3600.0
    state.remote_checkpoint = RemoteCheckpoint(step=30)
    after.tick(False)
    assert after.removal is not None and after.removal.wait(10 * GENEROUS_S)
    after.tick(False)  # the failure collected: tried again in an hour
    assert after.removal is None and _said(events, "tried again in 3600 s"), events
    stepped, real = time.time() + 7200, time.time
    monkeypatch.setattr(time, "time", lambda: stepped)
    try:
        after.tick(False)
        begun = after.removal
    finally:
        monkeypatch.setattr(time, "time", real)
    assert begun is None, events  # not tried again: its hour has not passed
    assert (keptcopy.place(cfg) / step_name(30)).is_dir()
