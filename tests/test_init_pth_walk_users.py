"""init.from naming a teammate's MiniMind .pth on a share (a real second user, nobody; a third uid without an
account): the .pth is resolved in its directory, that directory pinned (its identity) with its owner, and read by
staging (and the trainer) through that very directory's descriptor as a file of its owner or ours
(minilmd/init_pth.py, init_place.reopen).

Reproduced on the code before (the .pth source carried no identity nor owners, and was copied by its path): a third
user's .pth planted in the teammate's directory was resolved and staged, as was one swapped in after the
resolution; her directory replaced after the resolution by another one holding other bytes was followed and those
bytes staged. The swaps are made at one moment, deterministically: right after staging's resolution returns.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from init_from_helpers import swap_after_resolution
from minilmd.daemon.jobs import initstage
from minilmd.daemon.jobs.staging_errors import SourceInvalid, SourceUnreachable
from minilmd.init_source import InitSourceError, resolve
from second_user import chown_tree, second_user, shared_dir, teammate  # noqa: F401 - teammate: a fixture

pytestmark = pytest.mark.root

THIRD_UID = 54321
HERS, OTHER = b"hers" * 64, b"other" * 64


def _teammates_pth(teammate) -> Path:
    """Her .pth (HERS) in her directory on the share, both hers."""
    (uid, gid), where = teammate
    (where / "hers").mkdir()
    pth = where / "hers" / "base.pth"
    pth.write_bytes(HERS)
    chown_tree(where / "hers", uid, gid)
    return pth


def _owned_by_a_third_user(uid: int) -> str:
    return f"base.pth is owned by uid {THIRD_UID}, not by the source's owner, user nobody \\(uid {uid}\\), nor by you"


def _staged_pth(scratch: Path) -> Path:
    return scratch / initstage.INIT_DIR / initstage.INIT_PTH


def test_a_teammates_pth_is_staged_from_her_directory(teammate, tmp_path):
    pth = _teammates_pth(teammate)
    staged = initstage.stage_init(str(pth), tmp_path / "scratch")
    assert initstage.init_problems(staged) == []
    assert _staged_pth(tmp_path / "scratch").read_bytes() == HERS


def test_a_third_users_pth_in_her_directory_is_refused_naming_its_owner(teammate, tmp_path):
    pth = _teammates_pth(teammate)
    os.chown(pth, THIRD_UID, THIRD_UID)
    with pytest.raises(InitSourceError, match=_owned_by_a_third_user(teammate[0][0])):
        resolve(str(pth))
    with pytest.raises(InitSourceError, match=_owned_by_a_third_user(teammate[0][0])):
        initstage.stage_init(str(pth), tmp_path / "scratch")
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()


def test_a_third_users_pth_swapped_in_after_the_resolution_is_refused_naming_its_owner(teammate, tmp_path,
                                                                                       monkeypatch):
    pth = _teammates_pth(teammate)

    def third_users_file():
        pth.unlink()
        pth.write_bytes(OTHER)
        os.chown(pth, THIRD_UID, THIRD_UID)

    swap_after_resolution(monkeypatch, third_users_file)
    with pytest.raises(SourceInvalid, match=_owned_by_a_third_user(teammate[0][0])):
        initstage.stage_init(str(pth), tmp_path / "scratch")
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()


def test_a_pth_whose_directory_is_swapped_after_the_resolution_is_not_copied(teammate, tmp_path, monkeypatch):
    """Whoever can write the share replaces her directory with one of theirs holding other bytes at the same
    name: nothing is read from it; staging waits (SourceUnreachable), and the next attempt, resolving again, finds
    what stands there now (here a directory of a third user's: its .pth is that user's own, and would be staged)."""
    pth = _teammates_pth(teammate)
    hers = pth.parent

    def another_directory():
        hers.rename(hers.parent / "set-aside")
        hers.mkdir()
        pth.write_bytes(OTHER)
        chown_tree(hers, THIRD_UID, THIRD_UID)

    swap_after_resolution(monkeypatch, another_directory)
    with pytest.raises(SourceUnreachable, match=f"{pth}: cannot be read .*not the directory resolved a moment ago "
                                                f"\\(another directory there now: replaced since\\): '{hers}'"):
        initstage.stage_init(str(pth), tmp_path / "scratch")
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()
    shutil.rmtree(hers.parent / "set-aside")
