"""The launch's wait for room for scratch (daemon/scratchclaim.py) keeps a supervisor's promises (review9c findings 1
and 2). Before, it waited before the run lock and systemd's READY: the unit's TimeoutStartSec killed it every 5 min
(its 5th start in an hour left the unit failed), and `minilmd stop` found nobody. Now the wait holds the run lock,
tells systemd READY with a STATUS line, and a SIGTERM ends it, exit 0, nothing started. A run.dir with no room for the
private root's record is exit 73 (RunDirFull), the root that try made removed; before, a wait blaming the private
root that left one more empty root in the base at every try.
Real tmpfs mounts (skipped where mounting is refused); another user's directories and files are a real uid's (64123,
no passwd entry), chowned by the test (root). systemd's socket is a datagram socket the test binds.
"""
from __future__ import annotations

import errno
import functools
import io
import os
import signal
import socket
import tempfile

import pytest

from minilmd import names
from minilmd.daemon import preflight
from minilmd.daemon.host.lock import lock_holder
from minilmd.daemon.views import stop as views_stop
from supervisor_helpers import start_supervisor, wait_or_kill, write_config
from tmpfs_helpers import OTHER, UID, base, fill_inodes, wait_for_words  # noqa: F401 - base: the tmpfs fixture


@pytest.fixture
def notify_socket(monkeypatch):
    """systemd's notify socket, as the unit gives it (NOTIFY_SOCKET, WATCHDOG_USEC), bound by the test; a short path
    (AF_UNIX's limit)."""
    where = tempfile.mkdtemp(prefix="ntf", dir="/tmp")
    path = os.path.join(where, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    try:
        yield sock
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(where)


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_the_wait_holds_the_run_lock_tells_systemd_and_ends_on_sigterm(base, tmp_path, corpus,
                                                                        notify_socket, monkeypatch, capsys):
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    fill_inodes(base)
    seen: dict[str, object] = {}
    before = signal.getsignal(signal.SIGTERM)

    def meanwhile(wait: float) -> None:  # `minilmd stop` while the launch waits: it finds the lock, SIGTERMs it
        if seen:
            return
        run_dir = tmp_path / "s" / "run"
        holder = lock_holder(run_dir)
        seen["holder"] = holder.pid if holder else None
        seen["told"] = received(notify_socket)
        if seen["holder"] != os.getpid():  # before: no lock, no handler either: a SIGTERM would end the tests
            raise AssertionError(f"the wait holds no run lock (holder {seen['holder']}): `stop` finds nobody")
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(preflight, "claim_scratch", functools.partial(preflight.claim_scratch, sleep=meanwhile))
    with pytest.raises(preflight.LaunchEnds) as ended:
        preflight.launch(str(config))
    assert seen["holder"] == os.getpid(), seen  # before: no lock while it waited (`stop`: "not running")
    told = "\n".join(seen["told"])
    assert "READY=1" in told and "STATUS=s: waiting for room for scratch (run.scratch" in told, told
    assert ended.value.exit_status == 0 and "STOPPING=1" in "\n".join(received(notify_socket))
    assert lock_holder(tmp_path / "s" / "run") is None and signal.getsignal(signal.SIGTERM) is before
    assert "stopped (SIGTERM) while waiting for room for scratch" in capsys.readouterr().out
    assert not [p for p in base.iterdir() if p.name.startswith("minilmd-")]  # nothing made in the base


def test_a_run_dir_with_no_room_for_the_private_roots_record_is_exit_73_and_leaves_no_root(tmp_path, corpus,
                                                                                          monkeypatch, capsys,
                                                                                          small_tmpfs):
    if UID != 0:
        pytest.skip("needs root to make another user's directory")
    full = small_tmpfs("1m", "nr_inodes=2")
    run_dir = full / "run"
    run_dir.mkdir()  # the tmpfs's last inode: no file can be made in run.dir now
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(shm))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    squat = shm / f"minilmd-{UID}"
    squat.mkdir()
    os.chown(squat, OTHER, OTHER)  # the default root his: the launch makes a private one and records it
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": "", "dir": str(run_dir)})

    def never(wait: float) -> None:
        raise AssertionError(f"waited ({wait}s) for room that run.dir, not the base, lacks")

    monkeypatch.setattr(preflight, "claim_scratch", functools.partial(preflight.claim_scratch, sleep=never))
    with pytest.raises(preflight.LaunchEnds) as ended:
        preflight.launch(str(config))
    assert ended.value.exit_status == 73, ended.value
    assert "is full" in capsys.readouterr().out
    assert sorted(p.name for p in shm.iterdir()) == [squat.name]  # the private root that try made: removed


def test_no_room_is_measured_where_a_hand_set_scratch_goes_not_in_base(base, tmp_path, monkeypatch):
    """An error naming no file (a marker's write, say) is measured at the scratch's own place: a run.scratch set by
    hand on a full tmpfs is said to be there, not in base (before: base's free space was named)."""
    from minilmd.daemon.scratchclaim import _no_room

    fill_inodes(base)
    elsewhere = tmp_path / "base"
    elsewhere.mkdir()
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(elsewhere))
    words = _no_room(OSError(errno.ENOSPC, "No space left on device"), base / "hand")
    assert f"{base} has no inode left" in words, words


def test_minilmd_stop_ends_a_launch_waiting_for_room(base, tmp_path, corpus):
    """`minilmd run` waiting for the inodes of a full base, a real process; `minilmd stop` finds it by the run lock,
    signals it (SIGUSR2), and it exits 0 having started nothing (before: `stop` said "not running" and the wait went
    on)."""
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    fill_inodes(base)
    log = tmp_path / "run.out"
    proc = start_supervisor(config, log)
    try:
        wait_for_words(log, "waits:", proc)
        out = io.StringIO()
        views_stop.stop(tmp_path / "s" / "run", timeout=120, out=out)
        assert "SIGUSR2 sent to supervisor pid" in out.getvalue(), out.getvalue()
        assert wait_or_kill(proc, 120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped (SIGUSR2) while waiting for room for scratch" in log.read_text(), log.read_text()
