"""Where a run learns the owner a squashing share gives its new files (daemon/jobs/remote_write.py given_owner: one
file made and removed again): never in a directory of another user's, nor in one others may write.

On main, where dirfd's rule refused a local run.remote for an owner not known yet, open_root learnt in the remote's
own directory whoever owned it, and `run --check`'s look at the run's pointers (foreign_entries) and the read of the
remote's claim (cat_own) learnt in it by path without asking the rule at all: another user's `mkdir -m 2775` or
0777 directory at run.remote's name got a file made in it (as root, in any directory of his) before the refusal,
at every try, by the sync, a restarted supervisor and `--check` alike. Through a share that squashes (root_squash
for a run as root: tests/faultfs.py's `squash_uid`), a 2775 directory of nobody's, the owner the share gives every
squashed user, was even taken for the run's own once learnt there, and the sync wrote its checkpoints into it.
Now the learn happens only in a directory this user's or the squash uid's (nobody) that no one but its owner may
write, judged on its descriptor, or in a root the rule accepts (where the sync writes anyway); elsewhere the rule's
refusal stands and nothing is written: an inotify watch on the directory sees no change at all.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from dir_watch import DirWatch, look
from minilmd import perms
from minilmd.daemon.jobs import remote_write
from minilmd.daemon.jobs.remote_local import LocalRemote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.daemon.preflight import REMOTE_OWN
from minilmd.names import LATEST, REMOTE_OWNER
from minilmd.untrusted import Unreadable
from real_groups import groups  # noqa: F401 - a fixture
from second_user import as_user, second_user, shared_dir
from supervisor_helpers import cli, write_config
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture
from waiting import without_blocking


@pytest.fixture(params=["local disk", "squashing share"])
def server(request):
    """(backing, seen): the server's directory and what the run sees of it, in a fresh sticky 1777 directory of
    root's under /tmp that every user may make directories in (a share's top): the same directory on the local disk
    (the run as root may write into any directory), or a tests/faultfs.py mount of it that gives every file made
    through it nobody's uid (NFS root_squash for a run as root)."""
    from faults_fixtures import mounted_faultfs, unavailable_fuse

    nobody = second_user()[0]
    top = shared_dir()
    backing = top / "backing"
    backing.mkdir()
    backing.chmod(0o1777)
    try:
        if request.param == "local disk":
            yield backing, backing
            return
        if reason := unavailable_fuse():
            pytest.skip(reason)
        (top / "share").mkdir()
        with mounted_faultfs(backing, top / "share", squash_uid=nobody):
            yield backing, top / "share"
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False, timeout=60)


@pytest.fixture(params=["his 2775", "his 0777", "nobody's 2775"])
def owner(request, groups):
    """(argv prefix acting as the directory's owner, its uid, the mode it makes it with): a real second user made
    for the test (useradd, a group of his own), or nobody: the uid a squashing share gives every squashed user, so on
    the share it looks like the run's own, and only its mode tells it is not a place to learn in."""
    if request.param.startswith("nobody"):
        return as_user([]), second_user()[0], 0o2775
    name = groups.user(groups.group())
    entry = pwd.getpwnam(name)
    prefix = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--"]
    return prefix, entry.pw_uid, int(request.param.split()[1], 8)


def as_owner(owner, script: str, cwd: Path) -> None:
    prefix = owner[0]
    done = subprocess.run([*prefix, "sh", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def fresh_process(monkeypatch) -> None:
    """What a restarted supervisor, or a `run --check`, knows of the share: nothing learnt yet."""
    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners())


def test_no_file_is_made_in_another_users_directory_at_run_remotes_name(tmp_path, weights, corpus, server, owner,
                                                                          monkeypatch):
    backing, seen = server
    _, uid, mode = owner
    as_owner(owner, f"mkdir -m {mode:o} r8 && echo step-00000010 > r8/{LATEST} && echo '{{}}' > r8/{REMOTE_OWNER}",
             backing)
    his, root = backing / "r8", seen / "r8"
    assert os.lstat(his).st_uid == uid and os.lstat(his).st_mode & 0o7777 == mode
    os.utime(his, ns=(10**18, 10**18))  # no write can leave its modification time as it is (2001)
    before = look(his)
    local = tmp_path / "scratch"
    save(local, 10, weights)
    with DirWatch(his) as watch:
        fresh_process(monkeypatch)  # run --check's question, and a restarted supervisor's at its first sync
        refused = remote_write.root_refused(str(root))
        assert refused is not None and "belongs to" in refused, refused
        fresh_process(monkeypatch)  # run --check's look at the run's pointers (main: learnt in the root by path)
        assert any(found.startswith(f"{LATEST} there is") for found in
                   remote_write.foreign_entries(str(root), REMOTE_OWN))
        fresh_process(monkeypatch)  # the read of the remote's claim (main: learnt in the root by path)
        remote = LocalRemote(str(root))
        with pytest.raises(Unreadable), contextlib.closing(remote):
            remote.cat_own(remote.path(REMOTE_OWNER), 4096)
        fresh_process(monkeypatch)
        with pytest.raises(SyncError, match="belongs to"):
            without_blocking(Syncer(local, str(root), EXPECTED).sync_newest)
        fresh_process(monkeypatch)  # a remote not made yet below his directory: the nearest one there is his
        below = remote_write.root_refused(str(root / "run1"))
        assert below is not None and "belongs to" in below, below
        with pytest.raises(SyncError, match="belongs to"):  # main: run1 made in his directory first, then refused
            without_blocking(Syncer(local, str(root / "run1"), EXPECTED).sync_newest)
        checked = cli("run", "--check", str(write_config(tmp_path, corpus, run={"remote": str(root)})))
        said = checked.stdout + checked.stderr
        assert checked.returncode == 2 and "belongs to" in said and "Traceback" not in said, said
        assert watch.changes() == []  # main: CREATE and DELETE of .LATEST.<host>-<pid>-owner<8 hex>.tmp, each try
        assert look(his) == before
        assert remote_write.OWN_UIDS == {os.geteuid()}
        as_owner(owner, "touch x", his)  # the watch sees what is written there
        assert "CREATE x" in watch.changes()


def test_a_root_of_the_squash_uid_that_only_it_may_write_is_still_learnt_in(tmp_path, weights, server, monkeypatch):
    """What the rule keeps: a remote's directory the sync itself made on a squashing share (nobody's, 0755) is
    accepted after a restart by learning in it, the file it learns from gone again."""
    backing, seen = server
    local, root = tmp_path / "scratch", seen / "run1"
    for step in (10, 20):
        save(local, step, weights)
        fresh_process(monkeypatch)
        assert without_blocking(Syncer(local, str(root), EXPECTED).sync_newest).step == step
    assert os.lstat(backing / "run1").st_mode & 0o022 == 0
    fresh_process(monkeypatch)
    assert remote_write.root_refused(str(root)) is None
    assert sorted(os.listdir(backing / "run1")) == [LATEST, "step-00000010", "step-00000020"]
