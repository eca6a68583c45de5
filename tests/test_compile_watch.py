"""The supervisor's hang watch and a compiling trainer: while the trainer's own heartbeat says "compiling" (its
first torch.compile'd step), it is hung only after restart.compile_timeout; a real `minilmd run` whose fake trainer
compiles for longer than hang_timeout is not killed, and one that overstays compile_timeout is."""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from minilmd.config import load_config
from minilmd.daemon.base.runstate import read_heartbeat
from minilmd.daemon.child import process as childmod
from minilmd.daemon.child import trainerwatch
from minilmd.names import HEARTBEAT
from minilmd.protocol import SUPERVISOR_GAVE_UP
from supervisor_helpers import events, run_supervisor, state, write_config


class FakeChild:
    """What hang_limit asks of a daemon.child.Child: whether a heartbeat is this attempt's."""

    def __init__(self, started: float):
        self.started = started

    def beats(self, beat) -> bool:
        return beat is not None and beat[0] >= self.started - 1


def test_a_compiling_heartbeat_of_this_attempt_gets_compile_timeout(tmp_path, corpus):
    cfg = load_config(write_config(tmp_path, corpus, remote=False,
                                   restart={"hang_timeout": "90s", "compile_timeout": "20m"}))
    cfg.run_dir.mkdir(parents=True)
    hb = cfg.run_dir / HEARTBEAT
    hb.write_text("12 compiling\n")
    assert read_heartbeat(cfg.run_dir)[1:4] == (12, "compiling", "")
    ours = FakeChild(started=time.time())
    assert trainerwatch.hang_limit(cfg, ours, read_heartbeat(cfg.run_dir)) == 1200.0
    earlier = FakeChild(started=time.time() + 3600)  # the file is an earlier attempt's: no allowance
    assert trainerwatch.hang_limit(cfg, earlier, read_heartbeat(cfg.run_dir)) == 90.0
    hb.write_text("13\n")
    assert read_heartbeat(cfg.run_dir)[1:4] == (13, "", "")
    assert trainerwatch.hang_limit(cfg, ours, read_heartbeat(cfg.run_dir)) == 90.0
    cfg.restart.compile_timeout = "1m"  # shorter than hang_timeout: never less than hang_timeout
    hb.write_text("13 compiling\n")
    assert trainerwatch.hang_limit(cfg, ours, read_heartbeat(cfg.run_dir)) == 90.0


def hangs(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "hang"]


@pytest.mark.slow
def test_a_compile_longer_than_hang_timeout_is_not_a_hang_but_one_past_compile_timeout_is(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 10, "checkpoint_every": 5},
                          restart={"hang_timeout": "1s", "compile_timeout": "30s", "backoff_initial": "0.1s"})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, FAKE_COMPILE_S="4") == 0
    assert hangs(cfg.run_dir) == [] and state(cfg.run_dir)["restarts"] == []

    config = write_config(tmp_path, corpus, name="over", remote=False, train={"max_steps": 10},
                          restart={"hang_timeout": "1s", "compile_timeout": "2s", "backoff_initial": "0.1s",
                                   "max_restarts": 0})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, FAKE_COMPILE_S="30") == SUPERVISOR_GAVE_UP  # no restarts allowed
    (hang,) = hangs(cfg.run_dir)
    assert "while compiling (restart.compile_timeout)" in hang["message"]
    assert [e["cause"] for e in events(cfg.run_dir) if e["event"] == "child_exit"] == ["hang"]


def test_a_compile_that_ends_between_two_reads_of_the_heartbeat_is_not_a_hang(tmp_path, corpus):
    """The tick reads the heartbeat once: on main kill_if_hung read it again for its phase, so a trainer whose
    "compiling" heartbeat (300 s old, within compile_timeout) was replaced by its first step's in between was
    judged by that old mtime against hang_timeout (90 s), and killed as hung though it had just beaten."""
    cfg = load_config(write_config(tmp_path, corpus, remote=False,
                                   restart={"hang_timeout": "90s", "compile_timeout": "20m"}))
    cfg.run_dir.mkdir(parents=True)
    child = childmod.launch([sys.executable, "-c", "import time; time.sleep(600)"], cfg.run_dir, 1, "")
    try:
        child.started -= 600  # launched ten minutes ago; compiling for the last five
        hb = cfg.run_dir / HEARTBEAT
        hb.write_text("12 compiling\n")
        os.utime(hb, (time.time() - 300, time.time() - 300))
        beat = read_heartbeat(cfg.run_dir)  # the tick's one reading
        hb.write_text("13\n")  # the compile ends: the first step's heartbeat, between the tick's reads on main
        said = []
        trainerwatch.kill_if_hung(cfg, child, beat, lambda kind, message, **_: said.append(message))
        assert child.killed_at is None and said == []
        os.utime(hb, (time.time() - 300, time.time() - 300))  # silent since that step: hung, by one reading too
        trainerwatch.kill_if_hung(cfg, child, read_heartbeat(cfg.run_dir), lambda kind, message, **_: said.append(
            message))
        # 300 s and whatever a loaded machine took between the utime and the check: the seconds are not asserted
        assert child.killed_at is not None and re.search(r"no heartbeat for 3\d\ds", said[0]), said
    finally:
        child.signal_group(signal.SIGKILL)
        child.popen.wait()
