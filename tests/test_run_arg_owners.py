"""Which run a view's argument reaches (daemon/views/runarg.py): a link on the way followed, a config file read, only
when it is the caller's, root's or the run directory's owner's (run.dir's link rule, place_rule.link_followed). A third
user's link or config chose whose run root's `minilmd stop` signalled (hostile5 F1, F2): refused, exit 2, naming it,
its owner and the run directory it leads to. Paths that others name reach the terminal escaped (F3). A running run's
registry entry stays (F2). The real second users' version, with a live supervisor: tests/test_run_arg_users.py.

Root is needed to give a link or a config to another uid (lchown); the attacker's uid needs no passwd entry.
"""
from __future__ import annotations

import fcntl
import io
import json
import os
import socket
from pathlib import Path

import pytest

from minilmd import names, protocol
from minilmd.daemon.base import stoprequest
from minilmd.daemon.host import registry
from minilmd.daemon.views import overview
from minilmd.daemon.views import status as views
from minilmd.daemon.views import stop as views_stop
from supervisor_helpers import cli, ended_run, write_config

OTHER = 64123
"""Another user's uid (tests/test_stop_proof.py's attacker): no passwd entry needed to own a file."""
THIRD = 64124
"""A third user's uid: the owner of a run directory the attacker's link or config leads to."""
ESCAPES = "\x1b]0;OWNED-TITLE\x07\x1b[2J"
"""What another user's directory name or config may hold: OSC 0 retitles root's terminal, ESC[2J clears it."""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: gives a link or a config to another uid")


def theirs_link(at: Path, to: Path, uid: int = OTHER) -> Path:
    at.symlink_to(to)
    os.lchown(at, uid, uid)
    return at


def theirs_config(at: Path, run_dir: Path, uid: int = OTHER) -> Path:
    at.write_text(f'[run]\nname = "x"\ndir = "{run_dir}"\n')
    os.chown(at, uid, uid)
    return at


@needs_root
def test_another_users_link_or_config_to_a_run_is_refused_by_every_view_naming_it_and_where_it_leads(
        tmp_path, capsys):
    run = ended_run(tmp_path / "hers" / "run")
    (tmp_path / "his").mkdir()
    link = theirs_link(tmp_path / "his" / "run", run)
    config = theirs_config(tmp_path / "his" / "run.toml", run)
    through = theirs_link(tmp_path / "his" / "dir", run.parent)  # a link on the way, not the last component
    for arg, what in ((link, "a symbolic link"), (config, "a run config"), (through / "run", "a symbolic link")):
        for view in (views.status, views.logs, views_stop.stop):
            out = io.StringIO()
            assert view(arg, out=out) == 2, (view, arg)
            said = capsys.readouterr().err
            assert f"is {what} of uid {OTHER}, not root's" in said and f"leads to the run directory {run}" in said, said
            assert "nothing signalled, nothing written" in said and f"{run}`" in said, said
            assert out.getvalue() == ""
    assert not (run / names.STOP_REQUEST).exists()
    out = io.StringIO()
    assert overview.forget(str(link), out=out) == 2
    assert f"is a symbolic link of uid {OTHER}" in capsys.readouterr().err


@needs_root
def test_links_and_configs_of_root_and_the_caller_are_followed_as_before(tmp_path, capsys):
    run = ended_run(tmp_path / "mine" / "run")
    link = tmp_path / "link"
    link.symlink_to(run)
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\nname = "x"\ndir = "{link}"\n')  # run.dir through the caller's own link too
    for arg in (link, config, run):
        out = io.StringIO()
        assert views.status(arg, out=out) == 0, capsys.readouterr().err
        assert f"({run})" in out.getvalue() and "not running (ended" in out.getvalue(), out.getvalue()
        out = io.StringIO()
        assert views_stop.stop(arg, out=out) == protocol.STOP_DONE
        assert "not yours" not in out.getvalue() and "not running" in out.getvalue(), out.getvalue()


@needs_root
def test_a_config_of_the_caller_naming_a_run_dir_through_another_users_link_is_refused(tmp_path, capsys):
    run = ended_run(tmp_path / "hers" / "run")
    (tmp_path / "his").mkdir()
    link = theirs_link(tmp_path / "his" / "run", run)
    config = tmp_path / "mine.toml"
    config.write_text(f'[run]\nname = "x"\ndir = "{link}"\n')
    assert views_stop.stop(config, out=io.StringIO()) == 2
    said = capsys.readouterr().err
    assert f"{link} (run.dir of {config}) is a symbolic link of uid {OTHER}, not root's" in said, said


def test_paths_others_name_reach_the_terminal_escaped(tmp_path, capsys):
    """hostile5 F3: a run directory named with escape sequences (another user's config or directory name)."""
    run = ended_run(tmp_path / f"run{ESCAPES}")
    (run / "logs").mkdir()
    (run / "logs" / f"attempt-0001{ESCAPES}.log").write_text("a trainer's line\n")
    config = tmp_path / "cfg.toml"
    config.write_text(f'[run]\nname = "x"\ndir = "{tmp_path}/run\\u001b]0;OWNED-TITLE\\u0007\\u001b[2J"\n')
    said = []
    for view in (views_stop.stop, views.logs, views.status):
        for arg in (run, config):
            out = io.StringIO()
            assert view(arg, out=out) == 0
            said += [out.getvalue(), capsys.readouterr().err]
    (run / names.STATE).unlink()
    os.mkfifo(run / names.STATE)  # status says it is unreadable, naming the run directory
    out = io.StringIO()
    assert views.status(run, out=out) == 0
    assert "unreadable" in out.getvalue(), out.getvalue()
    said.append(out.getvalue())
    missing = tmp_path / "gone.toml"
    missing.write_text(f'[run]\nname = "x"\ndir = "{tmp_path}/gone\\u001b[2J"\n')
    assert views.status(missing, out=io.StringIO()) == 2
    said.append(capsys.readouterr().err)
    joined = "".join(said)
    assert "\x1b" not in joined and "\x07" not in joined, joined
    assert "\\x1b]0;OWNED-TITLE\\x07" in joined and "not running" in joined and "==> " in joined, joined


def test_forget_keeps_the_entry_of_a_run_whose_supervisor_holds_its_lock(tmp_path, monkeypatch):
    """hostile5 F2: `forget RUN_DIR` of a running run took it off `status --all` until its next start."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    run = ended_run(tmp_path / "run")
    registry.register("tiny", run, tmp_path / "tiny.toml")
    fd = os.open(run / names.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a supervisor's lock: held, its body naming the holder
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": 1.0}).encode())
        out = io.StringIO()
        assert overview.forget(str(run), out=out) == 1
        assert f"kept {run}: its supervisor (pid {os.getpid()}) holds the run's lock" in out.getvalue()
        assert [e.run_dir for e in registry.entries()] == [run.resolve()]
    finally:
        os.close(fd)
    out = io.StringIO()
    assert overview.forget(str(run), out=out) == 0, out.getvalue()  # no longer running: forgotten
    assert registry.entries() == []


def test_a_run_directory_swapped_for_a_link_after_it_was_named_is_never_signalled_for(tmp_path):
    """The views name a run by its real path (runarg.real_path), then signal through procs.scope_of, after waits
    (the orphan hunt comes after the supervisor's end): whoever owns a directory on the way (his own run directory,
    which root's `stop` was asked to stop) could swap it for a link to her run meanwhile. scope_of refuses a path
    that is not real (every caller passes the real one), so nothing of hers is looked for, let alone signalled."""
    from minilmd import procs
    from minilmd.daemon.child import orphans

    tmp_path = tmp_path.resolve()  # real: scope_of refuses any link on the way, a symlinked TMPDIR's too
    his, hers = ended_run(tmp_path / "his" / "run"), ended_run(tmp_path / "hers" / "run")
    assert procs.scope_of(his).run_dir == his  # named: its real path
    his.rename(his.with_name("moved"))
    his.symlink_to(hers)
    with pytest.raises(procs.Refused, match="changed since it was named; nothing signalled"):
        procs.scope_of(his)
    assert orphans.recorded_launch(his) is None and orphans.find_orphans(his) == []


def theirs_run(run_dir: Path, uid: int = OTHER) -> Path:
    """An ended run directory of `uid`'s, every file in it his."""
    ended_run(run_dir)
    for path in (run_dir, *run_dir.rglob("*")):
        os.lchown(path, uid, uid)
    return run_dir


@needs_root
def test_a_users_own_link_or_config_to_her_own_run_is_followed_for_root(tmp_path, capsys):
    """Review 6 finding 1: root's `minilmd status current`, where nobody's `current` leads to her own run, was
    refused as if it were a third user's link (and a teammate reading her run.share = "group" run through her
    config). A link or config of the run directory's own owner chooses among her own runs only: followed."""
    run = theirs_run(tmp_path / "her" / "runs" / "r1")
    link = theirs_link(tmp_path / "her" / "current", run)
    config = theirs_config(tmp_path / "her" / "r1.toml", run)
    through = theirs_link(tmp_path / "her" / "latest", run.parent)  # hers on the way, not the last component
    linked_config = theirs_config(tmp_path / "her" / "via.toml", through / "r1")  # her config through her link
    for arg in (link, config, through / "r1", linked_config):
        out = io.StringIO()
        assert views.status(arg, out=out) == 0, capsys.readouterr().err
        assert f"({run})" in out.getvalue() and "not running (ended" in out.getvalue(), out.getvalue()
        out = io.StringIO()
        assert views.logs(arg, out=out) == 0 and "the supervisor's line" in out.getvalue(), out.getvalue()
        out = io.StringIO()
        assert views_stop.stop(arg, out=out) == protocol.STOP_DONE, capsys.readouterr().err
        assert f"{run}: a run directory of uid {OTHER}, not yours" in out.getvalue(), out.getvalue()
    said = capsys.readouterr().err  # the tiny configs' own problems said as warnings: nothing refused
    assert "refused" not in said and "Traceback" not in said, said
    # her run ended: the stop's request is for a start under way only (stoprequest.py after_end), at her run
    assert stoprequest.read(run, OTHER)[0].after_end, os.listdir(run)


@needs_root
def test_a_users_link_or_config_to_a_third_users_run_is_still_refused_even_past_her_own_links(tmp_path, capsys):
    """The other side of finding 1 (hostile5 F1): his link or config leads to her run, or his link leads through
    her own link to her run: he chose which run it is, refused, naming his link or config."""
    run = theirs_run(tmp_path / "her" / "run", THIRD)
    hers = theirs_link(tmp_path / "her" / "current", run, THIRD)
    his_link = theirs_link(tmp_path / "his-current", hers)  # his link to her link to her run
    his_config = theirs_config(tmp_path / "his.toml", hers)
    for arg, what, named in ((his_link, "a symbolic link", his_link), (his_config, "a run config", his_config)):
        for view in (views.status, views.logs, views_stop.stop):
            assert view(arg, out=io.StringIO()) == 2, (view, arg)
            said = capsys.readouterr().err
            assert f"{named} is {what} of uid {OTHER}, not root's" in said, said
            assert f"leads to the run directory {run} of uid {THIRD}" in said, said
    mine = theirs_link(tmp_path / "her" / "mine", his_link, THIRD)  # hers, but through his link: his choice
    assert views.status(mine, out=io.StringIO()) == 2
    assert f"{his_link} (on the way from {mine}) is a symbolic link of uid {OTHER}" in capsys.readouterr().err
    assert overview.forget(str(his_link), out=io.StringIO()) == 2
    assert f"{his_link} is a symbolic link of uid {OTHER}" in capsys.readouterr().err


@needs_root
def test_another_users_link_or_config_to_a_run_not_made_yet_is_refused_saying_it_does_not_exist(tmp_path, capsys):
    """Review 7 #6: root's `status` of nobody's config whose run.dir is not made yet (a stage not started) said
    "leads to the run directory X (which cannot be looked at); whoever owns a link or config chooses which run it
    leads to": it blamed the config. The truth: X does not exist (yet). Still refused (exit 2): no owner of X
    proves it the run's."""
    tmp_path = tmp_path.resolve()  # the words name the real path
    (tmp_path / "his").mkdir()
    future = tmp_path / "his" / "runs" / "r1"
    config = theirs_config(tmp_path / "his" / "r1.toml", future)
    link = theirs_link(tmp_path / "his" / "current", future)
    for arg, what in ((config, "a run config"), (link, "a symbolic link")):
        for view in (views.status, views.logs, views_stop.stop):
            assert view(arg, out=io.StringIO()) == 2, (view, arg)
            said = capsys.readouterr().err
            assert (f"{arg} is {what} of uid {OTHER}, not root's: it leads to {future}, which does not exist (yet); "
                    f"whose run will be there cannot be told") in said, said
            assert "refused: nothing signalled, nothing written" in said and "cannot be looked at" not in said, said
    assert not future.exists()


def test_forget_name_forgets_the_gone_runs_of_that_name_though_a_directory_here_of_that_name_runs(
        tmp_path, monkeypatch):
    """Review 6 finding 6: `cd ~/runs; minilmd forget demo` while ./demo trains kept everything (exit 1): the
    directory here of that name was taken as the target alone. Now that one is kept and the gone ones forgotten."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    gone, live = ended_run(tmp_path / "old" / "demo"), ended_run(tmp_path / "runs" / "demo")
    registry.register("demo", gone, tmp_path / "demo.toml")
    registry.register("demo", live, tmp_path / "demo.toml")
    (gone / names.STATE).unlink()
    (gone / names.SUPERVISOR_LOG).unlink()
    gone.rmdir()
    monkeypatch.chdir(live.parent)
    fd = os.open(live / names.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": 1.0}).encode())
        out = io.StringIO()
        assert overview.forget("demo", out=out) == 0, out.getvalue()
        assert f"kept {live.resolve()}: its supervisor (pid {os.getpid()})" in out.getvalue(), out.getvalue()
        assert "forgot demo: removed" in out.getvalue() and "still exists" not in out.getvalue(), out.getvalue()
        assert [e.run_dir for e in registry.entries()] == [live.resolve()]
        assert overview.forget("demo", out=io.StringIO()) == 1  # nothing gone left: the live one stays
        assert [e.run_dir for e in registry.entries()] == [live.resolve()]
    finally:
        os.close(fd)


@needs_root
def test_forget_says_by_case_whose_entries_of_another_users_run_it_removes(tmp_path):
    """Review 6 finding 7: a user's forget of another user's run directory said "forgetting its entries", though it
    removes only the user's own (root's removes anyone's). The words of a real non-root uid, from a forked child."""
    from minilmd.daemon.views.runarg import not_yours_line

    def said_as(uid: int) -> str:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: that uid for real, then the line it would print
            try:
                os.setresuid(uid, uid, uid) if uid else None
                os.write(write, (not_yours_line(tmp_path, THIRD, overview._forgetting()) or "").encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            text = f.read()
        os.waitpid(pid, 0)
        return text

    assert said_as(OTHER).endswith("forgetting only your own entries of it (its owner's stay)"), said_as(OTHER)
    assert said_as(0).endswith("forgetting its entries"), said_as(0)


def test_a_link_removed_between_its_lstat_and_its_readlink_is_no_traceback(tmp_path, monkeypatch, capsys):
    """Review 6 finding 8: os.readlink after the lstat, outside any try: a link removed in between raised an
    OSError out of status, stop and forget. The removal happens for real, at the readlink."""
    run = ended_run(tmp_path / "run")
    link = tmp_path / "current"
    link.symlink_to(run)
    real_readlink = os.readlink

    def removed_first(path, *args, **kwargs):
        if Path(path) == link and link.is_symlink():
            link.unlink()
        return real_readlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "readlink", removed_first)
    assert views.status(link, out=io.StringIO()) == 2
    assert f"{link}: no such file or directory" in capsys.readouterr().err
    link.symlink_to(run)
    assert overview.forget(str(link), out=io.StringIO()) == 1  # gone: nothing of that path registered


def test_the_supervisors_process_checks_say_once_that_a_link_is_on_the_run_dirs_path_now(tmp_path, capsys):
    """Review 6 finding 9: a link put on a running run's path (an admin's compat link, a /data migration) made the
    supervisor's kill_rest and orphan hunt find nothing, unsaid. Now said once, on its log (stderr)."""
    from minilmd.daemon.child import orphans

    tmp_path = tmp_path.resolve()
    run = ended_run(tmp_path / "data" / "run")
    (tmp_path / "data").rename(tmp_path / "data2")
    (tmp_path / "data").symlink_to(tmp_path / "data2")  # ours (or root's): a compat link after a migration
    assert orphans.recorded_launch(run) is None and orphans.find_orphans(run) == []
    assert orphans.launched_at(run) is None
    said = capsys.readouterr().err
    assert said.count("a symbolic link on the way now leads to") == 1, said
    assert "no process can be proven to be this run's" in said and "none is signalled" in said, said


def test_a_link_the_supervisors_checks_meet_is_an_event_that_logs_shows_later(tmp_path, corpus, capsys):
    """The same link met by a supervisor's process checks (its orphan hunt, daemon/child/orphans.py): said once on
    stderr, which only the terminal or journal of the moment had, and now an event of the run's too, through its
    one event writer (daemon/runfiles.py RunFiles: events.jsonl and supervisor.log), which `logs` shows later."""
    from minilmd.config import load_config
    from minilmd.daemon.child import orphans
    from minilmd.daemon.runfiles import RunFiles

    tmp_path = tmp_path.resolve()
    (tmp_path / "data").mkdir()
    config = write_config(tmp_path / "data", corpus)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    files = RunFiles(cfg, cfg.run_dir, config, echo=False)
    try:
        (tmp_path / "data").rename(tmp_path / "data2")
        (tmp_path / "data").symlink_to(tmp_path / "data2")  # ours: a compat link after a migration
        assert orphans.find_orphans(cfg.run_dir) == [] and orphans.find_orphans(cfg.run_dir) == []
    finally:
        files.close(0, "done", "done")
    said = capsys.readouterr().err
    assert said.count("a symbolic link on the way now leads to") == 1, said
    real = tmp_path / "data2" / cfg.run_dir.relative_to(tmp_path / "data")
    events = [json.loads(line) for line in (real / names.EVENTS).read_text().splitlines()]
    linked = [e["message"] for e in events if e["event"] == "link"]
    assert len(linked) == 1 and "no process can be proven to be this run's" in linked[0], events
    logs = cli("logs", str(real))
    assert "[link] " in logs.stdout and "a symbolic link on the way now leads to" in logs.stdout, logs


@needs_root
def test_the_overview_row_of_a_run_directory_swapped_for_a_link_to_another_users_looks_at_nothing_there(tmp_path):
    """Root's `status --all` row read a registered run directory by path (a limit the hostile audit of stop 63
    left). Its owner, swapping it for a link to a third user's run directory whose supervisor is starting (its lock
    held, no state.json yet), had root's row look at her run lock through his link (a shared flock probe on her
    supervisor.lock, which her own start at that moment meets as held) and show her start as his run's, "starting".
    The row now opens the directory as `minilmd status` does (runarg.real_path, then no link followed) and reads
    every file through it: his link to her place is refused."""
    hers = tmp_path / "hers" / "run"
    hers.mkdir(parents=True)
    lock = hers / names.LOCK
    lock.touch(0o600)
    for path in (hers.parent, hers, lock):
        os.chown(path, THIRD, THIRD)
    (tmp_path / "his").mkdir()
    os.chown(tmp_path / "his", OTHER, OTHER)
    swapped = theirs_link(tmp_path / "his" / "run", hers)  # registered as his directory, a link now
    entry = registry.Entry("his", swapped, "", OTHER, tmp_path / "his" / "entry.json")
    with open(lock) as starting:
        fcntl.flock(starting, fcntl.LOCK_EX)  # her supervisor, starting: the lock held, no state.json yet
        row = overview.row(entry, 0.0)
    assert row["phase"] == "unreadable" and f"is a symbolic link of uid {OTHER}" in row["why"], row
    assert row["running"] is False and "starting" not in row, row
