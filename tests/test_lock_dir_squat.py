"""A gpu.lock_dir another user made first (anyone may `mkdir -m 1777 /tmp/minilmd-gpu-locks` before the first run)
is never leased through, and ends no run: hostile audit 6, F4. Before, `run --check` and the launch refused it with
exit 2, which systemd and the tmux launcher take as final: one mkdir stopped every user's GPU run for good. Now the
run waits in waiting_gpu, every device busy with the words naming the directory's owner and the admin's fix, and
leases by itself once the directory is gone. A real second user (nobody, through setpriv) makes it; the GPU is the
scripted fake NVML (tests/fakes_nvml.py), the trainer the fake one.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import threading

import pytest

from fakes_nvml import FREE, FakeNvml
from minilmd.daemon import preflight
from minilmd.daemon.child.process import TRAINER_CMD_ENV
from minilmd.daemon.host.gpu import GpuAdmission
from minilmd.daemon.supervisor import Infra, Supervisor
from second_user import sh_as_user as as_nobody
from second_user import shared  # noqa: F401 - a fixture
from supervisor_helpers import FAKE_TRAINER, events, state, wait_for, write_config

pytestmark = [pytest.mark.root, pytest.mark.slow]  # a supervised run to its end


class FakeGpuInfra(Infra):
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


def test_a_lock_dir_another_user_made_first_is_waited_for_never_used_and_the_run_leases_once_it_is_gone(
        shared, tmp_path, corpus, monkeypatch):
    as_nobody("mkdir -m 1777 locks", shared)
    locks = shared / "locks"
    config = write_config(tmp_path, corpus, remote=False, train={"device": "cuda", "max_steps": 20},
                          gpu={"count": 1, "poll_interval": "0.05s", "stable_polls": 1, "lock_dir": str(locks)})
    # this machine may have no NVIDIA driver: the fake NVML below is the GPU, so the launch's driver check is not asked
    monkeypatch.setattr(preflight, "device_problems", lambda cfg: [])
    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")

    cfg, waits = preflight.check_with_waits(str(config))  # before: ConfigError, exit 2 (final)
    said = [w for w in waits if w.startswith("gpu.lock_dir:")]
    assert said and f"{locks} belongs to user nobody" in said[0] and "the run waits in waiting_gpu" in said[0], waits
    assert "install -d -m 1777 -o root -g root" in said[0]  # the admin's fix
    cfg, resumes, _ = preflight.launch(str(config))

    seen: dict[str, object] = {}

    def admin_removes_it_once_the_run_waits_for_it():
        def waiting():
            return [e["message"] for e in events(cfg.run_dir) if e["event"] == "gpu"
                    and "lease not taken safely" in e["message"]]
        try:
            seen["waiting"] = wait_for(waiting, timeout=120, what="the run waiting for the lock directory")
            seen["in his directory"] = sorted(os.listdir(locks))
            seen["phase"] = state(cfg.run_dir)["phase"]
        finally:  # the admin (root) removes it; the next poll makes the run's own and leases
            shutil.rmtree(locks, ignore_errors=True)

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    admin = threading.Thread(target=admin_removes_it_once_the_run_waits_for_it, daemon=True)
    admin.start()
    try:
        status = Supervisor(cfg, str(config), infra=FakeGpuInfra(FakeNvml([[FREE]])), echo=False,
                            resumes=resumes).run()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    admin.join(timeout=10)
    assert status == 0 and state(cfg.run_dir)["phase"] == "done", events(cfg.run_dir)[-5:]
    assert seen["phase"] == "waiting_gpu" and seen["in his directory"] == []  # waited; no lease file made in his
    message = seen["waiting"][0]
    assert f"{locks} belongs to user nobody" in message and "install -d -m 1777" in message, message
    leased = [e for e in events(cfg.run_dir) if e.get("new") == "staging"]
    assert leased and leased[0]["devices"] == [0]
    st = os.lstat(locks)  # made again by the run, root's (the user's own), shared like /tmp
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o1777 and os.listdir(locks) == ["gpu-GPU-fake-0000.lock"]
