"""A DPO run's reference pass that outlasts the supervisor's limits (found by a new user: the demo's pairs doubled,
restart.hang_timeout 30s): the pass wrote no heartbeat, so the supervisor killed it as hung after its start-up
grace, every restart computed it again from zero, and the run gave up (exit 79) before its first step. Each batch of
the pass now refreshes the heartbeat, and a long pass prints its progress."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from minilmd.config import load_config
from minilmd.daemon.child.trainerwatch import STARTUP_GRACE_S
from minilmd.names import ATTEMPT_LOGS, TRAINER_CMD_ENV
from minilmd.protocol import EXIT_DONE
from minilmd.trainer.loop.dpo_reference import PassProgress
from supervisor_helpers import events, run_supervisor, write_config
from trainer_corpus import read_metrics

SLOW_REFERENCE_TRAINER = Path(__file__).with_name("slow_reference_trainer.py")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_reference_pass_prints_its_progress_only_when_it_is_long(capsys):
    clock = Clock()
    progress = PassProgress(2446, printing=True, clock=clock)
    for _ in range(30):  # 240 pairs in 3 s: short, nothing said
        clock.now += 0.1
        progress.advance(8)
    assert capsys.readouterr().out == ""
    clock.now += 9.0  # 12 s in, a tenth more than at the start
    progress.advance(8)
    assert capsys.readouterr().out == "minilmd: DPO reference pass: 248/2,446 pairs, 12 s\n"
    clock.now += 20.0  # 20 s later, only 8 pairs more: not yet a tenth
    progress.advance(8)
    assert capsys.readouterr().out == ""
    clock.now += PassProgress.PROGRESS_MAX_S  # however slow, never silent for longer than this
    progress.advance(8)
    assert capsys.readouterr().out.startswith("minilmd: DPO reference pass: 264/2,446 pairs")
    clock.now += 60.0
    progress.advance(2446 - 264)  # the end: the caller's own line says it
    assert capsys.readouterr().out == "" and progress.elapsed() == pytest.approx(clock.now - 100.0)
    quiet = PassProgress(10, printing=False, clock=clock)  # a rank other than 0
    clock.now += 1000
    quiet.advance(5)
    assert capsys.readouterr().out == ""


@pytest.mark.slow  # a reference pass made to last past the supervisor's start-up grace (60 s), then 4 steps
def test_a_reference_pass_longer_than_the_hang_timeout_is_not_taken_for_a_hang(tmp_path, dpo_corpus):
    config = write_config(tmp_path, dpo_corpus, name="slowref", data={"val_windows": 8},
                          train={"seq_len": 128, "micro_batch_size": 1, "max_steps": 4, "checkpoint_every": 2},
                          restart={"hang_timeout": "5s", "no_progress_limit": 1, "max_restarts": 1})
    slow = f"{sys.executable} {SLOW_REFERENCE_TRAINER}"
    assert run_supervisor(config, tmp_path, timeout=600, fake=False, **{TRAINER_CMD_ENV: slow}) == EXIT_DONE, \
        (tmp_path / "supervisor.out").read_text()
    run_dir = load_config(config).run_dir
    assert not [e for e in events(run_dir) if e["event"] == "hang"]
    made = read_metrics(run_dir, "dpo_reference")
    assert len(made) == 1 and made[0]["source"] == "computed"
    assert made[0]["seconds"] > STARTUP_GRACE_S  # outlasted every limit the supervisor has before a first step
    log = (run_dir / ATTEMPT_LOGS / "attempt-0001.log").read_text()
    assert "minilmd: DPO reference pass: " in log and " pairs, " in log
