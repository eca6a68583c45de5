"""The supervisor's waiting_gpu phase against a scripted fake NVML, in process (the trainer is the fake one).

A busy card (another user's job) is never taken, a card must stay free for stable_polls polls, the lease reaches
the child as CUDA_VISIBLE_DEVICES, and a CUDA OOM while a foreign process sits on our card sends the run back to
waiting instead of halving the micro-batch.
"""
from __future__ import annotations

import signal
import threading

import pytest

from fakes_nvml import FREE, FakeNvml, busy
from minilmd.config import load_config
from minilmd.daemon.child.process import TRAINER_CMD_ENV
from minilmd.daemon.host.gpu import GpuAdmission
from minilmd.daemon.supervisor import Infra, Supervisor
from supervisor_helpers import FAKE_TRAINER, events, state, step_of_state, transitions, wait_for, write_config

pytestmark = pytest.mark.slow  # every test runs a supervised run to its end


class FakeGpuInfra(Infra):
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


@pytest.fixture
def supervise(monkeypatch):
    """Run a Supervisor in this process; restore the signal handlers it installs."""
    import sys

    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def run(config, nvml):
        sup = Supervisor(load_config(config), str(config), infra=FakeGpuInfra(nvml), echo=False)
        return sup.run()

    yield run
    for s, handler in saved.items():
        signal.signal(s, handler)


def gpu_config(tmp_path, corpus, **train):
    return write_config(tmp_path, corpus, remote=False,
                        train={"device": "cuda", "max_steps": 20, **train},
                        gpu={"count": 1, "poll_interval": "0.05s", "stable_polls": 3,
                             "lock_dir": str(tmp_path / "gpu-locks")})


def test_waits_for_a_stably_free_card_and_never_takes_a_busy_one(tmp_path, corpus, supervise, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    foreign = busy(used_mib=49500, procs=[(4242, 49500)])
    # GPU 0: another user's job for 8 polls, then free. GPU 1: flaps free/busy, never 3 free polls in a row.
    nvml = FakeNvml([[foreign] * 8 + [FREE], [FREE, FREE, busy(utilization=90)] * 20 + [busy(utilization=90)]])
    config = gpu_config(tmp_path, corpus)
    cfg = load_config(config)
    assert supervise(config, nvml) == 0
    evs = events(cfg.run_dir)
    waiting = [e["message"] for e in evs if e["event"] == "gpu"]
    assert waiting and "pid 4242" in waiting[0]
    acquired = [e for e in evs if e.get("new") == "staging"][0]
    assert acquired["devices"] == [0] and nvml.polls >= 8 + 3
    log = (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
    assert "CUDA_VISIBLE_DEVICES='GPU-fake-0000'" in log
    assert "CUBLAS_WORKSPACE_CONFIG=':4096:8'" in log  # train.deterministic: set before the trainer's CUDA starts
    assert state(cfg.run_dir)["phase"] == "done"


def test_cuda_oom_with_a_foreign_process_goes_back_to_waiting(tmp_path, corpus, supervise, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_S", "0.1")
    monkeypatch.setenv("MINILMD_FAULT", "oom@30")
    nvml = FakeNvml([[FREE]])
    config = gpu_config(tmp_path, corpus, max_steps=40)
    cfg = load_config(config)

    def another_user_arrives_then_leaves():
        wait_for(lambda: step_of_state(cfg.run_dir) >= 5, 60, "training")
        nvml.set(0, busy(used_mib=30000, procs=[(777, 30000)]))
        wait_for(lambda: transitions(cfg.run_dir).count("waiting_gpu") >= 1, 60, "back to waiting")
        seen = nvml.polls  # the supervisor, back in waiting_gpu, finds the card busy a few times before it leaves
        wait_for(lambda: nvml.polls >= seen + 3, 60, "three polls of the busy card", interval=0.01)
        nvml.set(0, FREE)

    helper = threading.Thread(target=another_user_arrives_then_leaves, daemon=True)
    helper.start()
    assert supervise(config, nvml) == 0
    helper.join(60)
    st = state(cfg.run_dir)
    assert [(r["cause"], r["action"]) for r in st["restarts"]] == [("cuda_oom", "wait_gpu")]
    assert st["overrides"] == {}  # not the micro-batch's fault: nothing halved
    assert transitions(cfg.run_dir).count("staging") == 2
