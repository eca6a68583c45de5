"""A run whose run.dir is removed while it runs (daemon/phases/rundirwatch.py) stops after its last sync, and said
"start the run again". The run lock lived in the removed run.dir: a start meanwhile made run.dir anew with a free
lock, and the scratch's owner marker names the run by its run.dir's path, the same for both, so the second
supervisor claimed the scratch the first was still syncing from (review11b, not verified there: verified here, it
was not refused). Now a supervisor holds an flock on its scratch's marker (minilmd/scratch_hold.py): `run --check`
and the launch refuse while it lives, naming its pid, and the first supervisor's words say to wait for it.

The first supervisor is a real one (the fake trainer), stopped with SIGSTOP once run.dir is removed so that it is
still alive, as in a long last sync, while the second start is tried; then let go, it ends exit 73 and the run
starts again."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from minilmd import checkpoint_dirs, protocol
from minilmd.config import ConfigError, load_config
from supervisor_helpers import cli, remove_while_written, start_supervisor, wait_for, wait_or_kill, write_config

HOLDER = """import sys
from pathlib import Path
from minilmd import scratch, scratch_hold
scratch.claim(Path(sys.argv[1]), Path(sys.argv[2]), "s", False)
scratch_hold.hold(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""


def test_the_launchs_claim_is_refused_while_another_process_holds_the_scratch_then_taken(tmp_path, corpus):
    from minilmd import scratch_hold
    from minilmd.daemon.scratchclaim import _settle_and_claim

    cfg = load_config(write_config(tmp_path, corpus))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(cfg.scratch_dir), str(cfg.run_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said = scratch_hold.in_use(cfg.scratch_dir)
        assert said and f"still held by another supervisor of this run (pid {holder.pid}," in said, said
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            _settle_and_claim(cfg)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert scratch_hold.in_use(cfg.scratch_dir) is None
    try:
        assert _settle_and_claim(cfg) is None  # claimed and held by this process now
        assert scratch_hold.in_use(cfg.scratch_dir) is None  # its own hold is no refusal of its own
    finally:
        scratch_hold.let_go(cfg.scratch_dir)


@pytest.mark.slow  # a real supervisor and the fake trainer
def test_a_start_while_the_first_supervisor_of_a_removed_run_dir_lives_is_refused_naming_its_pid(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 100_000, "checkpoint_every": 10})
    cfg = load_config(config)
    out = tmp_path / "first.out"
    first = start_supervisor(config, out, FAKE_STEP_S="0.05")
    try:
        wait_for(lambda: checkpoint_dirs.read_latest(cfg.run.remote) is not None, 120, "a first sync")
        os.kill(first.pid, signal.SIGSTOP)  # alive, as in a long last sync, but not yet looking at run.dir
        remove_while_written(cfg.run_dir)  # its run lock with it; its trainer (not stopped) still writes there
        check = cli("run", "--check", str(config))
        said = check.stdout + check.stderr
        assert check.returncode == protocol.SUPERVISOR_CONFIG, said
        assert f"is still held by another supervisor of this run (pid {first.pid}," in said, said
        second = cli("run", str(config), timeout=120)
        assert second.returncode == protocol.SUPERVISOR_CONFIG, second.stdout + second.stderr
        assert f"pid {first.pid}" in second.stdout + second.stderr
        os.kill(first.pid, signal.SIGCONT)
        rc = wait_or_kill(first, 120)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
    text = out.read_text()
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, text[-3000:]
    assert f"once this supervisor (pid {first.pid}) has ended" in text, text[-3000:]
    assert f"Once this supervisor (pid {first.pid}) has ended" in text, text[-3000:]
    again = cli("run", "--check", str(config))
    assert again.returncode == 0 and "still held" not in again.stdout + again.stderr, again.stdout + again.stderr


def test_a_probe_in_the_instant_of_a_claim_does_not_refuse_it_and_a_lasting_hold_does(tmp_path, monkeypatch):
    """`in_use`'s probe (a user's `run --check`) holds a shared lock for an instant: a claim meeting it tries again
    and takes the scratch (before, review11c F1: ScratchInUse, exit 2 for good, a supervisor named that did not
    exist); a lock held past PROBE_WAIT_S is a supervisor's, refused."""
    import fcntl
    import threading

    from minilmd import names, scratch_hold

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / names.SCRATCH_OWNER).write_text("{}")
    probe = os.open(scratch / names.SCRATCH_OWNER, os.O_RDONLY)  # another open file: its own flock
    fcntl.flock(probe, fcntl.LOCK_SH)
    letting_go = threading.Timer(0.3, fcntl.flock, (probe, fcntl.LOCK_UN))
    letting_go.start()
    try:
        scratch_hold.hold(scratch)  # waits out the probe
        assert scratch_hold.in_use(scratch) is None  # this process's own hold
    finally:
        letting_go.join()
        scratch_hold.let_go(scratch)
    fcntl.flock(probe, fcntl.LOCK_SH)  # now held for good: a supervisor's
    monkeypatch.setattr(scratch_hold, "PROBE_WAIT_S", 0.2)
    try:
        with pytest.raises(scratch_hold.ScratchInUse):
            scratch_hold.hold(scratch)
    finally:
        os.close(probe)
