"""The launch's wait for room for scratch in state.json, and its run lock handed to the supervisor held.

Before, the wait wrote no state.json: `minilmd status` showed the previous supervisor's record while it waited (here
`stopped`, "not running"), and its lock was given back once scratch was made and taken again by the supervisor, a
moment in which `minilmd stop` said "not running" and a second launch could take the run. Now state.json says
`waiting_scratch`, why (which place, how full, whose entries fill it) and this process as the supervisor; a stop
writes its end; the lock and the stop signals pass to the supervisor never let go; and what a later start reads of
the record is the previous supervisor's, unchanged (daemon/waitrecord.py).
Real tmpfs mounts of few inodes (skipped where mounting is refused), another user's files a real uid's (64123).
"""
from __future__ import annotations

import functools
import json
import os
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from minilmd import names, run_owner
from minilmd.daemon import preflight, scratchclaim
from minilmd.daemon.base.runstate import RunState, load_state, new_state
from minilmd.daemon.host.lock import LockHeld, RunLock, lock_holder
from minilmd.fsio import atomic_write_json
from supervisor_helpers import cli, start_supervisor, wait_or_kill, write_config
from tmpfs_helpers import OTHER, base, fill_inodes, wait_for_words  # noqa: F401 - base: the tmpfs fixture

OLD_CHILD = {"pid": 4000000, "start_ticks": 12, "attempt": 3, "started": 1000.0, "newest_at_launch": 10}


def previous_record(run_dir: Path, config: Path, ended: bool) -> dict:
    """The state.json an earlier supervisor of the run left: it ran attempt 3, restarted twice, chose an override,
    recorded step 20; `ended`: it exited cleanly (stopped), else it was killed (no outcome)."""
    old = new_state("s", run_dir, str(config))
    old.update(phase="done" if ended else "training", reason="stopped on request" if ended else "training",
               child=OLD_CHILD, restarts=[{"time": 900.0, "cause": "crash", "attempt": 2}], no_progress_streak=1,
               overrides={"train.micro_batch_size": 2}, last_error="attempt 2 crashed", last_error_at=900.0)
    old["supervisor"]["pid"], old["progress"]["step"] = 4000001, 20
    if ended:
        old["outcome"] = {"exit": 0, "phase": "done", "time": 1100.0, "reason": "stopped on request",
                          "ended": "stopped"}
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / names.STATE, old)
    return old


def test_status_shows_the_wait_and_stop_ends_it_as_stopped(base, tmp_path, corpus):
    """A real `minilmd run` waiting for the inodes of a full tmpfs: `minilmd status` says waiting_scratch, why and
    whose files, with this process running as the supervisor (before: the previous supervisor's `stopped ... not
    running`); `minilmd stop` ends it, exit 0, and reports the wait's end, which state.json keeps."""
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    run_dir = tmp_path / "s" / "run"
    previous_record(run_dir, config, ended=True)
    fill_inodes(base)
    log = tmp_path / "run.out"
    proc = start_supervisor(config, log)
    try:
        wait_for_words(log, "waits:", proc)
        shown = cli("status", str(run_dir))
        head = shown.stdout.splitlines()[0]
        assert "waiting_scratch for" in head and f"supervisor pid {proc.pid} running" in head, shown.stdout
        assert "waiting for room for scratch" in shown.stdout and "no inode left" in shown.stdout, shown.stdout
        assert f"of uid {OTHER}" in shown.stdout, shown.stdout  # whose entries fill the place
        stopped = cli("stop", str(run_dir), timeout=180)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "SIGUSR2 sent to supervisor pid" in stopped.stdout, stopped.stdout
        assert "trainer's save" not in stopped.stdout, stopped.stdout  # none runs while it waits (new user, stop 65)
        # the reason said once: on the last phase line when stop saw it ("exit 0 (said above)"), else with the exit
        reason = "stopped (SIGUSR2) while waiting for room for scratch: nothing started"
        assert stopped.stdout.count(reason) == 1 and re.search(r"stopped after [\d.]+s: exit 0 \(", stopped.stdout), \
            stopped.stdout
        assert wait_or_kill(proc, 120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = load_state(run_dir)
    assert (after["phase"], after["outcome"]["ended"], after["outcome"]["exit"]) == ("done", "stopped", 0), after
    assert after["progress"]["step"] == 20 and after["previous_child"] == OLD_CHILD, after  # the record before it
    assert "stopped for" in cli("status", str(run_dir)).stdout.splitlines()[0]


def test_the_run_lock_and_a_stop_pass_to_the_supervisor_never_let_go(base, tmp_path, corpus, monkeypatch):
    """In this process: the wait finds room at its second try, and a SIGTERM comes just after (as `minilmd stop`
    could at the hand-over). The lock was never released: the launch returns it held, a second launch then is
    refused as the run's owner, the supervisor uses that lock, and the stop is its signals' (its first tick stops
    the run). Before: the lock was let go (a second launch took the run; `stop` said "not running") and the stop
    was lost with the wait's handlers."""
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    files = fill_inodes(base)
    released: list[str] = []
    real_release = RunLock.release

    def release(lock: RunLock) -> None:
        released.append(str(lock.path))
        real_release(lock)

    def room_again(wait: float) -> None:  # an admin frees the inodes during the first wait
        for path in files:
            path.unlink(missing_ok=True)

    real_try = scratchclaim._settle_and_claim

    def try_then_stop(cfg):  # a stop right as the last try has made scratch, before the supervisor runs
        full = real_try(cfg)
        if full is None:
            os.kill(os.getpid(), signal.SIGTERM)
        return full

    monkeypatch.setattr(RunLock, "release", release)
    monkeypatch.setattr(scratchclaim, "_settle_and_claim", try_then_stop)
    monkeypatch.setattr(preflight, "claim_scratch", functools.partial(preflight.claim_scratch, sleep=room_again))
    before = signal.getsignal(signal.SIGTERM)
    launched = preflight.launch(str(config))
    run_dir, held = launched[0].run_dir, getattr(launched, "held", None)
    try:
        assert released == [], released  # before: released once scratch was made, taken again by Supervisor.run
        assert held is not None and lock_holder(run_dir).pid == os.getpid()
        with pytest.raises(LockHeld):
            RunLock(run_dir).acquire()  # a second launch right at the hand-over: the run is owned
        second = cli("run", str(config), timeout=180)  # a real one: refused before it makes anything
        assert second.returncode == 2 and "run already owned by another supervisor" in second.stdout, \
            second.stdout + second.stderr
        assert preflight.run_lock(held, run_dir) is held.lock and released == []
        assert held.signals.stop == 1  # the supervisor's record: its first tick enters stopping
    finally:
        if held is not None:
            held.give_back()
    assert signal.getsignal(signal.SIGTERM) is before and lock_holder(run_dir) is None


def test_a_run_that_waited_trains_to_its_end_on_the_lock_it_was_handed(small_tmpfs, tmp_path, corpus, monkeypatch):
    """A real `minilmd run` (the fake trainer) waits for the inodes of a full tmpfs; his files removed, it trains to
    its end on the run lock the wait took: the supervisor, handed it, starts from waiting_scratch (states.check_start
    `waited`). Before, state.json never said waiting_scratch. A tmpfs of 512 inodes: the staged corpus and the
    checkpoints need more than tmpfs_helpers.base's 8."""
    roomy = small_tmpfs("128m", "nr_inodes=512,mode=1777")
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(roomy))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    run_dir = tmp_path / "s" / "run"
    files = fill_inodes(roomy)
    log = tmp_path / "run.out"
    proc = start_supervisor(config, log)
    try:
        deadline = time.monotonic() + 120
        while load_state_or_none(run_dir).get("phase") != "waiting_scratch" and proc.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        assert load_state_or_none(run_dir).get("phase") == "waiting_scratch", log.read_text()
        holder = lock_holder(run_dir)
        for path in files:  # an admin frees the inodes
            path.unlink()
        assert wait_or_kill(proc, 180) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert holder is not None and holder.pid == proc.pid
    done = load_state(run_dir)
    assert (done["phase"], done["outcome"]["ended"], done["supervisor"]["pid"]) == ("done", "finished", proc.pid)
    assert "room again" in log.read_text() and "run already owned" not in log.read_text()


def load_state_or_none(run_dir: Path) -> dict:
    try:
        return load_state(run_dir)
    except Exception:  # noqa: BLE001 - not written yet
        return {}


@pytest.mark.parametrize("ended", [False, True])
def test_a_start_after_the_wait_adopts_what_it_would_have_adopted_before_it(tmp_path, ended):
    """The wait's record is what a later start reads (a wait killed or stopped): the supervisor's adopt of it
    carries what it carries of the previous supervisor's record (the trainer it ran, its overrides, its restart
    history while it did not end), and the wait shows no trainer, no end of its own while it runs. Before there was
    no such record; a record that kept the trainer only as previous_child was adopted with none."""
    from minilmd.daemon.waitrecord import WaitRecord  # here: the module is new

    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text("")
    old = previous_record(run_dir, config, ended)
    record = WaitRecord(SimpleNamespace(run_dir=run_dir, run=SimpleNamespace(name="s")), str(config))
    record.waiting("waiting for room for scratch: /dev/shm has no inode left")
    written = json.loads((run_dir / names.STATE).read_text())
    assert (written["phase"], written["child"], written["outcome"]) == ("waiting_scratch", None, None)
    assert written["supervisor"]["pid"] == os.getpid() and written["progress"]["step"] == 20

    def adopted(raw: dict) -> dict:
        state = RunState(run_dir / names.STATE, new_state("s", run_dir, str(config)))
        state.adopt(raw, None)
        kept = ("overrides", "restarts", "no_progress_streak", "last_error", "remote_checkpoint", "previous_child")
        return {key: state.data[key] for key in kept} | {"attempt": state.previous_attempt}

    assert adopted(written) == adopted(old)
    assert adopted(written)["previous_child"] == OLD_CHILD and adopted(written)["attempt"].attempt == 3


def test_a_failed_wait_ends_its_record_and_an_unreadable_one_is_left_for_the_supervisor(tmp_path):
    """A later try's refusal ends the wait as a supervisor's failure (failed, its exit status, the last error); a
    previous state.json that cannot be read is not written over: the supervisor must find it and say so."""
    from minilmd.daemon.waitrecord import WaitRecord  # here: the module is new

    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text("")
    previous_record(run_dir, config, ended=False)
    record = WaitRecord(SimpleNamespace(run_dir=run_dir, run=SimpleNamespace(name="s")), str(config))
    record.waiting("waiting for room for scratch: full")
    record.failed(73, "while waiting for room for scratch: run.dir is full")
    ended = load_state(run_dir)
    assert (ended["phase"], ended["outcome"]["exit"], ended["outcome"]["ended"]) == ("failed", 73, "failed"), ended
    assert ended["last_error"] == "while waiting for room for scratch: run.dir is full"

    (run_dir / names.STATE).write_text("{not json")
    left = WaitRecord(SimpleNamespace(run_dir=run_dir, run=SimpleNamespace(name="s")), str(config))
    left.waiting("waiting for room for scratch: full")
    left.stopped("stopped (SIGTERM) while waiting for room for scratch: nothing started")
    assert (run_dir / names.STATE).read_text() == "{not json"


@pytest.mark.slow
def test_stop_of_the_wait_after_a_reboot_reports_no_checkpoint_that_is_not_there(base, tmp_path, corpus):
    """A power cut, then a reboot (reports fault8 F2): state.json, the killed supervisor's, names step 100 in a
    scratch that is gone and the remote at step 50, while run.remote's LATEST names step 100. `minilmd stop` of the
    launch waiting for room for scratch: exit 0, nothing started; before, exit 3 "NOT SYNCED: the newest
    checkpoint, step 100, is only in scratch: PATH" (a path that did not exist) "the remote has step 50"."""
    config = write_config(tmp_path, corpus, run={"scratch": ""})
    run_dir, remote = tmp_path / "s" / "run", tmp_path / "s" / "remote"
    old = previous_record(run_dir, config, ended=False)
    for step in (50, 100):
        (remote / names.step_name(step)).mkdir(parents=True)
        (remote / names.step_name(step) / names.MANIFEST).write_text("{}")
    (remote / names.LATEST).write_text(names.step_name(100) + "\n")
    (remote / names.REMOTE_OWNER).write_bytes(run_owner.encode(run_owner.record(run_dir, "s")))  # its first sync's
    old["local_checkpoint"] = {"step": 100, "time": 1000.0,
                               "path": str(tmp_path / "gone" / names.CHECKPOINTS / names.step_name(100))}
    old["remote_checkpoint"] = {"step": 50, "time": 900.0, "verified": True,
                                "path": str(remote / names.step_name(50))}
    old["sync"] = {"state": "ok", "since": 900.0, "error": None, "attempts": 0}
    atomic_write_json(run_dir / names.STATE, old)
    fill_inodes(base)
    log = tmp_path / "run.out"
    proc = start_supervisor(config, log)
    try:
        wait_for_words(log, "waits:", proc)
        stopped = cli("stop", str(run_dir), timeout=180)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "NOT SYNCED" not in stopped.stdout and "no local checkpoint; remote checkpoint step 100" in \
            stopped.stdout, stopped.stdout
        assert "nothing started" in stopped.stdout, stopped.stdout
        assert wait_or_kill(proc, 120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
