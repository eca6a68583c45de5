"""The messages of a remote out of reach name what is actually missing or failing: a stage whose predecessor's
remote is gone names that remote (on main: `<init.from>: no such file or directory`, the config file that is
there); a prune while no sync has failed does not say the remote has been failing (on main: "the remote has been
failing for 64s" with `sync: idle`); the overview shows a run waiting for its remote as such; a run's records say
whether it synced before (daemon/jobs/remotewait.py)."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import RunConfig, load_config
from minilmd.daemon.base.runstate import RunState, new_state
from minilmd.daemon.base.worker import Inbox
from minilmd.daemon.infra import Infra
from minilmd.daemon.jobs.syncworker import SyncWorker
from minilmd.daemon.views.overview import shown_phase
from minilmd.fsio import atomic_write_json
from minilmd.init_source import InitSourceUnreachable, resolve
from supervisor_helpers import cli, write_config


def finished_predecessor(tmp_path: Path, corpus) -> tuple[Path, Path]:
    """A run "sft" that has finished (its state.json says so) and synced to its remote: (its config, its remote)."""
    config = write_config(tmp_path, corpus, name="sft")
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    body = new_state("sft", cfg.run_dir, str(config))
    body.update(phase="done", outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": "the run finished"})
    atomic_write_json(cfg.run_dir / names.STATE, body)
    return config, Path(cfg.run.remote)


@pytest.mark.parametrize("how", ["not there", "an empty directory", "a link to nowhere"])
def test_a_stage_whose_predecessors_remote_is_gone_names_that_remote(tmp_path, corpus, how):
    sft, remote = finished_predecessor(tmp_path, corpus)
    if how == "an empty directory":
        remote.mkdir(parents=True)
    elif how == "a link to nowhere":
        remote.symlink_to(tmp_path / "nfs" / "sft")
    with pytest.raises(InitSourceUnreachable) as caught:
        resolve(str(sft))
    said = str(caught.value)
    assert said.startswith(f"the run sft has finished, but {remote}, which holds its checkpoints, is {how}"), said
    assert "no such file or directory" not in said

    stage = write_config(tmp_path, corpus, name="lora", init={"from": str(sft)})
    out = cli("run", "--check", str(stage))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"waits: init.from = '{sft}' cannot be reached now (the run sft has finished, but {remote}, which holds " \
           f"its checkpoints, is {how}" in out.stdout, out.stdout


class NoPrune(Infra):
    def __init__(self):
        self.asked: list[int] = []

    def prune_local(self, root, keep, protect, log):
        self.asked.append(keep)
        return [root / "step-00000001"]  # what it would have deleted: the message is what is looked at


def unsynced_worker(tmp_path: Path) -> tuple[SyncWorker, list[str]]:
    """A SyncWorker with a remote, four local checkpoints and no verified sync for 4000 s (a clock set back)."""
    cfg = RunConfig()
    cfg.run.scratch, cfg.run.remote, cfg.train.keep_local = str(tmp_path / "scratch"), "/nfs/r", 1
    for step in (1, 2, 3, 4):
        ckpt = cfg.checkpoint_dir / names.step_name(step)
        ckpt.mkdir(parents=True)
        (ckpt / names.MANIFEST).write_text(json.dumps({"files": {}}))
    said: list[str] = []
    sync = SyncWorker(cfg, NoPrune(), RunState(tmp_path / "state.json", {}), lambda kind, msg, **d: said.append(msg),
                      Inbox(lambda *a, **k: None))
    sync.syncer = object()  # tick() goes on only with one; no sync is due here
    sync.next_at = time.time() + 3600
    sync.healthy_since -= 4000  # past 2 x sync.every (15 min)
    return sync, said


def test_a_prune_while_no_sync_has_failed_does_not_say_the_remote_is_failing(tmp_path):
    sync, said = unsynced_worker(tmp_path)
    sync.tick(periodic=True)
    assert len(said) == 1 and "has been failing" not in said[0], said
    assert re.match(r"pruned local checkpoints \['step-00000001'\] \(no verified sync for 4\d\d\ds, though no sync "
                    r"has failed \(none was due; sync: off\)", said[0]), said


def test_a_prune_while_syncs_fail_says_since_when_and_how_many(tmp_path):
    sync, said = unsynced_worker(tmp_path)
    sync.failures, sync.failing_since = 3, time.time() - 200
    sync.state.sync.error = "SyncError: EIO"
    sync.tick(periodic=True)
    assert len(said) == 1 and re.search(r"\(no verified sync for 4\d\d\ds: the remote has been failing for 2\d\ds "
                                        r"\(3 syncs in a row failed: SyncError: EIO\)", said[0]), said


def test_the_overview_shows_a_run_waiting_for_its_remote():
    assert shown_phase({"phase": "staging", "staging_state": "waiting_remote"}) == "staging: waiting_remote"
    assert shown_phase({"phase": "staging", "staging_state": "fetching"}) == "staging"


def test_a_runs_records_say_whether_it_synced_before(tmp_path):
    from minilmd.daemon.base.statesections import RemoteCheckpoint
    from minilmd.daemon.jobs import remotewait  # new: a module of its own

    on_it = RemoteCheckpoint(step=194, time=1.0, verified=True, path="/nfs/r/step-00000194")
    assert remotewait.records("/nfs/r", tmp_path, on_it) == \
        remotewait.Records("synced", "state.json records step 194 on it", 194)
    assert remotewait.records("/nfs/r", tmp_path, None).verdict == "never"
    lines = [{"event": "sync", "message": "periodic sync: syncing"},
             {"event": "sync", "message": "synced step 30", "step": 30, "verified": True, "remote": "/nfs/r"},
             {"event": "prune", "message": "x", "step": 99},
             {"event": "fetch", "message": "scratch held no checkpoint: fetched", "step": 40, "remote": "/nfs/r/"}]
    (tmp_path / names.EVENTS).write_text("".join(json.dumps(rec, sort_keys=True) + "\n" for rec in lines) + "{torn")
    found = remotewait.records("/nfs/r", tmp_path, None)
    assert found.why == "events.jsonl records step 40 synced to or fetched from it"
    wait, why = remotewait.decision("/nfs/r", "not there (its share gone?)", found, fresh=False)
    assert wait and why == "/nfs/r is not there (its share gone?), and this run has synced to it before " \
                           "(events.jsonl records step 40 synced to or fetched from it)"
    assert not remotewait.decision("/nfs/r", "not there (its share gone?)", found, fresh=True)[0]


def test_a_remote_that_answers_with_no_checkpoint_that_verifies_is_waited_for_by_a_run_that_synced_there():
    """fault9 F2: every checkpoint set aside as invalid (or gone) on a remote that answers; before, step 0."""
    from minilmd.daemon.jobs import remotewait

    synced = remotewait.Records("synced", "state.json records step 160 on it", 160)
    aside = ("/nfs/r/step-00000160 (moved to /nfs/r/quarantine/step-00000160-20261206T090758)",)
    wait, why = remotewait.decision("/nfs/r", "", synced, fresh=False, set_aside=aside)
    assert wait and why.startswith("/nfs/r holds no checkpoint that verifies: 1 set aside as invalid (/nfs/r/step-"
                                   "00000160 (moved to /nfs/r/quarantine/step-00000160-") and \
        "this run has synced to it before (state.json records step 160 on it)" in why, why
    wait, why = remotewait.decision("/nfs/r", "", synced, fresh=False)  # a restart: quarantined at the last one
    assert wait and "/nfs/r/quarantine" in why, why
    assert not remotewait.decision("/nfs/r", "", synced, fresh=True, set_aside=aside)[0]
    unknown = remotewait.Records("unknown", "state.json is not valid JSON")
    assert remotewait.decision("/nfs/r", "", unknown, fresh=False, set_aside=aside)[0]
    assert remotewait.decision("/nfs/r", "", unknown, fresh=False) == \
        (False, "neither scratch nor /nfs/r holds a checkpoint")
    never = remotewait.Records("never", "")
    assert remotewait.decision("/nfs/r", "", never, fresh=False) == (False, "neither scratch nor /nfs/r holds a "
                                                                           "checkpoint")
    wait, why = remotewait.decision("/nfs/r", "", never, fresh=False, set_aside=aside)
    assert not wait and why.startswith("/nfs/r holds no checkpoint that verifies: 1 set aside") and \
        why.endswith("this run has never synced to it"), why
