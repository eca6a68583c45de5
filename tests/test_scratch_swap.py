"""Scratch swapped or squatted by another user, with real Unix users (root and nobody) and real `minilmd run`s.

Each test first reproduced the attack on the code before the fix (issue 21, "Data loss"):
- a non-default run.scratch under a directory another user can write: `--check` said OK, and that user could later
  replace the scratch by a symbolic link to the victim's data (re-staging then deleted `~/data/corpus`) or by his own
  0777 directory (the victim's corpus was copied into it). Now `--check` and the launch refuse such a place (exit 2),
  and a scratch whose identity changed since the claim stops the run (exit 2, state.json and events name the
  change) before anything is staged, deleted or started in it;
- an existing directory without the owner marker, holding files, was adopted and its `corpus/` deleted ("existing
  copy ... is not usable"). Now only an empty one is adopted;
- `run --check` with a scratch inside another user's 0700 directory: exit 2 with a message, no traceback;
- staging deletes nothing in a scratch that changed since this process claimed it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from minilmd import scratch
from minilmd.daemon.jobs import staging
from minilmd.protocol import SUPERVISOR_CONFIG
from scratch_helpers import NOBODY, owned_by_nobody, shared, text_of, two_users  # noqa: F401
from supervisor_helpers import start_supervisor, state, wait_for, wait_or_kill, write_config

VICTIMS_DATA = {"corpus/raw.jsonl": '{"text": "her only copy"}\n', "corpus/notes.txt": "notes\n"}


def victims_data(root: Path) -> Path:
    for rel, text in VICTIMS_DATA.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def untouched(root: Path) -> bool:
    return all((root / rel).read_text() == text for rel, text in VICTIMS_DATA.items()) and \
        sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["corpus", *sorted(VICTIMS_DATA)]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["owned", "world-writable"])
def test_a_scratch_under_a_directory_another_user_can_write_is_refused(shared, how):
    # nobody owns (or can write, not sticky) the directory that holds root's scratch: he could swap it at any time
    parent = owned_by_nobody(shared.root / "his") if how == "owned" else shared.root / "open"
    parent.mkdir(exist_ok=True)
    if how == "world-writable":
        parent.chmod(0o777)
    config = shared.config("root", "r", scratch=str(parent / "scratch"))
    for args in (("run", "--check", str(config)), ("run", str(config))):
        out = shared.users.minilmd("root", *args)
        assert out.returncode == SUPERVISOR_CONFIG, (args, text_of(out)[-3000:])
        said = text_of(out)
        assert f"run.scratch {parent / 'scratch'}: the directory {parent} above it" in said, said
        assert ("belongs to user nobody" if how == "owned" else "can be written by other users") in said, said
        assert "Traceback" not in said
    assert list(parent.iterdir()) == []


@pytest.mark.slow
def test_a_directory_without_the_marker_holding_files_is_never_adopted(shared):
    existing = victims_data(shared.home("root") / "existing")
    config = shared.config("root", "r", scratch=str(existing))
    for args in (("run", "--check", str(config)), ("run", str(config))):
        out = shared.users.minilmd("root", *args)
        assert out.returncode == SUPERVISOR_CONFIG, (args, text_of(out)[-3000:])
        assert f"run.scratch {existing} already holds files (corpus) and no owner.json" in text_of(out), text_of(out)
    assert untouched(existing)
    # an empty one is adopted, as before
    empty = shared.home("root") / "empty"
    empty.mkdir()
    out = shared.users.minilmd("root", "run", str(shared.config("root", "e", scratch=str(empty))))
    assert out.returncode == 0, text_of(out)[-3000:]
    assert (empty / "owner.json").is_file()


@pytest.mark.slow
def test_check_of_a_scratch_inside_another_users_private_directory_says_so(shared):
    private = shared.root / "roots-private"
    private.mkdir(mode=0o700)
    config = shared.config("nobody", "n", scratch=str(private / "scratch"))
    out = shared.users.minilmd("nobody", "run", "--check", str(config))
    assert out.returncode == SUPERVISOR_CONFIG, text_of(out)[-3000:]
    assert "Traceback" not in text_of(out) and f"{private / 'scratch'}" in text_of(out), text_of(out)


@pytest.mark.slow
@pytest.mark.parametrize("swap", ["link to her data", "his own 0777 directory", "a copy of it"])
def test_a_scratch_swapped_mid_run_stops_the_run_before_anything_is_staged_or_deleted(shared, swap):
    home = shared.home("root")
    data = victims_data(home / "data")
    where = home / "scr"
    config = write_config(home, (shared.root / "prepared", shared.vocab), "swap", remote=False,
                          run={"scratch": str(where)}, train={"max_steps": 100000, "checkpoint_every": 100000})
    run_dir = config.parent / "swap" / "run"
    proc = start_supervisor(config, home / "supervisor.out", FAKE_STEP_S="0.05")
    try:
        wait_for(lambda: state(run_dir).get("phase") == "training", timeout=120)
        os.rename(where, home / "scr-was")
        if swap == "link to her data":
            where.symlink_to(data)
        elif swap == "a copy of it":  # the staged corpus is there: no re-staging, the next trainer start re-claims
            shutil.copytree(home / "scr-was", where, symlinks=True)
        else:
            owned_by_nobody(where).chmod(0o777)
        os.kill(state(run_dir)["child"]["pid"], signal.SIGKILL)  # the next attempt: re-claimed before its start
        assert wait_or_kill(proc, timeout=120) == SUPERVISOR_CONFIG
    finally:
        if proc.poll() is None:
            proc.kill()
    final = state(run_dir)
    said = final.get("last_error") or ""
    changed = "changed since this run claimed it" if swap != "a copy of it" else "is not the directory this run claimed"
    assert f"run.scratch {where} {changed}" in said, said
    if swap == "link to her data":
        assert f"it is now a symbolic link to {data};" in said, said
    elif swap == "a copy of it":  # the user's own copy: no stranger blamed (tests/test_scratch_removed.py)
        assert "another directory of yours" in said and "it holds no checkpoint" in said, said
        assert "someone" not in said, said
        assert final["child"] is None and len(final["restarts"]) == 1  # no second attempt started in the copy
    else:
        assert "it is now a directory of device" in said, said
        assert f"owned by user nobody (uid {NOBODY.pw_uid});" in said, said
    assert final["phase"] == "failed" and final["outcome"]["exit"] == SUPERVISOR_CONFIG
    assert changed in (run_dir / "events.jsonl").read_text()
    assert untouched(data)
    if swap == "his own 0777 directory":
        assert list(where.iterdir()) == []  # nothing of hers was copied into his directory


def test_staging_deletes_nothing_in_a_scratch_that_changed_since_the_claim(tmp_path, corpus):
    where, run_dir = tmp_path / "scr", tmp_path / "run"
    scratch.claim(where, run_dir, "r", False)
    staging.stage(str(corpus[0]), where)
    data = victims_data(tmp_path / "data")
    os.rename(where, tmp_path / "scr-was")
    where.symlink_to(data)  # her data behind the scratch's name: a not-verifying corpus/ is there
    with pytest.raises(scratch.ScratchRefused, match="symbolic link"):
        staging.stage(str(corpus[0]), where)
    where.unlink()
    where.mkdir(mode=0o700)  # another directory of the same owner and name
    victims_data(where)
    # one's own: no stranger blamed (the user's own `rm -rf` and mkdir: tests/test_scratch_removed.py)
    with pytest.raises(scratch.ScratchChanged, match=f"run.scratch {where} is not the directory this run claimed"):
        scratch.claim(where, run_dir, "r", False)
    with pytest.raises(scratch.ScratchChanged):
        staging.stage(str(corpus[0]), where)
    assert untouched(data) and untouched(where)


def _problems(where: Path, run_dir: Path) -> str:
    return "; ".join(scratch.problems(where, run_dir, False))


def test_no_link_on_the_way_and_no_directory_above_that_another_user_can_change(tmp_path):
    """Another user's link on the way is refused (the place rule's walk: a link of root's or ours is followed, as
    Dir.open follows it to the scratch), and so is a directory above that another user owns or can write."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a directory to another user (nobody)")
    run_dir = tmp_path / "run"
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    assert _problems(tmp_path / "via" / "a" / "scr", run_dir) == ""  # root's own link: followed
    os.lchown(tmp_path / "via", NOBODY.pw_uid, NOBODY.pw_gid)
    assert f"{tmp_path / 'via'} is a symbolic link of user nobody (uid {NOBODY.pw_uid}) (to {real})" in \
        _problems(tmp_path / "via" / "a" / "scr", run_dir)
    his = tmp_path / "his"
    his.mkdir()
    os.chown(his, NOBODY.pw_uid, NOBODY.pw_gid)
    assert f"the directory {his} above it belongs to user nobody" in _problems(his / "scr", run_dir)
    for mode, refused in ((0o777, True), (0o775, True), (0o1777, False), (0o755, False)):
        open_dir = tmp_path / f"open-{mode:o}"
        open_dir.mkdir()
        os.chown(open_dir, -1, NOBODY.pw_gid)  # a group of others' (root's own is root's alone: perms.private_group)
        open_dir.chmod(mode)
        said = _problems(open_dir / "scr", run_dir)
        assert ("can be written by other users" in said) == refused, (mode, said)
    mine_but_open = tmp_path / "mine-but-open"
    mine_but_open.mkdir()
    mine_but_open.chmod(0o1777)  # a sticky bit on the scratch itself does not keep others from adding names
    assert f"run.scratch {mine_but_open} can be written by other users (mode 1777)" in \
        _problems(mine_but_open, run_dir)
    with pytest.raises(scratch.ScratchRefused, match="symbolic link"):
        scratch.claim(tmp_path / "via" / "scr", run_dir, "r", False)
    assert list(real.iterdir()) == []


def test_a_scratch_that_is_gone_is_made_again_and_claimed_afresh(tmp_path):
    where, run_dir = tmp_path / "scr", tmp_path / "run"
    first = scratch.claim(where, run_dir, "r", False)
    assert scratch.claim(where, run_dir, "r", False) == first  # claimed again: the same directory
    shutil.rmtree(where)  # a cleaner emptied it: no one else's directory stands there
    scratch.claim(where, run_dir, "r", False)  # no ScratchChanged (the inode number may even be reused)
    assert (where / "owner.json").is_file() and json.loads((where / "owner.json").read_text())["run_dir"] == \
        str(run_dir.resolve())
