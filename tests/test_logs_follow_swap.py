"""`minilmd logs -f` reads a run's logs/ through the directory it opened, never by a path again.

Found by hostile audit 12: a run's owner renamed logs/ away while root followed it and put there a link to a third
user's private log directory; the follow loop kept opening `<run>/logs/attempt-0001.log` by path, the kernel followed
the link, and the third user's new lines were relayed as the run's own. logs/ is now opened once in the run directory
without following a link (the supervisor makes it once and never replaces it) and each log read by its name in it,
as a regular file of the run's owner (or ours).
"""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views import logs as views_logs
from minilmd.fsio import atomic_write_json
from second_user import second_user
from waiting import wait_until


def _run_with_a_log(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / names.ATTEMPT_LOGS).mkdir(parents=True)
    atomic_write_json(run_dir / names.STATE, new_state("demo", run_dir, str(tmp_path / "demo.toml")))
    (run_dir / names.SUPERVISOR_LOG).write_text("supervisor first\n")
    (run_dir / names.ATTEMPT_LOGS / "attempt-0001.log").write_text("own first\n")
    return run_dir


@pytest.mark.slow  # `minilmd logs -f` in a real process, its directory swapped while it follows
def test_a_link_put_at_logs_while_followed_is_not_followed_and_the_opened_logs_are_followed_on(tmp_path):
    run_dir = _run_with_a_log(tmp_path)
    private = tmp_path / "private-logs"  # another user's logs, as far as this run is concerned
    private.mkdir()
    (private / "attempt-0001.log").write_text("private first\n")
    shown = tmp_path / "shown.txt"
    with open(shown, "wb") as out:
        follower = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "logs", "-f", str(run_dir)],
                                    stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "own first" in shown.read_text(), what="the first lines shown")
        os.rename(run_dir / names.ATTEMPT_LOGS, run_dir / "logs.real")
        (run_dir / names.ATTEMPT_LOGS).symlink_to(private)
        with open(private / "attempt-0001.log", "a") as f:
            f.write("PRIVATE later\n")
        with open(run_dir / "logs.real" / "attempt-0001.log", "a") as f:
            f.write("own later\n")
        with open(run_dir / names.SUPERVISOR_LOG, "a") as f:
            f.write("supervisor later\n")
        wait_until(lambda: "[attempt-0001] own later" in shown.read_text() and "supervisor later" in shown.read_text(),
                   what="the opened logs followed on")
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(30)
    text = shown.read_text()
    assert "PRIVATE" not in text and "private first" not in text, text


def test_a_log_of_another_user_in_the_runs_logs_is_unreadable_not_shown(tmp_path):
    uid, gid = second_user()
    run_dir = _run_with_a_log(tmp_path)
    theirs = run_dir / names.ATTEMPT_LOGS / "attempt-0002.log"
    theirs.write_text("not the supervisor's\n")
    os.chown(theirs, uid, gid)
    out = io.StringIO()
    assert views_logs.logs(run_dir, out=out) == 0
    assert f"attempt-0002.log <==\nunreadable (owned by uid {uid})\n" in out.getvalue(), out.getvalue()
    assert "not the supervisor's" not in out.getvalue()
