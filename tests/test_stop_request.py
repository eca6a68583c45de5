"""`minilmd stop` holds when no supervisor runs but a launcher will start one (daemon/base/stoprequest.py).

The defect (docs/operations.md "Stop"): a supervisor SIGKILLed under the tmux launcher, then `minilmd stop` while
window "run" waited its restart delay: stop found no supervisor, stopped the orphaned trainer and said exit 0; the
window then started the run again and it trained on, unattended. Now stop leaves a stop request in the run
directory, and a start a launcher makes by itself (the window's restart, a requeued Slurm job) stops before any
trainer, exit 0; a start by hand clears the request and trains."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy_helpers import MINILMD, launcher  # noqa: F401 - the fixture
from minilmd import names, proc_info, protocol
from minilmd.daemon.base import stoprequest
from minilmd.daemon.base.runstate import fmt_time
from minilmd.daemon.host import sdnotify
from minilmd.daemon.host.lock import lock_holder
from minilmd.daemon.views import stop as views_stop
from second_user import second_user, shared, user_python  # noqa: F401 - shared: the fixture
from supervisor_helpers import (
    env_for,
    events,
    launches_after_last_start,
    run_supervisor,
    start_supervisor,
    state,
    step_of_state,
    stop_cli,
    write_config,
)
from waiting import wait_until


def end_the_restart_wait(pane_pid: int) -> None:
    """The window loop's `sleep` of its restart delay, ended as if the delay were over: the loop goes on to start
    the supervisor again at once (no timing in the test)."""
    def sleeps() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                comm = (entry / "comm").read_text().strip()
            except (OSError, IndexError):
                continue
            if entry.name.isdigit() and int(fields[1]) == pane_pid and comm == "sleep":
                found.append(int(entry.name))
        return found
    wait_until(lambda: sleeps(), 120, "the window's restart delay (sleep)")
    for pid in sleeps():
        os.kill(pid, signal.SIGTERM)


@pytest.mark.slow
def test_a_stop_while_the_tmux_window_waits_to_restart_a_killed_supervisor_holds(tmp_path, corpus, launcher):
    config = write_config(tmp_path, corpus, name="held", train={"max_steps": 100000, "checkpoint_every": 5})
    run_dir = tmp_path / "held" / "run"
    env = {k: v for k, v in env_for(FAKE_STEP_S="0.05").items() if k not in launcher.env and k != "TMUX"}
    out = launcher("--no-attach", str(config), MINILMD=str(MINILMD), MINILMD_TMUX_RESTART_SEC="3600", **env)
    assert out.returncode == 0, out.stdout + out.stderr
    session = "minilmd-held"
    try:
        wait_until(lambda: step_of_state(run_dir) >= 6, 120, "the supervisor's trainer to train")
        first = lock_holder(run_dir)
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: "starting it again in 3600s" in launcher.screen(session, "run"), 60,
                   "the window to wait for its restart")
        stopped = stop_cli(run_dir)
        print(stopped.stdout)
        # 3: the orphaned trainer's save on SIGTERM is only in scratch (no supervisor synced it)
        assert stopped.returncode in (protocol.STOP_DONE, protocol.STOP_UNSYNCED), stopped.stdout + stopped.stderr
        [(_, _, pane_pid, _)] = [w for w in launcher.windows(session) if w[1] == "run"]
        end_the_restart_wait(pane_pid)
        wait_until(lambda: any(name == "run" and dead for _, name, _, dead in launcher.windows(session)), 120,
                   "the restarted supervisor to end on the stop request")
    finally:
        holder = lock_holder(run_dir)
        if holder is not None and holder.pid:  # a failure above: the supervisor ignores tmux's SIGHUP
            os.kill(holder.pid, signal.SIGKILL)
    said = launcher.last_word(session, "run")
    assert "ended with exit status 0 (the run is done, or stopped on request): not restarted" in said, said
    outcome = state(run_dir)["outcome"]
    assert outcome["exit"] == 0 and outcome["reason"].startswith("stopped on request (minilmd stop at "), outcome
    assert "the tmux launcher's automatic restart does not start the run" in outcome["reason"], outcome
    assert launches_after_last_start(run_dir) == []  # no trainer was started after the stop
    final = state(run_dir)  # the restart's last sync took what the orphan saved
    assert final["remote_checkpoint"]["step"] == final["local_checkpoint"]["step"], final
    assert [e for e in events(run_dir) if e["event"] == "stop_request"], events(run_dir)[-5:]
    assert "no supervisor is running; the launcher's pending restart will not start the run" in stopped.stdout, \
        stopped.stdout
    assert f"stop request left at {run_dir.resolve() / names.STOP_REQUEST}" in stopped.stdout, stopped.stdout


@pytest.mark.slow
def test_an_automatic_restart_honours_the_request_and_a_start_by_hand_clears_it(tmp_path, corpus):
    """The same without tmux: `minilmd run` as a launcher restarts it (MINILMD_AUTO_RESTART=tmux) stops before any
    trainer, exit 0, and the request stays for the next automatic restart; `minilmd run` by hand clears it and
    trains to the end."""
    config = write_config(tmp_path, corpus, name="hand", train={"max_steps": 40, "checkpoint_every": 5})
    run_dir = tmp_path / "hand" / "run"
    # held at step 6 until stop's SIGTERM (FAKE_HOLD_STOPS; no release file): under load the orphan trained to the
    # budget's end before the stop reached it, and the start by hand found the run done, no trainer to launch
    proc = start_supervisor(config, tmp_path / "first.out", FAKE_STEP_S="0.05",
                            FAKE_HOLD=f"6:{tmp_path / 'never'}", FAKE_HOLD_STOPS="1")
    try:
        wait_until(lambda: step_of_state(run_dir) >= 6, 120, "the first supervisor's trainer to train")
    finally:
        proc.kill()  # SIGKILL: its trainer is left running, as a killed supervisor leaves it
        proc.wait()
    stopped = stop_cli(run_dir)
    assert stopped.returncode in (protocol.STOP_DONE, protocol.STOP_UNSYNCED), stopped.stdout + stopped.stderr

    for n in (1, 2):
        assert run_supervisor(config, tmp_path, MINILMD_AUTO_RESTART="tmux") == 0
        assert launches_after_last_start(run_dir) == [], n
        assert state(run_dir)["outcome"]["reason"].startswith("stopped on request (minilmd stop at "), n
        assert (run_dir / names.STOP_REQUEST).is_file()
    assert "stop request left at" in stopped.stdout, stopped.stdout

    assert run_supervisor(config, tmp_path, FAKE_STEP_S="0") == 0
    assert not (run_dir / names.STOP_REQUEST).exists()
    assert len(launches_after_last_start(run_dir)) == 1
    assert state(run_dir)["outcome"]["reason"].startswith("the run finished"), state(run_dir)["outcome"]
    cleared = [e["message"] for e in events(run_dir) if e["event"] == "stop_request"][-1]
    assert "cleared, this start is no launcher's automatic restart" in cleared, cleared


@pytest.mark.parametrize(("env", "automatic"), [
    ({}, False),
    ({"MINILMD_AUTO_RESTART": "tmux"}, True),
    ({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0"}, False),  # the job as sbatch submitted it
    ({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2"}, True),  # requeued
    ({"SLURM_RESTART_COUNT": "2"}, False),  # no job: a stray variable
    ({"INVOCATION_ID": "ab12", "NOTIFY_SOCKET": "/run/x"}, False),  # systemd: its restarts look like a start
], ids=["by-hand", "tmux-restart", "sbatch", "slurm-requeue", "no-job", "systemd"])
def test_which_starts_are_a_launchers_own(env, automatic):
    assert (stoprequest.automatic_restart(env) is not None) == automatic


def test_a_request_that_is_a_link_is_neither_honoured_nor_removed(tmp_path):
    """Only a regular file of this user's (or root's) is a request: a link there, whoever planted it, is said and
    left as it is."""
    target = tmp_path / "elsewhere.json"
    target.write_text('{"time": 1}\n')
    (tmp_path / names.STOP_REQUEST).symlink_to(target)
    request, problem = stoprequest.read(tmp_path)
    assert request is None and problem and "a symbolic link" in problem, problem
    assert stoprequest.clear(tmp_path) and (tmp_path / names.STOP_REQUEST).is_symlink() and target.exists()


def test_a_run_directory_reached_through_another_users_link_is_not_cleared(tmp_path):
    """clear() opened the run directory by its path (links followed, no owner looked at) where its twin, the clear
    of a start by hand of a run already done, walks it with Dir.open: the two removals of one file kept two rules.
    Both walk it now, so a link of another user's on the way leads no removal into the directory it names."""
    real = tmp_path / "real"
    real.mkdir()
    path = stoprequest.leave(real, os.getuid())
    run_dir = tmp_path / "run"
    run_dir.symlink_to(real)
    if os.geteuid() != 0:
        pytest.skip("a link of another user's needs root")
    os.lchown(run_dir, 4242, 4242)
    left = stoprequest.clear(run_dir)
    assert left and "left" in left and "link" in left, left
    assert path.exists()
    assert stoprequest.clear(real) is None and not path.exists()  # the directory itself: cleared


def test_a_request_left_then_read_then_cleared(tmp_path):
    path = stoprequest.leave(tmp_path, os.getuid())
    assert path == tmp_path / names.STOP_REQUEST and not path.stat().st_mode & 0o022  # no one else writes it
    request, problem = stoprequest.read(tmp_path)
    assert problem is None and request is not None and request.time is not None
    assert request.words().startswith("minilmd stop at ") and f"by uid {os.getuid()} on " in request.words()
    assert stoprequest.clear(tmp_path) is None and not path.exists()


def test_a_start_of_a_done_run_keeps_a_request_it_would_honour_and_clears_one_it_would_not(tmp_path):
    """clear_at_a_done_start asks the one rule (_honours): this process began before the stop (a start under way),
    so the request is its to honour, and stays (audit, stop 65: its own test cleared it); a process begun after the
    request, by hand, clears it."""
    path = stoprequest.leave(tmp_path, os.getuid())  # asked after this process began
    assert stoprequest.clear_at_a_done_start(tmp_path, {}) is None and path.exists()
    asked = stoprequest.read(tmp_path)[0].since_boot
    while proc_info.since_boot() < asked + 0.03:  # past the 10 ms tick a process's start is kept in (rounded down)
        time.sleep(0.01)
    later = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from minilmd.daemon.base import stoprequest; "
                            "print(stoprequest.clear_at_a_done_start(Path(sys.argv[1]), {}))", str(tmp_path)],
                           capture_output=True, text=True, timeout=120)
    assert "cleared, this start is no launcher's automatic restart" in later.stdout, later.stdout + later.stderr
    assert not path.exists()
    stoprequest.leave(tmp_path, os.getuid(), after_end=True)  # for a start under way, this one: honoured and done
    assert "cleared, the run is done" in stoprequest.clear_at_a_done_start(tmp_path, {}) and not path.exists()


def test_roots_request_in_a_users_run_directory_is_hers_to_honour_and_clear(shared):
    """Root stopping a user's run writes the request at her run directory's descriptor, readable by her: her
    supervisor honours it and a start of hers by hand removes it."""
    uid, gid = second_user()
    run_dir = shared / "run"
    run_dir.mkdir()
    os.chown(run_dir, uid, gid)
    path = stoprequest.leave(run_dir, uid)
    assert path.stat().st_uid == 0
    code = ("import sys\nfrom pathlib import Path\nfrom minilmd.daemon.base import stoprequest\n"
            "request, problem = stoprequest.read(Path(sys.argv[1]))\n"
            "print(request is not None and request.time is not None, problem, stoprequest.clear(Path(sys.argv[1])))\n")
    out = subprocess.run(user_python(code, str(run_dir)), capture_output=True, text=True, timeout=60, cwd="/")
    assert out.stdout.split() == ["True", "None", "None"], out.stdout + out.stderr
    assert not path.exists()


SYSTEMD = {"INVOCATION_ID": "4f1c", "NOTIFY_SOCKET": "/run/user/1000/systemd/notify"}


@pytest.mark.parametrize(("env", "cgroup", "unit"), [
    (SYSTEMD, "0::/user.slice/user-1000.slice/user@1000.service/app.slice/minilmd@tiny.service\n",
     ("minilmd@tiny.service", True)),
    (SYSTEMD, "0::/system.slice/system-minilmd.slice/minilmd@tiny.service\n", ("minilmd@tiny.service", False)),
    (SYSTEMD, "12:pids:/x\n1:name=systemd:/system.slice/minilmd@v1.service\n", ("minilmd@v1.service", False)),
    (SYSTEMD, "0::/user.slice/user-1000.slice/user@1000.service/app.slice/tmux-spawn-1.scope\n", None),
    (SYSTEMD, "0::/user.slice/user-1000.slice/session-4.scope\n", None),
    ({"INVOCATION_ID": "4f1c"}, "0::/system.slice/tmux.service\n", None),  # no notify unit: not ours
    ({}, "0::/system.slice/minilmd@tiny.service\n", None),
], ids=["user", "system", "cgroup-v1", "user-scope", "ssh-session", "other-service", "no-systemd"])
def test_the_unit_a_supervisor_runs_as(tmp_path, env, cgroup, unit):
    (tmp_path / "cgroup").write_text(cgroup)
    assert sdnotify.own_unit(env, str(tmp_path / "cgroup")) == unit


def test_stop_of_a_run_systemd_ran_names_its_unit(tmp_path):
    """A supervisor killed under systemd, whose restart cannot be told from a start: `stop` says which unit to
    stop, with the manager's flag; the request is left all the same."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    st = {"run": "tiny", "phase": "training", "outcome": None,
          "supervisor": {"pid": None, "systemd_unit": "minilmd@tiny.service", "systemd_user": True}}
    (run_dir / names.STATE).write_text(json.dumps(st))
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == protocol.STOP_DONE
    said = out.getvalue()
    assert "its supervisor ran under systemd" in said and "`systemctl --user stop minilmd@tiny.service`" in said, said
    assert (run_dir / names.STOP_REQUEST).is_file()


def test_a_request_of_another_user_is_neither_honoured_nor_removed(tmp_path):
    """Someone who may write the run directory but is neither its user nor root cannot stop the run this way."""
    uid, gid = second_user()
    if os.getuid() == uid:
        pytest.skip("runs as the second user itself")
    planted = tmp_path / names.STOP_REQUEST
    planted.write_text('{"time": 1}\n')
    os.chown(planted, uid, gid)
    request, problem = stoprequest.read(tmp_path)
    assert request is None and problem and f"owned by uid {uid}" in problem, problem
    assert stoprequest.clear(tmp_path) and planted.exists()


@pytest.mark.parametrize("outcome", [None, {"time": 1, "exit": 1, "reason": "crashed"}], ids=["killed", "failed"])
def test_stop_of_a_tmux_or_slurm_run_names_no_unit_to_stop(tmp_path, outcome):
    """Every tmux run (and a Slurm one) records no systemd unit: `stop` printed `under systemd stop the unit as
    well: systemctl --user stop minilmd@NAME` for them all, a hint that did not apply."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    st = {"run": "tiny", "phase": "training", "outcome": outcome, "supervisor": {"pid": None}}
    (run_dir / names.STATE).write_text(json.dumps(st))
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == protocol.STOP_DONE
    said = out.getvalue()
    assert "systemd" not in said and "systemctl" not in said, said
    assert f"stop request left at {run_dir / names.STOP_REQUEST}" in said, said


ENDED_FOR_GOOD = {
    "finished": ("done", {"exit": 0, "reason": "the run finished", "ended": "finished"}),
    "finished-old-version": ("done", {"exit": 0, "reason": "the run finished"}),  # no "ended": read by the reason
    "stopped": ("done", {"exit": 0, "reason": "stopped on request (SIGTERM)", "ended": "stopped"}),
    "cancelled": ("done", {"exit": 0, "reason": "the Slurm job was cancelled", "ended": "cancelled"}),
    "gave-up": ("failed", {"exit": protocol.SUPERVISOR_GAVE_UP, "reason": "too many restarts", "ended": "failed"}),
    "bad-data": ("failed", {"exit": protocol.EXIT_DATA, "reason": "the corpus is invalid", "ended": "failed"}),
}


def ended_run(tmp_path: Path, phase: str, outcome: dict) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    st = {"run": "tiny", "phase": phase, "reason": outcome["reason"], "outcome": {"time": 1, **outcome},
          "supervisor": {"pid": None}}
    (run_dir / names.STATE).write_text(json.dumps(st))
    return run_dir


@pytest.mark.parametrize("ending", ENDED_FOR_GOOD.values(), ids=ENDED_FOR_GOOD.keys())
def test_stop_of_a_run_that_ended_for_good_leaves_a_request_for_a_start_under_way_only(tmp_path, ending):
    """No launcher starts such a run by itself (exit 0 or a final status: the tmux window and systemd do not
    restart it, its Slurm job is not requeued). `stop` said `not running (ended ..., exit 0: ...)` and wrote a
    request all the same: `status` then said `stop requested ... an automatic restart will not start the run` of a
    finished run. The request it leaves now is marked for a start already under way (after_end), which neither
    `stop` nor `status` speaks of; a start under way honours it (test_a_stop_while_a_start_is_under_way_stops_it)."""
    run_dir = ended_run(tmp_path, *ending)
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == protocol.STOP_DONE
    said = out.getvalue()
    assert f"{run_dir}: not running (ended " in said and "stop request" not in said, said
    request, problem = stoprequest.read(run_dir)
    assert problem is None and request is not None and request.after_end, (request, problem)
    assert stoprequest.status_line(run_dir) is None
    assert stoprequest.as_json(run_dir)["after_end"] is True


def test_a_second_stop_of_a_run_stopped_keeps_the_request_an_ordinary_one(tmp_path):
    """The first stop signalled the live supervisor and left an ordinary request; the run ended "stopped". A second
    stop, to make sure, found it ended for good: it rewrote the request as after_end, for a start under way only,
    and `status` stopped saying it while a requeue or a tmux restart would then have trained (a review's finding)."""
    run_dir = ended_run(tmp_path, *ENDED_FOR_GOOD["stopped"])
    stoprequest.leave(run_dir, os.getuid())  # what the first stop left
    assert views_stop.stop(run_dir, out=io.StringIO()) == protocol.STOP_DONE
    request, _ = stoprequest.read(run_dir)
    assert request is not None and not request.after_end, request
    assert stoprequest.status_line(run_dir) is not None


def test_stop_of_a_requeued_run_leaves_the_request_and_says_so(tmp_path):
    """A requeued Slurm job ended its supervisor with exit 0, yet Slurm starts it again by itself: the request is
    left (as after a failure that is not final, test_stop_of_a_tmux_or_slurm_run_names_no_unit_to_stop), and now
    said too (an exit 0 said nothing of it)."""
    run_dir = ended_run(tmp_path, "done", {"exit": 0, "reason": "requeued by Slurm (preempted at step 8)",
                                           "ended": "requeued"})
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == protocol.STOP_DONE
    said = out.getvalue()
    assert f"stop request left at {run_dir / names.STOP_REQUEST}" in said, said
    assert (run_dir / names.STOP_REQUEST).is_file() and stoprequest.status_line(run_dir) is not None


@pytest.mark.slow
def test_status_says_a_stop_request_is_left_until_a_start_by_hand_clears_it(tmp_path, corpus):
    """`minilmd stop` of a live supervisor leaves the request too, and it stays after that supervisor's end: an
    automatic restart will not start the run. `minilmd status` did not say so; now it does, until a start by hand
    clears it."""
    config = write_config(tmp_path, corpus, name="st", train={"max_steps": 40, "checkpoint_every": 5})
    run_dir = tmp_path / "st" / "run"
    release = tmp_path / "release"  # held at step 2 until the stop is under way: the run cannot reach its end first
    proc = start_supervisor(config, tmp_path / "first.out", FAKE_STEP_S="0.05", FAKE_HOLD=f"2:{release}")
    try:
        wait_until(lambda: step_of_state(run_dir) >= 2, 120, "the trainer to train")
        stopping = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "stop", str(run_dir)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for())
        wait_until(lambda: state(run_dir).get("phase") == "stopping", 120, "the supervisor to be stopping")
        release.touch()
        out, err = stopping.communicate(timeout=300)
        stopped = subprocess.CompletedProcess(stopping.args, stopping.returncode, out, err)
        assert stopped.returncode == protocol.STOP_DONE, stopped.stdout + stopped.stderr
        # said at the stop itself, not only by a later `status`
        assert (f"stop request left at {run_dir / names.STOP_REQUEST}: an automatic restart" in stopped.stdout
                and "a start by hand (`minilmd run`, the tmux launcher, sbatch) clears it" in stopped.stdout), \
            stopped.stdout
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    request, _ = stoprequest.read(run_dir)
    assert request is not None and request.time is not None

    shown = status(run_dir)
    assert (f"stop requested at {fmt_time(request.time)} by uid {os.getuid()} on " in shown and
            "an automatic restart will not start the run" in shown and "a start by hand clears it" in shown), shown
    assert "systemd" not in shown, shown  # this supervisor did not run under systemd

    assert run_supervisor(config, tmp_path, FAKE_STEP_S="0") == 0  # by hand: clears it
    assert "stop requested" not in status(run_dir)


@pytest.mark.slow
def test_a_start_by_hand_of_a_run_already_done_clears_a_stop_request(tmp_path, corpus):
    """A `stop` whose supervisor reached the budget's end leaves its request; a start by hand then finds the run
    done and ends before any supervisor (preflight's NothingToDo). It left the request, while `status` said "a start
    by hand clears it"; now that start clears it too."""
    config = write_config(tmp_path, corpus, name="dn", train={"max_steps": 5, "checkpoint_every": 5})
    run_dir = tmp_path / "dn" / "run"
    assert run_supervisor(config, tmp_path, FAKE_STEP_S="0") == 0
    stoprequest.leave(run_dir, os.getuid())  # what that stop left
    assert "stop requested" in status(run_dir)
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", str(config)], capture_output=True, text=True,
                          timeout=120, env=env_for())
    assert done.returncode == protocol.SUPERVISOR_DONE, done.stdout + done.stderr
    assert "cleared, this start is no launcher's automatic restart" in done.stdout, done.stdout
    assert not (run_dir / names.STOP_REQUEST).exists()
    assert "stop requested" not in status(run_dir)


def status(run_dir: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "minilmd.cli", "status", str(run_dir)], capture_output=True,
                         text=True, timeout=120, env=env_for())
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_status_json_and_the_overview_show_a_request_left(tmp_path):
    """`status --json` and `status --all` (its table and --json) did not show the request `minilmd stop` leaves: a
    run an automatic restart will not start looked like any stopped run there."""
    from minilmd.daemon.host import registry
    from minilmd.daemon.views import overview
    from minilmd.daemon.views import status as views_status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / names.STATE).write_text(json.dumps({"run": "tiny", "phase": "done", "supervisor": {"pid": None},
                                                          "outcome": {"ended": "finished"}}))
    entry = registry.Entry("tiny", run_dir, "tiny.toml", os.getuid(), tmp_path / "entry")

    def shown() -> tuple[dict, dict, str]:
        out = io.StringIO()
        assert views_status.status(run_dir, as_json=True, out=out) == 0
        r = overview.row(entry, 0.0)
        return json.loads(out.getvalue()), r, overview.table([r])[1]

    said, r, line = shown()
    assert said["stop_request"] is None and r["stop_request"] is None and "stop requested" not in line, line
    left = stoprequest.leave(run_dir, os.getuid())
    request, _ = stoprequest.read(run_dir)
    said, r, line = shown()
    assert said["stop_request"] == r["stop_request"] == {
        "path": str(left), "time": request.time, "by": f"uid {os.getuid()} on {os.uname().nodename}",
        "after_end": False}
    assert line.split()[:3] == ["tiny", "done", "(stop"] and "(stop requested)" in line, line
    stoprequest.clear(run_dir)
    stoprequest.leave(run_dir, os.getuid(), after_end=True)  # a stop that found the run ended: no word of it
    said, r, line = shown()
    assert said["stop_request"]["after_end"] is True and "(stop requested)" not in line, line
    stoprequest.clear(run_dir)
    assert shown()[0]["stop_request"] is None
