"""A second stop signal (Ctrl-C twice) while the trainer saves on the first: the supervisor SIGKILLs it, and says so.

Observed before (user walk 5, during a DPO reference pass): `second stop signal: killing the trainer now, without
its save`, then the attempt `killed (exit -9): killed by SIGKILL from outside, not by the OOM killer (...)`. The
SIGKILL was the supervisor's own, and the save had landed (step 0 with 360 pairs, resumed from). Now the death says
who killed it, and the event says what scratch shows: a checkpoint saved since the first signal, or none (its save,
if it had not finished, is lost). Real supervisor, fake trainer held in its stop's save (FAKE_STOP_HOLD), real
SIGINTs.
"""
from __future__ import annotations

import signal

import pytest

from minilmd import names
from minilmd.config import load_config
from supervisor_helpers import start_supervisor, wait_for, wait_or_kill, write_config


def _second_ctrl_c(tmp_path, corpus, when: str) -> str:
    """Ctrl-C while the trainer holds at step 7 (a checkpoint at step 5 behind it, none due before the stop's),
    again once it holds its stop's save `when` ("before" or "after" it); the supervisor's output."""
    config = write_config(tmp_path, corpus, train={"max_steps": 100000, "checkpoint_every": 5},
                          restart={"hang_timeout": "300s"})  # no SIGKILL for a slow exit before the second signal
    cfg = load_config(config)
    release = tmp_path / "release"
    out = tmp_path / "sup.out"
    sup = start_supervisor(config, out, FAKE_HOLD=f"7:{tmp_path / 'never'}", FAKE_HOLD_STOPS="1",
                           FAKE_STOP_HOLD=f"{when}:{release}")
    try:
        wait_for(lambda: _heartbeat_step(cfg.run_dir) == "7" or sup.poll() is not None, 120, "the hold at step 7")
        sup.send_signal(signal.SIGINT)
        wait_for(lambda: (tmp_path / "release.holding").exists() or sup.poll() is not None, 120,
                 "the trainer holding its stop's save")
        assert sup.poll() is None, out.read_text()
        sup.send_signal(signal.SIGINT)
        wait_or_kill(sup, 120)
    finally:
        release.touch()  # a trainer the test left holding ends
        if sup.poll() is None:
            sup.kill()
    return out.read_text()


def _heartbeat_step(run_dir) -> str:
    try:
        return (run_dir / names.HEARTBEAT).read_text().split(maxsplit=1)[0].split("/")[0]  # "STEP/TOTAL"
    except (OSError, IndexError):
        return ""


@pytest.mark.slow
def test_a_second_ctrl_c_after_the_save_landed_says_it_landed_and_the_kill_was_the_supervisors(tmp_path, corpus):
    said = _second_ctrl_c(tmp_path, corpus, "after")
    assert "second stop signal: killed the trainer" in said, said
    assert "a checkpoint was saved since the first signal" in said, said
    assert "without its save" not in said and "is lost" not in said, said
    assert "killed by the supervisor on a second stop signal (SIGKILL)" in said, said
    assert "from outside" not in said, said


@pytest.mark.slow
def test_a_second_ctrl_c_before_the_save_landed_says_it_may_be_lost(tmp_path, corpus):
    said = _second_ctrl_c(tmp_path, corpus, "before")
    assert "no checkpoint was saved since the first signal: its save, if it had not finished, is lost" in said, said
    assert "killed by the supervisor on a second stop signal (SIGKILL)" in said, said
    assert "from outside" not in said, said
