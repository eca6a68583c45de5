"""`minilmd status` of a run whose supervisor ended before it could write state.json (daemon/views/lastwords.py).

Observed before (user walk 5): a run.dir on a filesystem already full at launch; `minilmd run` exited 73 saying
"run.dir ... is full (state.json: No space left on device) ...", and events.jsonl held the `gave_up`, but
`minilmd status RUN_DIR` said "no state.json yet (the supervisor has not started here, or is just starting)" and
the overview listed the run "not started". docs/failure-modes.md promises "`status` says failed, exit 73".
"""
from __future__ import annotations

import fcntl
import io
import json
import os
import socket

import pytest

from minilmd import names, protocol
from minilmd.config import load_config
from minilmd.daemon.host import registry
from minilmd.daemon.views import overview
from minilmd.daemon.views.lastwords import ended_in_events
from minilmd.daemon.views.status import status
from supervisor_helpers import cli, start_supervisor, wait_or_kill, write_config


@pytest.mark.slow
def test_a_run_dir_full_at_launch_is_failed_exit_73_in_status_and_the_overview(tmp_path, corpus, small_tmpfs):
    disk = small_tmpfs("16k")  # room for run.toml and a few events, none for state.json
    config = write_config(tmp_path, corpus, run={"dir": str(disk / "run")})
    cfg = load_config(config)
    out = tmp_path / "sup.out"
    rc = wait_or_kill(start_supervisor(config, out), 120)
    said = out.read_text()
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, said
    assert not (cfg.run_dir / names.STATE).exists(), said  # the case: no state.json, its end in events.jsonl
    one = cli("status", str(cfg.run_dir)).stdout
    assert f"{cfg.run_dir}: failed (exit 73): stopped because run.dir is full" in one, one
    assert "no state.json yet" not in one and "events.jsonl" in one, one
    table = cli("status").stdout
    # this worker's other runs named "s" share the registry: the row is the one of this run's directory
    row = next(line for line in table.splitlines() if line.rstrip().endswith(str(cfg.run_dir)))
    assert "failed (exit 73)" in row and "not started" not in row, table
    assert "s: failed (exit 73): stopped because run.dir is full" in table, table
    as_json = json.loads(cli("status", "--json", str(cfg.run_dir)).stdout)
    assert as_json["state"] is None and as_json["ended_in_events"]["exit"] == 73, as_json


def _events(run_dir, *records) -> None:
    run_dir.mkdir(exist_ok=True)
    (run_dir / names.RUN_CONFIG_COPY).touch()  # a run directory (daemon/views/runarg.py), as a supervisor leaves it
    with open(run_dir / names.EVENTS, "a") as f:
        f.writelines((json.dumps(r) if isinstance(r, dict) else r) + "\n" for r in records)


START = {"event": "start", "message": "supervisor pid 1 owns it", "pid": 1, "time": 1.0}
GAVE_UP = {"event": "gave_up", "exit": 73, "message": "stopping -> failed: stopped because run.dir is full (x)",
           "new": "failed", "old": "stopping", "time": 2.0, "transition": "gave_up"}


def _status(run_dir) -> str:
    out = io.StringIO()
    assert status(run_dir, out=out) == 0
    return out.getvalue()


def test_the_end_counts_only_for_the_last_supervisor_and_a_torn_line_is_passed_by(tmp_path):
    run_dir = tmp_path / "run"
    _events(run_dir, START, '{"event": "info", "mess', GAVE_UP)
    end = ended_in_events(run_dir, os.getuid())
    assert end is not None and end.words() == "failed (exit 73): stopped because run.dir is full (x)"
    assert "failed (exit 73): stopped because run.dir is full (x)" in _status(run_dir)
    _events(run_dir, START)  # started again since, no state.json yet: not ended by its predecessor's words
    assert ended_in_events(run_dir, os.getuid()) is None
    assert "no state.json yet" in _status(run_dir)


def test_an_end_without_an_exit_status_is_no_end_and_the_exit_event_gives_one(tmp_path):
    run_dir = tmp_path / "run"
    _events(run_dir, START, {**GAVE_UP, "exit": "73"})  # a wrongly typed exit: not read as one
    assert ended_in_events(run_dir, os.getuid()) is None
    _events(run_dir, {"event": "exit", "exit": 73, "message": "supervisor exits with status 73 (failed)"})
    end = ended_in_events(run_dir, os.getuid())
    assert end is not None and end.exit == 73


def test_a_supervisor_holding_the_lock_before_its_start_event_is_starting_not_its_predecessors_failure(
        tmp_path, monkeypatch):
    """Review 7 #7: a new supervisor writes its "start" event only after the lock, its adopt notes, the remote's
    take-over and the orphan hunt (daemon/supervisor.py); meanwhile `status` and the overview showed its
    predecessor's "failed (exit 73)" while it ran. The lock is looked at first: its holder is starting."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    run_dir = tmp_path / "run"
    _events(run_dir, START, GAVE_UP)  # the predecessor's end, exit 73, no state.json
    registry.register("s", run_dir, tmp_path / "s.toml")
    fd = os.open(run_dir / names.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the new supervisor's lock, its body naming it; no "start" event yet
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": 1.0}).encode())
        one = _status(run_dir)
        assert f"{run_dir}: starting (supervisor pid {os.getpid()}); no state.json yet" in one, one
        assert "failed" not in one, one
        as_json = io.StringIO()
        assert status(run_dir, as_json=True, out=as_json) == 0
        said = json.loads(as_json.getvalue())
        assert said["running"] and said["starting_pid"] == os.getpid() and "ended_in_events" not in said, said
        table = io.StringIO()
        assert overview.status_all(out=table) == 0
        row = next(line for line in table.getvalue().splitlines() if line.startswith("s "))
        assert f"starting (supervisor pid {os.getpid()})" in row and "failed" not in row, table.getvalue()
    finally:
        os.close(fd)
    assert "failed (exit 73): stopped because run.dir is full (x)" in _status(run_dir)  # the lock let go: its end


def test_events_of_another_user_or_behind_a_link_are_not_read(tmp_path):
    run_dir = tmp_path / "run"
    _events(tmp_path / "elsewhere", START, GAVE_UP)
    run_dir.mkdir()
    (run_dir / names.RUN_CONFIG_COPY).touch()
    os.symlink(tmp_path / "elsewhere" / names.EVENTS, run_dir / names.EVENTS)
    assert ended_in_events(run_dir, os.getuid()) is None
    assert "no state.json yet" in _status(run_dir)
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.unlink(run_dir / names.EVENTS)
    _events(run_dir, START, GAVE_UP)
    os.chown(run_dir / names.EVENTS, 65534, 65534)  # nobody's file in our run directory: not the supervisor's
    assert ended_in_events(run_dir, os.getuid()) is None
    assert "no state.json yet" in _status(run_dir)


@pytest.mark.slow
def test_run_check_notes_a_run_dir_whose_file_system_is_nearly_full(tmp_path, corpus, small_tmpfs):
    disk = small_tmpfs("16k")  # the launch there exits 73 (above); --check said OK without a word
    nearly_full = cli("run", str(write_config(tmp_path, corpus, name="full", run={"dir": str(disk / "run")})),
                      "--check")
    assert nearly_full.returncode == 0, nearly_full.stdout + nearly_full.stderr
    said = nearly_full.stdout + nearly_full.stderr
    assert f"run.dir {disk / 'run'}: its file system has " in said and "free, under the 4 MiB" in said, said
    assert not (disk / "run").exists()  # --check makes nothing
    roomy = cli("run", str(write_config(tmp_path, corpus, name="roomy")), "--check")
    assert roomy.returncode == 0 and "its file system has" not in roomy.stdout + roomy.stderr, roomy.stdout


def _fill(disk) -> None:
    """Every byte of the file system at `disk` taken (a file written until ENOSPC)."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
        except OSError:
            pass
    assert os.statvfs(disk).f_bavail == 0


def test_a_free_run_lock_alone_on_a_full_run_dir_could_not_start_and_with_room_is_not_said_so(tmp_path,
                                                                                           monkeypatch, small_tmpfs):
    """User7 #5: a run.dir with 0 bytes free at launch leaves only its (empty) run lock, not even events.jsonl;
    `status` said "has not started here, or is just starting", and the overview did not list it. Review 9b #5: a
    supervisor killed before its first event leaves the same files, so with room now the older words stay; #4: the
    overview showed "could not start (not running)"."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    roomy = tmp_path / "roomy"
    roomy.mkdir()
    (roomy / names.LOCK).touch()  # a supervisor's lock, let go, and nothing else; room now: no evidence of why
    one = _status(roomy)
    assert f"{roomy}: no state.json yet (the supervisor has not started here, or is just starting)" in one, one
    assert "could not start" not in one, one
    disk = small_tmpfs("64k")
    run_dir = disk / "run"
    run_dir.mkdir()
    (run_dir / names.LOCK).touch()
    _fill(disk)
    one = " ".join(_status(run_dir).split())
    assert f"{run_dir}: could not start: run.dir is full (0 bytes free on its file system now)" in one, one
    assert "free space there, then start the run again" in one and "not started" not in one, one
    as_json = io.StringIO()
    assert status(run_dir, as_json=True, out=as_json) == 0
    assert "run.dir is full" in json.loads(as_json.getvalue())["could_not_start"]
    registry.register("s", run_dir, tmp_path / "s.toml")  # as the supervisor does when it ends so (supervisor.py)
    table = io.StringIO()
    assert overview.status_all(out=table) == 0
    row = next(line for line in table.getvalue().splitlines() if line.startswith("s "))
    assert " could not start " in row and "not started" not in row and "not running" not in row, table.getvalue()
    assert "s: could not start: run.dir is full" in table.getvalue(), table.getvalue()


def test_a_full_run_dir_whose_lock_is_held_or_cannot_be_opened_is_not_said_to_have_failed(tmp_path, monkeypatch,
                                                                                          small_tmpfs):
    """Review 9b #5: a lock held by a supervisor that has not written its pid yet, and a lock that cannot be opened
    (another user's, mode 0600: whether anyone holds it cannot be told), were "could not start: run.dir is full" on
    a full run.dir, though that supervisor may be starting now."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    disk = small_tmpfs("64k")
    held, unopenable = disk / "held", disk / "unopenable"
    held.mkdir()
    unopenable.mkdir()
    monkeypatch.chdir(unopenable)  # a short name to bind: a socket's path is bounded
    server = socket.socket(socket.AF_UNIX)
    server.bind(names.LOCK)  # open() of it fails (ENXIO), as one of another user's lock (EACCES) does, even for root
    fd = os.open(held / names.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # taken, its body (the pid) not written yet: RunLock.acquire's next step
        _fill(disk)
        one = " ".join(_status(held).split())
        assert f"{held}: starting (supervisor pid not known yet); no state.json yet" in one, one
        one = " ".join(_status(unopenable).split())
        assert f"{unopenable}: no state.json yet, and whether a supervisor holds its run lock cannot be told " \
               f"({names.LOCK}: No such device or address)" in one, one
        for run_dir in (held, unopenable):
            as_json = io.StringIO()
            assert status(run_dir, as_json=True, out=as_json) == 0
            assert "could_not_start" not in json.loads(as_json.getvalue()), as_json.getvalue()
        registry.register("h", held, tmp_path / "h.toml")
        registry.register("u", unopenable, tmp_path / "u.toml")
        table = io.StringIO()
        assert overview.status_all(out=table) == 0
        said = table.getvalue()
        assert "could not start" not in said, said
        row = next(line for line in said.splitlines() if line.startswith("h "))
        assert "starting (supervisor pid not known yet)" in row, said
        row = next(line for line in said.splitlines() if line.startswith("u "))
        assert f"unreadable ({names.LOCK}: No such device or address: cannot tell if starting)" in row, said
    finally:
        os.close(fd)
        server.close()


@pytest.mark.slow
def test_a_launch_on_a_run_dir_with_no_byte_free_is_listed_as_could_not_start(tmp_path, corpus, small_tmpfs):
    disk = small_tmpfs("64k")
    _fill(disk)
    config = write_config(tmp_path, corpus, name="nofree", run={"dir": str(disk / "run")})
    out = tmp_path / "sup.out"
    rc = wait_or_kill(start_supervisor(config, out), 120)
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, out.read_text()
    assert not (disk / "run" / names.EVENTS).exists()  # the case: nothing written but the lock
    one = cli("status", str(disk / "run")).stdout
    assert "could not start: run.dir is full (0 bytes free" in " ".join(one.split()), one
    table = cli("status").stdout
    row = next(line for line in table.splitlines() if line.rstrip().endswith(str(disk / "run")))
    assert "could not start" in row, table
