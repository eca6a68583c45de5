"""systemd's STATUS line follows the trainer's step, not the phase alone: on main it said "training (first
heartbeat from attempt 1 (step 0))" for the whole run, while deploy/minilmd@.service promises "the phase and step".
The supervisor's notifier is told the step where the heartbeat and metrics.jsonl are read (daemon/runfiles.py), and
sends it at most every PROGRESS_EVERY_S, and only when the step moved. A real unix datagram socket stands in for
systemd's NOTIFY_SOCKET."""
from __future__ import annotations

import json
import socket

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.statesections import ChildInfo
from minilmd.daemon.host import sdnotify
from minilmd.daemon.host.sdnotify import Notifier
from minilmd.daemon.runfiles import RunFiles
from supervisor_helpers import write_config


@pytest.fixture
def notify_socket(tmp_path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(tmp_path / "notify"))
    server.settimeout(30)
    yield server
    server.close()


def _pending(server: socket.socket) -> list[str]:
    """The datagrams already sent (none waited for)."""
    said = []
    server.setblocking(False)
    try:
        while True:
            said.append(server.recv(4096).decode())
    except BlockingIOError:
        pass
    finally:
        server.settimeout(30)
    return said


def _trainer_logs(run_dir, step: int, loss: float) -> None:
    """What a trainer writes at a step: a metrics.jsonl train line and its heartbeat."""
    with open(run_dir / names.METRICS, "a") as f:
        f.write(json.dumps({"kind": "train", "step": step, "total_steps": 2000, "loss": loss}) + "\n")
    (run_dir / names.HEARTBEAT).write_text(f"{step}\n")


def test_status_says_the_step_as_it_advances(tmp_path, corpus, notify_socket, monkeypatch):
    cfg = load_config(write_config(tmp_path, corpus, remote=False))
    cfg.run_dir.mkdir(parents=True)
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify")})
    files = RunFiles(cfg, cfg.run_dir, tmp_path / "s.toml", echo=False, notifier=notifier)
    try:
        notifier.phase("u8sd", "training", "first heartbeat from attempt 1 (step 0)")
        assert notify_socket.recv(4096).decode() == "STATUS=u8sd: training (first heartbeat from attempt 1 (step 0))"

        monkeypatch.setattr(sdnotify, "PROGRESS_EVERY_S", 0.0)  # every tick may say a newer step
        _trainer_logs(cfg.run_dir, 120, 3.25)
        files.read_progress()
        assert notify_socket.recv(4096).decode() == "STATUS=u8sd: training, step 120/2000, loss 3.25"
        files.read_progress()  # the step has not moved: nothing new to say
        _trainer_logs(cfg.run_dir, 450, 2.5)
        files.read_progress()
        assert notify_socket.recv(4096).decode() == "STATUS=u8sd: training, step 450/2000, loss 2.5"
        assert _pending(notify_socket) == []

        monkeypatch.setattr(sdnotify, "PROGRESS_EVERY_S", 1e9)  # rate-limited: a step a tick is not sent
        _trainer_logs(cfg.run_dir, 451, 2.4)
        files.read_progress()
        assert _pending(notify_socket) == []
        notifier.phase("u8sd", "backoff", "trainer exited 1")  # a phase change is said at once
        assert _pending(notify_socket) == ["STATUS=u8sd: backoff (trainer exited 1)"]
        monkeypatch.setattr(sdnotify, "PROGRESS_EVERY_S", 0.0)
        files.read_progress()  # no step since the phase changed: its line and reason stay
        assert _pending(notify_socket) == []
    finally:
        files.events.close()


def test_a_dpo_reference_pass_is_said_in_status_and_in_supervisor_log_as_it_goes(tmp_path, corpus, notify_socket,
                                                                                  monkeypatch):
    """Found by a new user: through a DPO run's reference pass (hours on a big corpus, before step 1) STATUS said
    `training, step 0` and supervisor.log nothing; only the attempt log and `status` said how far it was. STATUS now
    says the pairs; supervisor.log each attempt's pass as first seen (a restart from pair 0 too, and one going on
    from the pairs a stopped pass kept), each quarter, and its end (the trainer's metrics line)."""
    cfg = load_config(write_config(tmp_path, corpus, remote=False))
    cfg.run_dir.mkdir(parents=True)
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify")})
    files = RunFiles(cfg, cfg.run_dir, tmp_path / "s.toml", echo=False, notifier=notifier)
    files.state.child = ChildInfo(pid=4242, attempt=1, started=1.0)  # its trainer runs (launched)
    monkeypatch.setattr(sdnotify, "PROGRESS_EVERY_S", 0.0)

    def beat(body: str) -> list[str]:
        (cfg.run_dir / names.HEARTBEAT).write_text(f"0 {names.HEARTBEAT_REFERENCE} {body}\n")
        files.read_progress()
        return _pending(notify_socket)

    try:
        notifier.phase("dpo", "training", "first heartbeat from attempt 1 (step 0)")
        notify_socket.recv(4096)
        bodies = ("96/2446/0/9", "400/2446/0/40", "896/2446/0/89", "900/2446/0/90")
        said = [line for body in bodies for line in beat(body)]
        assert said == [f"STATUS=dpo: training, DPO reference pass {done:,}/2,446 pairs"
                        for done in (96, 400, 896, 900)]
        assert beat("700/2446/0/2") == ["STATUS=dpo: training, DPO reference pass 700/2,446 pairs"]  # killed, again
        beat("1000/2446/896/3")  # a stopped pass's pairs kept: the next attempt goes on from them
        beat("2446/2446/896/50")
        with open(cfg.run_dir / names.METRICS, "a") as f:
            f.write(json.dumps({"kind": "dpo_reference", "step": 0, "pairs": 2446, "seconds": 50.2,
                                "source": "computed", "resumed_at": 896}) + "\n")
        _trainer_logs(cfg.run_dir, 1, 0.69)  # the pass done: the steps again
        files.read_progress()
        assert _pending(notify_socket) == ["STATUS=dpo: training, step 1/2000, loss 0.69"]
    finally:
        files.events.close()
    log = (cfg.run_dir / names.SUPERVISOR_LOG).read_text()
    assert [line.split("] ", 1)[1] for line in log.splitlines() if "DPO reference pass" in line] == [
        "DPO reference pass: 96/2,446 pairs (3%), before step 1",
        "DPO reference pass: 896/2,446 pairs (36%), before step 1",
        "DPO reference pass: 700/2,446 pairs (28%), before step 1",
        "DPO reference pass: 1,000/2,446 pairs (40%), before step 1; going on from the 896 pairs a stopped pass kept",
        "DPO reference pass: 2,446/2,446 pairs (100%), before step 1; going on from the 896 pairs a stopped pass kept",
        "DPO reference pass done: 2,446 pairs computed in 50s"], log


def test_a_step_that_is_no_int_is_never_said(tmp_path, notify_socket, monkeypatch):
    """metrics.jsonl is the trainer's file in run.dir, read as untrusted: a step that is a string, a bool or None
    sends nothing."""
    monkeypatch.setattr(sdnotify, "PROGRESS_EVERY_S", 0.0)
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify")})
    notifier.phase("r", "training", "x")
    notify_socket.recv(4096)
    for step in ("12; rm -rf", True, None, 1.5):
        notifier.progress(step, "2000", "nan")
    assert _pending(notify_socket) == []
    notifier.progress(7, True, 1)
    assert _pending(notify_socket) == ["STATUS=r: training, step 7"]


def test_a_notify_socket_no_one_reads_never_blocks_the_notifier(notify_socket, capsys):
    """Before: a blocking datagram send to a socket whose queue was full hung the supervisor's loop (and the
    watchdog it sends) for ever. Now a send that would block is dropped, said once, and the notifier returns."""
    import threading

    notifier = sdnotify.Notifier({"NOTIFY_SOCKET": notify_socket.getsockname()})
    results: list[bool] = []
    done = threading.Event()

    def fill() -> None:
        while len(results) < 100_000 and (not results or results[-1]):  # until a send is dropped
            results.append(notifier.send("STATUS=" + "x" * 1000))
        results.append(notifier.send("WATCHDOG=1"))
        done.set()

    threading.Thread(target=fill, daemon=True).start()
    assert done.wait(120), f"the notifier blocked after {len(results)} sends"
    assert results[-2:] == [False, False] and all(results[:-2]), results[-5:]
    said = capsys.readouterr().err
    assert said.count("is not read (its queue full)") == 1, said
