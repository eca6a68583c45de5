"""Where a run's supervisor is, whether it runs, and how that is known: one rule for `minilmd status` and the
overview (daemon/base/seen.py).

- A supervisor on another host (run.dir on a share two machines see) is not "killed or crashed": status's head line
  says which host, when it was last seen, and that this host cannot check it; the overview's row says the same
  (before: `not running (... killed or crashed ...)`, and `training (not running)`).
- A teammate of a run shared with run.share "group" or "all" cannot open its run lock (0600, hostile10 F1): who
  holds it is read from the kernel's lock table (/proc/locks, the file lstat'ed, never opened), and a starting
  supervisor is shown so, of its user (before: "whether a supervisor holds its run lock cannot be told"). A running
  one is named with its user, and where the record alone judged (the lock table disagrees), the words say so.
The teammate is a real second Unix user where the tests run as root (tests/second_user.py); elsewhere a fake lock
open that fails as a teammate's does (EACCES).
"""
from __future__ import annotations

import errno
import io
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from held_process import HeldProcess
from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host import registry
from minilmd.daemon.views import lastwords, overview, status
from minilmd.daemon.views.runarg import open_run
from minilmd.fsio import atomic_write_json
from minilmd.proc_info import process_start_ticks
from second_user import second_user, shared_dir, user_python

HOLD = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
sys.stdin.read()
"""
"""The stand-in of a supervisor: holds the run lock's flock until stdin closes."""


def hold_lock(run_dir: Path) -> HeldProcess:
    """A real process holding `run_dir`'s supervisor.lock (made 0600, as every run lock is)."""
    return HeldProcess(HOLD, str(run_dir / names.LOCK))


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def _state(run_dir: Path, phase: str = "training", host: str | None = None, pid: int | None = None,
           outcome: dict | None = None) -> None:
    st = new_state(run_dir.name, run_dir, str(run_dir.parent / f"{run_dir.name}.toml"))
    st["phase"] = phase
    st["supervisor"]["pid"] = pid if pid is not None else _dead_pid()
    st["supervisor"]["start_ticks"] = process_start_ticks(pid) if pid is not None else 1
    if host is not None:
        st["supervisor"]["host"] = host
    if outcome is not None:
        st["outcome"] = outcome
    atomic_write_json(run_dir / names.STATE, st)
    os.chmod(run_dir / names.STATE, 0o644)  # run.share "all": anyone reads it


def _status_of(run_dir: Path) -> str:
    out = io.StringIO()
    assert status.status(run_dir, out=out) == 0
    return out.getvalue()


@pytest.fixture
def own_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))


def test_a_supervisor_on_another_host_is_said_to_be_there_not_killed_or_crashed(tmp_path, own_registry):
    assert socket.gethostname() != "node-b"
    run_dir = tmp_path / "shared"
    run_dir.mkdir()
    _state(run_dir, "training", host="node-b")
    head = _status_of(run_dir).splitlines()[0]
    assert "supervisor on host node-b (last seen " in head and "in training" in head, head
    assert "this host cannot check it" in head, head
    assert "killed or crashed" not in head and "not running" not in head, head  # before: both

    ended = tmp_path / "ended"  # a final phase without its outcome: on another host, not known to have crashed
    ended.mkdir()
    _state(ended, "done", host="node-b")
    mine = tmp_path / "mine"  # this host's killed supervisor: still said so
    mine.mkdir()
    _state(mine, "training")
    assert "killed or crashed" in _status_of(mine).splitlines()[0]
    for each in (run_dir, ended, mine):
        registry.register(each.name, each, tmp_path / f"{each.name}.toml")
    out = io.StringIO()
    overview.status_all(out=out)
    rows = {line.split()[0]: line for line in out.getvalue().splitlines()[1:] if line.strip()}
    assert "training (on host node-b: not checked from here)" in rows["shared"], rows  # before: (not running)
    assert "killed or crashed" not in rows["ended"], rows
    assert "training (not running)" in rows["mine"], rows
    out = io.StringIO()
    overview.status_all(as_json=True, out=out)
    judged = {r["run"]: (r["elsewhere"], r["judged_by"]) for r in json.loads(out.getvalue())}
    assert judged["shared"] == ("node-b", "other host") and judged["mine"] == (None, "lock"), judged


def test_a_live_record_that_holds_no_run_lock_is_said_to_be_judged_from_the_record(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _state(run_dir, "training", pid=os.getpid())  # a live process, this one, holding no lock
    head = _status_of(run_dir).splitlines()[0]
    assert f"supervisor pid {os.getpid()} running (judged from its record, state.json's pid and start time" in head
    assert "no process holds its run lock by the kernel's lock table" in head, head
    holder = hold_lock(run_dir)  # the lock held by the record's process: judged by the lock, no more words
    try:
        _state(run_dir, "training", pid=holder.pid)
        head = _status_of(run_dir).splitlines()[0]
        assert head.endswith(f"; supervisor pid {holder.pid} running"), head
    finally:
        holder.end()


def test_a_supervisor_whose_proc_entry_is_hidden_but_holds_its_run_lock_is_running(tmp_path, monkeypatch):
    """/proc mounted hidepid=2 hides the run's user's processes from a teammate (faked: the record's /proc look says
    gone); /proc/locks still has its pid holding the lock, which only the owner's processes can open."""
    from minilmd.daemon.base import seen

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = hold_lock(run_dir)
    try:
        _state(run_dir, "training", pid=holder.pid)
        monkeypatch.setattr(seen, "supervisor_runs_here", lambda _sup: False)  # where the rule reads it
        head = _status_of(run_dir).splitlines()[0]
        assert head.endswith(f"; supervisor pid {holder.pid} running"), head  # before: killed or crashed
    finally:
        holder.end()


def test_a_gone_record_whose_run_lock_another_pid_holds_is_not_judged_killed_nor_running(tmp_path, own_registry):
    """state.json names a supervisor gone, a real process holds the 0600 run lock (only the owner's can: one that
    systemd started again before it wrote state.json). Before: `not running (... killed or crashed; `minilmd run`
    again resumes) (judged from its record ...: the kernel's lock table has pid N holding its run lock)`."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _state(run_dir, "training")  # the record's supervisor is gone
    registry.register(run_dir.name, run_dir, tmp_path / "run.toml")
    holder = hold_lock(run_dir)
    try:
        head = _status_of(run_dir).splitlines()[0]
        assert f"supervisor not judged: pid {holder.pid} holds its run lock (a supervisor starting?)" in head, head
        assert "killed or crashed" not in head and "again resumes" not in head and "running" not in head, head
        out = io.StringIO()
        overview.status_all(out=out)
        row = next(line for line in out.getvalue().splitlines() if line.startswith("run "))
        assert f"training (not judged: pid {holder.pid} holds its run lock" in row, row
        assert "(not running)" not in row, row
        out = io.StringIO()
        overview.status_all(as_json=True, out=out)
        (listed,) = json.loads(out.getvalue())
        assert listed["running"] is False and f"pid {holder.pid}" in listed["unjudged"], listed
    finally:
        holder.end()
    assert "killed or crashed" in _status_of(run_dir).splitlines()[0]  # none holds it now: gone, as the record says


def test_a_starting_supervisor_is_seen_in_the_lock_table_where_its_lock_cannot_be_opened(tmp_path, monkeypatch):
    """The fake teammate: lock_look's open refused as a stranger's is (EACCES); the holder is a real process."""
    from minilmd.daemon.host import lock

    def refused(*_args, **_kw):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = hold_lock(run_dir)
    monkeypatch.setattr(lock, "lock_look", refused)
    try:
        said = "\n".join(lastwords.no_state_lines(run_dir))
        assert f"starting (supervisor pid {holder.pid}; seen holding its run lock in the kernel's lock table" in said
        assert "cannot be told" not in said, said  # before: "whether a supervisor holds its run lock cannot be told"
        with open_run(run_dir) as run:  # as the overview opens it
            row = lastwords.no_state_row(run, os.geteuid())
        assert row["phase"] == "starting" and row["running"] is True, row  # before: "unreadable"
    finally:
        holder.end()
    said = "\n".join(lastwords.no_state_lines(run_dir))  # none holds it now: the table says so too
    assert "cannot be told" not in said and "no state.json yet (the supervisor has not started here" in said, said


TEAMMATE_STATUS = """import sys
from minilmd.daemon.views.lastwords import no_state_row
from minilmd.daemon.views.runarg import open_run
from minilmd.daemon.views.status import status
from pathlib import Path
status(sys.argv[1])
with open_run(Path(sys.argv[1])) as run:
    print("ROW", no_state_row(run, 0)["phase"])
"""


def test_a_teammate_sees_whose_supervisor_runs_or_starts_though_its_run_lock_is_private():
    """A real second user (`nobody`) looks at root's run shared with run.share "all": its lock is root's, 0600."""
    second_user()  # skipped where the tests cannot act as one (not root)
    place = shared_dir()
    try:
        run_dir = place / "run"
        run_dir.mkdir(0o755)
        holder = hold_lock(run_dir)
        try:
            assert os.stat(run_dir / names.LOCK).st_mode & 0o777 == 0o600
            look = subprocess.run(user_python(TEAMMATE_STATUS, str(run_dir)), capture_output=True, text=True,
                                  timeout=120, cwd="/")
            said = look.stdout + look.stderr
            assert look.returncode == 0, said
            assert (f"starting (supervisor pid {holder.pid} of user root (uid 0); seen holding its run lock in the "
                    f"kernel's lock table") in said, said  # before: "... cannot be told (supervisor.lock: ...)"
            assert "ROW starting" in said, said  # before: "ROW unreadable"
            _state(run_dir, "training", pid=holder.pid)
            look = subprocess.run(user_python(TEAMMATE_STATUS, str(run_dir)), capture_output=True, text=True,
                                  timeout=120, cwd="/")
            head = look.stdout.splitlines()[0] if look.stdout else look.stderr
            assert head.endswith(f"; supervisor pid {holder.pid} of user root (uid 0) running"), head
        finally:
            holder.end()
        look = subprocess.run(user_python(TEAMMATE_STATUS, str(run_dir)), capture_output=True, text=True,
                              timeout=120, cwd="/")
        head = look.stdout.splitlines()[0] if look.stdout else look.stderr
        assert "killed or crashed" in head and "judged from its record" not in head, head  # the lock table agrees
    finally:
        shutil.rmtree(place, ignore_errors=True)


def test_a_stage_waiting_for_its_predecessor_and_logs_follow_ask_the_same_rule(tmp_path, monkeypatch):
    """initwait judged the predecessor by the host test and its record inline, `logs --follow` by the record alone:
    a predecessor whose /proc entry is hidden (hidepid, faked) while it holds its run lock was "not running since",
    one started again before it wrote state.json (a dead record, another pid holding the lock) too, and `logs
    --follow` ended on "the run has ended" of a run whose new supervisor holds the lock. Now both ask seen.py's rule:
    running, or not judged (alive None): waited on, followed on."""
    from minilmd.daemon.base import seen
    from minilmd.daemon.phases import initwait
    from minilmd.daemon.views import logs
    from minilmd.dirfd import Dir

    run_dir = tmp_path / "pre"
    run_dir.mkdir()
    pred = initwait.Predecessor("pre", run_dir, tmp_path / "remote")
    holder = hold_lock(run_dir)
    try:
        _state(run_dir, "training", pid=holder.pid)
        monkeypatch.setattr(seen, "supervisor_runs_here", lambda _sup: False)  # /proc hides it
        body = json.loads((run_dir / names.STATE).read_text())
        assert initwait.predecessor_liveness(pred, body).running  # before: "its supervisor is gone"
        monkeypatch.undo()
        _state(run_dir, "training")  # a dead record: its pid gone, another holding the lock
        body = json.loads((run_dir / names.STATE).read_text())
        assert initwait.predecessor_liveness(pred, body).running  # not judged: waited on, as one running
        _state(run_dir, "done", outcome={"time": 1.0, "exit": 0, "phase": "done", "ended": "finished"})
        with Dir(os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY), run_dir) as run:
            assert logs._ended(run) == ""  # before: "the run has ended (done, exit 0)"
    finally:
        holder.end()
    with Dir(os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY), run_dir) as run:
        assert "the run has ended" in logs._ended(run)  # none holds it: gone, as its record says


def test_a_lock_body_that_names_the_lock_table_is_not_taken_for_a_look_at_the_table(tmp_path):
    """lastwords marked a holder seen in /proc/locks by a sentinel launch id, "(the kernel's lock table)": a lock
    body naming that launch id was said to be seen in the table. Now a field of its own (LockInfo.from_table)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / names.LOCK).write_text(json.dumps({"pid": 4321, "host": socket.gethostname(), "since": 1.0,
                                                  "launch_id": "(the kernel's lock table)"}))
    os.chmod(run_dir / names.LOCK, 0o600)
    holder = hold_lock(run_dir)
    try:
        said = "\n".join(lastwords.no_state_lines(run_dir))
    finally:
        holder.end()
    assert "starting (supervisor pid 4321); no state.json yet" in said, said  # read from the body, said so
    assert "kernel's lock table" not in said, said
