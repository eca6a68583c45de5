"""A slow sync is told from a stalled one by its progress, the last sync too (daemon/jobs/syncworker.py
`_judge_running`, the Syncer's ReadWatch).

Observed before: the last sync was called stalled once it had run for 2 x the stall limit, however it moved, and the
run exited 1 ("finished, but the last sync stalled (Ns)"): a 2.4 GB checkpoint on a 10 MB/s NFS (240 s) was cut at
every end, the same copy started again after each restart. Reproduced through the FUSE fault filesystem, every op on
the remote slowed by 0.1 s: "the last sync stalled (10s)", exit 1, at a 5 s limit. Now a sync is stalled only when
nothing moved (no byte copied or read back, no step of it done) for the limit; a slow one that moves is "running,
slow (X MB/s, Y of Z ...)" and the last sync waits for it; one that moves nothing for 2 x the limit at the end is
still the last sync stalled, exit 1, as before.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from held_sync import last_sync_running
from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.daemon.base.knobs import Knobs
from minilmd.daemon.base.runstate import now
from reliability_helpers import event_texts, fake_weights_of, undisturbed_fake_weights
from supervisor_helpers import start_supervisor, state, wait_for, wait_or_kill, write_config
from waiting import wait_until

LIMIT_S = 10.0


def test_a_last_sync_that_still_moves_is_waited_for_however_long_it_runs(tmp_path):
    with last_sync_running(tmp_path, Knobs(sync_stalled_after_s=LIMIT_S)) as (sync, syncer, said):
        assert sync.worker is not None
        sync.worker.started -= 10 * LIMIT_S  # running for 100 s: 2 x the limit was the end before
        syncer.watch.began -= 10 * LIMIT_S
        syncer.watch.answer(1_000_000_000)  # 1 GB moved, the last chunk just now: 10 MB/s
        assert sync.final_sync(None) is None, "a slow sync that moves was called stalled"
        assert sync.state.sync.state == "running"
        progress = sync.state.sync.progress or ""
        assert progress.startswith("slow (10.0 MB/s, 1,000.0 MB of 2,400.0 MB copying step-00000004"), progress
        assert [m for m in said if "still moving: waited for" in m], said
        syncer.release.set()
        wait_until(lambda: sync.final_sync(None) == "", 30, "the last sync to end synced")
    assert sync.state.sync.state == "ok" and sync.state.sync.progress is None
    assert sync.state.remote_checkpoint is not None and sync.state.remote_checkpoint.step == 4


def test_a_sync_that_moves_nothing_is_stalled_and_the_last_one_given_up_on_after_twice_the_limit(tmp_path):
    with last_sync_running(tmp_path, Knobs(sync_stalled_after_s=LIMIT_S)) as (sync, syncer, said):
        assert sync.worker is not None
        sync.worker.started -= 10 * LIMIT_S
        syncer.watch.answered = now() - 1.5 * LIMIT_S  # nothing moved for 15 s: stalled, waited for still
        assert sync.final_sync(None) is None
        assert sync.state.sync.state == "stalled"
        assert (sync.state.sync.error or "").startswith("no byte moved for 15s (copying step-00000004"), \
            sync.state.sync.error
        syncer.watch.answered = now() - 2.5 * LIMIT_S  # 25 s: the last sync is given up on
        problem = sync.final_sync(None) or ""
        assert problem.startswith("the last sync stalled (no byte moved for 25s (copying step-00000004"), problem
        syncer.watch.answer(1_000_000)  # it moves again: running, no longer stalled
        assert sync.final_sync(None) is None and sync.state.sync.state == "running"
        assert [m for m in said if m.startswith("the sync moves again, slow (")], said


# --- a real supervisor, its remote on the FUSE fault filesystem (tests/faultfs.py) --------------------------------

def held_run(tmp_path, corpus, faultfs, limit_s: str) -> tuple[Path, Path, subprocess.Popen]:
    """A supervisor whose fake trainer holds before its last step (30) until `release` exists, once steps 10 and
    20 are synced: the config, the release path and the supervisor."""
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(faultfs.root / "remote")})
    release = tmp_path / "release"
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_HOLD=f"29:{release}",
                           MINILMD_SYNC_STALLED_AFTER=limit_s)
    cfg = load_config(config)
    wait_for(lambda: ((state(cfg.run_dir).get("remote_checkpoint") or {}).get("step") or 0) >= 20, 120,
             "steps 10 and 20 synced")
    return config, release, sup


@pytest.mark.slow
@pytest.mark.fuse
def test_a_run_whose_last_sync_is_slow_but_moving_finishes_with_the_last_step_verified_on_the_remote(
        tmp_path, corpus, faultfs):
    # every op on the remote 0.05 s slower: the last sync takes some 30 s (over 2 x the 10 s limit, where the old
    # rule cut it), while no step of it goes 10 s without a byte or an answer (some 5 s at most, unloaded)
    config, release, sup = held_run(tmp_path, corpus, faultfs, str(LIMIT_S))
    cfg = load_config(config)
    try:
        faultfs.stall("remote*", 0.05, op="*")
        release.touch()
        assert wait_or_kill(sup, timeout=600) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        faultfs.clear()
        if sup.poll() is None:
            sup.kill()
    assert faultfs.hits("stall"), "the remote was never slowed"
    st = state(cfg.run_dir)
    assert st["phase"] == "done" and st["remote_checkpoint"]["step"] == 30 and st["remote_checkpoint"]["verified"]
    remote = faultfs.backing / "remote"
    assert checkpoint_dirs.read_latest(remote) == "step-00000030"
    assert fake_weights_of(remote / "step-00000030") == undisturbed_fake_weights(config)
    assert [m for m in event_texts(cfg.run_dir, "sync") if "still moving: waited for" in m], \
        event_texts(cfg.run_dir, "sync")


@pytest.mark.slow
@pytest.mark.fuse
def test_a_run_whose_last_sync_moves_nothing_ends_with_the_last_sync_stalled(tmp_path, corpus, faultfs):
    config, release, sup = held_run(tmp_path, corpus, faultfs, "2")
    cfg = load_config(config)
    try:
        faultfs.stall("remote*", 600, op="*")  # a hung NFS: no op returns
        release.touch()
        # the supervisor says its exit; the process itself ends once the mount answers (closing its descriptors
        # there waits on the server, as on a hung NFS)
        wait_for(lambda: "supervisor exits with status 1 (failed)" in event_texts(cfg.run_dir), 300, "the exit")
        faultfs.clear()
        assert wait_or_kill(sup) == 1
    finally:
        faultfs.clear()
        if sup.poll() is None:
            sup.kill()
    st = state(cfg.run_dir)
    assert st["phase"] == "failed" and st["remote_checkpoint"]["step"] == 20
    assert "finished, but the last sync stalled (no byte moved for" in json.dumps(st), st
