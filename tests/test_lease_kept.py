"""A GPU lease is an flock on the file at the lease's name in gpu.lock_dir (/tmp/minilmd-gpu-locks by default). A
cleaner that ages /tmp's files by their times (systemd-tmpfiles before v254, which takes no notice of an flock on a
file: systemd issue 30760, fixed by PR 27029; tmpwatch, tmpreaper, a cron `find -delete`) removes the file of a
lease held for days, or made long before by an earlier run and reused since: nothing wrote it while it was held.
Then the next run made a new file at the name, locked it and took the GPU the first run was training on. Now the
holder keeps its lease valid every few seconds (daemon/host/gpu.py GpuAdmission.keep, from the supervisor's
loop: daemon/phases/gpuwait.py keep_lease): the file touched through the held descriptor (its own; another user's
cannot be) and its name checked to still lead to it (lockfile.still_named), else the name taken again and said in
an event; a name another run took meanwhile is said plainly, in an event and as the run's last error."""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import pytest

from fakes_nvml import FREE, FakeNvml
from lease_helpers import LEASE, admin_lock_dir, admission, second_run
from minilmd.config import GpuSection, RunConfig, load_config
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.child.process import TRAINER_CMD_ENV
from minilmd.daemon.host import leases
from minilmd.daemon.host.gpu import GpuAdmission
from minilmd.daemon.host.leasekeep import Kept
from minilmd.daemon.phases.gpuwait import GpuReady, GpuWaiter
from minilmd.daemon.supervisor import Infra, Supervisor
from minilmd.procs import flock_holders
from second_user import sh_as_user, shared  # noqa: F401 - shared: a fixture
from supervisor_helpers import FAKE_TRAINER, events, state, write_config
from waiting import wait_until

OLD = 86400.0  # 1970-01-02: the times of a lease file made long ago by an earlier run, and reused since

def _held_by(path, pid: int) -> bool:
    try:
        return pid in flock_holders(os.stat(path))
    except FileNotFoundError:
        return False


def test_a_lease_file_removed_while_held_is_taken_again_and_a_second_run_is_refused(tmp_path):
    lock_dir = tmp_path / "locks"
    first_run = admission(lock_dir, "first")
    first = first_run.try_acquire(1)
    assert first is not None
    try:
        os.unlink(lock_dir / LEASE)  # the cleaner
        said = first_run.keep(first)
        assert len(said) == 1 and said[0].kind == Kept.AGAIN, said
        assert said[0].words.startswith(f"GPU 0: its lease file {lock_dir / LEASE} was removed while this run held it")
        assert said[0].words.endswith("its name taken again"), said
        assert _held_by(lock_dir / LEASE, os.getpid())
        assert first_run.keep(first) == []  # named again: nothing to say
        second = second_run(lock_dir)
        assert second.startswith("refused: ") and f"leased by run first pid {os.getpid()}" in second, second
    finally:
        first.release()
    assert second_run(lock_dir) == "leased"  # once the first lets go, the card is free again


def test_a_name_another_run_took_meanwhile_is_said_as_lost_and_taken_again_once_free(tmp_path):
    lock_dir = tmp_path / "locks"
    first_run = admission(lock_dir, "first")
    first = first_run.try_acquire(1)
    assert first is not None
    os.unlink(lock_dir / LEASE)
    second = admission(lock_dir, "second").try_acquire(1)  # before the first kept it: a new file, his lease
    assert second is not None
    try:
        said = first_run.keep(first)
        assert len(said) == 1 and said[0].kind == Kept.LOST, said
        assert f"its name is not this run's again (leased by run second pid {os.getpid()} on " \
               f"{socket.gethostname()}): another run may train on that GPU now" in said[0].words, said
    finally:
        second.release()
    assert [said.kind for said in first_run.keep(first)] == [Kept.AGAIN]  # free again: taken again
    assert _held_by(lock_dir / LEASE, os.getpid())
    first.release()


def test_a_held_lease_file_is_touched_its_own_and_another_users_left_as_it_is(tmp_path, shared):
    """Its own file, made long ago: touched, so a cleaner aging by times leaves it. Another user's (nobody's, in
    the admin's shared lock directory): not hers to touch (its times stay), still held while named."""
    lock_dir = tmp_path / "locks"
    run = admission(lock_dir)
    lease = run.try_acquire(1)
    assert lease is not None
    os.utime(lock_dir / LEASE, (OLD, OLD))
    assert run.keep(lease) == []
    assert os.stat(lock_dir / LEASE).st_mtime > OLD and os.stat(lock_dir / LEASE).st_atime > OLD
    lease.release()

    locks = admin_lock_dir(shared)
    sh_as_user(f"touch -d @{int(OLD)} {locks / LEASE} && chmod 644 {locks / LEASE}", cwd=shared)
    run = admission(locks)
    lease = run.try_acquire(1)
    assert lease is not None
    try:
        assert run.keep(lease) == [] and os.stat(locks / LEASE).st_mtime == OLD
        assert os.stat(locks / LEASE).st_size == 0  # his file: no body written
    finally:
        lease.release()


def test_keep_says_not_named_for_a_missing_lock_directory_and_makes_nothing(tmp_path):
    lock_dir = tmp_path / "locks"
    lease = leases.take(lock_dir, LEASE)
    assert lease is not None
    try:
        assert leases.keep(lease)
        os.unlink(lock_dir / LEASE)
        os.rmdir(lock_dir)  # a cleaner removes the emptied directory too
        assert not leases.keep(lease) and not lock_dir.exists()
    finally:
        lease.close()


class FakeGpuInfra(Infra):
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


def _supervise(config) -> int:
    """A Supervisor in this process on one free fake card, the fake trainer behind it; the signal handlers it
    installs put back after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)}
    try:
        return Supervisor(load_config(config), str(config), infra=FakeGpuInfra(FakeNvml([[FREE]])), echo=False).run()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.mark.slow
def test_the_supervisor_keeps_its_lease_while_training_and_a_second_run_never_gets_its_gpu(
        tmp_path, corpus, monkeypatch):
    """The whole run, its trainer held at step 5: the lease file made old is touched; removed, its name is taken
    again; a second run (a process of its own) is refused the card meanwhile. Before: no touch, the name stayed
    missing, and the second run leased the card the first was training on."""
    release = tmp_path / "release"
    monkeypatch.setenv("FAKE_HOLD", f"5:{release}")
    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")
    config = write_config(tmp_path, corpus, name="kept", remote=False, train={"device": "cuda", "max_steps": 10},
                          gpu={"poll_interval": "0.1s", "stable_polls": 1, "lock_dir": str(tmp_path / "gpu-locks")})
    cfg = load_config(config)
    path = tmp_path / "gpu-locks" / LEASE
    seen: dict[str, object] = {}

    def cleaner_then_second_run() -> None:
        try:
            mine = os.getpid()  # the supervisor runs in this process: its flock is this pid's
            wait_until(lambda: (state(cfg.run_dir) or {}).get("phase") == "training" and _held_by(path, mine),
                       timeout=120, what="the run training on its leased card")
            os.utime(path, (OLD, OLD))
            seen["touched"] = _eventually(lambda: os.stat(path).st_mtime > OLD)
            os.unlink(path)
            seen["taken_again"] = _eventually(lambda: _held_by(path, mine))
            seen["second"] = second_run(path.parent)
        except BaseException as e:  # noqa: BLE001 - said by the test, after the run
            seen["error"] = e
        finally:
            release.touch()

    cleaner = threading.Thread(target=cleaner_then_second_run)
    cleaner.start()
    try:
        assert _supervise(config) == 0
    finally:
        release.touch()
        cleaner.join(timeout=300)
    assert "error" not in seen, seen
    second = str(seen["second"])
    assert second.startswith("refused: ") and f"leased by run kept pid {os.getpid()}" in second, seen
    assert seen["touched"] and seen["taken_again"], seen
    said = [e["message"] for e in events(cfg.run_dir) if e["event"] == "gpu" and "lease file" in e["message"]]
    assert said and said[0].endswith("its name taken again"), said
    assert state(cfg.run_dir)["phase"] == "done"


def _eventually(condition, timeout: float = 60) -> bool:
    """Whether `condition` came true within `timeout` (False rather than a raise: the test says what it saw)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class _Infra:
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


def test_the_supervisors_waiter_says_a_lost_lease_once_as_an_event_and_its_last_error(tmp_path):
    """GpuWaiter.keep_lease, the supervisor's every tick: a name another run took is a `gpu` event and the run's
    last error (what `status` shows), said once while it stays so; taken again once free, said in an event."""
    cfg = RunConfig()
    cfg.run.name = "first"
    cfg.gpu = GpuSection(lock_dir=str(tmp_path / "locks"), stable_polls=1, poll_interval="0s")
    said: list[tuple[str, str]] = []
    state = RunState(tmp_path / "state.json", {})
    waiter = GpuWaiter(cfg, _Infra(FakeNvml([[FREE]])), state, lambda kind, msg, **d: said.append((kind, msg)))
    assert isinstance(waiter.tick(), GpuReady)
    said.clear()  # the wait's own `gpu` event
    waiter.keep_lease()
    assert said == []  # held, named: nothing to say
    os.unlink(tmp_path / "locks" / LEASE)
    second = admission(tmp_path / "locks", "second").try_acquire(1)
    assert second is not None
    try:
        for _ in range(3):
            waiter.keep_lease()
        assert len(said) == 1 and said[0][0] == "gpu" and "leased by run second pid" in said[0][1], said
        assert state.last_error == said[0][1]
    finally:
        second.release()
    waiter.keep_lease()
    assert len(said) == 2 and said[1][1].endswith("its name taken again"), said
    assert _held_by(tmp_path / "locks" / LEASE, os.getpid())
    waiter.release()
    assert second_run(tmp_path / "locks") == "leased"


def test_a_holder_with_a_long_poll_interval_keeps_its_lease_before_a_second_run_can_take_the_card(
        tmp_path, monkeypatch):
    """The keep's interval is not the holder's gpu.poll_interval when that is long: a run polling every hour (its
    admission's own choice) kept its lease an hour after a cleaner removed the file, while a second run leases a card
    after its own stable free polls (one, here; 90 s by default): two runs on one card. Now kept every
    LEASE_KEPT_EVERY_S at most. A fake clock: the waiter's `now`, moved on by hand."""
    from minilmd.daemon.phases import gpuwait

    clock = [1000.0]
    monkeypatch.setattr(gpuwait, "now", lambda: clock[0])
    cfg = RunConfig()
    cfg.run.name = "first"
    cfg.gpu = GpuSection(lock_dir=str(tmp_path / "locks"), stable_polls=1, poll_interval="1h")
    said: list[tuple[str, str]] = []
    waiter = GpuWaiter(cfg, _Infra(FakeNvml([[FREE]])), RunState(tmp_path / "state.json", {}),
                       lambda kind, msg, **d: said.append((kind, msg)))
    assert isinstance(waiter.tick(), GpuReady)
    try:
        waiter.keep_lease()  # the first tick after the lease
        os.unlink(tmp_path / "locks" / LEASE)  # the cleaner
        clock[0] += gpuwait.LEASE_KEPT_EVERY_S
        waiter.keep_lease()
        assert said and said[-1][1].endswith("its name taken again"), said
        assert _held_by(tmp_path / "locks" / LEASE, os.getpid())
        second = second_run(tmp_path / "locks")  # its one free poll: the card is the first's again
        assert second.startswith("refused: ") and f"leased by run first pid {os.getpid()}" in second, second
    finally:
        waiter.release()
