"""prepare's worker processes die with it: a `minilmd prepare --workers 2` killed with SIGKILL (no chance to clean
up) leaves no worker and no multiprocessing helper process running. Real processes, a real SIGKILL."""
from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

from data_helpers import demo_slice
from waiting import wait_until


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The ones still running (a zombie has ended: it only waits for its new parent to reap it)."""
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_sigkill_of_prepare_takes_its_workers_and_helpers_with_it(tmp_path, tokenizer):
    big = demo_slice(tmp_path / "big", 4000)
    out = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "prepare", *big, "--tokenizer", str(tokenizer),
                              "--out", str(out), "--workers", "2"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    helpers: list[psutil.Process] = []
    try:
        parent = psutil.Process(child.pid)
        def workers() -> int:
            try:
                return sum("multiprocessing.spawn" in " ".join(p.cmdline()) for p in parent.children())
            except psutil.Error:  # a child that ended between listing and reading its command line
                return 0

        # both workers have started (the pool spawns them one by one) and tokens are being written
        wait_until(lambda: list(tmp_path.glob(".out.prepare-*/train/tokens.bin")) and workers() >= 2
                   or child.poll() is not None, 120, "prepare's workers to be at work", interval=0.02)
        assert child.poll() is None, "prepare ended before it could be killed"
        helpers = parent.children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in helpers]
        assert sum("multiprocessing.spawn" in c for c in commands) == 2, commands  # the two workers
        assert sum("resource_tracker" in c for c in commands) == 1, commands  # the helper the workers keep alive
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        wait_until(lambda: not alive(helpers), 30, "prepare's workers and helpers to end after its SIGKILL")
    finally:
        for p in alive(helpers):
            p.kill()
        if child.poll() is None:
            child.kill()
