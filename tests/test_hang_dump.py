"""What the supervisor says after a hang is what reached the attempt log: a real stack dump, or why none came.

Children are real processes in their own group with their output in a real attempt log (child.launch): one that
registered its faulthandler for SIGUSR1 (as `minilmd train` does), one that has not yet (a hang in imports), and
one blocked in a read of a stalled FUSE file (uninterruptible: no handler runs until the read returns).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import names, proc_info, procs
from minilmd.config import load_config
from minilmd.daemon.child.process import launch
from minilmd.daemon.child.stackdump import _DUMP_MARK, dump_stack
from supervisor_helpers import run_supervisor, state, write_config
from waiting import wait_until

REGISTERED = ("import faulthandler, signal, sys, threading, time\n"
              "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
              "threading.Thread(target=lambda: time.sleep(600), daemon=True).start()\n"
              "def stuck_here():\n"
              "    print('READY'.lower(), flush=True)\n"
              "    {body}\n"
              "stuck_here()\n")


def start(tmp_path: Path, code: str):
    child = launch([sys.executable, "-c", code], tmp_path, 1, devices="")
    # "ready" as the child prints it (the command line in the log's header spells it otherwise)
    wait_until(lambda: b"\nready\n" in child.log_path.read_bytes(), 30, "the child to start", interval=0.02)
    return child


def test_a_registered_faulthandler_dumps_every_thread_and_the_message_counts_them(tmp_path):
    child = start(tmp_path, REGISTERED.format(body="time.sleep(600)"))
    try:
        said = dump_stack(child.pid, child.log_path)
        log = child.log_path.read_bytes()
        assert log.count(_DUMP_MARK) == 2 and b"in stuck_here" in log
        assert said.startswith("SIGUSR1: the faulthandler dumped 2 thread stack(s)")
        assert child.poll() is None  # dumping does not end it; the supervisor kills it next
    finally:
        child.kill_group()


# A handler that, as faulthandler's does (installed without SA_NODEFER), holds SIGUSR1 blocked while it writes, and
# is paused between its two thread blocks as a trainer on a loaded machine may be: written in Python, where the
# mask is set by hand (Python's own C handler only sets a flag), so that the pause can be made long.
PAUSING = ("import os, signal, time\n"
           "def dump(signum, frame):\n"
           "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
           "    os.write(2, b'Thread 0x1 (most recent call first):\\n  File \"t.py\", line 1 in first\\n')\n"
           "    time.sleep(1.0)\n"
           "    os.write(2, b'Thread 0x2 (most recent call first):\\n  File \"t.py\", line 2 in second\\n')\n"
           "    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})\n"
           "signal.signal(signal.SIGUSR1, dump)\n"
           "print('READY'.lower(), flush=True)\n"
           "while True:\n"
           "    time.sleep(600)\n")


def test_a_dump_paused_midway_is_waited_for_until_its_handler_has_returned(tmp_path):
    """The dump is over when the handler is, not when the log is quiet for one poll: a trainer paused within its
    dump (a loaded machine) still has SIGUSR1 blocked in the thread running the handler (/proc/PID/task/*/status
    SigBlk). Before, the supervisor counted what had come by the first quiet poll: "dumped 1 thread stack(s)" of 2."""
    child = start(tmp_path, PAUSING)
    try:
        said = dump_stack(child.pid, child.log_path, wait_s=120)  # generous: the rule, not the clock, ends the wait
        assert said.startswith("SIGUSR1: the faulthandler dumped 2 thread stack(s)"), said
        dumped = child.log_path.read_bytes().split(b"\nready\n", 1)[1]  # the header's command line spells it too
        assert dumped.count(_DUMP_MARK) == 2 and dumped.endswith(b"line 2 in second\n")
        assert child.poll() is None
    finally:
        child.kill_group()


def test_faulthandler_holds_sigusr1_blocked_in_the_thread_writing_its_dump(tmp_path):
    """What the rule above relies on, with the real faulthandler: its handler runs with SIGUSR1 blocked until it has
    written the dump. Its file is a full pipe, so the handler is held in its write; read through proc_info."""
    code = ("import faulthandler, os, signal, time\n"
            "r, w = os.pipe()\n"
            "os.set_blocking(w, False)\n"
            "try:\n"
            "    while True:\n"
            "        os.write(w, b'x' * 4096)\n"
            "except BlockingIOError:\n"
            "    pass\n"
            "os.set_blocking(w, True)\n"
            "faulthandler.register(signal.SIGUSR1, file=w, all_threads=True)\n"
            "print('READY'.lower(), flush=True)\n"
            "time.sleep(600)\n")
    child = start(tmp_path, code)
    try:
        before = proc_info.signal_masks(child.pid)
        assert before is not None and not before.blocks(signal.SIGUSR1) and not before.pending(signal.SIGUSR1)
        os.kill(child.pid, signal.SIGUSR1)
        held = wait_until(lambda: (m := proc_info.signal_masks(child.pid)) and m.blocks(signal.SIGUSR1) and m, 60,
                          "the handler to hold SIGUSR1 blocked in its write", interval=0.02)
        assert not held.pending(signal.SIGUSR1)  # taken by the handler, which has not returned
        assert child.poll() is None
    finally:
        child.kill_group()


def test_a_process_without_the_handler_is_not_sent_sigusr1_and_the_message_says_no_dump(tmp_path):
    child = start(tmp_path, "import time\nprint('READY'.lower(), flush=True)\ntime.sleep(600)\n")
    try:
        # "ready" is printed just before the sleep: a child preempted between the two (under load) is state R
        wait_until(lambda: procs.process_state(child.pid) == "S", 30, "the child to sleep", interval=0.02)
        said = dump_stack(child.pid, child.log_path)
        assert said.startswith("no stack dump: it does not catch SIGUSR1 yet")
        assert f"pid {child.pid} state S" in said
        assert _DUMP_MARK not in child.log_path.read_bytes()
        assert child.poll() is None  # SIGUSR1 would have killed it
    finally:
        child.kill_group()


def test_a_link_planted_at_the_attempt_log_is_not_written_through_and_no_sigusr1_is_sent(tmp_path, monkeypatch):
    """The attempt log is in run.dir, which others may reach (a team share): the dump appends through
    minilmd/jsonlines.py (no link followed), as every append there does. Before, open(log, "a") wrote the
    supervisor's lines through a link planted at the log's name into the file it named."""
    from minilmd.daemon.child import stackdump

    monkeypatch.setattr(stackdump.shutil, "which", lambda name: None)  # the SIGUSR1 path, py-spy or not here
    child = start(tmp_path, REGISTERED.format(body="time.sleep(600)"))
    victim = tmp_path / "victim"
    victim.write_text("theirs\n")
    try:
        child.log_path.unlink()
        child.log_path.symlink_to(victim)
        said = dump_stack(child.pid, child.log_path, wait_s=0.5)
        assert said.startswith(f"no stack dump: the attempt log {child.log_path} cannot be appended to"), said
        assert victim.read_text() == "theirs\n"
        assert child.poll() is None
    finally:
        child.kill_group()


def test_a_stopped_process_gets_no_dump_and_the_message_says_it_is_stopped_not_in_io(tmp_path):
    """A trainer stopped by SIGSTOP (state T: Ctrl-Z, a debugger) runs no handler until SIGCONT; the message said
    "a process in uninterruptible I/O", which is state D's reason, not T's."""
    child = start(tmp_path, REGISTERED.format(body="time.sleep(600)"))
    try:
        os.kill(child.pid, signal.SIGSTOP)
        wait_until(lambda: procs.process_state(child.pid) == "T", 30, "the child to stop", interval=0.02)
        said = dump_stack(child.pid, child.log_path, wait_s=0.5)
        assert said.startswith("SIGUSR1 sent but no stack dump reached the attempt log within 0.5s"), said
        assert f"pid {child.pid} state T" in said, said
        assert "a stopped process (state T: SIGSTOP, SIGTSTP or Ctrl-Z) runs no handler until it gets SIGCONT" in \
            said and "uninterruptible" not in said, said
    finally:
        child.kill_group()


@pytest.mark.slow
def test_a_process_blocked_in_a_stalled_read_gets_no_dump_and_the_message_says_why(tmp_path, faultfs):
    (faultfs.backing / "tokens.bin").write_bytes(b"\0" * 65536)
    faultfs.stall("tokens.bin", 300)
    body = f"open({str(faultfs.root / 'tokens.bin')!r}, 'rb').read()"
    child = start(tmp_path, REGISTERED.format(body=body))
    try:
        wait_until(lambda: faultfs.hits("stall"), 30, "the read to stall")
        said = dump_stack(child.pid, child.log_path, wait_s=1.0)
        assert said.startswith("SIGUSR1 sent but no stack dump reached the attempt log within 1s")
        assert f"pid {child.pid} state D" in said
        log = child.log_path.read_bytes()
        assert _DUMP_MARK not in log and b"# hang: no stack dump within 1s of SIGUSR1" in log
    finally:
        child.kill_group(reap_s=30)
        faultfs.clear()


@pytest.mark.slow
def test_after_a_real_hang_the_restart_names_the_dump_that_is_in_the_log(tmp_path, corpus):
    config = write_config(tmp_path, corpus, restart={"hang_timeout": "2s", "backoff_initial": "0.1s"},
                          train={"max_steps": 8, "checkpoint_every": 4, "micro_batch_size": 4, "grad_accum": 1})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, timeout=300, fake=False, MINILMD_FAULT="hang@5") == 0
    (restart,) = state(cfg.run_dir)["restarts"]
    log = (cfg.run_dir / "logs" / "attempt-0001.log").read_bytes()
    threads = log.count(_DUMP_MARK)
    assert threads >= 1 and b" in _hang" in log
    said = [json.loads(line) for line in (cfg.run_dir / "events.jsonl").read_text().splitlines()
            if json.loads(line)["event"] == "child_exit"][0]["message"]
    assert restart["cause"] == "hang" and f"the faulthandler dumped {threads} thread stack(s)" in said
    assert signal.SIGKILL == -restart["exit"]


def test_py_spy_attaches_only_to_processes_proven_the_launchs_right_before(tmp_path, monkeypatch):
    """py-spy's ptrace stops the process it reads: like a signal, it is attached to a torchrun worker (not our
    child: its pid may have been taken since the scan) only once minilmd/procs.py proves it is still that process
    of the launch. A fake py-spy on PATH records each pid it is given: the launch's worker yes; a process of ours
    that does not carry the launch, and the worker under a start time it no longer has (a recycled pid), no."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    fake = bin_dir / "py-spy"
    fake.write_text(f"#!/bin/sh\necho \"$3\" >> {asked}\necho 'Thread 1 (idle)'\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = start(run_dir, "import time\nprint('READY'.lower(), flush=True)\ntime.sleep(600)\n")
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    env = {**os.environ, names.RUN_DIR_ENV: str(run_dir.resolve()), names.LAUNCH_ID_ENV: child.launch_id}
    worker, stranger = subprocess.Popen(sleep, env=env), subprocess.Popen(sleep)
    try:
        ticks = {p.pid: wait_until(lambda p=p: procs.process_start_ticks(p.pid), 30, "a start time")
                 for p in (worker, stranger)}
        launch_of = child.launch()
        assert launch_of is not None
        others = ((worker.pid, ticks[worker.pid]), (stranger.pid, ticks[stranger.pid]),
                  (worker.pid, ticks[worker.pid] - 1))
        said = dump_stack(child.pid, child.log_path, others=others, launch=launch_of)
        assert said == "py-spy dumped the stacks into the attempt log"
        assert asked.read_text().split() == [str(child.pid), str(worker.pid)]
        log = child.log_path.read_text()
        assert f"py-spy dump --pid {stranger.pid} not run: its environment does not carry" in log
        assert f"py-spy dump --pid {worker.pid} not run: it has ended" in log  # the stale start time
    finally:
        for p in (worker, stranger):
            p.kill()
            p.wait()
        child.kill_group()
