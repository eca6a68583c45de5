"""A local remote on a share that gives this run's new files another owner (NFS's root_squash for a run as root, the
default; all_squash for anyone): the owner is learnt (daemon/jobs/remote_write.py OWN_UIDS) before a directory of
that owner counts as the run's own.

On main the directories a first sync made above a remote below the share's top (`run.remote = /mnt/nfs/minilmd/run1`:
minilmd/ made by os.makedirs) belonged to nobody, and dirfd's rule refused them at every later sync and at a
restarted supervisor's `--check` (exit 2) ("belongs to nobody ..., who could replace"): the sync itself made its
remote unusable. Now open_root learns the owner the share gives new files and counts it as this user's there
(place_problem's `owners`), while a directory of another uid is still refused.

And the file the owner is learnt from had a predictable name (`.LATEST.<host>-<pid>-owner.tmp`): one planted there
(or a crash's leftover) made the O_EXCL fail silently, nothing was learnt, and every sync failed, each leaving one
more unmarked directory no later sync removed. Now the name ends at random, and where the owner cannot be learnt the
directory just made goes again and the error says why.

Without NFS the share is tests/faultfs.py's `squash_uid` mount (every file made through it nobody's), the run as root.
"""
from __future__ import annotations

import errno
import os

import pytest

from minilmd import perms, tmpnames
from minilmd.daemon.jobs import remote_claim, remote_write
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.names import LATEST
from minilmd.proc_info import this_maker
from second_user import second_user
from supervisor_helpers import cli, write_config
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture
from waiting import without_blocking

OTHER = 4242
"""A uid neither this run's nor the one the share gives its files: another user's."""


@pytest.fixture
def squash_share(tmp_path, monkeypatch):
    """(backing, share, mount): a faultfs mount at share over backing that gives every file made through it nobody's
    uid, as a root_squash export does to a run as root; OWN_UIDS as a fresh process has it."""
    from faults_fixtures import mounted_faultfs, unavailable_fuse

    if (reason := unavailable_fuse()) or os.geteuid() != 0:
        pytest.skip(reason or "needs root: the share maps root to nobody")
    nobody = second_user()[0]
    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners())
    backing, share = tmp_path / "backing", tmp_path / "share"
    backing.mkdir()
    share.mkdir()
    with mounted_faultfs(backing, share, squash_uid=nobody) as mount:
        yield backing, share, mount


def fresh_process(monkeypatch) -> None:
    """What a restarted supervisor knows of the share: nothing learnt yet."""
    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners())


def test_a_remote_below_the_shares_top_stays_usable_after_the_sync_made_its_parent(
        tmp_path, weights, squash_share, monkeypatch, corpus):
    backing, share, _ = squash_share
    root, local = share / "minilmd" / "run1", tmp_path / "scratch"
    claim = remote_claim.Claim(tmp_path / "s" / "run", "s")  # the run of the config checked below
    syncer = Syncer(local, str(root), EXPECTED, claim=claim)
    for step in (10, 20):
        save(local, step, weights)
        assert without_blocking(syncer.sync_newest).step == step
    assert os.lstat(share / "minilmd").st_uid == second_user()[0]  # made by the first sync, given to nobody
    fresh_process(monkeypatch)
    assert remote_write.root_refused(str(root)) is None  # what a restarted supervisor's --check asks
    fresh_process(monkeypatch)
    save(local, 30, weights)
    assert without_blocking(Syncer(local, str(root), EXPECTED, claim=claim).sync_newest).step == 30
    assert (root / LATEST).read_text() == "step-00000030\n"
    checked = cli("run", "--check", str(write_config(tmp_path, corpus, run={"remote": str(root)})))
    said = checked.stdout + checked.stderr
    # the place is accepted: --check reads the remote's newest checkpoint through it (which, made by sync_helpers'
    # tiny model, is not this config's model: the one problem it has)
    assert "belongs to" not in said and "step 30, on the remote" in said, said
    assert "1 problem(s)" in said and "were trained with model." in said, said
    # another run's remote beside it, not made yet: its --check learns the owner in the directory above it
    fresh_process(monkeypatch)
    assert remote_write.root_refused(str(share / "minilmd" / "run2")) is None
    assert sorted(os.listdir(backing / "minilmd")) == ["run1"]  # the file the owner was learnt from is gone


def test_a_directory_above_the_remote_of_another_uid_is_still_refused(tmp_path, weights, squash_share,
                                                                      monkeypatch):
    backing, share, _ = squash_share
    (backing / "theirs").mkdir()
    os.chown(backing / "theirs", OTHER, OTHER)  # made on the server by another user: his uid, not the squashed one
    (backing / "theirs").chmod(0o1777)  # his, and every user may make files in it (as in /tmp)
    save(tmp_path / "scratch", 10, weights)
    refused = remote_write.root_refused(str(share / "theirs" / "run1"))
    assert refused is not None and f"belongs to uid {OTHER}" in refused, refused
    # nothing learnt in his directory (on main a file was made and removed there at every refused try, and the
    # owner the share gives new files was counted as ours from then on): a refusal naming another uid learns nothing
    assert remote_write.OWN_UIDS == {os.getuid()}
    assert os.listdir(backing / "theirs") == []
    with pytest.raises(SyncError, match=f"belongs to uid {OTHER}"):
        without_blocking(Syncer(tmp_path / "scratch", str(share / "theirs" / "run1"), EXPECTED).sync_newest)


def test_a_planted_file_at_the_owners_learning_name_stops_no_sync(tmp_path, weights, squash_share):
    backing, share, _ = squash_share
    planted = tmpnames.atomic_tmp_prefix(LATEST) + tmpnames.pointer_tmp_tag(*this_maker()) + "owner.tmp"
    (backing / planted).write_text("his\n")
    os.chown(backing / planted, OTHER, OTHER)
    local = tmp_path / "scratch"
    save(local, 10, weights)
    assert without_blocking(Syncer(local, str(share), EXPECTED).sync_newest).step == 10
    assert sorted(os.listdir(share)) == sorted([planted, LATEST, "step-00000010"])
    assert (backing / planted).read_text() == "his\n"


def test_a_directory_whose_owner_cannot_be_learnt_goes_again_and_the_error_says_why(tmp_path, weights,
                                                                                  squash_share):
    from faultfs import write_rules

    backing, share, mount = squash_share
    write_rules(mount.control, [{"id": 1, "op": "create", "glob": "*owner*.tmp", "action": "error",
                                 "errno": errno.EACCES}])
    local = tmp_path / "scratch"
    save(local, 10, weights)
    syncer = Syncer(local, str(share), EXPECTED)
    for _ in range(2):
        with pytest.raises(SyncError, match="cannot learn the owner this share gives new files"):
            without_blocking(syncer.sync_newest)
        assert os.listdir(share) == []  # no unmarked directory of an unknown owner left behind
    write_rules(mount.control, [])
    assert without_blocking(syncer.sync_newest).step == 10
    assert sorted(os.listdir(share)) == [LATEST, "step-00000010"]


def test_a_directory_of_the_learnt_owner_that_others_may_write_is_refused_above_the_root(tmp_path, weights,
                                                                                          squash_share, monkeypatch):
    """The owner learnt from a squashing share counts as ours above the root only for a directory no one but that
    owner may write: a 0775 one of its (on all_squash every user's) lets others rename the root away. On main it was
    accepted (team_above lets a directory of ours be group-writable)."""
    backing, share, _ = squash_share
    root, local = share / "minilmd" / "run1", tmp_path / "scratch"
    save(local, 10, weights)
    assert without_blocking(Syncer(local, str(root), EXPECTED).sync_newest).step == 10
    fresh_process(monkeypatch)
    assert remote_write.root_refused(str(root)) is None
    (backing / "minilmd").chmod(0o775)
    fresh_process(monkeypatch)
    refused = remote_write.root_refused(str(root))
    assert refused is not None and "can be written by others than its owner (mode 775)" in refused, refused
