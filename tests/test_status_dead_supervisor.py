"""`minilmd status` of a run whose supervisor no longer runs (fault10 F3, F5).

F3: a supervisor SIGKILLed during its final sync left state.json's sync "running": status said `not running (...
killed or crashed)` and `sync: running` together. A sync or staging in progress (run_states.IN_PROGRESS) of a
supervisor that is gone is shown "interrupted" (run_states.shown_state: status, the overview's sync cell and the
textfile written at exit alike). F5: a finished run's status said `remote: step 4000 (verified)` from its record after
the remote had lost that step: for a local run.remote status now looks at the remote's LATEST (daemon/views/
remotenow.py) and says when it names another step; a teammate's directory at run.remote's path (hostile audit 11 F3,
a real second user, nobody, owning it: after `mv vr vr.stolen; mkdir -m777 vr` and a copy of the step there with his
LATEST, status said `LATEST names it now`; before he wrote one, "`minilmd run` repairs it", though `minilmd run`
refuses that remote) is said to be not the run's: judged by remote_root's rule against the root the run recorded, its
LATEST read as a file of the run's user.

Each state.json is real and its supervisor a real process of this test, started and SIGKILLed (its pid and start
time recorded as a supervisor's are), read by the real `minilmd status` command.
"""
from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host import prometheus
from minilmd.daemon.jobs import remote_made, remote_root
from minilmd.daemon.views import status as views
from minilmd.daemon.views.overview import _cells
from minilmd.dirfd import Dir
from minilmd.fsio import atomic_write_json
from minilmd.proc_info import process_start_ticks
from second_user import chown_tree, second_user
from supervisor_helpers import cli, write_config


def killed_supervisor() -> dict:
    """state.json's supervisor section of a process that ran and was SIGKILLed: its pid, start time, this host."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        ticks = process_start_ticks(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    return {"pid": proc.pid, "start_ticks": ticks, "host": socket.gethostname(), "started": time.time() - 600}


def write_state(run_dir: Path, **changes) -> float:
    run_dir.mkdir(parents=True, exist_ok=True)
    st = new_state("r", run_dir, str(run_dir / names.RUN_CONFIG_COPY))
    st.update(supervisor=killed_supervisor(), **changes)
    atomic_write_json(run_dir / names.STATE, st)
    return st["updated"]


def status(run_dir: Path) -> str:
    done = cli("status", str(run_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_sync_running_when_its_supervisor_was_killed_is_shown_interrupted(tmp_path):
    t = time.time()
    run_dir = tmp_path / "run"
    write_state(run_dir, phase="stopping", sync={"state": "running", "since": t - 30, "attempts": 4},
                remote_checkpoint={"step": 20, "time": t - 300, "verified": True, "path": str(tmp_path / "remote" /
                                                                                         names.step_name(20))})
    said = status(run_dir)
    assert "not running (last seen" in said and "killed or crashed" in said, said
    assert "sync: interrupted (was running at " in said and "when the supervisor ended; `minilmd run` syncs again)" \
        in said, said
    assert "sync: running" not in said, said  # before: the dead supervisor's sync shown as going on
    assert "remote: step 20 (5m ago, verified when synced)" in said, said  # no run.toml: nothing looked at


def test_a_stalled_sync_keeps_its_error_and_a_fetch_is_interrupted_too(tmp_path):
    t = time.time()
    run_dir = tmp_path / "run"
    write_state(run_dir, phase="staging", sync={"state": "stalled", "since": t - 30, "error": "no byte for 130s"},
                staging={"state": "fetching", "since": t - 60, "progress": "fetching step-00000020"})
    said = status(run_dir)
    assert "sync: interrupted (was stalled at " in said and ": no byte for 130s; `minilmd run` syncs again)" in said, \
        said
    assert "staging: interrupted (was fetching at " in said and "`minilmd run` stages again)" in said, said
    assert "staging: fetching" not in said, said


def test_the_overview_and_the_textfile_written_at_exit_say_the_same():
    row = {"run": "r", "run_dir": "/x", "phase": "stopping", "running": False, "sync_state": "running",
           "last_sync_age_s": 600.0}
    assert _cells(row)[7] == "10m ago (interrupted)"
    assert _cells({**row, "running": True})[7] == "10m ago"  # a supervisor alive: its sync goes on
    # a supervisor of another host (a Slurm job's run dir on a share) is not known dead from here (review12b F4)
    assert _cells({**row, "elsewhere": "node7"})[7] == "10m ago"
    state = new_state("r", Path("/x"), "c.toml")
    state["sync"] = {"state": "running", "since": time.time(), "attempts": 1}

    def failing(up: bool) -> str:
        text = prometheus.render(state, time.time(), up=up)
        return next(line for line in text.splitlines() if line.startswith("minilmd_sync_failing{"))

    assert failing(up=True).endswith(" 0") and failing(up=False).endswith(" 1")


def finished_run(tmp_path: Path, corpus) -> tuple[Path, Path]:
    """(run dir, remote) of a run that finished at step 20, synced and verified there, its supervisor gone."""
    config = write_config(tmp_path, corpus, name="r", train={"max_steps": 20})
    cfg = load_config(config)
    remote = Path(cfg.run.remote)
    for step in (10, 20):
        (remote / names.step_name(step)).mkdir(parents=True)
    (remote / names.LATEST).write_text(names.step_name(20) + "\n")
    t = time.time()
    write_state(cfg.run_dir, phase="done", outcome={"exit": 0, "phase": "done", "time": t, "reason": "finished",
                                                     "ended": "finished"},
                sync={"state": "ok", "since": t - 600, "last_ok": t - 600, "attempts": 2},
                remote_checkpoint={"step": 20, "time": t - 600, "verified": True,
                                   "path": str(remote / names.step_name(20))})
    shutil.copyfile(config, cfg.run_dir / names.RUN_CONFIG_COPY)
    return cfg.run_dir, remote


def test_status_looks_at_the_remotes_latest_of_a_finished_run(tmp_path, corpus):
    run_dir, remote = finished_run(tmp_path, corpus)
    said = status(run_dir)
    assert "remote: step 20 (10m ago, verified; LATEST names it now)" in said, said

    shutil.rmtree(remote / names.step_name(20))  # the remote lost its last step; LATEST repointed to step 10
    (remote / names.LATEST).write_text(names.step_name(10) + "\n")
    said = status(run_dir)
    assert "remote: step 20 verified at " in said and "; the remote's LATEST now names step 10: `minilmd run` " \
        "repairs it" in said, said
    assert "(10m ago, verified" not in said, said  # before: the record alone, `remote: step 20 (10m ago, verified)`


    def in_process() -> str:  # the same view, without a new interpreter each time
        out = io.StringIO()
        assert views.status(run_dir, out=out) == 0
        return out.getvalue()

    (remote / names.LATEST).unlink()
    assert "; the remote holds no LATEST now: `minilmd run` repairs it" in in_process()
    (remote / names.LATEST).symlink_to(tmp_path / "elsewhere")  # a link is never followed: no LATEST of the remote
    assert "; the remote holds no LATEST now" in in_process()
    (remote / names.LATEST).unlink()
    (remote / names.LATEST).write_text(names.step_name(30) + "\n")  # a sync its record missed: nothing to repair
    assert "the remote's LATEST now names step 30, newer than this record" in in_process()
    (remote / names.LATEST).write_text(names.step_name(20) + "\n")  # LATEST names it, its directory is gone
    assert f"its directory {names.step_name(20)} is gone from the remote now, though LATEST names it: " \
           f"`minilmd run` repairs it" in \
        in_process()
    shutil.rmtree(remote)
    assert "run.remote is not there now" in in_process()


NOT_OURS = "run.remote is not this run's directory now ("


def _status_words(run_dir: Path) -> str:
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    return " ".join(out.getvalue().split())


def _recorded(run_dir: Path, remote: Path) -> None:
    """The root recorded as the run's first sync records it (remote_root.remember, in run.dir's record)."""
    url = load_config(run_dir / names.RUN_CONFIG_COPY).run.remote.rstrip("/")
    with Dir(os.open(remote, os.O_RDONLY | os.O_DIRECTORY), remote) as held:
        remote_root.remember(url, held, remote_made.Made(remote_made.run_record(run_dir)))


def _his_directory_at(remote: Path, latest: bool) -> None:
    """The teammate's swap: the run's remote moved away, his own 0777 directory at its name holding a copy of its
    step 20 (and his LATEST naming it)."""
    remote.rename(remote.with_name(remote.name + ".stolen"))
    remote.mkdir(mode=0o777)
    shutil.copytree(remote.with_name(remote.name + ".stolen") / names.step_name(20), remote / names.step_name(20))
    if latest:
        (remote / names.LATEST).write_text(names.step_name(20) + "\n")
    chown_tree(remote, *second_user())


@pytest.mark.root
@pytest.mark.parametrize("latest", [True, False], ids=["his LATEST", "no LATEST yet"])
def test_a_teammates_directory_at_run_remote_is_not_vouched_for(tmp_path, corpus, latest):
    second_user()
    run_dir, remote = finished_run(tmp_path, corpus)
    _recorded(run_dir, remote)
    assert "remote: step 20 (10m ago, verified; LATEST names it now)" in _status_words(run_dir)
    _his_directory_at(remote, latest)
    said = _status_words(run_dir)
    assert f"{NOT_OURS}the directory there is not the one it synced to: it was dev " in said, said
    assert "LATEST names it now" not in said and "repairs it" not in said, said


@pytest.mark.root
def test_without_a_record_another_users_root_or_latest_is_not_the_runs(tmp_path, corpus):
    uid, gid = second_user()
    run_dir, remote = finished_run(tmp_path, corpus)  # an older run: no record of its root
    os.chown(remote / names.LATEST, uid, gid)  # a LATEST of his in the run's own root
    said = _status_words(run_dir)
    assert f"{NOT_OURS}its LATEST belongs to user nobody (uid {uid}))" in said, said
    _his_directory_at(remote, latest=True)
    said = _status_words(run_dir)
    assert f"{NOT_OURS}{remote} belongs to user nobody (uid {uid}))" in said, said
    assert "LATEST names it now" not in said, said
