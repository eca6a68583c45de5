"""The grace a SIGTERM to the torchrun launcher gives its ranks before SIGKILL is the run's save grace
(names.TORCHRUN_GRACE_ENV, set by the supervisor from restart.hang_timeout: daemon/child/grace.py), the one a single
trainer gets, through torch's knob (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) or, on a torch without it, the launcher's
fallback (trainer/loop/torchrun.py `_give_grace`). Two real gloo ranks on CPU (tests/torchrun_ranks.py).

Before, torch's agent waited its own 30 s whatever the run's grace: a stop save of rank 0 longer than that was
SIGKILLed while a single trainer would have been waited for up to restart.hang_timeout (10 min by default).

Torch's 30 s is not waited out here (too slow on a small box): a grace set well under a save's few seconds cuts it,
where torch's 30 s would have let it land (what fails on the old code), and one set well over them lets it land.
Outcomes only (the checkpoint on disk or not, who was SIGKILLed), no timing.
"""
from __future__ import annotations

import signal
import sys

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
from torchrun_ranks import ended, start

SAVE_S = 12
"""Rank 0's stop save: well over the small grace, well under torch's 30 s."""


@pytest.mark.slow  # two ranks to start, and SAVE_S: ~40 s
@pytest.mark.parametrize("knob", [True, False], ids=["torch_knob", "fallback"])
def test_a_stop_save_longer_than_the_runs_grace_is_cut_at_that_grace_not_torchs_30s(tmp_path, corpus, knob):
    child, _, cfg, _ = start(tmp_path, corpus, {"SLOW_SAVE_S": str(SAVE_S), names.TORCHRUN_GRACE_ENV: "2"},
                             knob=knob)
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


@pytest.mark.parametrize("knob", [True, False])
def test_the_grace_goes_to_torchs_knob_where_it_has_one_else_to_the_launchers_own_close(monkeypatch, knob):
    monkeypatch.setattr(torchrun, "torch_takes_grace", lambda: knob)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert torchrun._give_grace("600") == (None if knob else 600)
    assert torchrun.os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") == ("600" if knob else None)
    for unset in ("", "-1", "2.5", "ten"):  # torch's own default kept
        monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
        assert torchrun._give_grace(unset) is None and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in torchrun.os.environ

