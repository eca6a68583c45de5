"""The demo's directory (`make demo`'s demo-run/, or the DIR of `python -m minilmd.daemon.demo DIR`) is removed and
made again at each start. A second user plants a link at that name, to the victim's work: in /tmp, or in a team
checkout he can write. Before, main resolved the link first and fresh_start judged, and removed, the victim's
directory it led to (`demo: removing the earlier /tmp/victim_work/`: her thesis gone). Now the name as given is
judged by run.dir's place rule before anything, and only a directory holding the demo's own marker is removed,
through the descriptor of the directory that holds it (daemon/demo.py fresh_start)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd.daemon import demo
from minilmd.perms import user_words
from second_user import as_teammate, group_dir, second_user, teammate  # noqa: F401 - the fixture

THESIS = "chapter 1\n"


class DemoWentOn(Exception):
    """The demo got past its fresh start (its first section): raised instead of running the real demo."""


@pytest.fixture
def stop_after_fresh_start(monkeypatch):
    def first_section(text: str) -> None:
        raise DemoWentOn(text)

    monkeypatch.setattr(demo, "say", first_section)


def _victims_work(tmp_path: Path) -> Path:
    work = tmp_path / "work"  # the victim's: under pytest's root-only directory
    work.mkdir()
    (work / "thesis.txt").write_text(THESIS)
    return work


@pytest.mark.parametrize("where_kind", ["sticky /tmp", "team checkout"])
def test_a_link_a_teammate_planted_at_the_demo_directory_is_refused_and_nothing_removed(
        teammate, tmp_path, stop_after_fresh_start, where_kind):
    (uid, gid), where = teammate
    holder = where if where_kind == "sticky /tmp" else group_dir(where, gid, "checkout")
    work = _victims_work(tmp_path)
    as_teammate(f"ln -s {work} {holder}/demo-run")
    assert os.lstat(holder / "demo-run").st_uid == uid

    with pytest.raises(SystemExit) as refused:
        demo.main(str(holder / "demo-run"))
    said = str(refused.value.code)
    assert said.startswith("demo: the demo directory ") and "nothing was removed" in said
    link_words = f"is a symbolic link of {user_words(uid)} (to"  # the walk's words (walk_problem)
    assert (link_words if where_kind == "sticky /tmp" else "can be written by other users") in said
    assert sorted(os.listdir(work)) == ["thesis.txt"] and (work / "thesis.txt").read_text() == THESIS
    assert (holder / "demo-run").is_symlink()


def test_a_directory_the_demo_did_not_make_is_never_removed(tmp_path, stop_after_fresh_start):
    """`python -m minilmd.daemon.demo ~/work` by mistake: a directory of the user's own, but without the demo's
    marker: left whole."""
    work = _victims_work(tmp_path)
    with pytest.raises(SystemExit, match=r"holds no \.minilmd-demo of yours.*nothing was removed"):
        demo.main(str(work))
    assert sorted(os.listdir(work)) == ["thesis.txt"]


def test_a_marker_that_is_not_this_users_file_proves_nothing(tmp_path, stop_after_fresh_start):
    second_user_ids = second_user()
    root = tmp_path / "demo-run"
    with pytest.raises(DemoWentOn):
        demo.main(str(root))  # the demo made it: its marker in it
    (root / "thesis.txt").write_text(THESIS)
    os.chown(root / demo.DEMO_MARKER, *second_user_ids, follow_symlinks=False)
    with pytest.raises(SystemExit, match="holds no .minilmd-demo of yours"):
        demo.main(str(root))
    assert (root / "thesis.txt").read_text() == THESIS

    os.chown(root / demo.DEMO_MARKER, os.geteuid(), os.getegid(), follow_symlinks=False)
    with pytest.raises(DemoWentOn):
        demo.main(str(root))  # its own again: the earlier demo's directory, removed and made afresh
    assert os.listdir(root) == [demo.DEMO_MARKER]


@pytest.mark.parametrize("module", ["minilmd.daemon.demo", "minilmd.daemon.demo_sft", "minilmd.daemon.demo_dpo"])
def test_a_demos_help_and_options_are_never_taken_for_its_directory(tmp_path, module):
    """`python -m minilmd.daemon.demo --help` made a directory named `--help` and ran the whole demo in it."""
    shown = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0 and shown.stdout.startswith(f"usage: python -m {module} [DIR]"), shown
    refused = subprocess.run([sys.executable, "-m", module, "--steps", "3"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "takes one argument, its directory" in refused.stderr, refused
    assert list(tmp_path.iterdir()) == []  # nothing made, nothing run
