"""What the supervisor says after a hang is what reached the attempt log: a real stack dump, or why none came.

Children are real processes in their own group with their output in a real attempt log (child.launch): one that
registered its faulthandler for SIGUSR1 (as `minilmd train` does), one that has not yet (a hang in imports), and
one blocked in a read of a stalled FUSE file (uninterruptible: no handler runs until the read returns).
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from minilmd.config import load_config
from minilmd.daemon.child.process import launch
from minilmd.daemon.child.stackdump import _DUMP_MARK, _proc_stat, dump_stack
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


def test_a_process_without_the_handler_is_not_sent_sigusr1_and_the_message_says_no_dump(tmp_path):
    child = start(tmp_path, "import time\nprint('READY'.lower(), flush=True)\ntime.sleep(600)\n")
    try:
        said = dump_stack(child.pid, child.log_path)
        assert said.startswith("no stack dump: it does not catch SIGUSR1 yet")
        assert f"pid {child.pid} state S" in said
        assert _DUMP_MARK not in child.log_path.read_bytes()
        assert child.poll() is None  # SIGUSR1 would have killed it
    finally:
        child.kill_group()


def test_a_stopped_process_gets_no_dump_and_the_message_says_it_is_stopped_not_in_io(tmp_path):
    """A trainer stopped by SIGSTOP (state T: Ctrl-Z, a debugger) runs no handler until SIGCONT; the message said
    "a process in uninterruptible I/O", which is state D's reason, not T's."""
    child = start(tmp_path, REGISTERED.format(body="time.sleep(600)"))
    try:
        os.kill(child.pid, signal.SIGSTOP)
        wait_until(lambda: _proc_stat(child.pid)[:1] == ["T"], 30, "the child to stop", interval=0.02)
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
