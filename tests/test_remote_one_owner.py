"""A local remote on a share that gives every file one owner (NFS's all_squash; root_squash for a run as root):
another user's directory there is owned by the very uid this run's own directories get, which the sync learns as
its own (daemon/jobs/remote_write.py OWN_UIDS). On main the owner was the only proof before a removal, so the sync's
retention, its clean-up of temporary names, the fetch's quarantine and the making way for a copy removed or moved
what another user made there. Now, on such a share, each directory a sync makes holds a mark of its user
(names.REMOTE_MARK) and a directory of the squashed owner is removed or set aside only with it
(remote_write.not_made_here); the rest is left and said once.

Without NFS the share is simulated two ways: as root, the "other user's" entries given a uid the run has learnt as
the owner the share gives its own files (OWN_UIDS), as mkdir_new learns it on such a share; and, where FUSE can be
mounted, a real second user writing through a mount that gives every file nobody's uid (tests/faultfs.py
`squash_uid`), the run as root, its own directories nobody's too.
"""
from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest

from minilmd import perms, tmpnames
from minilmd.daemon.jobs import remote_write
from minilmd.daemon.jobs import sync as sync_module
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.names import LATEST, MANIFEST, MODEL_FILE, QUARANTINE, REMOTE_MARK
from minilmd.tmpnames import sync_tmp_name
from second_user import second_user, sh_as_user
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture
from waiting import without_blocking

NOT_MADE = "(the owner this share gives new files)"


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def entries_of_another(remote: Path, make) -> list[str]:
    """Another user's entries in the remote, made by make(shell command, cwd): a step directory without a manifest,
    one with an invalid manifest, an intact checkpoint his own sync made (his mark), a day-old temporary name of
    another host and one naming this host and a pid that is gone."""
    stale, dead = sync_tmp_name("step-00000003", "otherhost", 4242), sync_tmp_name("step-00000004", tmpnames.host_tag(),
                                                                                  dead_pid())
    make(f"mkdir step-00000005 step-00000007 {stale} {dead} && echo '[[' > step-00000007/{MANIFEST} "
         f"&& echo half > {stale}/{MODEL_FILE} && cp -r step-00000010 step-00000008 "
         f"&& echo 'made by a sync of uid 4242' > step-00000008/{REMOTE_MARK}", remote)
    day_ago = time.time() - sync_module.STALE_TMP_SECONDS - 60
    os.utime(remote / stale, (day_ago, day_ago))
    return ["step-00000005", "step-00000007", "step-00000008", stale, dead]


SQUASHED = 4242
"""The uid the simulated share gives every file (not this process's own)."""


@pytest.fixture
def squashing(monkeypatch):
    """make(command, cwd) for another user's entries on a share whose owner the run has learnt as its own: made by
    this process, then given SQUASHED (new entries only), which OWN_UIDS holds, as on an all_squash share."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the other user's entries are given another uid")
    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners(SQUASHED))

    def make(command: str, cwd: Path) -> None:
        before = set(os.listdir(cwd))
        subprocess.run(["sh", "-c", command], cwd=cwd, check=True)
        for name in set(os.listdir(cwd)) - before:
            for path in [cwd / name, *(cwd / name).rglob("*")]:
                os.lchown(path, SQUASHED, SQUASHED)
    return make


def prune_past(remote: Path, tmp_path: Path, weights, make) -> tuple[list[str], list[str]]:
    """A run (keep=1) that synced step 10, then step 20 twice after another user made his entries: (his entries,
    what the syncs logged)."""
    local, logs = tmp_path / "scratch", list[str]()
    syncer = Syncer(local, str(remote), EXPECTED, keep=1, log=logs.append)
    save(local, 10, weights)
    without_blocking(syncer.sync_newest)
    theirs = entries_of_another(remote, make)
    save(local, 20, weights)
    for _ in range(2):
        without_blocking(syncer.sync_newest)
    return theirs, logs


def test_retention_and_the_clean_up_leave_what_they_did_not_make_though_its_owner_is_the_runs(
        tmp_path, weights, squashing):
    remote = tmp_path / "remote"
    theirs, logs = prune_past(remote, tmp_path, weights, squashing)
    assert sorted(os.listdir(remote)) == sorted([*theirs, LATEST, "step-00000020"]), logs  # step 10: the run's
    assert (remote / theirs[3] / MODEL_FILE).read_text() == "half\n"
    for name in theirs:
        assert sum(f"{remote}/{name} is" in m and NOT_MADE in m for m in logs) == 1, (name, logs)
    assert any(f"{remote}/step-00000008 is" in m and f"whose {REMOTE_MARK} is another user's" in m for m in logs)


def test_the_fetch_never_sets_aside_what_it_did_not_make(tmp_path, weights, squashing):
    remote, local = tmp_path / "remote", tmp_path / "scratch"
    save(tmp_path / "old-scratch", 10, weights)
    without_blocking(Syncer(tmp_path / "old-scratch", str(remote), EXPECTED).sync_newest)
    squashing(f"mkdir step-00000030 && echo '[[' > step-00000030/{MANIFEST}", remote)
    logs: list[str] = []
    assert without_blocking(Syncer(local, str(remote), EXPECTED, log=logs.append).fetch_latest) == \
        local / "step-00000010"
    assert os.listdir(remote / "step-00000030") == [MANIFEST] and not (remote / QUARANTINE).exists()
    assert any(f"{remote}/step-00000030 is" in m and NOT_MADE in m for m in logs), logs


def test_a_copy_never_replaces_a_directory_at_its_step_name_it_did_not_make(tmp_path, weights,
                                                                          squashing):
    remote, local = tmp_path / "remote", tmp_path / "scratch"
    remote.mkdir()
    squashing("mkdir step-00000010 && echo theirs > step-00000010/notes", remote)
    save(local, 10, weights)
    with pytest.raises(SyncError) as refused:
        without_blocking(Syncer(local, str(remote), EXPECTED).sync_newest)
    assert (remote / "step-00000010" / "notes").read_text() == "theirs\n" and NOT_MADE in str(refused.value)
    assert os.listdir(remote) == ["step-00000010"]


def test_another_users_higher_step_neither_stops_the_sync_nor_takes_its_keep(tmp_path, weights,
                                                                            squashing):
    """His intact copy planted as step-99999990, of the owner the run's own steps have there: on main the sync
    deferred to it as the remote's newest, pointed LATEST at it and never copied the run's checkpoints again. Now it
    is passed by as the newest and not counted among the `keep` (2) the run keeps of its own."""
    remote, local, logs = tmp_path / "remote", tmp_path / "scratch", list[str]()
    syncer = Syncer(local, str(remote), EXPECTED, keep=2, log=logs.append)
    save(local, 10, weights)
    without_blocking(syncer.sync_newest)
    squashing("cp -r step-00000010 step-99999990", remote)
    for step in (20, 30):
        save(local, step, weights)
        without_blocking(syncer.sync_newest)
    assert (remote / LATEST).read_text().strip() == "step-00000030", logs
    assert sorted(os.listdir(remote)) == [LATEST, "step-00000020", "step-00000030", "step-99999990"], logs
    assert os.lstat(remote / "step-99999990").st_uid == SQUASHED


def test_on_a_squashing_share_another_users_entries_are_left(tmp_path, weights, monkeypatch):
    """The run as root through a mount that gives every file it makes nobody's uid, as a squashing export does, and a
    real second user (nobody) writing the same export: what he made is owned by the uid the run learns as its own."""
    from faults_fixtures import mounted_faultfs, unavailable_fuse

    if (reason := unavailable_fuse()) or os.geteuid() != 0:
        pytest.skip(reason or "needs root: the share maps root to nobody")
    nobody = second_user()[0]
    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners())  # what this process learns stays in this test
    backing, share = tmp_path / "backing", tmp_path / "share"
    backing.mkdir()
    share.mkdir()
    os.chmod(backing, 0o1777)  # a shared sticky directory
    with mounted_faultfs(backing, share, squash_uid=nobody):
        # he writes the share from another machine: straight into what the server exports, as nobody
        theirs, logs = prune_past(share, tmp_path, weights, lambda command, cwd: sh_as_user(command, cwd=backing))
        assert sorted(os.listdir(share)) == sorted([*theirs, LATEST, "step-00000020"]), logs  # step 10: the run's
        assert os.lstat(share / theirs[0]).st_uid == os.lstat(share / "step-00000020").st_uid == nobody
        assert (share / "step-00000020" / REMOTE_MARK).read_bytes() == remote_write.mark()
        for name in theirs:
            assert sum(f"{share}/{name} is" in m and NOT_MADE in m for m in logs) == 1, (name, logs)


def test_a_directory_whose_mark_cannot_be_written_is_not_left_behind(tmp_path, weights, monkeypatch):
    """A full share (ENOSPC on the mark's write): the directory the sync just made goes again, so no unmarked
    leftover (which no later sync could remove) stays; the next sync copies once there is room."""
    from faultfs import write_rules
    from faults_fixtures import mounted_faultfs, unavailable_fuse

    if (reason := unavailable_fuse()) or os.geteuid() != 0:
        pytest.skip(reason or "needs root: the share maps root to nobody")
    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners())
    backing, share, local = tmp_path / "backing", tmp_path / "share", tmp_path / "scratch"
    backing.mkdir()
    share.mkdir()
    save(local, 10, weights)
    with mounted_faultfs(backing, share, squash_uid=second_user()[0]) as mount:
        write_rules(mount.control, [{"id": 1, "op": "write", "glob": REMOTE_MARK, "action": "error",
                                     "errno": errno.ENOSPC}])
        syncer = Syncer(local, str(share), EXPECTED)
        with pytest.raises(SyncError):
            without_blocking(syncer.sync_newest)
        assert os.listdir(share) == []
        write_rules(mount.control, [])
        without_blocking(syncer.sync_newest)
        assert sorted(os.listdir(share)) == [LATEST, "step-00000010"]
