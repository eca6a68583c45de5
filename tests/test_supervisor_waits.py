"""The supervisor never waits for a process without a bound, and its waits never starve the systemd watchdog.

Real processes and a real sd_notify socket throughout: a child that catches SIGTERM; a trainer that the kernel does
not release after SIGKILL (uninterruptible I/O on a stalled mount: the process is a `UnreapedPopen`, a real Popen
whose end stays invisible until the test lets it go, and whose wait without a timeout blocks as the real one
would); an orphaned trainer that ignores SIGTERM, so that the orphan hunt at start lasts its whole grace.
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from minilmd.config import load_config
from minilmd.daemon.child import trainerwatch
from minilmd.daemon.child.process import TRAINER_CMD_ENV, launch
from minilmd.daemon.infra import Infra
from minilmd.daemon.supervisor import Supervisor
from supervisor_helpers import FAKE_TRAINER, events, start_supervisor, state, wait_for, wait_or_kill, write_config


class NotifySocket:
    """systemd's end of $NOTIFY_SOCKET: a unix datagram socket; every datagram is kept with its arrival time."""

    def __init__(self, path):
        self.path = str(path)
        self.received: list[tuple[float, str]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            self.received.append((time.time(), data.decode()))

    def watchdog_times(self) -> list[float]:
        return [t for t, message in list(self.received) if "WATCHDOG=1" in message.split("\n")]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


class UnreapedPopen:
    """A real child's Popen whose end stays invisible until `release()`: how a process stuck in uninterruptible I/O
    looks to its parent, SIGKILL or not. A wait without a timeout blocks until the release, as it would for real,
    and is counted; a wait with one raises TimeoutExpired like Popen's."""

    def __init__(self, popen: subprocess.Popen):
        self.real = popen
        self.pid = popen.pid
        self.blocking_waits = 0
        self._released = threading.Event()

    def release(self) -> None:
        self._released.set()

    def poll(self) -> int | None:
        rc = self.real.poll()
        return rc if self._released.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            self.blocking_waits += 1
            self._released.wait()
            return self.real.wait()
        if self._released.wait(timeout):
            return self.real.wait(timeout)
        raise subprocess.TimeoutExpired(self.real.args, timeout)


@pytest.mark.slow
def test_kill_group_gives_a_child_that_catches_sigterm_its_grace_then_kills_it(tmp_path):
    code = ("import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('SIGTERM caught', flush=True)); "
            "print('ready', flush=True); time.sleep(600)")
    c = launch([sys.executable, "-c", code], tmp_path, 1, devices="")
    try:
        wait_for(lambda: "ready" in c.log_path.read_text().splitlines(), 30, "the child to install its handler")
        pings: list[float] = []
        started = time.monotonic()
        # a grace of 3 s: 60 polls of 0.05 s, so that 5 pings come even on a machine 10x slower
        assert c.kill_group(grace=3.0, while_waiting=lambda: pings.append(time.monotonic())) == -signal.SIGKILL
        assert time.monotonic() - started >= 3.0  # it had its grace...
        assert "SIGTERM caught" in c.log_path.read_text().splitlines()  # ...and used it to ignore SIGTERM
        assert len(pings) >= 5  # the caller (the watchdog) was called throughout
    finally:
        if c.popen.poll() is None:
            c.popen.kill()
            c.popen.wait()


@pytest.mark.slow
def test_kill_group_gives_up_on_a_child_the_kernel_does_not_release_instead_of_blocking(tmp_path):
    c = launch([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path, 1, devices="")
    held = c.popen = UnreapedPopen(c.popen)
    try:
        assert c.kill_group(grace=0.0, reap_s=0.5) is None  # not reaped within the bound: None, not a hang
        assert held.blocking_waits == 0 and c.killed_at is not None
        held.release()
        assert wait_for(lambda: c.poll(), 10, "the reap") == -signal.SIGKILL
    finally:
        held.release()
        if held.real.poll() is None:
            held.real.kill()
            held.real.wait()


class FirstAttemptUnreaped(Infra):
    """The real launch; the first attempt's process is an UnreapedPopen."""

    def __init__(self):
        self.held: UnreapedPopen | None = None

    def launch(self, command, run_dir, attempt, devices, compile_cache=None, extra_env=None):
        child = super().launch(command, run_dir, attempt, devices, compile_cache)
        if attempt == 1:
            child.popen = self.held = UnreapedPopen(child.popen)
        return child


@pytest.fixture
def in_process(monkeypatch):
    """Run a Supervisor in this process (the trainer is the fake one); restore the signal handlers it installs."""
    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def run(config, infra):
        return Supervisor(load_config(config), str(config), infra=infra, echo=False).run()

    yield run
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.slow
def test_a_hung_trainer_not_released_after_sigkill_never_freezes_the_loop_state_or_watchdog(tmp_path, corpus,
                                                                                          in_process, monkeypatch):
    monkeypatch.setattr(trainerwatch, "UNREAPED_REPORT_S", 0.5)
    monkeypatch.setenv("MINILMD_FAULT", "hang@12")
    notify = NotifySocket(tmp_path / "n.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", notify.path)
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # a ping at least every 0.2 s
    config = write_config(tmp_path, corpus, remote=False, restart={"hang_timeout": "1.5s", "backoff_initial": "0.1s"})
    cfg = load_config(config)
    infra = FirstAttemptUnreaped()
    seen: dict = {}

    def while_the_kernel_holds_it():
        try:
            wait_for(lambda: any(e["event"] == "kill" for e in events(cfg.run_dir)), 60,
                     "the loop to report the killed trainer as not reaped")
            since, updated = time.time(), state(cfg.run_dir)["updated"]
            wait_for(lambda: state(cfg.run_dir)["updated"] > updated + 1, 30, "state.json to be rewritten")
            wait_for(lambda: len([t for t in notify.watchdog_times() if t > since]) >= 3, 30, "watchdog pings")
            seen["phase"] = state(cfg.run_dir)["phase"]
        except AssertionError as e:
            seen["error"] = str(e)
        finally:
            seen["released"] = time.time()
            infra.held.release()  # the mount comes back: the kernel lets the process go

    observer = threading.Thread(target=while_the_kernel_holds_it, daemon=True)
    observer.start()
    try:
        assert in_process(config, infra) == 0
    finally:
        observer.join(10)
        notify.close()
    assert "error" not in seen, seen["error"]
    assert infra.held.blocking_waits == 0
    assert seen["phase"] == "training"  # still the killed attempt's phase: its end is not made up
    st = state(cfg.run_dir)
    assert [r["cause"] for r in st["restarts"]] == ["hang"] and st["phase"] == "done"
    first_end = [e for e in events(cfg.run_dir) if e["event"] == "child_exit"][0]
    assert first_end["cause"] == "hang" and first_end["time"] >= seen["released"]


@pytest.mark.slow
def test_the_orphan_hunt_at_start_keeps_feeding_the_watchdog(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, restart={"hang_timeout": "4s"})
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    # a trainer left by a killed supervisor that does not stop on SIGTERM: the hunt lasts its whole grace
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
           "time.sleep(120)"
    trainer = launch([sys.executable, "-c", code], cfg.run_dir, 1, devices="")  # recorded as the run's trainer
    orphan = trainer.popen
    notify = NotifySocket(tmp_path / "n.sock")
    try:
        wait_for(lambda: "ready" in trainer.log_path.read_text(), 30, "the orphan's start")
        proc = start_supervisor(config, tmp_path / "sup.out", NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="500000")
        assert wait_or_kill(proc, 120) == 0
        assert orphan.wait(60) == -signal.SIGKILL
    finally:
        notify.close()
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
    began, ended = [e["time"] for e in events(cfg.run_dir) if e["event"] == "orphan"]
    assert ended - began >= 4  # the grace (restart.hang_timeout), 16 watchdog intervals
    pings = [t for t in notify.watchdog_times() if began <= t <= ended]
    gaps = [b - a for a, b in zip([began, *pings], [*pings, ended], strict=True)]
    # without pings during the hunt: one gap of 4 s; pings only as it began: none in its second half. No bound on a
    # gap in seconds: a loaded machine may leave the supervisor unscheduled for one
    middle = (began + ended) / 2
    assert len([t for t in pings if t < middle]) >= 2 and len([t for t in pings if t >= middle]) >= 2, gaps
