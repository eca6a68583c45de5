"""A stage waiting for its predecessor (waiting_init) whose run directory is on a share that stops answering: the
poll of the predecessor (its run.toml, its state.json) runs in a worker thread (daemon/phases/initwait.py), so the
supervisor's loop goes on (its own state.json rewritten, a stop signal handled) while the read is held.

Before: InitWaiter.tick read the predecessor's files in the loop itself; a stalled NFS held the whole supervisor
(no state.json, no heartbeat check, no SIGTERM handled) for as long as the mount hung.
"""
from __future__ import annotations

import shutil
import signal
import time

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.fsio import atomic_write_json
from supervisor_helpers import start_supervisor, state, wait_or_kill, write_config
from waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]  # a FUSE mount, a real supervisor


def test_a_predecessor_on_a_stalled_share_never_holds_the_supervisors_loop(tmp_path, corpus, faultfs):
    first = write_config(tmp_path, corpus, name="sft", remote=False, run={"dir": str(faultfs.root / "sft")})
    pred_dir = faultfs.backing / "sft"
    pred_dir.mkdir()
    shutil.copyfile(first, pred_dir / names.RUN_CONFIG_COPY)
    body = new_state("sft", pred_dir, str(first))
    body.update(phase="training", progress={"step": 3}, updated=time.time())
    atomic_write_json(pred_dir / names.STATE, body)
    second = write_config(tmp_path, corpus, name="lora", init={"from": str(faultfs.root / "sft")})
    proc = start_supervisor(second, tmp_path / "lora.out")
    run_dir = load_config(second).run_dir
    try:
        wait_until(lambda: (state(run_dir).get("init_wait") or {}).get("run") == "sft", timeout=120,
                   what="the wait for the predecessor")
        faultfs.stall("sft/state.json", 600, op="*")  # the share hangs: every operation on it blocks
        wait_until(lambda: faultfs.hits("stall"), timeout=60, what="a poll held by the stalled share")
        held_since = time.time()
        wait_until(lambda: (state(run_dir).get("updated") or 0) > held_since + 2, timeout=60,
                   what="the supervisor's state.json rewritten while the poll is held")
        assert state(run_dir)["phase"] == "waiting_init"
        proc.send_signal(signal.SIGTERM)  # handled by the loop, the read still held
        wait_until(lambda: (state(run_dir).get("outcome") or {}).get("exit") == 0, timeout=60,
                   what="the stop handled and recorded while the poll is held")
        # the process itself ends once the share answers: the kernel keeps a thread blocked in the hung mount (as
        # on a hard NFS mount), and a process ends with all its threads
        faultfs.clear()
        assert wait_or_kill(proc, timeout=60) == 0, (tmp_path / "lora.out").read_text()
    finally:
        faultfs.clear()  # first: a process with a thread held in the mount cannot end, even on SIGKILL
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in (tmp_path / "lora.out").read_text()
