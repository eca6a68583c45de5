"""A directory of a local remote removed or set aside is the very one judged the run's (remote_write.not_made_here).

On main remove_ours looked at the directory first (not_made_here(path)) and took the identity remove_tree compares
afterwards (root.lstat(name)): another user's directory moved to the name in between (his 0777 directory, uid 4242)
was deleted; set_aside moved it into quarantine/ and wrote into it. Now the identity is taken first and the look
confirms the directory it opens has it; set_aside checks what it moved and puts back another's.

The swap is made at the one moment between the two, deterministically: right after the look returns.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd.daemon.jobs import remote_write
from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.daemon.jobs.remote_write import NotOurs
from minilmd.names import QUARANTINE

NAME = "step-00000005"
OTHER = 4242


@pytest.fixture
def swapped_after_the_look(tmp_path, monkeypatch):
    """(remote, root, his): a run's directory NAME in the remote, which another user's directory replaces (the run's
    moved aside) right after not_made_here has judged the run's."""
    root = tmp_path / "remote"
    remote = open_remote(str(root))
    remote.makedirs()
    remote.makedirs(NAME)
    judge = remote_write.not_made_here

    def judged_then_swapped(path, *args, **kwargs):
        why = judge(path, *args, **kwargs)
        os.rename(root / NAME, root / "ours-moved-aside")
        his = root / NAME
        his.mkdir()
        (his / "notes").write_text("his\n")
        his.chmod(0o777)
        if os.geteuid() == 0:
            os.chown(his, OTHER, OTHER)
        return why

    monkeypatch.setattr(remote_write, "not_made_here", judged_then_swapped)
    return remote, root


def his_directory_is_there(root: Path) -> bool:
    return (root / NAME / "notes").read_text() == "his\n" and os.listdir(root / NAME) == ["notes"]


def test_removal_never_deletes_a_directory_moved_there_after_the_look(swapped_after_the_look):
    remote, root = swapped_after_the_look
    left = remote.rm(NAME)
    assert left is not None and "not removed" in left, left
    assert his_directory_is_there(root)


def test_set_aside_never_moves_a_directory_moved_there_after_the_look(swapped_after_the_look):
    remote, root = swapped_after_the_look
    with pytest.raises(NotOurs, match="moved there while it was looked at"):
        remote.quarantine(NAME, "damaged")
    assert his_directory_is_there(root)
    assert not (root / QUARANTINE).exists() or os.listdir(root / QUARANTINE) == []
