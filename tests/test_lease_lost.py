"""A card's lease lost to another run while this run holds it: the run does not share the card.

Admission reads the card's processes and memory too, so no run is admitted to a card this run's trainer is on; the
lease guards the moments it looks idle (staging, a backoff, a trainer starting). A second run that took the lease's
name in such a moment (the name removed, then taken by it before this run's next keep) is admitted and will train
there. Before, the run that lost the lease only said so and trained on beside it. Now, found lost at two keeps in a
row (GpuWaiter.lost), its trainer is asked to save and stop (SIGTERM) and the run goes back to waiting_gpu, where
the card is "leased by run second" until that run lets go; then it leases it again and resumes (daemon/attempt.py
_leave_lost_gpu). The second run's lease is made here as a real one: a lease file it took and flocks, renamed over
the name (what a cleaner's removal and the second run's new file at the name come to, without a race), never
touched by the first run.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading

import pytest

from fakes_nvml import FREE, FakeNvml
from lease_helpers import LEASE
from minilmd.config import GpuSection, RunConfig, load_config
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.child.process import TRAINER_CMD_ENV
from minilmd.daemon.host import leases
from minilmd.daemon.host.gpu import GpuAdmission
from minilmd.daemon.phases.gpuwait import GpuReady, GpuWaiter
from minilmd.daemon.supervisor import Infra, Supervisor
from minilmd.names import FAULT_ENV
from minilmd.procs import flock_holders
from supervisor_helpers import FAKE_TRAINER, events, state, write_config
from waiting import wait_until


def _taken_by_second(lock_dir) -> leases.LeaseFile:
    """The second run's lease of the card, a file of its own flocked and then named LEASE (rename over the first
    run's name): the name leads to a file another open file holds, as when a second run made one at a removed name."""
    theirs = leases.take(lock_dir, "second.lock")
    assert theirs is not None
    leases.write_body(theirs, leases.lease_body("second", socket.gethostname()))
    os.rename(lock_dir / "second.lock", lock_dir / LEASE)
    theirs.path = lock_dir / LEASE
    return theirs


class _Infra(Infra):
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


def test_a_lease_is_lost_only_when_found_so_at_two_keeps_in_a_row(tmp_path):
    cfg = RunConfig()
    cfg.run.name = "first"
    cfg.gpu = GpuSection(lock_dir=str(tmp_path / "locks"), stable_polls=1, poll_interval="0s")
    said: list[tuple[str, str]] = []
    waiter = GpuWaiter(cfg, _Infra(FakeNvml([[FREE]])), RunState(tmp_path / "state.json", {}),
                       lambda kind, msg, **d: said.append((kind, msg)))
    assert isinstance(waiter.tick(), GpuReady)
    theirs = _taken_by_second(tmp_path / "locks")
    waiter.keep_lease()
    assert waiter.lost == "" and any("leased by run second" in m for _, m in said), said  # said, not acted on yet
    theirs.close()  # a run that could not take all its cards lets go of this one at once
    waiter.keep_lease()
    assert waiter.lost == "" and said[-1][1].endswith("its name taken again"), said
    theirs = _taken_by_second(tmp_path / "locks")
    try:
        waiter.keep_lease()
        waiter.keep_lease()
        assert "leased by run second" in waiter.lost and "another run may train on that GPU now" in waiter.lost
    finally:
        theirs.close()
    waiter.keep_lease()
    assert waiter.lost == ""  # taken again: nothing lost any more
    waiter.release()



def test_a_two_card_run_that_loses_one_card_names_it_and_lets_both_go(tmp_path):
    """A run on two cards whose second card's lease another run holds now: found lost at two keeps in a row, that
    card alone is named; the run's trainer spans both, so the run lets both go (release: the first card's lease is
    free for any run at once), and the other run's lease file is left as it was, still its own."""
    cfg = RunConfig()
    cfg.run.name = "first"
    lock_dir = tmp_path / "locks"
    cfg.gpu = GpuSection(lock_dir=str(lock_dir), stable_polls=1, poll_interval="0s", count=2)
    waiter = GpuWaiter(cfg, _Infra(FakeNvml([[FREE], [FREE]])), RunState(tmp_path / "state.json", {}),
                       lambda kind, msg, **d: None)
    ready = waiter.tick()
    assert isinstance(ready, GpuReady) and ready.devices == [0, 1], ready
    theirs = leases.take(lock_dir, "second.lock")
    assert theirs is not None
    leases.write_body(theirs, leases.lease_body("second", socket.gethostname()))
    os.rename(lock_dir / "second.lock", lock_dir / LEASE.replace("0000", "0001"))
    try:
        waiter.keep_lease()
        waiter.keep_lease()
        assert waiter.lost.startswith("GPU 1: ") and "GPU 0" not in waiter.lost, waiter.lost
        assert "leased by run second" in waiter.lost, waiter.lost
        waiter.release()
        assert waiter.lost == "" and waiter.lease is None
        first = leases.take(lock_dir, LEASE)  # card 0: free at once
        assert first is not None
        first.close()
        probe = leases.open_lease(lock_dir, LEASE.replace("0000", "0001"))
        try:
            assert os.fstat(probe.fd).st_ino == os.fstat(theirs.fd).st_ino
            assert not leases.try_lock(probe, exclusive=False)  # still the second run's
        finally:
            probe.close()
    finally:
        theirs.close()

def _supervise(config) -> int:
    """A Supervisor in this process on one free fake card, the fake trainer behind it; its signal handlers put back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)}
    try:
        return Supervisor(load_config(config), str(config), infra=_Infra(FakeNvml([[FREE]])), echo=False).run()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.mark.slow
def test_a_run_whose_lease_another_run_took_stops_at_a_checkpoint_and_waits_for_the_card(
        tmp_path, corpus, monkeypatch):
    """The whole run, its trainer held at step 5: the second run takes the card's lease; the first run's trainer saves
    and stops, the run waits in waiting_gpu ("leased by run second"), never touching the second run's file; once the
    second lets go, it leases the card again and finishes from its checkpoint. Before: it trained on beside it."""
    release = tmp_path / "release"
    monkeypatch.setenv("FAKE_HOLD", f"5:{release}")
    monkeypatch.setenv("FAKE_HOLD_STOPS", "1")  # a SIGTERM ends the hold: the trainer saves and exits 75
    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")
    lock_dir = tmp_path / "gpu-locks"
    config = write_config(tmp_path, corpus, name="first", remote=False, train={"device": "cuda", "max_steps": 10},
                          gpu={"poll_interval": "0.1s", "stable_polls": 1, "lock_dir": str(lock_dir)})
    cfg = load_config(config)
    seen: dict[str, object] = {}

    def second_run_takes_the_card() -> None:
        try:
            mine = os.getpid()  # the supervisor runs in this process: its flock is this pid's
            wait_until(lambda: (state(cfg.run_dir) or {}).get("phase") == "training"
                       and mine in flock_holders(os.stat(lock_dir / LEASE)), timeout=120,
                       what="the run training on its leased card")
            theirs = _taken_by_second(lock_dir)
            file = os.stat(lock_dir / LEASE)
            try:
                seen["waiting"] = wait_until(
                    lambda: (s := state(cfg.run_dir) or {}).get("phase") == "waiting_gpu" and s.get("gpu_wait")
                    and "leased by run second" in str(s["gpu_wait"]), timeout=120,
                    what="the first run waiting for a GPU, the card leased by the second")
                now = os.stat(lock_dir / LEASE)
                seen["theirs_left_alone"] = (now.st_ino, now.st_mtime_ns) == (file.st_ino, file.st_mtime_ns)
            finally:
                release.touch()  # the resumed trainer is not held again
                theirs.close()  # the second run ends: the card is free
        except BaseException as e:  # noqa: BLE001 - said by the test, after the run
            seen["error"] = e
        finally:
            release.touch()

    second = threading.Thread(target=second_run_takes_the_card)
    second.start()
    try:
        assert _supervise(config) == 0
    finally:
        release.touch()
        second.join(timeout=300)
    assert "error" not in seen, seen
    assert seen["waiting"] and seen["theirs_left_alone"], seen
    said = [e["message"] for e in events(cfg.run_dir) if e["event"] == "gpu"]
    assert any("leased by run second" in m and "so as not to share that GPU, SIGTERM sent to trainer pid" in m
               for m in said), said
    final = state(cfg.run_dir)
    assert final["phase"] == "done" and final["progress"]["step"] == 10, final
    restarts = final["restarts"]
    assert [(r["cause"], r["action"]) for r in restarts] == [("stopped", "wait_gpu")], restarts
    assert restarts[0]["step"] >= 5 and "stopped on the supervisor's SIGTERM" in restarts[0]["detail"], restarts
    transitions = [e.get("transition") for e in events(cfg.run_dir)]
    assert "wait_for_gpu" in transitions and transitions.count("gpu_ready") == 2, transitions



@pytest.mark.slow
def test_a_stop_while_the_trainer_saves_for_a_lost_lease_wins(tmp_path, corpus, monkeypatch):
    """A SIGTERM to the supervisor while its trainer, asked to save and stop for a lost lease, is still saving: the
    stop wins. The trainer's end is the stop's (the run ends `done`, stopped on request), never a wait for a GPU or
    a restart; and the trainer is not sent a second SIGTERM (ending.py _ask_trainer_to_stop: before, the stop sent
    one more, which cut torch's agent's close of its ranks short and started it again, and the save grace too)."""
    release, save_hold = tmp_path / "release", tmp_path / "save-hold"
    monkeypatch.setenv("FAKE_HOLD", f"5:{release}")
    monkeypatch.setenv("FAKE_HOLD_STOPS", "1")
    monkeypatch.setenv("FAKE_STOP_HOLD", f"before:{save_hold}")  # its save held until the stop is taken
    monkeypatch.setenv("FAKE_SIGNALS_TO", str(tmp_path / "signals"))
    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")
    lock_dir = tmp_path / "gpu-locks"
    config = write_config(tmp_path, corpus, name="first", remote=False, train={"device": "cuda", "max_steps": 10},
                          gpu={"poll_interval": "0.1s", "stable_polls": 1, "lock_dir": str(lock_dir)},
                          restart={"hang_timeout": "300s"})
    cfg = load_config(config)
    seen: dict[str, object] = {}

    def second_run_takes_the_card_then_stop() -> None:
        try:
            mine = os.getpid()
            wait_until(lambda: (state(cfg.run_dir) or {}).get("phase") == "training"
                       and mine in flock_holders(os.stat(lock_dir / LEASE)), timeout=120,
                       what="the run training on its leased card")
            theirs = _taken_by_second(lock_dir)
            try:
                wait_until(lambda: save_hold.with_suffix(".holding").exists(), timeout=120,
                           what="the trainer, SIGTERMed for the lost lease, holding its save")
                signal.raise_signal(signal.SIGTERM)  # systemd's stop of the supervisor, in this process
                wait_until(lambda: (state(cfg.run_dir) or {}).get("phase") == "stopping", timeout=120,
                           what="the stop taken")
            finally:
                save_hold.touch()
                release.touch()
                theirs.close()
        except BaseException as e:  # noqa: BLE001 - said by the test, after the run
            seen["error"] = e
        finally:
            save_hold.touch()
            release.touch()

    second = threading.Thread(target=second_run_takes_the_card_then_stop)
    second.start()
    try:
        _supervise(config)
    finally:
        save_hold.touch()
        release.touch()
        second.join(timeout=400)
    assert "error" not in seen, seen
    final = state(cfg.run_dir)
    assert final["phase"] == "done" and final["restarts"] == [], final
    transitions = [e.get("transition") for e in events(cfg.run_dir)]
    assert "wait_for_gpu" not in transitions and transitions.count("gpu_ready") == 1, transitions
    assert any("stopped on request" in e["message"] for e in events(cfg.run_dir) if e.get("transition") == "stopped")
    assert (tmp_path / "signals").read_text() == "SIGTERM\n"  # the lost lease's only
    assert any("is saving already (asked to stop before)" in e.get("message", "") for e in events(cfg.run_dir))

@pytest.mark.slow
def test_a_lease_lost_between_two_trainers_launches_none_there_and_waits_for_the_card(tmp_path, corpus, monkeypatch):
    """The trainer killed at step 3 (an injected SIGKILL), the run in its backoff (10-20 s: time enough for the test
    to act however loaded the machine): the second run takes the card's lease. The relaunch does not happen on that
    card: the run goes to waiting_gpu, then leases it again once the second lets go, and finishes. Before: the next
    trainer was launched on the card the second run had been admitted to."""
    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")
    monkeypatch.setenv(FAULT_ENV, "sigkill@3")
    lock_dir = tmp_path / "gpu-locks"
    config = write_config(tmp_path, corpus, name="first", remote=False, train={"device": "cuda", "max_steps": 6},
                          gpu={"poll_interval": "0.1s", "stable_polls": 1, "lock_dir": str(lock_dir)},
                          restart={"backoff_initial": "20s", "backoff_max": "20s", "hang_timeout": "30s"})
    cfg = load_config(config)
    seen: dict[str, object] = {}

    def second_run_takes_the_card() -> None:
        try:
            wait_until(lambda: (state(cfg.run_dir) or {}).get("phase") == "backoff", timeout=120,
                       what="the run in its backoff after the injected SIGKILL")
            theirs = _taken_by_second(lock_dir)
            try:
                seen["waiting"] = wait_until(
                    lambda: (s := state(cfg.run_dir) or {}).get("phase") == "waiting_gpu"
                    and "leased by run second" in str(s.get("gpu_wait")), timeout=120,
                    what="the first run waiting for a GPU, the card leased by the second")
                seen["attempts"] = len(list((cfg.run_dir / "logs").glob("attempt-*.log")))
            finally:
                theirs.close()
        except BaseException as e:  # noqa: BLE001 - said by the test, after the run
            seen["error"] = e

    second = threading.Thread(target=second_run_takes_the_card)
    second.start()
    try:
        assert _supervise(config) == 0
    finally:
        second.join(timeout=300)
    assert "error" not in seen, seen
    assert seen["attempts"] == 1, seen  # no second trainer was launched on the card the second run leased
    moved = [e["message"] for e in events(cfg.run_dir) if e.get("transition") == "wait_for_gpu"]
    assert len(moved) == 1 and "leased by run second" in moved[0] and "no trainer is launched on that GPU" in moved[0]
    final = state(cfg.run_dir)
    assert final["phase"] == "done" and final["progress"]["step"] == 6, final
