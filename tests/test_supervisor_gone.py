"""The trainer's watch for its supervisor's end (minilmd/supervisor_gone.py), on real processes: gone only when proven
gone (review10d F2: an EMFILE on the /proc read stopped a healthy trainer for good), and armed only once the
supervisor was seen alive (F3: a trainer in another pid namespace stopped at every start)."""
from __future__ import annotations

import errno
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd.names import RUN_DIR_ENV, SUPERVISOR_PROCESS_ENV
from minilmd.procs import process_start_ticks
from minilmd.supervisor_gone import SupervisorWatch, pid_namespace


def watch_of(pid: int, ticks: int, read=None, said: list[str] | None = None) -> SupervisorWatch:
    env = {RUN_DIR_ENV: "/a/run", SUPERVISOR_PROCESS_ENV: f"{pid} {ticks} {socket.gethostname()}"}
    return SupervisorWatch(env, read=read, say=(said if said is not None else []).append)


def look(watch: SupervisorWatch) -> bool:
    watch.next_check = 0.0  # each call a look of its own, not the once-a-second throttle
    return watch.gone()


def start_supervisor_stand_in() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ticks = process_start_ticks(proc.pid)
    assert ticks is not None
    return proc, ticks


def _emfile(path: str) -> str:
    raise OSError(errno.EMFILE, "Too many open files")


@pytest.mark.parametrize("failed_read", [_emfile, lambda path: "1 (py"], ids=["EMFILE", "torn"])
def test_a_failed_proc_read_is_not_known_and_not_kept(failed_read):
    """A /proc read that fails (EMFILE: review10d F2) or comes back cut short (review10e F7) is "not known": looked
    at again, never kept as gone."""
    supervisor, ticks = start_supervisor_stand_in()
    failing = [False]

    def read(path: str) -> str:
        return failed_read(path) if failing[0] else Path(path).read_text()

    try:
        watch = watch_of(supervisor.pid, ticks, read)
        assert not look(watch)  # seen alive: armed
        failing[0] = True
        assert not look(watch)
        failing[0] = False
        assert not look(watch) and not watch.ended
    finally:
        supervisor.stdin.close()
        supervisor.wait(60)
    assert look(watch), "the supervisor is gone now, proven"


def test_a_supervisor_never_seen_never_fires_and_is_said_once():
    supervisor, ticks = start_supervisor_stand_in()
    said: list[str] = []
    try:
        watch = watch_of(supervisor.pid, ticks + 1, said=said)  # another process under its pid, as another pid ns sees
        assert not look(watch)
        assert not look(watch)
    finally:
        supervisor.stdin.close()
        supervisor.wait(60)
    assert not look(watch)
    assert len(said) == 1 and "not seen from here" in said[0]


def test_a_supervisor_seen_then_ended_is_gone():
    supervisor, ticks = start_supervisor_stand_in()
    watch = watch_of(supervisor.pid, ticks)
    assert not look(watch)
    supervisor.stdin.close()
    supervisor.wait(60)
    assert look(watch) and "has ended" in watch.why()


def test_in_the_same_pid_namespace_a_supervisor_gone_before_the_first_look_is_gone():
    """The supervisor's namespace comes with its identity: in the same one the watch is armed from the start, so a
    supervisor killed before the trainer's first look (model build, compile, the DPO reference pass) is seen gone
    (review10e F2; before, the first look found nobody, took it for another namespace and turned the watch off)."""
    supervisor, ticks = start_supervisor_stand_in()
    env = {RUN_DIR_ENV: "/a/run",
           SUPERVISOR_PROCESS_ENV: f"{supervisor.pid} {ticks} {socket.gethostname()} {pid_namespace()}"}
    said: list[str] = []
    watch = SupervisorWatch(env, say=said.append)
    supervisor.stdin.close()
    supervisor.wait(60)
    assert look(watch) and not said


def test_in_another_pid_namespace_the_watch_is_off_and_said_once():
    supervisor, ticks = start_supervisor_stand_in()
    env = {RUN_DIR_ENV: "/a/run",
           SUPERVISOR_PROCESS_ENV: f"{supervisor.pid} {ticks} {socket.gethostname()} {pid_namespace() + 1}"}
    said: list[str] = []
    watch = SupervisorWatch(env, say=said.append)
    supervisor.stdin.close()
    supervisor.wait(60)
    assert not look(watch) and not look(watch)
    assert len(said) == 1 and "not seen from here" in said[0]


def test_a_torn_proc_read_is_a_value_error_never_an_index_error():
    """A /proc/PID/stat read cut short is "not known" (ValueError, as start_ticks_or_raise promises), and
    process_start_ticks answers None: before, an IndexError escaped both (review10e F7)."""
    from minilmd.procs import start_ticks_or_raise

    with pytest.raises(ValueError):
        start_ticks_or_raise(1, read=lambda path: "1 (init) S 0")
