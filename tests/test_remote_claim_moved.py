"""A claim moved from one remote to another is no run's claim of the second (hostile audit, stop 65, F1). One user's
two runs with their remotes side by side in a team directory (group-writable, not sticky: a member may rename the
entries of another's): a teammate's `mv r1/owner.json r2/owner.json` made run 2's remote "another run's", and run 2
stopped for good (exit 2, its final refusal), told to move its run.remote. Now a claim records the remote it was
written for (remote_claim.RUN_REMOTE): one written for another remote is said to be moved here, and waited for
(its owner puts it back); the claim of another run written for this remote stays the final refusal."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from minilmd import names, run_owner
from minilmd.config import load_config
from minilmd.daemon.jobs import remote_claim
from minilmd.daemon.jobs.remote_local import open_remote
from second_user import as_user, group_dir, teammate  # noqa: F401 - the fixture
from supervisor_helpers import cli, write_config

OWNER = names.REMOTE_OWNER
SYNCED = "state.json records step 10 on it"


def claimed(remote: Path, run_dir: Path) -> remote_claim.Claim:
    claim = remote_claim.Claim(run_dir, run_dir.name, synced_before=lambda: SYNCED)
    remote.mkdir(exist_ok=True)  # the sync makes it first (LocalRemote.makedirs)
    assert remote_claim.ensure(open_remote(str(remote)), claim) is True
    return claim


def test_a_claim_a_teammate_moved_to_another_remote_of_the_users_is_waited_for_not_another_runs(teammate, tmp_path):
    (_, gid), where = teammate
    r1, r2 = group_dir(where, gid, "r1"), group_dir(where, gid, "r2")
    run1, run2 = claimed(r1, tmp_path / "run1"), claimed(r2, tmp_path / "run2")
    moved = subprocess.run(as_user(["mv", str(r1 / OWNER), str(r2 / OWNER)]), capture_output=True, text=True,
                           timeout=60)
    assert moved.returncode == 0, moved.stderr  # his rename, in a directory his group may write

    refused = remote_claim.judge(open_remote(str(r2)), run2)

    assert refused is not None and not refused.another_run  # on main: "belongs to another run", final (exit 2)
    assert "moved here" in refused.words and str(r1) in refused.words and "move it back" in refused.words
    (r2 / OWNER).rename(r1 / OWNER)  # the way on it says
    assert remote_claim.judge(open_remote(str(r1)), run1) is None
    assert remote_claim.ensure(open_remote(str(r2)), run2) is True  # its own claim again, at its next sync


def test_another_runs_claim_written_for_this_remote_is_still_the_final_refusal(tmp_path):
    remote = tmp_path / "remote"
    claimed(remote, tmp_path / "run1")
    written = json.loads((remote / OWNER).read_text())
    assert written[remote_claim.RUN_REMOTE] == run_owner.run_identity(remote)

    refused = remote_claim.judge(open_remote(str(remote)), remote_claim.Claim(tmp_path / "run2", "run2"))

    assert refused is not None and "belongs to another run" in refused.another_run


def test_the_same_remote_by_a_links_name_is_the_remote_the_claim_was_written_for(tmp_path):
    remote = tmp_path / "remote"
    claimed(remote, tmp_path / "run1")
    (tmp_path / "alias").symlink_to(remote)
    refused = remote_claim.judge(open_remote(str(tmp_path / "alias")), remote_claim.Claim(tmp_path / "run2", "run2"))
    assert refused is not None and refused.another_run  # another run's remote, named otherwise: not "moved here"


def test_an_older_claim_without_its_remote_is_judged_as_before(tmp_path):
    """A claim an older minilmd wrote names no remote: another run's is the final refusal, as it was."""
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / OWNER).write_bytes(run_owner.encode(run_owner.record(tmp_path / "run1", "run1")))
    refused = remote_claim.judge(open_remote(str(remote)), remote_claim.Claim(tmp_path / "run2", "run2"))
    assert refused is not None and refused.another_run
    assert remote_claim.judge(open_remote(str(remote)), remote_claim.Claim(tmp_path / "run1", "run1")) is None


def test_run_check_and_the_launch_say_a_claim_moved_here_among_the_waits_never_exit_2(tmp_path, corpus):
    """A restart of the run (systemd, a Slurm requeue, a reboot, a start by hand) after the rename: the launch's
    check waits for it as the syncs do; before, its problems ended the run for good, exit 2 (review, stop 65)."""
    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    r1 = tmp_path / "r1"
    claimed(r1, tmp_path / "run1")
    Path(cfg.run.remote).mkdir(parents=True)
    (r1 / OWNER).rename(Path(cfg.run.remote) / OWNER)

    checked = cli("run", "--check", str(config))

    said = " ".join((checked.stdout + checked.stderr).split())
    assert checked.returncode == 0, said  # on main: 2, "1 problem(s): ... belongs to another run"
    assert "waits:" in said and "moved here" in said and str(r1) in said, said


def test_a_claim_written_for_a_path_not_there_on_this_host_stays_another_runs(tmp_path):
    """Another host's mount point of the same share (`/mnt/team/r` there, `/srv/team/r` here): not there on this
    host, so maybe this very remote; another run's claim is judged as one (final), never advised to be removed."""
    remote = tmp_path / "remote"
    claimed(remote, tmp_path / "run1")
    owner = json.loads((remote / OWNER).read_text())
    owner[remote_claim.RUN_REMOTE] = "/mnt/another-hosts-mount-point/remote"
    (remote / OWNER).write_bytes(run_owner.encode(owner))
    refused = remote_claim.judge(open_remote(str(remote)), remote_claim.Claim(tmp_path / "run2", "run2"))
    assert refused is not None and refused.another_run and not refused.moved
