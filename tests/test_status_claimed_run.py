"""`minilmd status DIR` shows the directory it read, not the run a state.json there claims (hostile audit 6: mal
copied vic's run directory into a share, and vic's status of it printed "run base (/home/vic/runs/base): done"
with vic's own path). When the state.json names another run directory, the run is shown as this directory's and a
line says what the file claims."""
from __future__ import annotations

import io
import os
import shutil

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views.status import status
from minilmd.fsio import atomic_write_json
from second_user import second_user, shared_dir


@pytest.fixture
def shared():
    path = shared_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def shown(run_dir) -> str:
    out = io.StringIO()
    assert status(run_dir, out=out) == 0
    return out.getvalue()


@pytest.mark.root
def test_a_state_json_claiming_another_users_run_is_shown_as_the_directory_read(shared, tmp_path):
    uid, gid = second_user()
    victims = tmp_path / "runs" / "base"  # root's (the victim's) real run directory
    copied = shared / "hrun"  # nobody's copy of it, in a share
    copied.mkdir()
    atomic_write_json(copied / names.STATE, new_state("base", victims, "x.toml"))
    for path in (copied, copied / names.STATE):
        os.chown(path, uid, gid)
    said = shown(copied)
    head = said.splitlines()[0]
    assert head.startswith(f"run hrun ({copied}): "), said  # was "run base (<the victim's run dir>)"
    assert str(victims) not in head, said
    assert f"its state.json names run base in {victims}, another directory" in said, said


def test_a_run_directorys_own_state_json_is_shown_as_it_says(tmp_path):
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    atomic_write_json(run_dir / names.STATE, new_state("my-run", run_dir, "x.toml"))
    said = shown(run_dir)
    assert said.startswith(f"run my-run ({run_dir}): ") and "another directory" not in said, said
