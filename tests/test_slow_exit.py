"""A finished run never ends as failed: a trainer that has finished its budget but is slow to exit (a slow NCCL
teardown) is not killed as hung while its heartbeat says `exiting` (restart.exit_timeout, not hang_timeout), and an
attempt that ends in any other way after that heartbeat, with the final checkpoint saved, is the run's finish, not
a restart that starts at the final step, saves nothing new and counts toward restart.no_progress_limit."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from minilmd import checkpoint
from minilmd.config import RestartSection, load_config
from minilmd.daemon.base.runstate import RunState, read_heartbeat
from minilmd.daemon.base.states import Action, Cause
from minilmd.daemon.child import trainerwatch
from minilmd.daemon.child.death import Death
from minilmd.daemon.child.policy import decide
from minilmd.names import HEARTBEAT, MANIFEST, step_name
from supervisor_helpers import events, run_supervisor, state, write_config


class FakeChild:
    """What trainerwatch asks of a daemon.child.Child: whether a heartbeat is this attempt's."""

    def __init__(self, started: float):
        self.started = started
        self.attempt = 1

    def beats(self, beat) -> bool:
        return beat is not None and beat[0] >= self.started - 1


def hangs(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "hang"]


def ends(run_dir: Path) -> list[str]:
    return [e["cause"] for e in events(run_dir) if e["event"] == "child_exit"]


def test_an_exiting_heartbeat_of_this_attempt_gets_exit_timeout(tmp_path, corpus):
    cfg = load_config(write_config(tmp_path, corpus, remote=False,
                                   restart={"hang_timeout": "90s", "exit_timeout": "20m"}))
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / HEARTBEAT).write_text("30 exiting\n")
    ours = FakeChild(started=time.time())
    assert trainerwatch.hang_limit(cfg, ours, read_heartbeat(cfg.run_dir)) == 1200.0
    earlier = FakeChild(started=time.time() + 3600)  # an earlier attempt's heartbeat: no allowance
    assert trainerwatch.hang_limit(cfg, earlier, read_heartbeat(cfg.run_dir)) == 90.0
    cfg.restart.exit_timeout = "1m"  # shorter than hang_timeout: never less than hang_timeout
    assert trainerwatch.hang_limit(cfg, ours, read_heartbeat(cfg.run_dir)) == 90.0


def test_an_end_after_the_exiting_heartbeat_with_the_final_checkpoint_saved_is_finished(tmp_path, corpus):
    cfg = load_config(write_config(tmp_path, corpus, remote=False))
    cfg.run_dir.mkdir(parents=True)
    saved = cfg.checkpoint_dir / step_name(30)
    saved.mkdir(parents=True)
    (saved / MANIFEST).write_text("{}")
    ours, earlier = FakeChild(started=time.time()), FakeChild(started=time.time() + 3600)
    said = []

    def finished(child, body: str) -> bool:
        (cfg.run_dir / HEARTBEAT).write_text(body)
        return trainerwatch.finished_before_end(cfg, child, RunState(tmp_path / "state.json", {}),
                                                lambda kind, message, **_: said.append(message))

    assert finished(ours, "30 exiting\n")
    assert "step 30" in said[-1]
    assert not finished(ours, "30\n")  # still training: a death is a death
    assert not finished(ours, "30 compiling\n")
    assert not finished(ours, "40 exiting\n")  # no checkpoint at step 40: it did not finish saving
    assert not finished(earlier, "30 exiting\n")  # an earlier attempt said it
    (saved / MANIFEST).unlink()
    assert not finished(ours, "30 exiting\n")  # gone from scratch and not on the remote
    on_remote = RunState(tmp_path / "state.json", {"remote_checkpoint": {"step": 30}})
    assert trainerwatch.finished_before_end(cfg, ours, on_remote, lambda *a, **k: None)


def test_the_policy_finishes_a_run_whose_trainer_had_finished():
    restart = RestartSection()
    death = Death(Cause.HANG, -9, "no heartbeat for 4s (restart.hang_timeout 3s)")
    common = {"restart": restart, "restarts_so_far": restart.max_restarts, "stop_requested": False,
              "micro_batch_size": 4, "grad_accum": 1}
    done = decide(death, no_progress_streak=restart.no_progress_limit, finished=True, **common)
    assert done.action == Action.FINISH and not done.counts_as_restart
    assert decide(death, no_progress_streak=1, **common).action == Action.FAIL  # without it: max_restarts reached


@pytest.mark.slow
def test_a_trainer_slower_to_exit_than_hang_timeout_finishes_the_run(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 10, "checkpoint_every": 5},
                          restart={"hang_timeout": "3s", "backoff_initial": "0.1s", "no_progress_limit": 2})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, FAKE_EXIT_LINGER_S="5") == 0
    assert hangs(cfg.run_dir) == [] and ends(cfg.run_dir) == ["done"]
    st = state(cfg.run_dir)
    assert st["restarts"] == [] and st["phase"] == "done"
    assert checkpoint.read_latest(cfg.run.remote) == step_name(10)


@pytest.mark.slow
def test_a_trainer_killed_while_exiting_and_one_that_starts_at_the_final_step_finish_the_run(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 10, "checkpoint_every": 5},
                          restart={"hang_timeout": "2s", "exit_timeout": "3s", "backoff_initial": "0.1s",
                                   "no_progress_limit": 1, "max_restarts": 0})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, FAKE_EXIT_LINGER_S="600") == 0
    (hang,) = hangs(cfg.run_dir)
    assert "while exiting (restart.exit_timeout)" in hang["message"]
    assert ends(cfg.run_dir) == ["hang"]
    st = state(cfg.run_dir)
    assert st["restarts"] == [] and st["phase"] == "done" and st["outcome"]["exit"] == 0
    assert checkpoint.read_latest(cfg.run.remote) == step_name(10)
    (finish,) = [e for e in events(cfg.run_dir) if e["event"] == "finish"]
    assert "step 10" in finish["message"]

    # `minilmd run` again on a run whose supervisor was killed before it recorded its last sync (a run done and
    # synced is no launch: daemon/jobs/rundone.py): its attempt starts at the final step and is as slow to exit
    recorded = state(cfg.run_dir)
    (cfg.run_dir / "state.json").write_text(json.dumps({**recorded, "remote_checkpoint": None, "outcome": None}))
    assert run_supervisor(config, tmp_path, FAKE_EXIT_LINGER_S="600") == 0
    assert "resuming at step 10" in (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    assert ends(cfg.run_dir) == ["hang", "hang"] and state(cfg.run_dir)["phase"] == "done"
