"""The last sync pushes nothing when scratch holds nothing newer than the remote is recorded to hold
(daemon/jobs/lastsyncrule.py, review12a F1), and the run's records of its remote take the newer of state.json's step
and events.jsonl's (daemon/jobs/remotewait.py `records`). A SyncWorker with a Syncer that only counts its syncs."""
from __future__ import annotations

import json

from held_sync import HeldSyncer, OneSyncer
from minilmd.config import RunConfig
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.daemon.base.worker import Inbox
from minilmd.daemon.jobs import remotewait
from minilmd.daemon.jobs.syncworker import SyncWorker

REMOTE = "/nfs/r"


def _worker(tmp_path, local: int, recorded: int | None) -> tuple[SyncWorker, HeldSyncer, list[str]]:
    """Scratch holding step `local`; state.json recording step `recorded` synced to REMOTE (None: none)."""
    cfg = RunConfig()
    cfg.run.scratch, cfg.run.remote = str(tmp_path / "scratch"), REMOTE
    ckpt = cfg.checkpoint_dir / f"step-{local:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text(json.dumps({"files": {}}))  # held_sync's: a checkpoint as scratch lists it
    state = RunState(tmp_path / "state.json", {})
    if recorded is not None:
        state.remote_checkpoint = RemoteCheckpoint(step=recorded, time=1.0, verified=True,
                                                   path=f"{REMOTE}/step-{recorded:08d}")
    said: list[str] = []
    syncer = HeldSyncer()
    syncer.release.set()
    return SyncWorker(cfg, OneSyncer(syncer), state, lambda kind, msg, **d: said.append(msg),
                      Inbox(lambda *a, **k: None)), syncer, said


def test_a_last_sync_of_an_older_step_than_state_json_records_is_refused_and_the_record_kept(tmp_path):
    """A trainer ran (it may have saved), but scratch's newest, step 4, is older than step 8 recorded synced: before,
    the last sync pushed step 4 (the remote's LATEST moved back, state.json's step rewritten); now nothing."""
    sync, syncer, said = _worker(tmp_path, 4, 8)
    sync.trainer_launched = True
    assert sync.final_sync(None) == ""
    assert not syncer.started.is_set() and sync.worker is None
    assert any("the last sync pushes nothing: scratch's newest checkpoint, step 4, is older than step 8, which "
               "state.json records synced to /nfs/r" in m for m in said), said
    assert sync.state.remote_checkpoint is not None and sync.state.remote_checkpoint.step == 8


def test_a_last_sync_of_the_step_this_start_fetched_with_no_trainer_run_pushes_nothing(tmp_path):
    """No record of the remote at all, but scratch's newest is the step this start fetched, and no trainer ran."""
    sync, syncer, said = _worker(tmp_path, 4, None)
    assert sync.final_sync(None, fetched=4) == ""
    assert not syncer.started.is_set()
    assert any("step 4, is the one this start fetched from /nfs/r, and no trainer ran since" in m for m in said), said


def test_a_last_sync_of_a_newer_step_than_recorded_goes_on(tmp_path):
    sync, syncer, _said = _worker(tmp_path, 4, 2)
    sync.trainer_launched = True
    assert sync.final_sync(None, fetched=4) is None  # begun
    assert syncer.started.wait(30)


def test_the_records_take_events_newer_step_over_an_older_state_json(tmp_path):
    """state.json says step 10 (rewritten by an older minilmd's last sync after a stop during the re-list), the
    events say step 20 was synced there: the records say 20 (before: 10, and no re-list at the next start)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [{"event": "sync", "message": "synced step 20", "step": 20, "remote": REMOTE},
             {"event": "sync", "message": "synced step 10", "step": 10, "remote": REMOTE}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    older = RemoteCheckpoint(step=10, time=1.0, verified=True, path=f"{REMOTE}/step-00000010")
    found = remotewait.records(REMOTE, run_dir, older)
    assert (found.verdict, found.step) == (remotewait.SYNCED, 20), found
    assert "records step 20" in found.why and "state.json records step 10" in found.why, found.why
    newer = RemoteCheckpoint(step=30, time=1.0, verified=True, path=f"{REMOTE}/step-00000030")
    assert remotewait.records(REMOTE, run_dir, newer).step == 30


def test_after_a_start_that_resumed_from_an_older_step_saying_so_the_older_steps_are_pushed(tmp_path):
    """This start's staging resumed from an older step than the remote held and said which steps are trained again
    (its newer ones set aside as invalid, or gone): the record's step is lost there, so the last sync pushes scratch's
    newest (step 4) though state.json records step 8."""
    sync, syncer, _said = _worker(tmp_path, 4, 8)
    sync.trainer_launched = True
    assert sync.final_sync(None, fetched=2, rewound=True) is None  # begun
    assert syncer.started.wait(30)
