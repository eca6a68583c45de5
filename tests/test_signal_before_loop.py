"""A stop signal while `minilmd run` is still launching (daemon/host/signals.py, daemon/supervisor.py run_supervisor).

After the launch has made its run directory's files, claimed its scratch and taken its run lock, but before the
supervisor's loop: held there by a FUSE mount (tests/faultfs.py) holding the registry (XDG_STATE_HOME), whose mkdir
stalls until the test lets it go. Before, the handlers were installed just before the loop: a SIGTERM (systemctl
stop, tmux kill, scancel) ended the process by its default action, and so did `minilmd stop`'s SIGUSR2, its cleanup
skipped: the scratch it had claimed left behind (a normal stop gives it back), run.dir left with no state.json
(`status`: "no state.json yet ... just starting", for ever), nothing registered, no exit said. Now the stop is
recorded and the supervisor's first tick ends the run as a stop does.

During the launch's checks, which make nothing: a stop ends them at once, exit 0, nothing made, though a check waits
on a share that does not answer (a run.remote whose look stalls)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults_fixtures import faultfs_dirs, mounted_faultfs
from minilmd import names, protocol
from minilmd.daemon.host.lock import lock_holder
from slurm_helpers import job_line, slurm_env
from supervisor_helpers import env_for, start_supervisor, state, wait_or_kill, write_config
from waiting import wait_until


def stop_cli(run_dir, out):
    """`minilmd stop RUN_DIR` in a process of its own, its output in `out`."""
    with open(out, "wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "minilmd.cli", "stop", str(run_dir)], stdout=sink,
                                stderr=subprocess.STDOUT, env=env_for())


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("stop_by", ["SIGTERM", "minilmd stop"])
def test_a_stop_while_the_launch_sets_up_its_run_dir_ends_the_run_as_a_stop(tmp_path, corpus, stop_by):
    backing, mount_point = faultfs_dirs(tmp_path)
    scratch = tmp_path / "s" / "scratch"
    with mounted_faultfs(backing, mount_point) as share:
        config = write_config(tmp_path, corpus, run={"keep_scratch": False})
        run_dir = tmp_path / "s" / "run"
        held = share.stall("runs", 600, op="mkdir")  # the registry's directory: made once run.dir is set up
        out, stop_out = tmp_path / "supervisor.out", tmp_path / "stop.out"
        proc = start_supervisor(config, out, XDG_STATE_HOME=str(mount_point / "state"))
        stopper = None
        try:
            wait_until(lambda: share.hits("stall", "mkdir") or proc.poll() is not None, 120, "the launch held")
            assert proc.poll() is None, out.read_text()
            assert (scratch / names.SCRATCH_OWNER).exists() and lock_holder(run_dir).pid == proc.pid
            if stop_by == "SIGTERM":
                proc.send_signal(signal.SIGTERM)
            else:  # it proves the launch the run's supervisor (the lock, the identity), then sends SIGUSR2
                stopper = stop_cli(run_dir, stop_out)
                wait_until(lambda: "SIGUSR2 sent to supervisor pid" in stop_out.read_text()
                           or stopper.poll() is not None, 120, "minilmd stop's signal")
                assert "SIGUSR2 sent to supervisor pid" in stop_out.read_text(), stop_out.read_text()
            share.remove(held)
            rc = wait_or_kill(proc, 120)
            if stopper is not None:
                assert wait_or_kill(stopper, 120) == protocol.STOP_DONE, stop_out.read_text()
        finally:
            share.clear()
            for p in (proc, stopper):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
        said = out.read_text()
        assert rc == 0, said  # before: -15 (SIGTERM), -12 (SIGUSR2): killed by the signal's default action
        ended = state(run_dir)
        assert (ended["phase"], ended["outcome"]["ended"]) == ("done", protocol.ENDED_STOPPED), ended
        assert "-> done: stopped on request" in said and not scratch.exists(), said  # given back, as a stop's
        assert lock_holder(run_dir) is None


def _signalled_in_the_checks(tmp_path: Path, corpus, sig: int, **env) -> tuple[int, str, Path, Path]:
    """`minilmd run` held in the launch's checks (its look at run.remote stalls on a FUSE getattr), sent `sig`: what
    it said while the look still stalled, nothing made by then, and its exit once the look answers. (exit status,
    its output, run.dir, scratch)."""
    backing, mount_point = faultfs_dirs(tmp_path)
    (backing / "remote").mkdir()
    with mounted_faultfs(backing, mount_point) as share:
        config = write_config(tmp_path, corpus, run={"remote": str(mount_point / "remote")})
        run_dir, scratch = tmp_path / "s" / "run", tmp_path / "s" / "scratch"
        share.stall("remote", 600, op="getattr")  # the checks' look at run.remote: no answer till the test ends
        out = tmp_path / "supervisor.out"
        proc = start_supervisor(config, out, **env)
        try:
            wait_until(lambda: share.hits("stall", "getattr") or proc.poll() is not None, 120, "a check held")
            proc.send_signal(sig)
            # said while the look still stalls: the check was not waited for (its thread stays in the kernel)
            wait_until(lambda: "during the launch's checks" in out.read_text(), 120, "the signal's words")
            assert share.hits("stall", "getattr") and not run_dir.exists() and not scratch.exists(), out.read_text()
            share.clear()  # the stalled look answers: the process can exit
            rc = wait_or_kill(proc, 120)
        finally:
            share.clear()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rc, out.read_text(), run_dir, scratch


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_the_launchs_checks_ends_them_at_once_with_nothing_made(tmp_path, corpus, sig):
    rc, said, run_dir, scratch = _signalled_in_the_checks(tmp_path, corpus, sig)
    assert rc == protocol.SUPERVISOR_DONE, said
    assert f"stopped ({signal.Signals(sig).name}) during the launch's checks: nothing made" in said, said
    assert not run_dir.exists() and not scratch.exists() and "Traceback" not in said, said


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("sig,job_state", [(signal.SIGTERM, "RUNNING"), (signal.SIGUSR2, "RUNNING"),
                                           (signal.SIGTERM, "CANCELLED")], ids=["preempted", "B:USR2", "scancel"])
def test_in_a_slurm_job_a_signal_during_the_launchs_checks_is_a_preemption_and_requeues_it(tmp_path, corpus, sig,
                                                                                         job_state):
    """In a Slurm job Slurm's SIGTERM (a preemption) or its B:USR2 warning (no `minilmd stop` sends SIGUSR2 before
    the run lock is held) during the checks ends them as the same signal later does: a preemption with nothing made,
    the job requeued (the scratch wait's rule, scratchclaim.preempted_in_checks), unless it is being cancelled
    (scancel: a SIGTERM for good). Before, it exited 0 "stopped during the launch's checks", never requeued: the
    unattended run stayed unfinished."""
    env = slurm_env(tmp_path, 0)
    job_line(tmp_path, 0, time.time() + 3600)
    if job_state == "CANCELLED":
        (tmp_path / "job-line").write_text("JobState=CANCELLED Reason=None Restarts=0\n")
    rc, said, _, _ = _signalled_in_the_checks(tmp_path, corpus, sig, **env)
    calls = tmp_path / "scontrol-calls"
    requeues = calls.read_text().splitlines().count("requeue 42") if calls.exists() else 0
    assert rc == protocol.SUPERVISOR_DONE and "Traceback" not in said, said
    assert "in Slurm job 42 during the launch's checks: nothing made" in said, said
    assert requeues == (0 if job_state == "CANCELLED" else 1), said
    if sig == signal.SIGUSR2:
        assert "Slurm's --signal warning (B:USR2), taken as its USR1" in said, said
