"""Whose a run is, by its directory: one rule (perms.run_dir_owner) for every reader.

Before, three spellings disagreed on a run directory named by a link: `sample/export/verify RUN_DIR`
(checkpoint_select.run_roots) and init.from's wait (daemon/phases/initwait.py) took the directory's owner (an open,
a stat), while `status`'s reading of a run without state.json (daemon/views/lastwords.py, and state.json's readers
through runstate.state_owners) took the link's own owner (an lstat): root's link to her run directory made root the
run's user there, and her events.jsonl "another user's file", unread. Now all take the directory as opened: its
descriptor's owner when the caller holds one, else the one its path opens.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state, process_start_ticks
from minilmd.daemon.phases.initwait import predecessor_liveness
from minilmd.daemon.views.lastwords import no_state_lines
from minilmd.init_source import Predecessor
from minilmd.perms import run_dir_owner

HERS = 64125
"""Another user: the owner of the run directory the link leads to."""


@pytest.fixture
def linked(tmp_path) -> tuple[Path, Path]:
    """(a link of ours, her run directory it leads to)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    real, link = tmp_path / "hers", tmp_path / "run"
    real.mkdir()
    os.chown(real, HERS, HERS)
    link.symlink_to(real)
    return link, real


def test_the_owner_is_the_directorys_as_opened_never_the_links(linked, tmp_path):
    link, real = linked
    assert os.lstat(link).st_uid == 0 and run_dir_owner(link) == HERS
    real.chmod(0o700)  # no read right needed: root's look aside, a teammate's private run directory has an owner
    fd = os.open(real, os.O_PATH | os.O_DIRECTORY)
    try:
        real.rename(tmp_path / "aside")
        real.mkdir()  # ours, where hers was: the descriptor's owner still, the path's now
        assert run_dir_owner(link, fd) == HERS and run_dir_owner(link) == 0
    finally:
        os.close(fd)
    (tmp_path / "file").touch()
    assert run_dir_owner(tmp_path / "file") is None and run_dir_owner(tmp_path / "gone") is None


def test_the_readers_of_a_run_named_by_a_link_agree_it_is_hers(linked, tmp_path):
    link, real = linked
    # checkpoint_select: her scratch is looked in (judged for root, it was "another user's": not looked in)
    scratch = tmp_path / "scratch"
    (scratch / names.CHECKPOINTS).mkdir(parents=True)
    for path in (scratch, scratch / names.CHECKPOINTS):
        os.chown(path, HERS, HERS)
    (real / names.RUN_CONFIG_COPY).write_text(f'[run]\nname = "r"\ndir = "{real}"\nscratch = "{scratch}"\n'
                                              f'[data]\nprepared = "{real}"\n[train]\nmax_steps = 1\n')
    from minilmd.checkpoint_select import run_roots

    run = run_roots(link)
    assert run.roots == [scratch / names.CHECKPOINTS] and not run.skipped, (run.roots, run.skipped)

    # lastwords: her events.jsonl is her supervisor's, its end said (the link's owner's rule: unread, "no state.json")
    events = [{"event": "start", "message": "supervisor pid 1 owns it", "pid": 1, "time": 1.0},
              {"event": "gave_up", "exit": 73, "message": "stopping -> failed: stopped because run.dir is full (x)",
               "new": "failed", "old": "stopping", "time": 2.0, "transition": "gave_up"}]
    (real / names.EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
    os.chown(real / names.EVENTS, HERS, HERS)
    said = no_state_lines(link)
    assert said[0].startswith(f"{link}: failed (exit 73): stopped because run.dir is full (x)"), said

    # initwait: her lock, held by the pid her state.json names, tells that her supervisor runs, though its record
    # alone does not (a start time that is not its own: a /proc hidden from us); the link's owner's rule took her
    # lock for a file someone else made, and the predecessor for gone
    lock = real / names.LOCK
    lock.touch()
    os.chown(lock, HERS, HERS)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(600)", str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        state = new_state("r", real, str(real / names.RUN_CONFIG_COPY))
        ticks = process_start_ticks(holder.pid)
        assert ticks is not None
        state["supervisor"].update(pid=holder.pid, start_ticks=ticks + 1)
        state.update(phase="training", updated=time.time())
        live = predecessor_liveness(Predecessor("r", link, scratch / names.CHECKPOINTS), state)
        assert live is not None and live.running, live
    finally:
        holder.kill()
        holder.wait()
