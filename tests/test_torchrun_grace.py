"""The grace a SIGTERM to the torchrun launcher gives its ranks before SIGKILL is the run's save grace
(names.TORCHRUN_GRACE_ENV, set by the supervisor from restart.hang_timeout: daemon/child/grace.py), the one a single
trainer gets, given by the launcher to the agent's close made while it handles that stop (trainer/loop/torchrun.py
`_give_grace`, `_record_rank_ends`; not torch's knob, which its agent also gives the close after any other error);
the agent's other closes (its stop of the other ranks once one has failed, its close after its own error) keep
torch's 30 s. Two real gloo ranks on CPU (tests/torchrun_ranks.py).

Before, torch's agent waited its own 30 s whatever the run's grace: a stop save of rank 0 longer than that was
SIGKILLed while a single trainer would have been waited for up to restart.hang_timeout (10 min by default).

Torch's 30 s is not waited out for a stop here (too slow on a small box): a grace set well under a save's 20
seconds cuts it, where torch's 30 s would have let it land (what fails on the old code), and one set well over them
lets it land. Outcomes only (the checkpoint on disk or not, who was SIGKILLed, the launcher ended), no timing.
"""
from __future__ import annotations

import os
import signal
import sys
from types import SimpleNamespace

import pytest

from minilmd import names, protocol
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import RestartSection, RunConfig, load_config
from minilmd.daemon.child.grace import save_grace, torchrun_grace_env
from minilmd.daemon.child.process import TRAINER_CMD_ENV
from minilmd.daemon.infra import Infra
from minilmd.daemon.supervisor import Supervisor
from minilmd.trainer.loop import torchrun
from supervisor_helpers import FAKE_TRAINER, write_config
from torchrun_ranks import ended, log_says, start
from waiting import wait_until

SAVE_S, GRACE_S = 20, 8
"""Rank 0's stop save: well over the run's grace, under torch's 30 s. The grace leaves rank 0 time to reach its step
boundary, agree the stop and begin its save on 2 busy cores (at 2 s, the agent's SIGKILL could come first)."""


@pytest.mark.slow  # two ranks to start, and GRACE_S: ~40 s
def test_a_stop_save_longer_than_the_runs_grace_is_cut_at_that_grace_not_torchs_30s(tmp_path, corpus):
    child, _, cfg, _ = start(tmp_path, corpus, {"SLOW_SAVE_S": str(SAVE_S), names.TORCHRUN_GRACE_ENV: str(GRACE_S)})
    rc, log = ended(child, lambda: child.signal_group(signal.SIGTERM))  # as the supervisor stops a trainer
    assert "rank 0: writing step" in log, log[-4000:]
    assert "rank 0: step" not in log.replace("rank 0: writing step", ""), log[-4000:]  # never written
    assert local_checkpoint_steps(cfg.checkpoint_dir) == [], log[-4000:]
    assert "rank 0: exiting" not in log, log[-4000:]  # SIGKILLed by the agent at the grace
    assert rc == 1, log[-4000:]  # not the 75 of a stop whose save landed


@pytest.mark.slow  # two ranks to start: ~30 s
def test_a_stop_save_within_a_large_grace_lands_and_the_job_exits_75(tmp_path, corpus):
    child, _, cfg, _ = start(tmp_path, corpus, {"SLOW_SAVE_S": "3", names.TORCHRUN_GRACE_ENV: "600"})
    rc, log = ended(child, lambda: child.signal_group(signal.SIGTERM))
    assert rc == protocol.EXIT_STOPPED, log[-4000:]
    steps = local_checkpoint_steps(cfg.checkpoint_dir)
    assert len(steps) == 1 and f"rank 0: step {steps[0]} written" in log, (steps, log[-4000:])
    assert "torchrun: stopped by SIGTERM; every rank exited 75: exit status 75" in log, log[-4000:]


def test_the_grace_is_the_runs_save_grace_in_whole_seconds_rounded_up():
    cfg = RunConfig(restart=RestartSection(hang_timeout="90.5s"))
    assert save_grace(cfg) == 90.5
    assert torchrun_grace_env(cfg) == {names.TORCHRUN_GRACE_ENV: "91"}


class RecordingInfra(Infra):
    """The real launch; each attempt's extra environment kept."""

    def __init__(self):
        self.envs: list[dict] = []

    def launch(self, command, run_dir, attempt, devices, compile_cache=None, extra_env=None):
        self.envs.append(dict(extra_env or {}))
        return super().launch(command, run_dir, attempt, devices, compile_cache=compile_cache, extra_env=extra_env)


@pytest.mark.slow  # a whole supervised run of the fake trainer: ~2 s
def test_the_supervisor_launches_every_trainer_with_the_runs_grace(tmp_path, corpus, monkeypatch):
    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    config = write_config(tmp_path, corpus, remote=False, restart={"hang_timeout": "7s"})
    infra = RecordingInfra()
    try:
        assert Supervisor(load_config(config), str(config), infra=infra, echo=False).run() == 0
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert infra.envs and all(env[names.TORCHRUN_GRACE_ENV] == "7" for env in infra.envs), infra.envs


TORCH_WAIT_S = 5
"""Torch's own 30 s before its SIGKILL, shortened for the test below (torchrun_ranks.LAUNCHER): it waits that wait out
and races nothing against it; the run's grace, 600 s, stays far beyond it and beyond the test's bound."""


@pytest.mark.slow  # two ranks to start, and torch's wait (TORCH_WAIT_S): ~25 s
@pytest.mark.parametrize("ending", ["rank_dies", "agent_raises"])
def test_after_a_ranks_death_or_the_agents_error_the_others_get_torchs_30s_not_the_runs_grace(tmp_path, corpus,
                                                                                              ending):
    """Rank 0, in an agreed stop, waits for its last write (which ignores the agent's SIGTERM as a rank stuck in a
    collective would) when rank 1 is SIGKILLed, or when the agent itself raises (as on a rendezvous or store error:
    its `finally` closes the ranks). The agent SIGKILLs rank 0 after its own wait (torch's 30 s, TORCH_WAIT_S here)
    and the launcher exits 1, a crash to restart; the run's grace (600 s here) would have held the restart past the
    test's bound (before, through torch's knob, the agent's error waited that grace: review10b F1)."""
    child, _, _, pids = start(tmp_path, corpus, {"SLOW_FINISH_S": "600", names.TORCHRUN_GRACE_ENV: "600"},
                              store_gone=ending == "agent_raises", torch_wait_s=TORCH_WAIT_S)

    def end_it():
        os.kill(int((pids / "rank1").read_text()), signal.SIGTERM)  # a stop both ranks agree on
        wait_until(lambda: log_says(child, "rank 0: waiting for its last write") and
                   log_says(child, "rank 1: in the exit barrier"), 300, "rank 0 in its wait, rank 1 at the barrier")
        if ending == "rank_dies":
            os.kill(int((pids / "rank1").read_text()), signal.SIGKILL)
        else:
            (pids / "store-gone").touch()

    rc, log = ended(child, end_it, timeout=300)  # the launcher ended: rank 0 is gone, and not by itself
    assert "rank 0: exiting" not in log and rc == 1, log[-4000:]
    assert ending == "rank_dies" or "the rendezvous store is gone (injected)" in log, log[-4000:]


def test_the_grace_is_given_only_to_the_close_made_while_a_stop_signal_is_handled(monkeypatch):
    """The two ways out of torch's SimpleElasticAgent.run, on a fake process context: the close inside its
    `except SignalException` gets the run's grace; the one in its `finally` after another exception keeps torch's
    30 s (torch's knob, TORCH_ELASTIC_SHUTDOWN_TIMEOUT, gave both the grace: review10b F1), and it is never set."""
    pytest.importorskip("torch")
    from torch.distributed.elastic.multiprocessing import SignalException, api

    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    waits: list[int] = []
    monkeypatch.setattr(api.PContext, "close", lambda self, death_sig=None, timeout=30: waits.append(timeout))
    torchrun._record_rank_ends(torchrun._give_grace("600"))
    close, pcontext = api.PContext.close, SimpleNamespace()  # the agent's ranks: none here
    try:
        raise SignalException("stop", signal.SIGTERM)
    except SignalException:
        close(pcontext, signal.SIGTERM, timeout=30)
    try:
        raise RuntimeError("the rendezvous store is gone")
    except RuntimeError:
        close(pcontext, timeout=30)
    close(pcontext, timeout=30)  # a close after the ranks' own end
    assert waits == [600, 30, 30] and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in os.environ


def test_a_grace_that_is_no_whole_number_of_seconds_keeps_torchs_30s():
    assert torchrun._give_grace("600") == 600
    for unset in ("", "-1", "2.5", "ten"):
        assert torchrun._give_grace(unset) is None
