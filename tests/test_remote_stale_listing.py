"""A restart with an empty scratch whose remote lists only older steps than state.json records synced there, none
set aside (fault9 F2's design, its case not covered then: a directory listing an NFS client cached, a replica behind):
staging lists the remote again after RELIST_AFTER_S before resuming from the older step, and takes the newer step
listed then; a listing that stays older resumes from it, saying which steps are trained again. Before, the fetch took
the older step at the first listing, in silence. A fake remote (a Syncer whose first listings hide the newest step)."""
from __future__ import annotations

from pathlib import Path

import pytest

from minilmd import names, scratch
from minilmd.config import load_config
from minilmd.daemon.base.runstate import RunState, new_state
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.daemon.base.worker import Inbox
from minilmd.daemon.jobs import stagingfetch
from minilmd.daemon.jobs.stagingworker import Staged, StagingWorker
from minilmd.daemon.jobs.sync import Syncer
from minilmd.names import step_name
from supervisor_helpers import write_config
from sync_helpers import EXPECTED, corrupt, save, weights  # noqa: F401  (fixtures)
from waiting import wait_until


class Infra:
    """Staging's infra, as far as the fetch asks it: the run's expectation (the tiny model these checkpoints hold)."""

    def expectation(self, cfg, staged):
        return EXPECTED


class StaleListing(Syncer):
    """A remote whose first `stale` listings lack its newest step (a cached directory listing)."""

    stale = 1
    listings = 0

    def _steps(self) -> list[str]:
        StaleListing.listings += 1
        steps = super()._steps()
        return steps[:-1] if StaleListing.listings <= StaleListing.stale else steps


@pytest.mark.parametrize("stale", [1, 1000])
def test_an_older_listing_than_state_json_records_is_listed_again_before_an_older_step_is_resumed(
        tmp_path, corpus, weights, monkeypatch, stale):
    monkeypatch.setattr(stagingfetch, "RELIST_AFTER_S", 0.1)
    StaleListing.stale, StaleListing.listings = stale, 0
    cfg = load_config(write_config(tmp_path, corpus, name="stale"))
    cfg.run_dir.mkdir(parents=True)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)  # as the launch claims it
    remote = Path(cfg.run.remote)
    elsewhere = tmp_path / "before-the-reboot"
    for step in (5, 8):
        save(elsewhere, step, weights)
        Syncer(elsewhere, str(remote), EXPECTED).sync_newest()
    assert (remote / step_name(5)).is_dir() and (remote / step_name(8)).is_dir()
    emitted: list[tuple[str, str]] = []
    emit = lambda event, message, **_: emitted.append((event, message))
    run_state = RunState(cfg.run_dir / names.STATE, new_state("stale", cfg.run_dir, "stale.toml"))
    run_state.remote_checkpoint = RemoteCheckpoint(step=8, time=1.0, verified=True, path=str(remote / step_name(8)))
    staging = StagingWorker(cfg, Infra(), run_state, emit, Inbox(emit),
                            lambda expected: StaleListing(cfg.checkpoint_dir, str(remote), expected))
    staging.awaiting_remote, staging.fetch_retry_at = cfg.scratch_dir / names.STAGED_CORPUS, 0.0  # fetch only
    done = wait_until(lambda: staging.tick(), 120, "the fetch")
    assert isinstance(done, Staged), done
    infos = [m for e, m in emitted if e == "info"]
    assert any("lists no step newer than 5, though the run's records say step 8 was synced there: listing it "
               "again" in m for m in infos), infos
    notes = [m for e, m in emitted if e == "note"]
    if stale == 1:  # the second listing shows step 8: fetched, as an undisturbed restart would
        assert done.fetched == cfg.checkpoint_dir / step_name(8), emitted
        assert (cfg.checkpoint_dir / names.LATEST).read_text().strip() == step_name(8)
        assert not notes, notes
    else:  # it stays older: step 5, saying what is trained again
        assert done.fetched == cfg.checkpoint_dir / step_name(5), emitted
        assert len(notes) == 1 and "listed again after 0.1s the same" in notes[0] and \
            "resuming from step 5, which verifies: steps 6-8 are trained again" in notes[0] and \
            "state.json records step 8 on it" in notes[0], notes
    assert not (remote / names.QUARANTINE).exists()


def _staging_behind(tmp_path, corpus, weights, steps, recorded, name):
    """A staging with an empty scratch over a remote holding `steps` whose first listing lacks its newest, and a
    state.json recording `recorded` synced there; (staging, cfg, remote, emitted)."""
    StaleListing.stale, StaleListing.listings = 1, 0
    cfg = load_config(write_config(tmp_path, corpus, name=name))
    cfg.run_dir.mkdir(parents=True)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)
    remote = Path(cfg.run.remote)
    elsewhere = tmp_path / "before-the-reboot"
    for step in steps:
        save(elsewhere, step, weights)
        Syncer(elsewhere, str(remote), EXPECTED).sync_newest()
    emitted: list[tuple[str, str]] = []
    emit = lambda event, message, **_: emitted.append((event, message))
    run_state = RunState(cfg.run_dir / names.STATE, new_state(name, cfg.run_dir, f"{name}.toml"))
    run_state.remote_checkpoint = RemoteCheckpoint(step=recorded, time=1.0, verified=True,
                                                   path=str(remote / step_name(recorded)))
    staging = StagingWorker(cfg, Infra(), run_state, emit, Inbox(emit),
                            lambda expected: StaleListing(cfg.checkpoint_dir, str(remote), expected))
    return staging, cfg, remote, emitted


def test_a_second_listing_newer_but_still_behind_the_records_is_not_said_the_same(tmp_path, corpus, weights,
                                                                                  monkeypatch):
    """Steps 5 and 7 on the remote, step 9 recorded; the first listing lacks 7. Listed again, 7 is fetched: still
    older than the records. Before, the note said the second listing was "the same" (review12a F3); now it says
    the first listing's step and the newer one, and which steps are trained again."""
    monkeypatch.setattr(stagingfetch, "RELIST_AFTER_S", 0.1)
    staging, cfg, _remote, _emitted = _staging_behind(tmp_path, corpus, weights, (5, 7), 9, "behind")
    _expected, fetched, error = staging._fetch_job(cfg.scratch_dir / names.STAGED_CORPUS)
    assert error is None and fetched == cfg.checkpoint_dir / step_name(7), (fetched, error)
    assert len(staging.set_aside) == 1, staging.set_aside
    note = staging.set_aside[0]
    assert "the same" not in note and "listed no step newer than 5" in note and \
        "listed again after 0.1s its newest was step 7, still older: resuming from step 7" in note and \
        "steps 8-9 are trained again" in note, note
    assert staging.rewound  # said: the last sync may push the steps trained again (lastsyncrule.py)


def test_what_the_second_fetch_of_a_relisting_sets_aside_is_the_stagings(tmp_path, corpus, weights, monkeypatch):
    """The second listing shows step 7, which does not verify: the second fetch sets it aside. Before, only the
    first fetch's set-asides reached `fetch_set_aside` (what the wait for a valid checkpoint says: review12a F3)."""
    from minilmd import checkpoint as ck  # numpy: as the fetch itself

    monkeypatch.setattr(stagingfetch, "RELIST_AFTER_S", 0.1)
    staging, cfg, remote, _emitted = _staging_behind(tmp_path, corpus, weights, (5, 7), 9, "aside")
    corrupt(remote / step_name(7) / ck.TRAINER_STATE)
    _expected, fetched, error = staging._fetch_job(cfg.scratch_dir / names.STAGED_CORPUS)
    assert error is None and fetched == cfg.checkpoint_dir / step_name(5), (fetched, error)
    assert len(staging.fetch_set_aside) == 1 and step_name(7) in staging.fetch_set_aside[0], staging.fetch_set_aside
