"""A run's remote belongs to that run alone (daemon/jobs/remote_claim.py), and never lies in its scratch
(minilmd/scratch.py remote_overlap_problem). A new-user audit lost every checkpoint two ways:

- a config copied for a second run (new run.name and run.dir, run.remote forgotten): `run --check` said OK and
  "resumes from step N (remote: <the first run's checkpoint>)", the twin adopted it, synced its own steps there and
  its retention (`sync.keep`) pruned the first run's checkpoints;
- a run.remote inside (or equal to) run.scratch: `--check` said OK, and giving scratch back at the end of the run
  deleted the remote with it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names, run_owner, scratch
from minilmd.config import load_config
from minilmd.daemon.jobs import remote_claim, remote_consent
from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import RemoteOfAnotherRun, SyncError
from supervisor_helpers import cli, events, run_supervisor, write_config
from sync_helpers import EXPECTED, dirs, save, weights  # noqa: F401 - fixtures

TWIN_WORDS = ("belongs to another run", "init.from")


def _steps(remote: Path) -> list[str]:
    return sorted(n for n in os.listdir(remote) if names.is_step_name(n))


def _twin(tmp_path: Path, corpus, first) -> Path:
    """The first run's config copied with a new run.name and run.dir, its run.remote left as it was."""
    return write_config(tmp_path, corpus, name="twin", run={"remote": first.run.remote})


# --- the remote vs scratch and run.dir: the rule ----------------------------------------------------------------------

@pytest.mark.parametrize("remote, words", [
    ("scr", "is run.scratch"),
    ("scr/remote", "lies inside run.scratch"),
    (".", "holds run.scratch"),
    ("run", "is run.dir itself"),
])
def test_a_remote_that_is_in_or_holds_scratch_or_is_run_dir_is_refused(tmp_path, remote, words):
    said = scratch.remote_overlap_problem(tmp_path / remote, tmp_path / "scr", tmp_path / "run")
    assert said is not None and words in said


@pytest.mark.parametrize("remote", ["run/remote", "nfs/remote", "scr-remote"])
def test_a_remote_apart_from_scratch_even_inside_run_dir_is_fine(tmp_path, remote):
    assert scratch.remote_overlap_problem(tmp_path / remote, tmp_path / "scr", tmp_path / "run") is None


def test_a_link_to_scratch_is_scratch(tmp_path):
    (tmp_path / "scr").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "scr")
    said = scratch.remote_overlap_problem(tmp_path / "alias" / "remote", tmp_path / "scr", tmp_path / "run")
    assert said is not None and "inside run.scratch" in said


@pytest.mark.slow
@pytest.mark.parametrize("where", ["inside", "equal", "file-url"])
def test_check_and_launch_refuse_a_remote_in_scratch_and_nothing_is_lost(tmp_path, corpus, where):
    scr = tmp_path / "s" / "scratch"
    remote = {"inside": str(scr / "remote"), "equal": str(scr), "file-url": f"file://{scr}/remote"}[where]
    config = write_config(tmp_path, corpus, run={"remote": remote, "keep_scratch": False})
    checked = cli("run", "--check", str(config))
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "run.scratch" in checked.stderr + checked.stdout and "durable" in checked.stderr + checked.stdout
    assert run_supervisor(config, tmp_path) == 2
    assert not (scr / names.CHECKPOINTS).exists()  # nothing trained, nothing given back


# --- the claim: a remote names its run ----------------------------------------------------------------------------

def _claim(run_dir: Path, name: str = "r") -> remote_claim.Claim:
    return remote_claim.Claim(run_dir, name)


def test_the_first_sync_claims_the_remote_and_another_runs_sync_neither_copies_nor_prunes(dirs, weights, tmp_path):
    local, remote = dirs
    first = Syncer(local, str(remote), EXPECTED, keep=2, claim=_claim(tmp_path / "a", "a"))
    for step in (10, 20):
        save(local, step, weights)
        first.sync_newest()
    owner = remote_claim.read(open_remote(str(remote)))
    assert owner is not None and owner["run_dir"] == run_owner.run_identity(tmp_path / "a") and owner["run_name"] == "a"

    twin_local = tmp_path / "twin" / "checkpoints"
    for step in (30, 40, 50):
        save(twin_local, step, weights)
    twin = Syncer(twin_local, str(remote), EXPECTED, keep=2, claim=_claim(tmp_path / "twin", "twin"))
    with pytest.raises(SyncError, match="belongs to another run"):
        twin.sync_newest()
    with pytest.raises(SyncError, match="belongs to another run"):
        twin.fetch_latest(tmp_path / "fetched")
    assert _steps(remote) == ["step-00000010", "step-00000020"]
    assert checkpoint_dirs.read_latest(remote) == "step-00000020"


def test_retention_prunes_nothing_once_the_remote_names_another_run(dirs, weights, tmp_path, monkeypatch):
    local, remote = dirs
    syncer = Syncer(local, str(remote), EXPECTED, keep=1, claim=_claim(tmp_path / "a"))
    save(local, 10, weights)
    syncer.sync_newest()
    # another run's claim there once this sync has checked it (a race, or a hand's): retention runs after the copy
    owner = remote / names.REMOTE_OWNER
    owner.unlink()
    owner.write_bytes(run_owner.encode(run_owner.record(tmp_path / "b", "b")))
    monkeypatch.setattr(syncer, "_ensure_claim", lambda: None)  # the check passed before the change
    logs: list[str] = []
    syncer.log = logs.append
    save(local, 20, weights)
    syncer.sync_newest()
    assert _steps(remote) == ["step-00000010", "step-00000020"]  # step 10 kept: keep=1 would have pruned it
    assert any("retention left" in m and str(tmp_path / "b") in m for m in logs), logs


def test_an_unclaimed_remote_with_checkpoints_is_adopted_only_by_the_run_that_synced_there(dirs, weights, tmp_path):
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()  # an older minilmd's sync: no claim
    store = open_remote(str(remote))
    said = remote_claim.problem(store, _claim(tmp_path / "twin"))
    assert said is not None and "no owner.json" in said and run_owner.run_identity(tmp_path / "twin") in said
    own = remote_claim.Claim(tmp_path / "a", "a", synced_before=lambda: "state.json records step 10 on it")
    assert remote_claim.problem(store, own) is None
    assert remote_claim.ensure(store, own) is True
    assert remote_claim.read(store)["run_dir"] == run_owner.run_identity(tmp_path / "a")


def test_an_empty_remote_is_anyones_and_an_unreadable_claim_is_refused(tmp_path):
    remote = tmp_path / "remote"
    store = open_remote(str(remote))
    assert remote_claim.problem(store, _claim(tmp_path / "a")) is None  # not even made yet
    remote.mkdir()
    (remote / names.REMOTE_OWNER).write_text("{not json")
    said = remote_claim.problem(open_remote(str(remote)), _claim(tmp_path / "a"))
    assert said is not None and "not valid JSON" in said


@pytest.mark.slow
def test_a_copied_config_that_kept_run_remote_is_refused_and_the_first_run_keeps_its_checkpoints(tmp_path, corpus):
    first = load_config(write_config(tmp_path, corpus))
    assert run_supervisor(Path(first.source), tmp_path) == 0
    remote = Path(first.run.remote)
    before = _steps(remote)
    assert before[-1] == "step-00000030", before  # which older step is kept depends on when each sync ran
    twin = _twin(tmp_path, corpus, first)

    checked = cli("run", "--check", str(twin))
    said = checked.stdout + checked.stderr
    assert checked.returncode == 2, said
    assert all(w in said for w in TWIN_WORDS) and str(first.run_dir) in said and "resumes from" not in said

    (tmp_path / "twin-out").mkdir()
    assert run_supervisor(twin, tmp_path / "twin-out") == 2
    assert _steps(remote) == before and checkpoint_dirs.read_latest(remote) == "step-00000030"
    assert not load_config(twin).checkpoint_dir.exists()  # the twin fetched nothing, trained nothing

    again = cli("run", "--check", first.source)  # the first run's own remote stays its own
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.slow
def test_a_remote_an_older_minilmd_synced_stays_its_runs_and_is_refused_to_a_copy(tmp_path, corpus):
    first = load_config(write_config(tmp_path, corpus, train={"max_steps": 20}))
    assert run_supervisor(Path(first.source), tmp_path) == 0
    remote = Path(first.run.remote)
    (remote / names.REMOTE_OWNER).unlink()  # as an older minilmd left it: checkpoints, no claim
    twin = _twin(tmp_path, corpus, first)
    checked = cli("run", "--check", str(twin))
    assert checked.returncode == 2 and "no owner.json" in checked.stdout + checked.stderr, checked.stderr

    # the first run's records say it synced there: a longer run of it adopts the remote and claims it again
    longer = write_config(tmp_path, corpus, train={"max_steps": 30})
    assert run_supervisor(longer, tmp_path) == 0, events(first.run_dir)[-5:]
    assert _steps(remote)[-1] == "step-00000030" and checkpoint_dirs.read_latest(remote) == "step-00000030"
    owner = remote_claim.read(open_remote(str(remote)))
    assert owner is not None and owner["run_dir"] == run_owner.run_identity(first.run_dir)


def test_a_run_moved_to_a_new_server_keeps_its_remote_and_a_copy_with_a_new_name_does_not(tmp_path):
    """A run is its run.dir: moved to a server where run.dir is the same path (a shared home), or renamed in its
    run.dir, it keeps its remote; under another run.dir (another server's path, or a copy of the config), its
    run.name the same or not, it is refused, and the refusal names the consent, with which it is this run's."""
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / names.REMOTE_OWNER).write_bytes(run_owner.encode(run_owner.record(Path("/old-server/runs/s"), "s")))
    store = open_remote(str(remote))
    assert remote_claim.problem(store, _claim(Path("/old-server/runs/s"), "s")) is None  # moved, the same run.dir
    assert remote_claim.problem(store, _claim(Path("/old-server/runs/s"), "renamed")) is None  # renamed only
    moved = _claim(tmp_path / "new-server" / "run", "s")
    said = remote_claim.problem(store, moved)  # moved under another run.dir: the same run.name is not enough
    assert said is not None and "belongs to another run" in said and "/old-server/runs/s" in said
    assert "the same run.name, but a run is its run.dir" in said and "minilmd run --claim-remote CONFIG" in said
    said = remote_claim.problem(store, _claim(tmp_path / "copy" / "run", "copy"))
    assert said is not None and "/old-server/runs/s" in said and "'copy'" in said and "same run.name" not in said
    assert "/old-server/runs/s" in remote_consent.take_over(store, moved)  # the consent: the claim names it now
    assert remote_claim.problem(store, moved) is None


def test_a_copied_config_with_the_same_run_name_neither_syncs_to_nor_prunes_the_first_runs_remote(dirs, weights,
                                                                                               tmp_path):
    """The audit's case: a config copied with only run.dir changed (run.name and run.remote kept, another scratch).
    Before, the remote took the copy for the first run by its run.name: it resumed from the first run's checkpoint,
    and its retention (sync.keep) pruned the first run's steps."""
    local, remote = dirs
    first = Syncer(local, str(remote), EXPECTED, keep=2, claim=_claim(tmp_path / "a" / "run", "pretrain"))
    for step in (10, 20):
        save(local, step, weights)
        first.sync_newest()
    copy_local = tmp_path / "b" / "scratch" / "checkpoints"
    for step in (30, 40, 50):
        save(copy_local, step, weights)
    copy = Syncer(copy_local, str(remote), EXPECTED, keep=2, claim=_claim(tmp_path / "b" / "run", "pretrain"))
    with pytest.raises(RemoteOfAnotherRun, match="belongs to another run") as refused:  # final: the run stops
        copy.sync_newest()
    assert "--claim-remote" in refused.value.detail and "init.from" in refused.value.detail  # the log's, whole
    with pytest.raises(SyncError, match="belongs to another run"):
        copy.fetch_latest(tmp_path / "fetched")
    assert _steps(remote) == ["step-00000010", "step-00000020"]
    assert checkpoint_dirs.read_latest(remote) == "step-00000020"
    why = remote_claim.still_ours(open_remote(str(remote)), _claim(tmp_path / "b" / "run", "pretrain"))
    assert why is not None and str(tmp_path / "a" / "run") in why  # retention would delete nothing either


@pytest.mark.slow
def test_a_config_copied_with_only_run_dir_changed_is_refused_and_the_first_run_keeps_its_checkpoints(tmp_path,
                                                                                                   corpus):
    """The CLI: the copy (the same run.name and run.remote, another run.dir and run.scratch) is refused by --check
    (naming the consent) and at launch, exit 2; the first run's checkpoints are as they were."""
    first = load_config(write_config(tmp_path, corpus))
    assert run_supervisor(Path(first.source), tmp_path) == 0
    remote = Path(first.run.remote)
    before = _steps(remote)
    assert before[-1] == "step-00000030", before
    (tmp_path / "copy").mkdir()
    copy = write_config(tmp_path / "copy", corpus, name=first.run.name, run={"remote": first.run.remote})
    assert load_config(copy).run_dir != first.run_dir and load_config(copy).scratch_dir != first.scratch_dir

    checked = cli("run", "--check", str(copy))
    said = checked.stdout + checked.stderr
    assert checked.returncode == 2, said
    assert "belongs to another run" in said and str(first.run_dir) in said and "--claim-remote" in said, said
    assert "resumes from" not in said

    assert run_supervisor(copy, tmp_path / "copy") == 2
    assert _steps(remote) == before and checkpoint_dirs.read_latest(remote) == "step-00000030"
    assert not load_config(copy).checkpoint_dir.exists()  # the copy fetched nothing, trained nothing
    assert remote_claim.read(open_remote(str(remote)))["run_dir"] == run_owner.run_identity(first.run_dir)
