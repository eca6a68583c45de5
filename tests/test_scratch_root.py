"""minilmd/scratch_root.py on its own: which root a default scratch goes in, the private one a launch makes where the
default root's name is taken (here by a file and by a link, which need no second user: tests/test_scratch_squat.py
has another user's directory and whole runs), and that run.dir's record is believed only in its own form.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from minilmd import scratch_root
from minilmd.names import SCRATCH_BASE_ENV, SCRATCH_ROOT_RECORD

UID = os.geteuid()


@pytest.fixture
def base(tmp_path, monkeypatch) -> Path:
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    monkeypatch.setenv(SCRATCH_BASE_ENV, str(shm))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return shm


@pytest.mark.parametrize("taken_by", ["file", "link"])
def test_a_taken_default_root_gets_a_private_root_that_every_later_start_finds(base, tmp_path, taken_by):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    default = base / f"minilmd-{UID}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if taken_by == "file":
        default.write_text("")
    else:
        default.symlink_to(elsewhere)
    assert scratch_root.check_note(default / "r", by_default=True).startswith("the default scratch root is taken: ")
    assert scratch_root.check_note(default / "r", by_default=False) == ""  # run.scratch set by hand: its own rules
    settled, said = scratch_root.settle(run_dir)
    own = scratch_root.recorded(run_dir)
    assert said and own is not None and settled == own and f"this run's scratch root is {own}" in said
    assert own.parent == base and own.is_dir() and not own.is_symlink() and (own.stat().st_mode & 0o777) == 0o700
    assert scratch_root.default_path("r", run_dir=run_dir) == own / "r"
    assert scratch_root.default_path("r") == default / "r"  # without a run.dir: the plain default
    assert scratch_root.settle(run_dir) == (own, None) and scratch_root.recorded(run_dir) == own  # the next start
    assert list(elsewhere.iterdir()) == []  # nothing made through the link
    assert "scratch in the private root" in scratch_root.in_use(run_dir, own)


def test_a_free_default_root_is_made_private_and_no_record_is_written(base, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    default = base / f"minilmd-{UID}"
    assert scratch_root.settle(run_dir) == (default, None)
    assert default.is_dir() and (default.stat().st_mode & 0o777) == 0o700
    assert not (run_dir / SCRATCH_ROOT_RECORD).exists() and scratch_root.in_use(run_dir, default) == ""


@pytest.mark.parametrize("root", ["/etc", "{base}/minilmd-{uid}", "{base}/minilmd-{other}-abcdefgh",
                                  "{base}/minilmd-{uid}-abc", "{base}/x/minilmd-{uid}-abcdefgh", 7])
def test_a_record_of_another_form_is_no_record(base, tmp_path, root):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if isinstance(root, str):
        root = root.format(base=base, uid=UID, other=UID + 1)
    (run_dir / SCRATCH_ROOT_RECORD).write_text(json.dumps({"root": root}))
    assert scratch_root.recorded(run_dir) is None
    assert scratch_root.default_path("r", run_dir=run_dir) == base / f"minilmd-{UID}" / "r"


def test_a_record_that_is_a_link_or_another_users_file_is_no_record(base, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    good = {"root": str(base / f"minilmd-{UID}-abcdefgh")}
    (tmp_path / "planted.json").write_text(json.dumps(good))
    (run_dir / SCRATCH_ROOT_RECORD).symlink_to(tmp_path / "planted.json")
    assert scratch_root.recorded(run_dir) is None
    (run_dir / SCRATCH_ROOT_RECORD).unlink()
    (run_dir / SCRATCH_ROOT_RECORD).write_text(json.dumps(good))
    assert scratch_root.recorded(run_dir) == base / f"minilmd-{UID}-abcdefgh"
    if UID == 0:
        os.chown(run_dir / SCRATCH_ROOT_RECORD, 65534, 65534)
        assert scratch_root.recorded(run_dir) is None


def test_status_names_a_private_scratch_root_and_why_only_when_the_run_has_one(base, tmp_path):
    """`minilmd status` (text and --json) said nothing of it: the start event and `run --check` did."""
    import io

    from minilmd import names
    from minilmd.daemon.base.runstate import new_state
    from minilmd.daemon.views.status import status
    from minilmd.fsio import atomic_write_json

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    atomic_write_json(run_dir / names.STATE, new_state("r", run_dir, "x.toml"))

    def shown(as_json: bool) -> str:
        out = io.StringIO()
        assert status(run_dir, as_json=as_json, out=out) == 0
        return out.getvalue()

    scratch_root.settle(run_dir)  # the default root is free: no record, no line
    assert "scratch root" not in shown(False) and "scratch_root" not in json.loads(shown(True))
    (base / f"minilmd-{UID}").rmdir()
    (base / f"minilmd-{UID}").write_text("")  # taken: the next start makes a private root
    own, _ = scratch_root.settle(run_dir)
    why = f"{base / f'minilmd-{UID}'} is a file of "
    line = next(x for x in shown(False).splitlines() if x.startswith("  scratch root: "))
    assert f"the private root {own} (the default: {why}" in line, line
    said = json.loads(shown(True))["scratch_root"]
    assert said["root"] == str(own) and said["because"].startswith(why), said


def test_a_checkpoint_left_in_the_taken_default_root_is_said_moved_by_the_taking_not_by_run_scratch(base, tmp_path):
    """user3 F6: another user took the default root, the run's scratch moved to a private one; its start said the
    earlier checkpoint was gone because "run.scratch changed", which the user never changed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    default = base / f"minilmd-{UID}"
    earlier = default / "r" / "checkpoints" / "step-5"
    default.write_text("")  # taken (after the run's earlier start had its scratch there)
    own, _ = scratch_root.settle(run_dir)
    said = scratch_root.moved_words(run_dir, own / "r", earlier)
    assert said.startswith(f"the default scratch root was taken, so the run's scratch is now {own / 'r'}: "), said
    assert "run.scratch changed" not in said
    hand_set = scratch_root.moved_words(run_dir, tmp_path / "mine" / "r", own / "r" / "checkpoints" / "step-5")
    assert hand_set.startswith("run.scratch changed"), hand_set
