"""What `minilmd status`, `stop` and `logs` print of a run directory someone else may have written.

A run directory's files are its user's to write (or anyone's its mode lets in): `status` and `logs` of another
user's run show what that user put there. Before, status printed state.json's strings (the reason, the last error,
the run's name...) and logs printed log lines as they were: an escape sequence there reached the reader's terminal
(retitle it, clear it, hide lines). And a state.json naming a supervisor by its pid alone (no start time) made
`status` call whichever process has that pid now "running", and `stop` SIGTERM it when it was one of ours.
"""
from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults_fixtures import faultfs  # noqa: F401  (the fixture)
from minilmd import names, protocol
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views import logs as views_logs
from minilmd.daemon.views import status as views
from minilmd.daemon.views import stop as views_stop
from minilmd.dirfd import Dir
from minilmd.fsio import atomic_write_json
from second_user import second_user, shared, user_python  # noqa: F401  (shared: the fixture)
from waiting import wait_until

CLI = "import sys; sys.argv[0] = 'minilmd'; from minilmd.cli import main; main()"
REGISTER = ("import sys\nfrom minilmd.daemon.host import registry\n"
            "registry.register(sys.argv[1], sys.argv[2], 'x.toml')\n")
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m"


def hostile_run(tmp_path: Path, **changes) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    st = new_state("demo", run_dir, str(tmp_path / "demo.toml"))
    st.update(changes)
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir


def assert_escaped(shown: str) -> None:
    assert not any(ch in shown for ch in "\x1b\x07\x9b"), repr(shown)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\u009b31m" in shown, shown


def test_status_escapes_what_state_json_says_before_the_terminal(tmp_path):
    t = time.time()
    run_dir = hostile_run(tmp_path, run="demo" + ESCAPES, reason="why" + ESCAPES, last_error="boom" + ESCAPES,
                          last_error_at=t, phase="training" + ESCAPES,
                          sync={"state": "failed", "error": "sync" + ESCAPES},
                          staging={"state": "failed", "error": "staging" + ESCAPES})
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    assert_escaped(out.getvalue())
    for said in ("demo", "why", "boom", "sync", "staging", "training"):
        assert said + "\\x1b]0;owned" in out.getvalue(), (said, out.getvalue())


def test_stop_of_an_ended_run_escapes_its_reason_and_error(tmp_path):
    saved = tmp_path / "x" / ("step-5" + ESCAPES)  # there: stop names a scratch checkpoint only where it is
    saved.mkdir(parents=True)
    (saved / names.MANIFEST).write_text("{}")
    run_dir = hostile_run(tmp_path, phase="done", last_error="boom" + ESCAPES,
                          supervisor={"pid": 2 ** 22 + 7, "start_ticks": 1, "host": socket.gethostname()},
                          outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": "over" + ESCAPES},
                          sync={"state": "ok", "error": "sync" + ESCAPES},
                          local_checkpoint={"step": 5, "time": time.time(), "path": str(saved)})
    out = io.StringIO()
    views_stop.stop(run_dir, out=out)
    assert_escaped(out.getvalue())
    assert "over\\x1b]0;owned" in out.getvalue() and "/x/step-5\\x1b]0;owned" in out.getvalue(), out.getvalue()


def _followed(run_dir: Path, name: str, offset: int) -> io.StringIO:
    """What `logs -f` relays of the attempt log `name` after `offset`."""
    followed = io.StringIO()
    with Dir(os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY), run_dir) as run:
        logs = views_logs._Logs(run)
        try:
            assert name in logs.attempts()
            logs.copy_new(name, offset, followed)
        finally:
            logs.close()
    return followed


def test_logs_escape_what_the_logs_hold_shown_and_followed(tmp_path):
    run_dir = hostile_run(tmp_path)
    (run_dir / names.SUPERVISOR_LOG).write_text("event" + ESCAPES + "\n")
    attempt = run_dir / names.ATTEMPT_LOGS / "attempt-0001.log"
    attempt.parent.mkdir()
    attempt.write_text("trainer" + ESCAPES + "\n")
    out = io.StringIO()
    assert views.logs(run_dir, lines=5, out=out) == 0
    assert_escaped(out.getvalue())
    assert "event\\x1b" in out.getvalue() and "trainer\\x1b" in out.getvalue(), out.getvalue()
    with open(attempt, "a") as f:
        f.write("later" + ESCAPES + "\n")
    followed = _followed(run_dir, attempt.name, len(("trainer" + ESCAPES + "\n").encode()))
    assert_escaped(followed.getvalue())
    assert "[attempt-0001] later\\x1b" in followed.getvalue(), followed.getvalue()


def test_logs_show_and_relay_a_planted_8_mib_line_cut_saying_so(tmp_path):
    """Hostile audit 4 F4(c): `logs -f` relayed an 8 MiB line of another user's attempt log whole. A line is shown
    and relayed cut to its first LOG_LINE_SHOWN bytes, saying how many were left out; the lines around it whole."""
    run_dir = hostile_run(tmp_path)
    attempt = run_dir / names.ATTEMPT_LOGS / "attempt-0001.log"
    attempt.parent.mkdir()
    shown_tail = f"before\n{'B' * (512 << 10)}\nafter\n"  # logs reads at most a file's last MiB
    attempt.write_text(shown_tail)
    out = io.StringIO()
    assert views.logs(run_dir, lines=5, out=out) == 0
    tail = out.getvalue()
    assert len(tail) < 40_000 and f"[... {(512 << 10) - (16 << 10):,} more characters left out]" in tail
    assert tail.endswith("\nafter\n") and "\nbefore\n" in tail, tail[-200:]
    with open(attempt, "a") as f:
        f.write(f"{'A' * (8 << 20)}\nlast\n")
    followed = _followed(run_dir, attempt.name, len(shown_tail))
    relayed = followed.getvalue()
    assert len(relayed) < 40_000, len(relayed)
    left_out = (8 << 20) - (16 << 10)
    assert relayed.splitlines() == [
        f"[attempt-0001] {'A' * (16 << 10)} [... {left_out:,} more bytes left out]",
        "[attempt-0001] last"], relayed[:200]


def test_a_supervisor_named_by_its_pid_alone_is_not_running_and_never_signalled(tmp_path):
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # ours, and no supervisor of the run
    try:
        run_dir = hostile_run(tmp_path, phase="training",
                              supervisor={"pid": bystander.pid, "host": socket.gethostname()})  # no start_ticks
        out = io.StringIO()
        assert views.status(run_dir, out=out) == 0
        assert "not running" in out.getvalue() and f"supervisor pid {bystander.pid} running" not in out.getvalue()
        stopped = io.StringIO()
        views_stop.stop(run_dir, timeout=5, out=stopped)
        assert "SIGTERM" not in stopped.getvalue() and "not running" in stopped.getvalue(), stopped.getvalue()
        assert bystander.poll() is None, "stop signalled a process that is not the run's supervisor"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.root
def test_stop_of_another_users_run_is_refused_naming_its_owner_before_its_lock_is_read(shared):
    second_user()
    run_dir = shared / "root-run"
    run_dir.mkdir()
    run_dir.chmod(0o755)
    body = new_state("root-run", run_dir, "x.toml")
    body["supervisor"].update(pid=2 ** 22 + 7, start_ticks=1)  # gone
    atomic_write_json(run_dir / names.STATE, body)
    (run_dir / names.STATE).chmod(0o644)
    (run_dir / names.LOCK).touch(mode=0o600)
    done = subprocess.run(user_python(CLI, "stop", str(run_dir)), capture_output=True, text=True, cwd="/",
                          timeout=60)
    assert "Traceback" not in done.stderr and done.returncode == protocol.STOP_FAILED, done
    said = f"a run directory of user root (uid 0), not yours, user nobody (uid {second_user()[0]}): nothing signalled"
    assert said in done.stdout, done


@pytest.mark.root
@pytest.mark.slow  # the overview gives the stalled row its 5 s
def test_a_run_on_stalled_storage_neither_hangs_the_overview_nor_hides_the_other_runs(tmp_path, faultfs):
    """Before, `status --all` waited on the stalled run directory for as long as the storage stalled."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"),
           names.SYSTEM_REGISTRY_ENV: str(tmp_path / "no-system-registry")}
    healthy = tmp_path / "healthy"
    stuck = faultfs.root / "stuck"
    for run_dir in (healthy, stuck):
        run_dir.mkdir()
        atomic_write_json(run_dir / names.STATE, new_state(run_dir.name, run_dir, "x.toml"))
        subprocess.run([sys.executable, "-c", REGISTER, run_dir.name, str(run_dir)], env=env, check=True,
                       timeout=60)
    faultfs.stall("stuck/state.json", 300, op="getattr")
    shown = tmp_path / "shown.txt"
    with open(shown, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "status", "--all"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:  # the table comes while the storage still stalls (the process may only end once it answers)
        wait_until(lambda: "stuck " in shown.read_text(), 90, "the table while the storage stalls")
        assert faultfs.hits("stall"), "the stall never fired: the test proves nothing"
    finally:
        faultfs.clear()
        proc.wait(60)
    lines = {line.split()[0]: line for line in shown.read_text().splitlines()[1:] if line.strip()}
    assert "waiting_gpu" in lines["healthy"], lines
    assert "unreadable (no answer within 5 s: its storage stalls)" in lines["stuck"], lines
    assert proc.returncode == 0


def test_logs_do_not_follow_a_logs_directory_that_is_a_link(tmp_path):
    """logs/ of a run directory replaced by a link to another directory: its files are not listed as the run's
    attempts (before: the link was followed, then each file opened without following one)."""
    run_dir = hostile_run(tmp_path)
    (run_dir / names.SUPERVISOR_LOG).write_text("event\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "attempt-0001.log").write_text("NOT-THIS-RUNS\n")
    (run_dir / names.ATTEMPT_LOGS).symlink_to(elsewhere)
    out = io.StringIO()
    views.logs(run_dir, lines=5, out=out)
    assert "event" in out.getvalue() and "NOT-THIS-RUNS" not in out.getvalue(), out.getvalue()
