"""The fresh-eyes audit of how the supervisor runs and restarts the trainer: real processes and signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor_helpers import env_for, events, state, wait_or_kill, write_config
from waiting import wait_until

pytestmark = pytest.mark.slow  # supervisors as real processes


def test_a_closed_ssh_session_does_not_end_the_run(tmp_path, corpus):
    """`minilmd run` started in an SSH session, its stdout the terminal (or `| tee`): the session closes, SIGHUP
    comes (taken as a log reopen) and every later echo of an event fails (EIO, EPIPE). Before, the first failed
    echo raised out of the loop: a supervisor crash, exit 1, the trainer killed; the run goes on to its end now."""
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 60})
    proc = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env_for(FAKE_STEP_S="0.05"))
    run_dir = tmp_path / "s" / "run"
    wait_until(lambda: state(run_dir).get("phase") == "training", what="the trainer's first heartbeat")
    assert proc.stdout is not None
    proc.stdout.close()  # the terminal is gone: nobody reads the supervisor's stdout any more
    proc.send_signal(signal.SIGHUP)
    assert wait_or_kill(proc) == 0
    final = state(run_dir)
    assert final["phase"] == "done", final
    assert not [e for e in events(run_dir) if e["event"] == "crash"]


WORKER = """import faulthandler, os, signal, sys, time
faulthandler.register(signal.SIGUSR1)  # as `minilmd train` does: its stacks into the attempt log
if os.environ["LOCAL_RANK"] == "0":
    open(os.path.join(os.environ["MINILMD_RUN_DIR"], "heartbeat"), "w").write("1 training")
open(os.path.join(sys.argv[1], f"worker-{os.getpid()}"), "w").close()
time.sleep(600)  # a rank hung in a collective: never returns by itself
"""


def _gone(pid: int) -> bool:
    """Exited (a zombie awaiting its new parent's reaping counts: it holds nothing any more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


def test_a_hung_torchrun_gets_its_workers_stacks_dumped_and_is_killed_whole(tmp_path, corpus, monkeypatch):
    """torchrun starts each worker in a session of its own (torch.distributed.elastic's SubprocessHandler:
    start_new_session=True), out of reach of a signal to the trainer's process group. Before, the hang watch found
    no worker to dump ("its torchrun workers do not catch SIGUSR1 yet") and its SIGKILL killed only the agent: the
    hung ranks went on holding the GPU and the run's files while the next attempt started beside them. Now every
    process of the launch (its launch id) is dumped and killed."""
    from minilmd.config import load_config
    from minilmd.daemon.base.runstate import read_heartbeat
    from minilmd.daemon.child import stackdump, trainerwatch
    from minilmd.daemon.child.process import launch, wait_bounded

    monkeypatch.setattr(stackdump.shutil, "which", lambda name: None)  # the SIGUSR1 path, py-spy or not here

    cfg = load_config(write_config(tmp_path, corpus, remote=False, restart={"hang_timeout": "1s"}))
    cfg.run_dir.mkdir(parents=True)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    marks = tmp_path / "marks"
    marks.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--max-restarts", "0", str(script), str(marks)]
    child = launch(command, cfg.run_dir, 1, devices="")
    workers: list[int] = []
    try:
        workers = wait_until(lambda: [int(p.name.split("-")[1]) for p in marks.iterdir()] if len(
            list(marks.iterdir())) == 2 else None, 120, "torchrun's two workers")
        assert all(os.getsid(w) != child.pid for w in workers)  # the premise: each worker is a session of its own
        said: list[str] = []
        wait_until(lambda: trainerwatch.kill_if_hung(cfg, child, read_heartbeat(cfg.run_dir),
                                                     lambda kind, message, **_: said.append(message))
                   or child.killed_for_hang, 60, "the hang watch to find the heartbeat 1 s old")
        assert "SIGUSR1: the faulthandler dumped" in child.hang_detail, child.hang_detail
        sent = [line for line in child.log_path.read_text().splitlines() if "hang: SIGUSR1 to pid" in line]
        assert sent and all(str(w) in sent[0] for w in workers), sent
        assert wait_bounded(child.popen, 30) == -signal.SIGKILL
        wait_until(lambda: all(_gone(w) for w in workers), 60, "the workers to die of the SIGKILL sent to them")
    finally:
        for w in workers:
            if not _gone(w):
                os.kill(w, signal.SIGKILL)
        child.kill_group()
