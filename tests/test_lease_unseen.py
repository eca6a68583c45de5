"""A held lease's name that could not be looked at for a moment is said as such, never as a lease lost.

Before, leases.keep answered False for a walk to the lock directory that failed (a directory above it refused by the
place rule for a moment, EIO, EMFILE) as for a name gone: the run then tried to take its own lease's name again,
failed (the same fault, or its own flock on the file still named) and said the card lost: "... its name is not this
run's again (leased by run <itself>) / (lease not taken: Too many open files): another run may train on that GPU
now", as the run's last error. Now such a keep says it could not look (daemon/host/leasekeep.py Kept.UNSEEN), in a
`gpu` event only, and looks again at the next keep; the lease holds throughout. Real faults: a directory above the
lock directory made writable by everyone (the place rule refuses it), and a real EMFILE in a process of its own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from fakes_nvml import FREE, FakeNvml
from lease_helpers import LEASE, second_run
from minilmd.config import GpuSection, RunConfig
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.host.gpu import GpuAdmission
from minilmd.daemon.phases.gpuwait import GpuReady, GpuWaiter
from minilmd.procs import flock_holders


class _Infra:
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


def test_a_lock_directory_refused_for_a_moment_is_not_a_lost_lease_and_the_lease_holds(tmp_path):
    above = tmp_path / "above"
    above.mkdir(mode=0o755)
    locks = above / "locks"
    cfg = RunConfig()
    cfg.run.name = "first"
    cfg.gpu = GpuSection(lock_dir=str(locks), stable_polls=1, poll_interval="0s")
    said: list[tuple[str, str]] = []
    state = RunState(tmp_path / "state.json", {})
    waiter = GpuWaiter(cfg, _Infra(FakeNvml([[FREE]])), state, lambda kind, msg, **d: said.append((kind, msg)))
    assert isinstance(waiter.tick(), GpuReady)
    said.clear()  # the wait's own `gpu` event
    held = os.stat(locks / LEASE)
    try:
        above.chmod(0o777)  # anyone may rename the lock directory away now: the place rule refuses to look there
        for _ in range(3):
            waiter.keep_lease()
        assert len(said) == 1, said
        kind, words = said[0]
        assert kind == "gpu", said
        assert words.startswith(f"GPU 0: its lease file {locks / LEASE} could not be looked at ("), said
        assert "looked at again at the next keep" in words and "lost" not in words and "another run" not in words, said
        assert state.last_error is None  # no failure of the run: nothing is known to be wrong with its lease
        second = second_run(locks)  # nor does another run lease the card through that directory
        assert second.startswith("refused: ") and "lease not taken safely" in second, second
    finally:
        above.chmod(0o755)
    waiter.keep_lease()
    assert len(said) == 1, said  # seen again, still named: nothing to say
    now = os.stat(locks / LEASE)
    assert (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino) and os.getpid() in flock_holders(now)
    second = second_run(locks)
    assert second.startswith("refused: ") and f"leased by run first pid {os.getpid()}" in second, second
    above.chmod(0o777)
    waiter.keep_lease()  # refused again after a keep that saw all well: news again, said again
    above.chmod(0o755)
    assert len(said) == 2 and "could not be looked at" in said[1][1], said
    waiter.release()


EMFILE_KEEPER = textwrap.dedent("""
    import json, os, resource, sys
    from fakes_nvml import FakeNvml, FREE
    from minilmd.config import GpuSection
    from minilmd.daemon.host.gpu import GpuAdmission
    adm = GpuAdmission(FakeNvml([[FREE]]), GpuSection(lock_dir=sys.argv[1], stable_polls=1), run_name="first")
    lease = adm.try_acquire(1)
    assert lease is not None
    lowest = os.open("/dev/null", os.O_RDONLY)  # the lowest free descriptor: every one below it is open
    os.close(lowest)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))  # the next open fails: EMFILE, a real one
    try:
        during = adm.keep(lease)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    after = adm.keep(lease)
    print(json.dumps({"during": [[s.kind.value, s.words] for s in during],
                      "after": [[s.kind.value, s.words] for s in after]}), flush=True)
""")


def test_a_keep_out_of_descriptors_says_it_could_not_look_and_the_next_keep_finds_the_lease_its_own(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", EMFILE_KEEPER, str(tmp_path / "locks")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert len(seen["during"]) == 1, seen
    kind, words = seen["during"][0]
    assert kind == "not seen" and "could not be looked at" in words and "Too many open files" in words, seen
    assert seen["after"] == [], seen  # still named, its own: nothing to say
