"""`minilmd plot --out` in a team directory (mode 2770, a group other users are in), attacked by a group member: he
plants `curves.png` as a link to the victim's private notes, or puts a link to the victim's private directory where
--out's directory was. The picture is written as tokenizer train writes its --out (minilmd/fsio.py
write_out_bytes): rendered in memory, then at the descriptor of --out's directory opened once under the place rule.
Before, plot made the directory by path and savefig wrote through the link: the victim's notes began with \\x89PNG."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from second_user import as_teammate, group_dir, private_notes, teammate  # noqa: F401 - the fixture
from supervisor_helpers import logged_run

pytestmark = pytest.mark.slow  # draws with matplotlib in a child process

NOTES = "the victim's own notes\n"


def _plot(run_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "plot", str(run_dir), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300)


def _run(tmp_path: Path) -> Path:
    """A finished run of 20 steps, as the trainer logs one."""
    return logged_run(tmp_path, 20)


def test_a_teammates_link_at_out_is_refused_naming_him_never_written_through(teammate, tmp_path):
    """Refused without --group-share (the team directory), and with it (his entry: hostile audit 7 F3; before, his
    link was replaced). Never written through."""
    pytest.importorskip("matplotlib")
    (uid, gid), where = teammate
    team = group_dir(where, gid, "team")
    notes = private_notes(tmp_path)
    as_teammate(f"ln -s {notes} {team}/curves.png")
    assert os.lstat(team / "curves.png").st_uid == uid
    run_dir = _run(tmp_path)

    refused = _plot(run_dir, team / "curves.png")  # a directory others write: refused without --group-share
    assert refused.returncode == 2, refused.stderr
    assert "--group-share" in refused.stderr and "nothing written" in refused.stderr
    assert notes.read_text() == NOTES and (team / "curves.png").is_symlink()

    his = _plot(run_dir, team / "curves.png", "--group-share")
    assert his.returncode == 2, his.stderr
    assert f"(uid {uid}): another user's file is never replaced" in his.stderr, his.stderr
    assert "nothing written" in his.stderr, his.stderr
    assert notes.read_text() == NOTES and (team / "curves.png").is_symlink()
    assert sorted(os.listdir(team)) == ["curves.png"]  # no temp file left

    os.unlink(team / "curves.png")  # gone: written, hers
    done = _plot(run_dir, team / "curves.png", "--group-share")
    assert done.returncode == 0, done.stderr
    picture = team / "curves.png"
    assert not picture.is_symlink() and picture.read_bytes()[:4] == b"\x89PNG"
    assert os.lstat(picture).st_uid == os.geteuid()


def test_a_teammates_link_in_place_of_outs_directory_is_refused(teammate, tmp_path):
    pytest.importorskip("matplotlib")
    (uid, gid), where = teammate
    team = group_dir(where, gid, "team")
    (team / "plots").mkdir()
    notes = private_notes(tmp_path)
    as_teammate(f"mv {team}/plots {team}/plots.moved && ln -s {notes.parent} {team}/plots")
    run_dir = _run(tmp_path)

    for extra in ((), ("--group-share",)):  # --group-share waives --out's own directory, not the team one above
        done = _plot(run_dir, team / "plots" / "notes.txt.png", *extra)
        assert done.returncode == 2, done.stderr
        assert f"the directory {team} above it" in done.stderr and "nothing written" in done.stderr
    assert sorted(os.listdir(notes.parent)) == ["notes.txt"] and notes.read_text() == NOTES
