"""A Slurm job's kept copy that does not verify when the requeued job fetches it back (daemon/jobs/keptcopy.py,
daemon/jobs/keptremote.py): set aside into `<run.dir>/unsynced/quarantine/`, said in the one line the start emits
(where, and why), recorded as this run's, and removed with unsynced/'s LATEST and unsynced/ itself once run.remote
holds its step or a newer one, or at the end of a run whose trainer ended done (daemon/aftersync.py at_end).

Before (real-fault audit F5): the quarantine was silent ("did not verify: not resumed from") and stayed in run.dir
after the run finished, with the LATEST naming it. What the record does not prove this run's is never removed: a
directory the user put in quarantine/, or a copy whose manifest does not name its step when it was set aside."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

from minilmd.daemon.aftersync import AfterSync
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.daemon.jobs import keptcopy
from minilmd.names import LATEST, MANIFEST, QUARANTINE, REASON_FILE, step_name
from sync_helpers import EXPECTED, corrupt, save, weights  # noqa: F401 - the fixture


def _damaged_kept(tmp_path, weights, step: int = 30, what: str = ".safetensors"):
    """A run whose step `step` is kept in run.dir (run.remote behind it), one of its files then damaged, and the
    requeued job's scratch empty (another node): cfg."""
    (tmp_path / "run").mkdir(mode=0o700)
    cfg = SimpleNamespace(checkpoint_dir=tmp_path / "scratch" / "checkpoints", run_dir=tmp_path / "run")
    save(cfg.checkpoint_dir, step, weights)
    assert keptcopy.keep(cfg, EXPECTED, 10).step == step
    shutil.rmtree(cfg.checkpoint_dir)
    corrupt(next(p for p in (keptcopy.place(cfg) / step_name(step)).iterdir() if p.name.endswith(what)))
    return cfg


def _set_aside(cfg) -> list[str]:
    return sorted(p.name for p in (keptcopy.place(cfg) / QUARANTINE).iterdir())


def test_a_damaged_kept_copy_is_said_where_it_is_set_aside_and_removed_once_the_remote_holds_its_step(
        tmp_path, weights):
    cfg = _damaged_kept(tmp_path, weights)
    said = keptcopy.bring_back(cfg, EXPECTED)
    [aside] = _set_aside(cfg)
    where = keptcopy.place(cfg) / QUARANTINE / aside
    assert "did not verify: not resumed from" in said and f"set aside in {where} (" in said, said
    assert "sha256" in said and "removed once run.remote holds its step" in said, said  # why, and what comes
    assert (where / REASON_FILE).is_file() and not (cfg.checkpoint_dir / step_name(30)).exists()
    assert keptcopy.drop_if_synced(cfg, 20) == "" and _set_aside(cfg) == [aside]  # the remote is behind it
    done = keptcopy.drop_if_synced(cfg, 30)
    assert f"removed the damaged copy set aside in {where}" in done and "empty then, with it" in done, done
    assert not keptcopy.place(cfg).exists()  # quarantine/, LATEST and unsynced/ itself: nothing left in run.dir


def test_the_end_of_a_run_done_removes_it_whatever_its_step(tmp_path, weights):
    cfg = _damaged_kept(tmp_path, weights)
    keptcopy.bring_back(cfg, EXPECTED)
    state = SimpleNamespace(remote_checkpoint=RemoteCheckpoint(step=20), slurm={})
    events: list[tuple] = []
    stopped = AfterSync(cfg, state, lambda *a, **k: events.append(a))  # a stop, not done: kept for the next start
    assert stopped.at_end(20) == "" and len(_set_aside(cfg)) == 1
    done = AfterSync(cfg, state, lambda *a, **k: events.append(a), finished=lambda: True)
    said = done.at_end(20)  # the budget lowered under it: run.remote never gets step 30, the run is done
    assert "removed the damaged copy set aside" in said and "the run is done" in said, said
    assert not keptcopy.place(cfg).exists()


def test_what_the_record_does_not_prove_this_runs_is_never_removed(tmp_path, weights):
    cfg = _damaged_kept(tmp_path, weights, what=MANIFEST)  # its manifest no longer names its step: no proof
    said = keptcopy.bring_back(cfg, EXPECTED)
    [aside] = _set_aside(cfg)
    assert f"set aside in {keptcopy.place(cfg) / QUARANTINE / aside}" in said and "left there for good" in said, said
    users = keptcopy.place(cfg) / QUARANTINE / "step-00000030-20990101T000000"  # the user's, by a set-aside name
    users.mkdir()
    (users / "notes.txt").write_text("the user's\n")
    assert keptcopy.drop_if_synced(cfg, 30, done=True) == ""
    assert _set_aside(cfg) == sorted([aside, users.name]) and (keptcopy.place(cfg) / LATEST).is_file()
    assert (users / "notes.txt").read_text() == "the user's\n"


def test_a_newer_copy_kept_since_stays_and_is_brought_back_when_the_one_set_aside_goes(tmp_path, weights):
    cfg = _damaged_kept(tmp_path, weights)
    keptcopy.bring_back(cfg, EXPECTED)  # step 30 set aside; the job resumes from run.remote's step 10
    save(cfg.checkpoint_dir, 40, weights)
    assert keptcopy.keep(cfg, EXPECTED, 30).step == 40  # its last sync put step 30 there, not step 40
    shutil.rmtree(cfg.checkpoint_dir)  # the next job, on another node
    said = keptcopy.drop_if_synced(cfg, 30)  # staging's first call (daemon/jobs/stagingfetch.py), then bring_back
    assert "removed the damaged copy set aside" in said and "removed step" not in said, said
    assert keptcopy.kept_step(cfg) == 40 and (keptcopy.place(cfg) / LATEST).read_text().strip() == step_name(40)
    assert "resuming from step 40" in keptcopy.bring_back(cfg, EXPECTED)


def test_a_copy_set_aside_then_removed_by_hand_is_recorded_no_more(tmp_path, weights):
    """quarantine/ stays (the user's own directory in it), the copy set aside removed by hand: its record goes, so
    that no later directory given its inode number is taken for it. Before: kept while quarantine/ was there."""
    import json

    from minilmd.names import KEPT_MADE

    cfg = _damaged_kept(tmp_path, weights)
    keptcopy.bring_back(cfg, EXPECTED)
    [aside] = _set_aside(cfg)
    made = cfg.run_dir / KEPT_MADE
    assert [e for e in json.loads(made.read_text())["made"] if e[0] == QUARANTINE]
    (keptcopy.place(cfg) / QUARANTINE / "mine").mkdir()
    shutil.rmtree(keptcopy.place(cfg) / QUARANTINE / aside)
    assert keptcopy.drop_if_synced(cfg, 20) == ""  # the remote behind: nothing due
    assert not [e for e in json.loads(made.read_text())["made"] if e[0] == QUARANTINE]
    assert _set_aside(cfg) == ["mine"]
