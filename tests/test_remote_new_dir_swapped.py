"""A directory a sync makes on a local remote, swapped by another user who can write the root between the mkdir and
the look at its owner (daemon/jobs/remote_write.py `mkdir_new`). Before, the owner was read from the name after the
mkdir and added to OWN_UIDS, the uids whose entries count as this run's: the other user's uid became "ours" for the
life of the process, so his planted step-99999999 counted as the run's newest checkpoint (it stops the syncs, counts
towards sync.keep, is fetched for a resume), and the copy's files were written into his directory. The swap is made
certain by running it right after the real mkdir (as root: the other user's directory is a chown of a new one).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd import perms
from minilmd.daemon.jobs import remote_write
from minilmd.daemon.jobs.remote_local import open_remote

pytestmark = pytest.mark.root
OTHER = 4242


def show(*names: str) -> str:
    return "/".join(names)


@pytest.fixture
def root(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("the other user's directory is a chown: needs root")
    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners())  # what this process learns stays in this test
    remote = tmp_path / "remote"
    remote.mkdir()
    return remote


def swap_after_mkdir(monkeypatch, name: str) -> None:
    """The first os.mkdir of `name` made, then replaced by another user's directory (his uid, mode 0755)."""
    real = os.mkdir
    done = []

    def mkdir(path, mode=0o777, *, dir_fd=None):
        real(path, mode, dir_fd=dir_fd)
        if not done and os.fspath(path) == name:
            done.append(True)
            os.rmdir(path, dir_fd=dir_fd)
            real(path, 0o755, dir_fd=dir_fd)
            os.chown(path, OTHER, OTHER, dir_fd=dir_fd, follow_symlinks=False)

    monkeypatch.setattr(os, "mkdir", mkdir)


def test_a_directory_swapped_after_its_mkdir_is_not_ours_and_its_owner_never_becomes_ours(root, monkeypatch):
    swap_after_mkdir(monkeypatch, ".tmp-step-00000002")
    opened = remote_write.open_root(str(root))
    try:
        with pytest.raises(remote_write.NotOurs, match="already there"):
            remote_write.mkdir_new(opened, (".tmp-step-00000002",), show)
    finally:
        opened.close()
    assert OTHER not in remote_write.OWN_UIDS
    # his planted step stays another user's: passed by, never the run's newest checkpoint
    (root / "step-99999999").mkdir()
    os.chown(root / "step-99999999", OTHER, OTHER)
    steps = open_remote(str(root)).steps()
    assert steps.ours == [] and "step-99999999" in steps.passed_by


def test_a_file_is_never_written_into_a_directory_another_user_swapped_in_after_it_was_made(root):
    opened = remote_write.open_root(str(root))
    try:
        remote_write.mkdir_new(opened, (".tmp-step-00000003",), show)
        os.rename(root / ".tmp-step-00000003", root / "mine-moved-away")  # his rename, where the root lets him
        theirs = root / ".tmp-step-00000003"
        theirs.mkdir(mode=0o777)
        os.chown(theirs, OTHER, OTHER)
        with pytest.raises(remote_write.NotOurs, match="never written into"):
            remote_write.open_new(opened, (".tmp-step-00000003", "model.safetensors"), show)
    finally:
        opened.close()
    assert list(Path(theirs).iterdir()) == []
