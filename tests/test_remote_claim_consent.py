"""`minilmd run --claim-remote` (daemon/jobs/remote_claim.py take_over): a run moved to another run.dir (another
server or path; renamed too, or not) is another run by the claim's rule (run_owner.is_run: a run is its run.dir):
its remote's owner.json, written by its first sync, names it as it was. Before, every sync of it was refused for
ever and the one way out was to remove owner.json by hand. The consent rewrites the claim whole (one rename, never
another user's file), says so in events.jsonl, and never takes the remote of a run whose supervisor is seen running.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names, run_owner
from minilmd.config import load_config
from minilmd.daemon.host.lock import RunLock
from minilmd.daemon.jobs import remote_claim, remote_consent
from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.dirfd import Dir
from second_user import second_user
from supervisor_helpers import cli, env_for, events, run_supervisor, wait_or_kill, write_config

OLD = Path("/old-server/runs/s")
"""Where the run was, and under which run.name ("s"), when its first sync claimed the remote."""


def _claimed(remote: Path, run_dir: Path = OLD, name: str = "s") -> Path:
    remote.mkdir(parents=True, exist_ok=True)
    owner = remote / names.REMOTE_OWNER
    owner.write_bytes(run_owner.encode(run_owner.record(run_dir, name)))
    return owner


def _moved_and_renamed(tmp_path: Path) -> remote_claim.Claim:
    return remote_claim.Claim(tmp_path / "new-server" / "run", "t")


def test_the_refusal_of_a_renamed_and_moved_run_names_the_consent(tmp_path):
    _claimed(tmp_path / "remote")
    said = remote_claim.problem(open_remote(str(tmp_path / "remote")), _moved_and_renamed(tmp_path))
    assert said is not None and "belongs to another run" in said and str(OLD) in said
    assert "minilmd run --claim-remote CONFIG" in said and "its syncs there refused" in said
    assert "init.from" in said  # the advice there was stays beside it
    # but not "remove owner.json": the remote holds that run's checkpoints, which this run's next sync would find
    # unclaimed and refuse all the same (a new user removed it, as the words said, and the syncs stayed refused)
    assert "remove" not in said


def test_the_consent_rewrites_this_users_claim_whole_and_the_run_may_sync(tmp_path):
    remote = tmp_path / "remote"
    owner = _claimed(remote)
    before = os.lstat(owner).st_ino
    store = open_remote(str(remote))
    claim = _moved_and_renamed(tmp_path)
    took = remote_consent.take_over(store, claim)
    assert str(OLD) in took and "'s'" in took
    now = remote_claim.read(store)
    assert now is not None and now["run_dir"] == run_owner.run_identity(claim.run_dir) and now["run_name"] == "t"
    assert os.lstat(owner).st_ino != before  # a new file renamed into place, not the old one written over
    assert sorted(os.listdir(remote)) == [names.REMOTE_OWNER]  # no temporary file, no old claim left beside it
    assert remote_claim.problem(store, claim) is None
    assert remote_consent.take_over(store, claim) == ""  # this run's now: nothing more to take
    said = remote_claim.problem(store, remote_claim.Claim(OLD, "s"))  # the old run's syncs: refused now
    assert said is not None and "belongs to another run" in said


def test_the_consent_rewrites_the_claim_on_an_object_store_too(tmp_path):
    """fsspec's stores (memory:// here, s3:// in use) have no rename: the claim is written whole in one PUT."""
    store = open_remote(f"memory://{tmp_path.name}/remote")
    store.fs.pipe_file(store.path(names.REMOTE_OWNER), run_owner.encode(run_owner.record(OLD, "s")))
    claim = _moved_and_renamed(tmp_path)
    assert remote_claim.problem(store, claim) is not None
    assert str(OLD) in remote_consent.take_over(store, claim)
    assert remote_claim.problem(store, claim) is None and remote_claim.read(store)["run_name"] == "t"


def test_the_consent_claims_an_unclaimed_remote_with_checkpoints(tmp_path):
    remote = tmp_path / "remote"
    (remote / "step-00000010").mkdir(parents=True)
    store = open_remote(str(remote))
    claim = _moved_and_renamed(tmp_path)
    said = remote_claim.problem(store, claim)
    assert said is not None and "--claim-remote" in said
    assert "step-00000010" in remote_consent.take_over(store, claim)
    assert remote_claim.problem(store, claim) is None


def test_the_consent_does_not_take_the_remote_of_a_run_whose_supervisor_holds_its_lock(tmp_path):
    alive = tmp_path / "old" / "run"
    alive.mkdir(parents=True)
    owner = _claimed(tmp_path / "remote", alive)
    kept = owner.read_bytes()
    store = open_remote(str(tmp_path / "remote"))
    claim = _moved_and_renamed(tmp_path)
    with RunLock(alive):  # that run's supervisor, running now
        with pytest.raises(remote_claim.ClaimRefused, match="is running now .*stop it first"):
            remote_consent.take_over(store, claim)
        assert owner.read_bytes() == kept
    assert str(alive) in remote_consent.take_over(store, claim)  # once it stopped, the consent takes the remote


def test_this_users_owner_json_that_holds_no_record_is_replaced_and_its_refusal_names_the_consent(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / names.REMOTE_OWNER).write_text("{not json")
    store = open_remote(str(remote))
    claim = _moved_and_renamed(tmp_path)
    said = remote_claim.problem(store, claim)
    assert said is not None and "not valid JSON" in said and "--claim-remote" in said
    assert "not valid JSON" in remote_consent.take_over(store, claim)
    assert remote_claim.problem(store, claim) is None


def test_a_link_at_owner_json_is_neither_replaced_nor_followed(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_bytes(run_owner.encode(run_owner.record(OLD, "s")))
    (remote / names.REMOTE_OWNER).symlink_to(target)
    store = open_remote(str(remote))
    said = remote_claim.problem(store, _moved_and_renamed(tmp_path))
    assert said is not None and "cannot be read" in said and "--claim-remote" not in said  # it would not help
    with pytest.raises(remote_claim.ClaimRefused, match="replaces only a regular file of this user's"):
        remote_consent.take_over(store, _moved_and_renamed(tmp_path))
    assert (remote / names.REMOTE_OWNER).is_symlink() and json.loads(target.read_text())["run_name"] == "s"


def test_without_an_exchanging_rename_nfs_the_claim_is_replaced_through_a_name_aside(tmp_path, monkeypatch):
    """NFS has no RENAME_EXCHANGE (dirfd.Dir.exchange says False): the old claim renamed aside, the new one renamed
    in where nothing stands, the old one removed."""
    monkeypatch.setattr(Dir, "exchange", lambda self, a, b: False)
    remote = tmp_path / "remote"
    _claimed(remote)
    store = open_remote(str(remote))
    claim = _moved_and_renamed(tmp_path)
    assert str(OLD) in remote_consent.take_over(store, claim)
    assert remote_claim.read(store)["run_name"] == "t" and sorted(os.listdir(remote)) == [names.REMOTE_OWNER]


@pytest.mark.parametrize("exchanges", [True, False], ids=["exchange", "nfs"])
def test_another_users_file_put_in_place_of_the_claim_meanwhile_is_left_as_it_is(tmp_path, monkeypatch, exchanges):
    """The claim judged this user's, then replaced by another user's file before the rename (a group-shared
    remote's member): that file is neither replaced nor removed, and the consent is refused."""
    uid, gid = second_user()
    remote = tmp_path / "remote"
    owner = _claimed(remote)
    planted = b'{"run_dir": "/srv/theirs"}\n'
    made = Dir.create_new

    def create_then_swap(self, prefix, suffix, mode=0o600):  # the new claim's temp file made: the file swapped now
        got = made(self, prefix, suffix, mode)
        owner.unlink()
        owner.write_bytes(planted)
        os.chown(owner, uid, gid)
        return got

    monkeypatch.setattr(Dir, "create_new", create_then_swap)
    if not exchanges:
        monkeypatch.setattr(Dir, "exchange", lambda self, a, b: False)
    with pytest.raises(remote_claim.ClaimRefused, match="was replaced while it was being replaced"):
        remote_consent.take_over(open_remote(str(remote)), _moved_and_renamed(tmp_path))
    assert owner.read_bytes() == planted and os.lstat(owner).st_uid == uid
    assert sorted(os.listdir(remote)) == [names.REMOTE_OWNER]  # the new claim's temp file removed


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moved", "s"], ids=["renamed", "same-run-name"])
def test_a_run_moved_to_another_run_dir_claims_its_remote_with_the_consent_and_resumes_from_it(tmp_path, corpus,
                                                                                                name):
    """The CLI end to end: the first run ("s") syncs steps 10-30; the same run moved to another run.dir (renamed,
    or under its run.name) is refused by `--check` (which names the consent), `--check --claim-remote` says what
    the launch will take, the launch with it resumes from step 30 and syncs step 40; the event says so, and the old
    place's syncs are refused from then on."""
    first = load_config(write_config(tmp_path, corpus, train={"max_steps": 30}))
    assert run_supervisor(Path(first.source), tmp_path) == 0
    remote = Path(first.run.remote)
    (tmp_path / "new-server").mkdir()
    moved = write_config(tmp_path / "new-server", corpus, name=name, run={"remote": str(remote)},
                         train={"max_steps": 40})

    refused = cli("run", "--check", str(moved))
    assert refused.returncode == 2 and "--claim-remote" in refused.stdout + refused.stderr, refused.stderr
    checked = cli("run", "--check", "--claim-remote", str(moved))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "note: --claim-remote: the launch makes run.remote" in checked.stdout
    assert str(first.run_dir) in checked.stdout
    assert remote_claim.read(open_remote(str(remote)))["run_name"] == "s"  # --check wrote nothing

    (tmp_path / "moved-out").mkdir()
    launched = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", "--claim-remote", str(moved)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_for(True))
    cfg = load_config(moved)
    assert wait_or_kill(launched) == 0, events(cfg.run_dir)[-5:]
    said = [e for e in events(cfg.run_dir) if e["event"] == "remote_claim"]
    assert len(said) == 1 and str(first.run_dir) in said[0]["message"], said
    fetched = [e["message"] for e in events(cfg.run_dir) if e["event"] == "fetch"]
    assert any("step-00000030" in m for m in fetched), fetched  # resumed from the first run's newest
    assert checkpoint_dirs.read_latest(remote) == "step-00000040"
    owner = remote_claim.read(open_remote(str(remote)))
    assert owner["run_dir"] == run_owner.run_identity(cfg.run_dir) and owner["run_name"] == name
    again = cli("run", "--check", first.source)  # the run as it was: its remote is the moved run's now
    assert again.returncode == 2 and "belongs to another run" in again.stdout + again.stderr


@pytest.mark.slow
def test_check_and_launch_with_the_consent_refuse_the_remote_of_a_live_run(tmp_path, corpus):
    """The CLI: the run the claim names has a supervisor holding its lock (one of its own, here the test's):
    `run --check --claim-remote` and `run --claim-remote` exit 2 saying it runs, and owner.json is as it was."""
    alive = tmp_path / "old" / "run"
    alive.mkdir(parents=True)
    remote = tmp_path / "remote"
    owner = _claimed(remote, alive)
    kept = owner.read_bytes()
    moved = write_config(tmp_path, corpus, name="moved", run={"remote": str(remote)})
    with RunLock(alive):
        for args in (["--check", "--claim-remote"], ["--claim-remote"]):
            done = cli("run", *args, str(moved))
            said = done.stdout + done.stderr
            assert done.returncode == 2 and "is running now" in said and "stop it first" in said, said
    assert owner.read_bytes() == kept and not load_config(moved).run_dir.exists()
