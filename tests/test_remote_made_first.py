"""A run.remote directory that another user made first (audit hostile4 F1): on main `run --check` said OK, the run
claimed it, synced its only checkpoint copies into it and gave scratch back; the directory's owner then took them
away (chmod 700) and `export` of the run died on a PermissionError traceback. A directory of his above the remote,
or a link at its name, was refused already: only the remote's own directory escaped the owner check (open_root waived
the place rule for it whole, as a team directory). Now the remote's own directory may still be one others write (a
team-shared remote, by its owner's choice: place_rule's `team_root`) but must be root's, this user's or the owner a
squashing share gives this user's files (remote_write.OWN_UIDS): refused at `--check`, at launch and by the sync
before its first claim (a directory he makes while the run trains: the run ends failed, its last checkpoint kept
in scratch), naming its owner, with nothing synced there. The legitimate remotes (the
run's own, a team directory of root's holding it) stay usable.
"""
from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.jobs import remote_claim
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from second_user import as_teammate, second_user, shared, team  # noqa: F401 - fixtures
from supervisor_helpers import (
    cli,
    run_supervisor,
    start_supervisor,
    state,
    step_of_state,
    wait_for,
    wait_or_kill,
    write_config,
)
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture
from waiting import without_blocking


def _made_by_him(where: Path, mode: int) -> Path:
    """where/remote made first by the second user, `mode` (2775 in a team directory, 0777 in a sticky one)."""
    remote = where / "remote"
    as_teammate(f"mkdir -m {mode:o} {remote}")
    assert os.lstat(remote).st_uid == second_user()[0]
    return remote


def _his_name() -> str:
    return pwd.getpwuid(second_user()[0]).pw_name


@pytest.fixture(params=["team", "sticky"])
def his_remote(request, shared, team):
    """run.remote's directory made first by the second user: in a team directory (root's, 0770, his group: he may
    create there) or in a sticky world-writable one (/tmp's kind)."""
    if request.param == "team":
        return _made_by_him(team, 0o2775)
    return _made_by_him(shared, 0o777)


@pytest.mark.slow
def test_check_and_launch_refuse_a_remote_another_user_made_first_naming_him(tmp_path, corpus, his_remote):
    config = write_config(tmp_path, corpus, run={"remote": str(his_remote)})
    checked = cli("run", "--check", str(config))
    said = checked.stdout + checked.stderr
    assert checked.returncode == 2, said  # main: 0, "OK"
    assert f"the directory {his_remote} belongs to user {_his_name()}" in said, said
    assert "choose another run.remote" in said and "Traceback" not in said, said
    assert run_supervisor(config, tmp_path) == 2  # main: 0, its checkpoints synced into his directory
    assert os.listdir(his_remote) == []  # nothing synced there: no claim, no step, no LATEST


def test_the_sync_writes_nothing_into_a_remote_another_user_made_first_and_scratch_keeps_its_checkpoint(
        tmp_path, weights, his_remote):
    """The remote made by him after the launch's checks (before the run's first sync): the sync refuses before it
    claims, copies or prunes anything, so the run never gives its scratch back on a copy it does not hold."""
    local = tmp_path / "scratch" / "checkpoints"
    step = save(local, 10, weights)
    syncer = Syncer(local, str(his_remote), EXPECTED, claim=remote_claim.Claim(tmp_path / "run", "r"))
    with pytest.raises(SyncError, match=f"belongs to user {_his_name()}"):
        without_blocking(syncer.sync_newest)  # main: synced, step-00000010 in his directory
    assert os.listdir(his_remote) == []
    assert (step / names.MANIFEST).is_file()


def test_a_team_shared_remote_of_this_users_own_stays_usable(tmp_path, weights, team):
    """The legitimate kinds: a run's own remote made on an earlier start, group-writable in a team directory of
    root's (this user's own here: the tests run as root), is claimed and synced as before; --check says OK."""
    remote = team / "remote"
    remote.mkdir()
    remote.chmod(0o2775)
    local = tmp_path / "scratch" / "checkpoints"
    save(local, 10, weights)
    syncer = Syncer(local, str(remote), EXPECTED, claim=remote_claim.Claim(tmp_path / "run", "r"))
    without_blocking(syncer.sync_newest)
    assert sorted(os.listdir(remote)) == [names.LATEST, names.REMOTE_OWNER, "step-00000010"]


@pytest.mark.slow
def test_a_remote_he_makes_after_the_launchs_checks_gets_nothing_and_scratch_keeps_the_run(tmp_path, corpus, shared):
    """His directory made while the run trains, before its first checkpoint (so before its first sync's claim): every
    sync is refused, the run ends failed with its last checkpoint in scratch, said; the start after it is refused."""
    remote, release = shared / "remote", tmp_path / "release"
    config = write_config(tmp_path, corpus, run={"remote": str(remote)})
    run_dir, scratch = tmp_path / "s" / "run", tmp_path / "s" / "scratch"
    proc = start_supervisor(config, tmp_path / "supervisor.out", FAKE_HOLD=f"5:{release}")
    try:
        wait_for(lambda: step_of_state(run_dir) >= 5 or proc.poll() is not None, timeout=120, what="step 5")
        _made_by_him(shared, 0o777)
        release.touch()
        status = wait_or_kill(proc, timeout=240)
    finally:
        release.touch()
        wait_or_kill(proc, timeout=60)
    final = state(run_dir)
    assert status == 1, (tmp_path / "supervisor.out").read_text()[-3000:]  # main: 0, its checkpoints in his directory
    assert final["phase"] == "failed" and f"belongs to user {_his_name()}" in final["reason"], final
    assert f"the checkpoint stays in {scratch / 'checkpoints'}" in final["reason"], final["reason"]
    assert os.listdir(remote) == []
    assert (scratch / "checkpoints" / names.step_name(30)).is_dir()  # the run's only copy, kept
    assert run_supervisor(config, tmp_path) == 2  # the restart (systemd's): refused, final
    assert os.listdir(remote) == [] and (scratch / "checkpoints" / names.step_name(30)).is_dir()


def test_a_remote_replaced_under_the_run_is_said_replaced_and_gets_nothing(tmp_path, weights, team):
    """Hostile audit 10 F4: a group member of the team directory above the run's remote moves it away and makes his
    own at its name (`mv remote remote.stolen; mkdir -m777 remote`). Before, the sync said only that the directory
    belonged to him; now it says first that run.remote was replaced since this run claimed it (the root's device and
    inode, recorded in the run's run.dir at the claim: the claim on the remote went with the directory) and that the
    checkpoints synced before are no longer there, in this process and after a restart alike; nothing is written."""
    remote, run_dir = team / "remote", tmp_path / "run"
    run_dir.mkdir()
    local = tmp_path / "scratch" / "checkpoints"
    save(local, 10, weights)
    claim = remote_claim.Claim(run_dir, "r")
    syncer = Syncer(local, str(remote), EXPECTED, claim=claim, run_dir=run_dir)
    without_blocking(syncer.sync_newest)
    claimed = os.stat(remote)
    assert names.REMOTE_OWNER in os.listdir(remote)

    as_teammate(f"cd {team} && mv remote remote.stolen && mkdir -m 777 remote")
    save(local, 20, weights)
    restarted = Syncer(local, str(remote), EXPECTED, claim=claim, run_dir=run_dir)  # its record alone remembers
    for sync in (syncer, restarted):
        with pytest.raises(SyncError) as refused:
            without_blocking(sync.sync_newest)
        said = str(refused.value)
        assert (f"run.remote {remote} was replaced since this run claimed it (was dev {os.major(claimed.st_dev)}:"
                f"{os.minor(claimed.st_dev)} inode {claimed.st_ino}" in said), said
        assert "the checkpoints synced before are no longer there" in said, said
        assert f"belongs to user {_his_name()}" in said, said  # and still refused: nothing written into his directory
        assert os.listdir(remote) == []
    assert sorted(os.listdir(team / "remote.stolen")) == [names.LATEST, names.REMOTE_OWNER, "step-00000010"]
