"""A remote too small for the next checkpoint, as the syncs during the run say it.

Observed before (a 12 MB tmpfs remote, 6.9 MB checkpoints, sync.every = 10s): the first sync worked; then every 10 s
`sync failed (sync to ... failed: [Errno 28] No space left on device); retry in 10s`, for minutes, and only the last
sync said `remote full (needs 6.9 MB, free 5.7 MB)`, never why a remote that took one checkpoint had no room for the
next. Now every sync says it in the last sync's words (remote_full_words.full_words), once when the remote becomes full,
then as a reminder every REMOTE_FULL_REMIND_S, with the rule: the new checkpoint is copied in full before the oldest
is removed (daemon/jobs/sync.py), so the remote must hold sync.keep + 1 of them.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from minilmd.config import RunConfig, load_config
from minilmd.corpus_meta import read_corpus_meta
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.base.worker import Inbox
from minilmd.daemon.infra import Infra
from minilmd.daemon.jobs import remote_room, syncworker
from minilmd.daemon.jobs.scratch_room import checkpoint_bytes
from minilmd.daemon.jobs.sync_errors import RemoteFull, SyncResult
from minilmd.daemon.jobs.syncworker import SyncWorker
from minilmd.names import CORPUS_TOKENIZER
from supervisor_helpers import cli, write_config
from waiting import wait_until


class FullRemote:
    """A Syncer whose remote is full while `full`: each sync raises RemoteFull, as sync.py does on ENOSPC."""

    base_problem = None  # no LoRA base to copy
    copying = None

    def __init__(self):
        self.tries, self.full = 0, True

    def sync_newest(self) -> SyncResult:
        self.tries += 1
        if self.full:
            raise RemoteFull("sync to /nfs/r failed: OSError: [Errno 28] No space left on device", free=1_000_000)
        return SyncResult(step=4, path="/nfs/r/step-00000004", verified=True, copied=True)


class OneSyncer(Infra):
    def __init__(self, syncer: FullRemote):
        self.the_syncer = syncer

    def syncer(self, cfg, expected, log):
        return self.the_syncer

    def prune_local(self, root, keep, protect, log):
        return []


def periodic_syncs(tmp_path) -> tuple[SyncWorker, FullRemote, list[str]]:
    cfg = RunConfig()
    cfg.run.scratch, cfg.run.remote, cfg.sync.every, cfg.sync.keep = str(tmp_path / "scratch"), "/nfs/r", "0.01s", 1
    ckpt = cfg.checkpoint_dir / "step-00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text(json.dumps({"files": {"model.safetensors": {"size": 2_000_000}}}))
    said: list[str] = []
    remote = FullRemote()
    sync = SyncWorker(cfg, OneSyncer(remote), RunState(tmp_path / "state.json", {}),
                      lambda kind, msg, **d: said.append(msg), Inbox(lambda *a, **k: None))
    assert sync.ensure_syncer(None)
    return sync, remote, said


def run_until(sync: SyncWorker, done) -> None:
    def tick() -> bool:
        sync.tick(periodic=True)
        return done()

    wait_until(tick, 30, "the syncs")


def test_every_sync_says_remote_full_in_one_wording_once_then_as_a_reminder(tmp_path, monkeypatch):
    sync, remote, said = periodic_syncs(tmp_path)
    run_until(sync, lambda: remote.tries >= 6 and sync.worker is None)
    full = [m for m in said if "remote full" in m]
    assert len(full) == 1, said  # once, not at each of the 6 tries
    assert full[0].startswith("remote full (needs 2.0 MB, free 1.0 MB): sync to /nfs/r failed: "), full[0]
    assert "copied in full before the oldest is removed, so room for 2 checkpoints, about 4.0 MB in all" in full[0]
    assert not [m for m in said if m.startswith("sync failed")], said  # no raw errno line per try
    assert sync.state.sync.error.startswith("remote full (needs 2.0 MB, free 1.0 MB): "), sync.state.sync.error

    monkeypatch.setattr(syncworker, "REMOTE_FULL_REMIND_S", 0.0)  # the reminder is due
    tries = remote.tries
    run_until(sync, lambda: remote.tries > tries and sync.worker is None)
    assert [m for m in said if "remote full" in m][-1].startswith("still, "), said

    remote.full = False  # room again: synced, and a new full spell is said again at once
    run_until(sync, lambda: sync.state.remote_checkpoint is not None)
    monkeypatch.setattr(syncworker, "REMOTE_FULL_REMIND_S", 600.0)
    remote.full, count = True, len([m for m in said if "remote full" in m])
    sync.state.remote_checkpoint = None  # step 4 is to be synced again
    tries = remote.tries
    run_until(sync, lambda: remote.tries > tries and sync.worker is None)
    again = [m for m in said if "remote full" in m]
    assert len(again) == count + 1 and again[-1].startswith("remote full (needs "), said


# --- `run --check`: the remote's room against the checkpoints its syncs hold at once (a real tmpfs as the remote) ---
@pytest.mark.slow
def test_run_check_weighs_a_local_remote_against_two_and_sync_keep_plus_one_checkpoints(tmp_path, corpus,
                                                                                       small_tmpfs):
    def check(size_in_checkpoints: float) -> subprocess.CompletedProcess:
        disk = small_tmpfs(max(4096, int(size_in_checkpoints * one)))
        (here := tmp_path / str(size_in_checkpoints)).mkdir()
        config = write_config(here, corpus, run={"remote": str(disk / "remote")},
                              sync={"keep": 3})
        return cli("run", str(config), "--check")

    (tmp_path / "probe").mkdir()
    probe = load_config(write_config(tmp_path / "probe", corpus))
    one = checkpoint_bytes(probe, read_corpus_meta(probe.data.prepared)["files"][CORPUS_TOKENIZER]["size"])
    never = check(1.5)  # the first sync fits, no second one ever could
    assert never.returncode == 2, never.stdout + never.stderr
    assert "less than the 2 checkpoints of about" in never.stdout + never.stderr, never.stdout + never.stderr
    tight = check(3)  # two fit, not the 4 of sync.keep = 3 + 1 being copied
    assert tight.returncode == 0, tight.stdout + tight.stderr
    assert "under the 4 checkpoints of about" in tight.stdout and "sync.keep = 3" in tight.stdout, tight.stdout
    roomy = check(8)
    assert roomy.returncode == 0 and "checkpoints of about" not in roomy.stdout, roomy.stdout + roomy.stderr


def test_the_room_on_a_remote_counts_this_runs_step_directories_as_room_and_follows_no_link(tmp_path):
    remote = tmp_path / "remote"
    (remote / "step-00000010").mkdir(parents=True)
    (remote / "step-00000010" / "model.safetensors").write_bytes(b"x" * 1000)
    (remote / "step-00000010" / "link").symlink_to(tmp_path / "big")
    (tmp_path / "big").write_bytes(b"y" * 5000)
    (remote / "step-00000020").symlink_to(tmp_path)  # a link by a step's name: not counted, not followed
    (remote / "other").mkdir()
    (remote / "other" / "f").write_bytes(b"z" * 3000)
    assert remote_room._steps_bytes(remote) == 1000
