"""`plot --out X --group-share` (and `tokenizer train/template --out`, the writers of minilmd/fsio.py
write_out_bytes) where X is a teammate's own file in a team directory: before, renamed over it silently (his thesis
figure gone), where a sticky directory refused it naming him (hostile audit 7 F3). Now another user's entry at X, a
file or a link, is refused naming its owner, --force or not; nothing is written. The teammate is a real uid (64123,
no passwd entry), the test root.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd import fsio
from minilmd.dirfd import PlaceRefused

OTHER = 64123

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's file")


def team_dir(tmp_path: Path) -> Path:
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2775)  # a team directory: --group-share lets it be used
    return team


def test_a_teammates_file_at_out_is_refused_naming_him_and_left_as_it_was(tmp_path):
    team = team_dir(tmp_path)
    his = team / "fig.png"
    his.write_text("his thesis figure data, 3 weeks of work\n")
    os.chown(his, OTHER, OTHER)
    for write in (lambda: fsio.write_out_bytes(his, b"\x89PNG", "--out", "the picture", "choose another",
                                               group_share=True),
                  lambda: fsio.write_out_text(his, "{}", "--out", "the tokenizer", "choose another",
                                              group_share=True)):
        with pytest.raises(PlaceRefused, match=f"belongs to uid {OTHER}: another user's file is never replaced"):
            write()
    assert his.read_text() == "his thesis figure data, 3 weeks of work\n" and os.lstat(his).st_uid == OTHER
    assert sorted(os.listdir(team)) == ["fig.png"]  # no temporary file left


def test_a_teammates_link_at_out_is_refused_too_and_never_followed(tmp_path):
    team = team_dir(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("hers\n")
    os.symlink(notes, team / "fig.png")
    os.chown(team / "fig.png", OTHER, OTHER, follow_symlinks=False)
    with pytest.raises(PlaceRefused, match=f"uid {OTHER}"):
        fsio.write_out_bytes(team / "fig.png", b"\x89PNG", "--out", "the picture", "choose another",
                             group_share=True)
    assert (team / "fig.png").is_symlink() and notes.read_text() == "hers\n"


def test_a_file_of_ones_own_at_out_is_replaced_whole(tmp_path):
    team = team_dir(tmp_path)
    mine = team / "fig.png"
    mine.write_text("old")
    fsio.write_out_bytes(mine, b"\x89PNG", "--out", "the picture", "choose another", group_share=True)
    assert mine.read_bytes() == b"\x89PNG" and sorted(os.listdir(team)) == ["fig.png"]
