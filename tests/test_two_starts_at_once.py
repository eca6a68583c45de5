"""Two `minilmd run` of one config started at the same instant (fault11 F6): the launch claims scratch (and holds
its marker: minilmd/scratch_hold.py) just before the supervisor takes run.dir's lock, so the loser found scratch held
and no lock holder, and was refused (exit 2, right) with the words of a run whose run.dir was removed while it ran
(wrong: run.dir was there, its supervisor about to lock it). Now the refusal looks at run.dir's lock for a moment
and names the supervisor that holds it, as any start beside a running one is named. The winner here has locked
before the loser looks; its first look is made to find no holder (the instant between the winner's claim and its
lock), so the test takes the wait itself."""
from __future__ import annotations

import subprocess
import sys

import pytest

from minilmd.config import ConfigError, load_config
from minilmd.daemon import scratchclaim
from minilmd.daemon.scratchclaim import _settle_and_claim
from supervisor_helpers import write_config

WINNER = """import sys
from pathlib import Path
from minilmd import scratch, scratch_hold
from minilmd.daemon.host.lock import RunLock
scratch.claim(Path(sys.argv[1]), Path(sys.argv[2]), "s", False)
scratch_hold.hold(Path(sys.argv[1]))
print("scratch held", flush=True)
sys.stdin.readline()  # the test's word: take run.dir's lock now, as the winner's supervisor does next
lock = RunLock(Path(sys.argv[2]))
lock.acquire()
print("locked", flush=True)
sys.stdin.read()
"""


def test_the_loser_of_two_starts_at_once_is_told_of_the_running_supervisor_not_of_a_removed_run_dir(tmp_path,
                                                                                                   corpus,
                                                                                                   monkeypatch):
    looks = []

    def not_locked_at_the_first_look(run_dir):  # the winner between its claim and its lock: the loser looks again
        looks.append(run_dir)
        return None if len(looks) == 1 else real_lock_holder(run_dir)

    real_lock_holder = scratchclaim.lock_holder
    monkeypatch.setattr(scratchclaim, "lock_holder", not_locked_at_the_first_look)
    cfg = load_config(write_config(tmp_path, corpus))
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    winner = subprocess.Popen([sys.executable, "-c", WINNER, str(cfg.scratch_dir), str(cfg.run_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert winner.stdout.readline().strip() == "scratch held"
        winner.stdin.write("lock\n")
        winner.stdin.flush()
        assert winner.stdout.readline().strip() == "locked"  # the instant after its claim, as in a real race
        with pytest.raises(ConfigError) as refused:
            _settle_and_claim(cfg)
    finally:
        winner.stdin.close()
        winner.wait(timeout=60)
    said = str(refused.value)
    assert f"run already owned by another supervisor: pid {winner.pid}" in said, said
    assert "run.dir was removed" not in said, said  # before: "a run whose run.dir was removed while it ran ..."
    assert len(looks) >= 2  # named on a later look: the wait for the lock (scratchclaim.in_use_words) was taken
