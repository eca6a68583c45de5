"""Helpers for the tests of GPU leases between two real Unix users (test_multiuser_leases, and the deep-JSON lease
of test_shared_places_attacks): the lease file of FakeNvml's device 0, the shared lock directory as an admin makes
it, an admission of this process, and one of `nobody` as a process of its own (its first line: leased or refused).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

from fakes_nvml import FREE, FakeNvml
from minilmd.config import GpuSection
from minilmd.daemon.host.gpu import GpuAdmission
from second_user import user_python

LEASE = "gpu-GPU-fake-0000.lock"  # the lease file of FakeNvml's device 0


def admission(lock_dir: Path, run: str = "victim") -> GpuAdmission:
    return GpuAdmission(FakeNvml([[FREE]]), GpuSection(lock_dir=str(lock_dir), stable_polls=1), run_name=run)


def admin_lock_dir(shared: Path) -> Path:
    """The shared lock directory as an admin makes it (docs/operations.md): root's, 1777."""
    locks = shared / "locks"
    locks.mkdir()
    locks.chmod(0o1777)
    return locks


HOLDER = textwrap.dedent("""
    import sys, time
    from fakes_nvml import FakeNvml, FREE
    from minilmd.config import GpuSection
    from minilmd.daemon.host.gpu import GpuAdmission
    adm = GpuAdmission(FakeNvml([[FREE]]), GpuSection(lock_dir=sys.argv[1], stable_polls=1), run_name=sys.argv[2])
    lease = adm.try_acquire(1)
    print("leased" if lease else "refused: " + adm.last_report.summary().replace("\\n", " | "), flush=True)
    if lease and sys.argv[3:] == ["hold"]:
        time.sleep(120)
""")


def nobody_run(lock_dir: Path, run: str, hold: bool = False) -> subprocess.Popen:
    argv = user_python(HOLDER, str(lock_dir), run, *(["hold"] if hold else []))
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")


@contextlib.contextmanager
def nobody_running(lock_dir: Path, run: str, hold: bool = False) -> Iterator[subprocess.Popen]:
    """nobody_run's process, stopped (stop) when the block ends, whatever the test found in it."""
    proc = nobody_run(lock_dir, run, hold)
    try:
        yield proc
    finally:
        stop(proc)


def first_line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline().strip()
    assert line, proc.stderr.read() if proc.poll() is not None else "no output"
    return line


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()


TAKER = textwrap.dedent("""
    import sys
    from fakes_nvml import FakeNvml, FREE
    from minilmd.config import GpuSection
    from minilmd.daemon.host.gpu import GpuAdmission
    adm = GpuAdmission(FakeNvml([[FREE]]), GpuSection(lock_dir=sys.argv[1], stable_polls=1), run_name="second")
    lease = adm.try_acquire(1)
    print("leased" if lease else "refused: " + adm.last_report.summary().replace("\\n", " | "), flush=True)
""")
"""A second run of this user, a process of its own: it polls once and tries to lease the one card; its one line says
whether."""


def second_run(lock_dir) -> str:
    """TAKER run in lock_dir: "leased", or "refused: " and its poll's summary on one line."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", TAKER, str(lock_dir)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
