"""Scratch filling up with checkpoints mid-run (a real tmpfs, mounted for the test), through `minilmd run`.

Observed before: scratch on a small tmpfs and a remote that fails, so checkpoints pile up; every save then hit
ENOSPC, the trainer crashed, was restarted, crashed again, and the run gave up with 79 ("21 ENOSPC crash-restarts
in 6.5 minutes"), having filled the tmpfs to the last byte with a half-written checkpoint.

- While training, when scratch has no room left for the next two checkpoints, the supervisor prunes the
  superseded ones (synced or not: the newest valid one and the one being synced stay) and syncs early: the
  trainer never dies of a full scratch, and the run ends with the weights of an undisturbed run.
- When nothing can be pruned (another job holds the space), the trainer's save refuses up front (it writes
  nothing, fault.json says scratch_full with the numbers), the supervisor waits in `waiting_space` and `status`
  says "scratch full: waiting for space (needs X, has Y)"; the wait is no restart: with no_progress_limit 1 and
  max_restarts 1 the run does not give up; once there is room it resumes and finishes bit for bit.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from filling import fill_leaving
from minilmd import checkpoint, checkpoint_dirs, protocol, scratch
from minilmd.config import RestartSection, RunConfig, load_config
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.base.states import Action, Cause
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.base.worker import Inbox
from minilmd.daemon.child.death import Death
from minilmd.daemon.child.policy import decide
from minilmd.daemon.infra import Infra
from minilmd.daemon.jobs import staging
from minilmd.daemon.jobs.sync_errors import RemoteFull, SyncResult
from minilmd.daemon.jobs.syncworker import FINAL_SYNC_TRIES, SyncWorker
from minilmd.daemon.views.status import summary_lines
from reliability_helpers import event_texts, fake_weights_of, undisturbed_fake_weights
from supervisor_helpers import cli, events, model_sha, start_supervisor, state, wait_for, wait_or_kill, write_config
from waiting import wait_until


def ckpt_bytes(ckpt: Path) -> int:
    return sum(f.stat().st_size for f in ckpt.iterdir())


class FailingRemote:
    """A remote directory that `block()` replaces by a plain file (after the config check, which refuses one),
    so that every sync fails until `unblock()`."""

    def __init__(self, tmp: Path):
        self.path = tmp / "remote"
        self.path.mkdir()

    def block(self) -> None:
        self.path.rmdir()
        self.path.write_text("not a directory\n")

    def unblock(self) -> None:
        self.path.unlink()
        self.path.mkdir()



# --- the rule, without processes -------------------------------------------------------------------------------
def test_a_full_scratch_is_a_wait_never_a_counted_restart():
    death = Death(Cause.SCRATCH_FULL, protocol.EXIT_SCRATCH_FULL, "scratch full")
    restart = RestartSection(max_restarts=3, no_progress_limit=2)
    decision = decide(death, restart=restart, restarts_so_far=3, no_progress_streak=7, stop_requested=False,
                      micro_batch_size=4, grad_accum=1)
    assert decision.action == Action.WAIT_SPACE and not decision.counts_as_restart
    stopped = decide(death, restart=restart, restarts_so_far=0, no_progress_streak=0, stop_requested=True,
                     micro_batch_size=4, grad_accum=1)
    assert stopped.action == Action.STOP


def test_the_wait_says_scratch_full_once_whatever_the_trainer_said():
    from minilmd.trainer.checkpoint.save import ScratchFull

    said = str(ScratchFull(Path("/dev/shm/x/checkpoints"), 100, 3_300_000, 1_000_000))
    restart = RestartSection()
    for detail in (said, "scratch full", "No space left on device"):
        death = Death(Cause.SCRATCH_FULL, protocol.EXIT_SCRATCH_FULL, detail)
        reason = decide(death, restart=restart, restarts_so_far=0, no_progress_streak=0, stop_requested=False,
                        micro_batch_size=4, grad_accum=1).message
        assert reason.startswith("scratch full") and reason.count("scratch full") == 1, reason
        assert detail.removeprefix("scratch full") in reason


def test_a_checkpoint_refused_for_want_of_inodes_says_so_not_mb_free(small_tmpfs):
    """Its ENOSPC came with bytes to spare: "which has 3.9 MB free" contradicted itself (inode9's leftover); the words
    name the inodes, as fsio.no_inode_left, the one rule, says."""
    from minilmd.trainer.checkpoint.save import ScratchFull

    disk = small_tmpfs("4m", "nr_inodes=8,mode=0755")
    made = 0
    while True:
        try:
            (disk / f"f{made}").touch()
        except OSError:
            break
        made += 1
    said = str(ScratchFull(disk, 100, 3_300_000, 4_000_000))
    assert "which has no inode left for a new file" in said and "MB free" not in said, said
    assert "MB free" in str(ScratchFull(Path("/"), 100, 3_300_000, 1_000_000))


def test_status_shows_the_wait_for_space():
    st = {"run": "s", "run_dir": "/r", "phase": "waiting_space", "since": 100.0,
          "reason": "scratch full: waiting for space (needs 1.2 MB, has 0.3 MB free in /dev/shm/x/checkpoints)",
          "space_wait": {"since": 100.0, "needs": 1_200_000, "free": 300_000, "path": "/dev/shm/x/checkpoints",
                         "checks": 12},
          "progress": {}, "sync": {"state": "off"}, "staging": {}, "restarts": []}
    text = "\n".join(summary_lines(StateJson.from_dict(st), alive=True, t=160.0))
    assert "waiting_space" in text
    assert "scratch full: waiting for space (needs 1.2 MB, has 0.3 MB free" in text
    assert "scratch: full for 60s" in text and "not counted as a restart" in text, text


# --- the save that does not fit (the real writer, a real tmpfs) ------------------------------------------------
@pytest.mark.slow
def test_a_save_that_cannot_fit_refuses_up_front_and_leaves_nothing_behind(tmp_path, small_tmpfs):
    import torch

    from minilmd.trainer.checkpoint.save import ScratchFull, save

    disk = small_tmpfs("1m")
    model = {"w": torch.zeros(256, 1024)}  # 1 MiB: more than the tmpfs holds
    with pytest.raises(ScratchFull) as caught:
        save(disk / "ckpt", 3, model, {"state": {}, "param_groups": []}, {"step": 3})
    e = caught.value
    assert e.needs > 1 << 20 and e.free <= 1 << 20 and "No space left" in str(e), str(e)
    assert "step-00000003" in str(e) and f"{e.needs / 1e6:,.1f} MB" in str(e)
    assert sorted(p.name for p in (disk / "ckpt").iterdir()) == []  # no half-written .tmp-step-*


@pytest.mark.slow
def test_enospc_in_the_middle_of_a_save_is_scratch_full_and_removes_the_half(tmp_path, small_tmpfs, monkeypatch):
    import torch

    from minilmd.trainer.checkpoint import save as save_mod

    disk = small_tmpfs("2m")
    model = {"w": torch.zeros(256, 1024)}  # 1 MiB: fits once, not with 1.5 MiB of another job's file
    monkeypatch.setattr(save_mod, "_free_bytes", lambda root: 10 << 20)  # the check up front saw room (a race)
    fill_leaving(disk, 512 << 10)
    with pytest.raises(save_mod.ScratchFull) as caught:
        save_mod.save(disk / "ckpt", 4, model, {"state": {}, "param_groups": []}, {"step": 4})
    assert isinstance(caught.value.__cause__, OSError)
    assert sorted(p.name for p in (disk / "ckpt").iterdir()) == []


# --- through `minilmd run` ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_checkpoints_piling_up_behind_a_failing_remote_are_pruned_before_scratch_fills(tmp_path, corpus,
                                                                                       small_tmpfs):
    disk = small_tmpfs("80m")
    remote = FailingRemote(tmp_path)
    config = write_config(tmp_path, corpus, remote=False,
                          run={"scratch": str(disk / "scratch"), "remote": str(remote.path)},
                          train={"max_steps": 60, "checkpoint_every": 5, "keep_local": 3},
                          sync={"every": "10s"}, restart={"no_progress_limit": 1})
    cfg = load_config(config)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, False)  # this run's (a marker-less one holding files
    staging.stage(str(corpus[0]), cfg.scratch_dir)  # would not be adopted), staged before the run starts
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.1")
    try:
        wait_for(lambda: state(cfg.run_dir).get("phase"), 60, "the supervisor to load the config")
        remote.block()
        first = wait_for(lambda: checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir) or sup.poll() is not None, 60,
                         "a first checkpoint")
        assert first is not True, (tmp_path / "sup.out").read_text()[-3000:]
        fill_leaving(disk, int(3.5 * ckpt_bytes(first[0])))  # room for three and a half checkpoints
        wait_for(lambda: any(e.get("cause") == "done" for e in events(cfg.run_dir) if e["event"] == "child_exit")
                 or sup.poll() is not None, 120, "the trainer to finish")
        remote.unblock()  # the remote comes back for the last sync
        assert wait_or_kill(sup, 120) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
    st = state(cfg.run_dir)
    assert st["restarts"] == [] and st["no_progress_streak"] == 0, st["restarts"]
    assert [e["cause"] for e in events(cfg.run_dir) if e["event"] == "child_exit"] == ["done"]
    assert any("no room for the next" in m for m in event_texts(cfg.run_dir, "prune")), event_texts(cfg.run_dir)
    final = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert final.name == "step-00000060" and fake_weights_of(final) == undisturbed_fake_weights(config)
    assert checkpoint_dirs.read_latest(remote.path) == "step-00000060"


@pytest.mark.slow
def test_when_nothing_can_be_pruned_the_run_waits_for_space_says_so_and_then_finishes(tmp_path, corpus, small_tmpfs,
                                                                                      undisturbed):
    straight = undisturbed()  # 16 steps, a checkpoint every 4
    disk = small_tmpfs("80m")
    remote = FailingRemote(tmp_path)
    config = straight.config_like(tmp_path, "s", run={"scratch": str(disk / "scratch"), "remote": str(remote.path)},
                                  sync={"every": "10s"}, restart={"no_progress_limit": 1, "max_restarts": 1})
    cfg = load_config(config)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, False)  # this run's (a marker-less one holding files
    staging.stage(str(corpus[0]), cfg.scratch_dir)  # would not be adopted), staged before the run starts
    sup = start_supervisor(config, tmp_path / "sup.out", fake=False)
    try:
        # another job takes the space once the launch's own check of scratch has passed (a full scratch at launch
        # is refused: test_check_catches.py), before the trainer's first checkpoints
        wait_for(lambda: state(cfg.run_dir).get("phase"), 60, "the supervisor to load the config")
        filler = fill_leaving(disk, int(1.5 * ckpt_bytes(straight.checkpoint)))  # room for one and a half
        remote.block()
        wait_for(lambda: state(cfg.run_dir).get("phase") == "waiting_space" or sup.poll() is not None, 180,
                 "the wait for space")
        assert sup.poll() is None, (tmp_path / "sup.out").read_text()[-3000:]
        # the supervisor looks again and again, and none of it counts as a restart
        wait_for(lambda: (state(cfg.run_dir).get("space_wait") or {}).get("checks", 0) >= 3, 60, "more checks")
        st = state(cfg.run_dir)
        assert st["phase"] == "waiting_space" and st["restarts"] == [] and st["no_progress_streak"] == 0
        text = cli("status", str(cfg.run_dir)).stdout
        assert "scratch full: waiting for space (needs " in text and " MB free in " in text, text
        assert [p.name for p in checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)] == ["step-00000004"]
        checkpoint.validate(cfg.checkpoint_dir / "step-00000004")
        assert not list(cfg.checkpoint_dir.glob(".tmp-*"))  # the refused save wrote nothing
        log = (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
        assert "scratch full" in log and "Traceback" not in log, log[-2000:]
        filler.unlink()
        remote.unblock()
        assert wait_or_kill(sup, 180) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
    st = state(cfg.run_dir)
    assert st["restarts"] == []
    assert [e["cause"] for e in events(cfg.run_dir) if e["event"] == "child_exit"] == ["scratch_full", "done"]
    assert any("space_freed" == e.get("transition") for e in events(cfg.run_dir))
    final = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert final.name == "step-00000016" and model_sha(final) == model_sha(straight.checkpoint)
    assert checkpoint_dirs.read_latest(remote.path) == "step-00000016"


# --- a full remote at the last sync -----------------------------------------------------------------------------
class FullRemote:
    """A Syncer whose remote is full until `room` is set: each sync raises RemoteFull, as sync.py does on ENOSPC."""

    base_problem = None  # no LoRA base to copy

    def __init__(self):
        self.tries, self.room = 0, False

    def sync_newest(self) -> SyncResult:
        self.tries += 1
        if not self.room:
            raise RemoteFull("sync to /nfs/r failed: OSError: [Errno 28] No space left on device", free=1000)
        return SyncResult(step=4, path="/nfs/r/step-00000004", verified=True, copied=True)


class OneSyncer(Infra):
    def __init__(self, syncer: FullRemote):
        self.the_syncer = syncer

    def syncer(self, cfg, expected, log):
        return self.the_syncer


def last_sync_of(tmp_path: Path, remote: FullRemote) -> tuple[SyncWorker, list[str]]:
    cfg = RunConfig()
    cfg.run.scratch, cfg.run.remote, cfg.sync.every = str(tmp_path / "scratch"), "/nfs/r", "0.01s"
    ckpt = cfg.checkpoint_dir / "step-00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text(json.dumps({"files": {"model.safetensors": {"size": 2_000_000}}}))
    said: list[str] = []
    state_ = RunState(tmp_path / "state.json", {})
    return SyncWorker(cfg, OneSyncer(remote), state_, lambda kind, msg, **d: said.append(msg),
                      Inbox(lambda *a, **k: None)), said


@pytest.mark.slow
def test_a_full_remote_at_the_last_sync_counts_no_try_and_a_stop_ends_the_wait(tmp_path):
    remote = FullRemote()
    sync, said = last_sync_of(tmp_path, remote)
    wait_until(lambda: sync.final_sync(None, True) is not None or remote.tries > FINAL_SYNC_TRIES + 2, 30,
               "more tries than FINAL_SYNC_TRIES")
    assert remote.tries > FINAL_SYNC_TRIES and sync.final_sync(None, True) is None  # still waiting, no give-up
    assert sync.room_wait == "final sync waiting: remote full (needs 2.0 MB, free 0.0 MB)", sync.room_wait
    assert len([m for m in said if m.startswith("final sync waiting")]) == 1, said  # said once, not per try
    remote.room = True
    wait_until(lambda: sync.final_sync(None, True) == "", 30, "the last sync once it fits")
    assert sync.state.remote_checkpoint is not None and sync.state.remote_checkpoint.step == 4

    stopped = FullRemote()
    sync, _ = last_sync_of(tmp_path / "stopped", stopped)
    wait_until(lambda: sync.final_sync(None, True) is None and sync.waited_for_room, 30, "the wait for room")
    problem = wait_until(lambda: sync.final_sync(None, False), 30, "the stop to end the wait")
    assert problem.startswith("the last sync found the remote full (needs 2.0 MB, free 0.0 MB): sync to "), problem
    assert "RemoteFull" not in problem  # the sync's own words, no Python class name (daemon/base/worker.py)
    assert "No space left on device" in problem


# --- a full remote at the last sync, through `minilmd run` (a real tmpfs as the remote) -------------------------
@pytest.mark.slow
def test_a_full_remote_at_the_last_sync_waits_for_room_keeps_scratch_then_finishes(tmp_path, corpus, small_tmpfs):
    """Observed before: the last sync failed 3 times on ENOSPC, the run exited 1 (systemd restarts it) and left
    its half-copied `.tmp-step-*` on the remote. Now the run waits for room as a sync during the run does, says so,
    keeps scratch (it holds the only copy), and finishes once another job frees the remote."""
    disk = small_tmpfs("8m")
    remote = disk / "remote"
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote), "keep_scratch": False},
                          sync={"every": "2s"})
    cfg = load_config(config)
    remote.mkdir()
    filler = fill_leaving(disk, 32 << 10)  # another job's file: less room than one checkpoint
    sup = start_supervisor(config, tmp_path / "sup.out")
    try:
        wait_for(lambda: "final sync waiting" in (state(cfg.run_dir).get("reason") or "") or sup.poll() is not None,
                 120, "the last sync to wait for room")
        assert sup.poll() is None, (tmp_path / "sup.out").read_text()[-3000:]
        st = state(cfg.run_dir)
        assert st["phase"] == "stopping", st["phase"]
        assert re.search(r"final sync waiting: remote full \(needs [\d.,]+ MB, free [\d.,]+ MB\)", st["reason"]), st
        text = cli("status", str(cfg.run_dir)).stdout
        assert "final sync waiting: remote full (needs " in text, text
        newest = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
        assert newest.name == "step-00000030"  # scratch is kept while the remote has no copy
        filler.unlink()
        assert wait_or_kill(sup, 120) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
    st = state(cfg.run_dir)
    assert st["phase"] == "done" and st["restarts"] == [], st
    assert checkpoint_dirs.read_latest(remote) == "step-00000030"
    checkpoint.validate(remote / "step-00000030")
    assert not list(remote.glob(".tmp-*"))
    assert not cfg.scratch_dir.exists()  # given back once the remote has the last checkpoint
    assert any("remote full" in m for m in event_texts(cfg.run_dir, "sync")), event_texts(cfg.run_dir)
