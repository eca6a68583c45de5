"""A local remote's root swapped for a link to another directory after the Remote opened it: every write, rename and
removal a sync makes there goes through the descriptor of the root opened once and checked (Remote._root,
minilmd/dirfd.py's Dir), never through the root's path. On main each was by path (shutil.rmtree, fsio.rename_new,
fsio.exchange, publish_dir, atomic_write_text, and the walk of remote_write.parent_dir from the root's path), which
followed the link: the run's own step directories in the other directory (another run's remote, a directory of the
user's) were removed, replaced or written into. And a root that another user could rearrange so is refused."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.daemon.jobs.remote_write import root_refused
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.dirfd import PlaceRefused
from minilmd.names import LATEST, MANIFEST
from supervisor_helpers import cli, write_config
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture

STEP, COPY = "step-00000001", ".tmp-step-00000002-h-1"


def tree(root: Path) -> dict[str, bytes | str]:
    """Everything under root, no link followed: each file's bytes, each directory and link by what it is."""
    found: dict[str, bytes | str] = {}
    for where, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(where) / name
            rel = str(path.relative_to(root))
            found[rel] = (f"link to {os.readlink(path)}" if path.is_symlink() else
                          "directory" if path.is_dir() else path.read_bytes())
    return found


def fill(root: Path, marker: str) -> None:
    """A remote as a sync leaves it: a step directory, a complete temporary copy, a LATEST."""
    for step, name in enumerate((STEP, COPY), 1):  # a manifest that names its step: what a sync may remove
        (root / name).mkdir(parents=True)
        (root / name / MANIFEST).write_text(json.dumps({"step": step, "marker": f"{marker} {name}"}))
    (root / LATEST).write_text(f"{STEP}\n")


OPERATIONS = {
    "rm": lambda r, src: r.rm(STEP),
    "rename_dir": lambda r, src: r.rename_dir(COPY, "step-00000002"),
    "publish_unless_taken": lambda r, src: r.publish_unless_taken(COPY, "init", lambda n: True, lambda n: True),
    "write_latest": lambda r, src: r.write_latest("step-00000002"),
    "quarantine": lambda r, src: r.quarantine(STEP, "damaged"),
    "put": lambda r, src: r.put(src, COPY, "weights.bin"),
    "make_tmp": lambda r, src: r.make_tmp(".tmp-step-00000003-h-1", "below"),
}

DONE_IN_THE_OPENED_ROOT = {
    "rm": lambda moved: not (moved / STEP).exists(),
    "rename_dir": lambda moved: (moved / "step-00000002" / MANIFEST).is_file() and not (moved / COPY).exists(),
    "publish_unless_taken": lambda moved: (moved / "init" / MANIFEST).is_file() and not (moved / COPY).exists(),
    "write_latest": lambda moved: (moved / LATEST).read_text() == "step-00000002\n",
    "quarantine": lambda moved: not (moved / STEP).exists() and len(list((moved / "quarantine").iterdir())) == 1,
    "put": lambda moved: (moved / COPY / "weights.bin").read_bytes() == b"ours",
    "make_tmp": lambda moved: (moved / ".tmp-step-00000003-h-1" / "below").is_dir(),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_root_swapped_for_a_link_after_it_was_opened_redirects_nothing(tmp_path, operation):
    root, moved, elsewhere = tmp_path / "remote", tmp_path / "remote.moved", tmp_path / "elsewhere"
    fill(root, "the run's")
    fill(elsewhere, "another run's")
    src = tmp_path / "weights.bin"
    src.write_bytes(b"ours")
    remote = open_remote(str(root), "h-1-")
    remote.makedirs()  # what each sync does first: the root made when missing, opened and checked
    before = tree(elsewhere)
    os.rename(root, moved)
    os.symlink(elsewhere, root)  # the root's name now leads elsewhere; the descriptor holds the directory opened

    OPERATIONS[operation](remote, src)

    assert tree(elsewhere) == before  # nothing written, renamed nor removed through the link
    assert DONE_IN_THE_OPENED_ROOT[operation](moved), tree(moved)


def test_a_remote_under_a_directory_others_can_rearrange_is_refused_but_a_team_directory_as_root_is_used(
        tmp_path, weights, corpus):
    """Whoever can write the directory above the root can rename the root away and put a link, or another of the
    user's directories, in its place before it is opened: dirfd's rule (place_problem, as for scratch and the GPU
    lock directory) refuses such a remote when anyone may write that directory (not sticky), final at `run --check`
    (exit 2), and nothing is synced (on main it was used). A team's directory, group-writable (2775, of root's or
    the user's), is accepted above the root (dirfd's team_above: /nfs/team/alice/run1; refused before, while
    /nfs/team itself was used). The root itself may be a directory others write (a team's, by its owner's choice:
    dirfd's group_share): the sync goes on there, opened again at a sync's start once the root was made again."""
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o777)  # not sticky: every user may rename what is in it
    local, below = tmp_path / "scratch", team / "remote"
    save(local, 10, weights)
    checked = cli("run", "--check", str(write_config(tmp_path, corpus, run={"remote": str(below)})))
    assert checked.returncode == 2 and "can be written by other users" in checked.stderr + checked.stdout, checked
    with pytest.raises(PlaceRefused, match="can be written by other users"):
        open_remote(str(below)).makedirs()
    with pytest.raises(SyncError, match="can be written by other users"):
        Syncer(local, str(below), EXPECTED).sync_newest()
    assert not below.exists() or not any(below.iterdir())
    team_dir = tmp_path / "nfs-team"
    (team_dir / "alice").mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(team_dir, -1, 4242)  # a group of others' (root's own is root's alone: perms.private_group)
    team_dir.chmod(0o2775)
    run1 = team_dir / "alice" / "run1"
    assert root_refused(str(run1)) is None  # what `run --check` and the start ask (preflight.remote_place_problems)
    assert Syncer(local, str(run1), EXPECTED).sync_newest().step == 10
    assert (run1 / LATEST).read_text() == "step-00000010\n"
    syncer = Syncer(local, str(team), EXPECTED)
    assert syncer.sync_newest().step == 10
    assert (team / LATEST).read_text() == "step-00000010\n"
    # the root emptied and made again between two syncs: the next sync's start opens the new one (checked again)
    shutil.rmtree(team)
    team.mkdir(mode=0o1777)
    save(local, 20, weights)
    assert syncer.sync_newest().step == 20 and (team / LATEST).read_text() == "step-00000020\n"


@pytest.mark.parametrize("swapped_in", ["his directory", "a link to his directory"])
def test_a_directory_above_the_root_swapped_after_the_check_is_refused_at_the_open(tmp_path, weights,
                                                                                   monkeypatch, swapped_in):
    """A team directory above the root (2775, group-writable: dirfd's team_above) lets a group member rename the
    user's directory in it away and put his own, holding a run1 of his, in its place right after the rule judged
    the team directory and before the open goes on (then swap back). On main the open followed the path of the
    moment (O_NOFOLLOW guards only the last name) and the sync wrote into his run1. Now Dir.open walks the path from
    "/" by descriptors and judges each directory on what it opened (minilmd/place_rule.py open_walked): refused,
    nothing written in his directory. The swap is made certain by a hook at the walk's judgement of the team
    directory (place_rule._judged's return)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the swapped-in directory belongs to another uid")
    from minilmd import place_rule

    team = tmp_path / "nfs-team"
    (team / "alice").mkdir(parents=True)
    os.chown(team, -1, 4242)  # a group of others': its members may rename what is in it
    team.chmod(0o2775)
    run1, his = team / "alice" / "run1", tmp_path / "his"
    (his / "run1").mkdir(parents=True)
    for made in (his, his / "run1"):
        os.chown(made, 4242, 4242)
    (his / "run1").chmod(0o777)
    judged = place_rule._judged

    def swapped_after_judging(fd, here, *args, **kwargs):
        opened = judged(fd, here, *args, **kwargs)
        if here == team and not (team / "alice.away").exists():
            os.rename(team / "alice", team / "alice.away")
            if swapped_in == "his directory":
                os.rename(his, team / "alice")
            else:
                os.symlink(his, team / "alice")
                os.lchown(team / "alice", 4242, 4242)
        return opened

    monkeypatch.setattr(place_rule, "_judged", swapped_after_judging)
    local = tmp_path / "scratch"
    save(local, 10, weights)
    with pytest.raises(SyncError, match="belongs to uid 4242|symbolic link"):
        Syncer(local, str(run1), EXPECTED).sync_newest()
    theirs = team / "alice" if swapped_in == "his directory" else his
    assert list((theirs / "run1").iterdir()) == []


@pytest.mark.parametrize("swapped_in", ["a link to his directory", "his directory"])
def test_a_missing_directory_on_the_way_swapped_after_it_was_made_leads_nothing_into_his_place(tmp_path, monkeypatch,
                                                                                             swapped_in):
    """A remote not there yet below a team directory (2775, of a group of others': dirfd's team_above) is made by
    the first sync. A group member renames the directory the sync has just made there away and puts a link to his
    own directory (or that directory itself) in its place, before the sync makes the next one in it. On main the
    place was judged by path, then made by path (os.makedirs), through whatever stood there by then: the remote's
    directories were made in his directory, and only the open after refused it. Now the walk makes each directory
    at its parent's descriptor, judged as reached, and opens it without following a link: refused, naming what it
    found, nothing made in his directory. The swap is made certain by a hook at the first mkdir."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the swapped-in link and directory belong to another uid")
    team, his = tmp_path / "nfs-team", tmp_path / "his"
    (team / "bob").mkdir(parents=True)  # a team directory in use: not an unmounted share's empty stub
    his.mkdir()
    os.chown(team, -1, 4242)  # a group of others': its members may rename what is in it
    team.chmod(0o2775)
    os.chown(his, 4242, 4242)
    his.chmod(0o777)
    root = team / "alice" / "run1"
    real_mkdir, made = os.mkdir, []

    def swapped_after_the_first_mkdir(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        if not made:
            made.append(path)
            os.rename(team / "alice", team / "alice.away")
            if swapped_in == "his directory":
                os.rename(his, team / "alice")
            else:
                os.symlink(his, team / "alice")
                os.lchown(team / "alice", 4242, 4242)

    monkeypatch.setattr(os, "mkdir", swapped_after_the_first_mkdir)
    with pytest.raises(PlaceRefused, match="symbolic link of .*uid 4242|belongs to .*uid 4242"):
        open_remote(str(root)).makedirs()
    theirs = team / "alice" if swapped_in == "his directory" else his
    assert made and os.listdir(theirs) == []  # nothing made through his link nor in his directory
