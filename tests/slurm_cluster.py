"""A real one-node Slurm on localhost for the Slurm tests: munged, slurmctld and slurmd as root, every file of theirs
(key, sockets, state, spool, logs, slurm.conf) under one temporary directory.

`start(root)` answers a `Cluster` (SLURM_CONF to put in the environment of the client commands) or a sentence
saying why there can be none here (not root, Debian's slurm-wlm and munge not installed and not installable, a
daemon that does not come up): the Slurm tests skip with that sentence. `.ci/run` installs the packages (best
effort, as it does fuse3); `MINILMD_SLURM_INSTALL=1` lets this module try `apt-get install` itself. Nothing here
touches the machine's own munge or Slurm configuration: the daemons run with explicit paths and their own ports.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ports import free_ports

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
START_TIMEOUT_S = 120.0  # a loaded machine: slurmctld and slurmd start slowly, and a late start skips every test


@dataclass
class Cluster:
    root: Path
    conf: Path
    node: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    setup_s: float = 0.0
    """Seconds from start() to a node that takes jobs (the install, if one was needed, included)."""

    def env(self, **extra: str) -> dict:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for key in list(env):
            if key.startswith("SLURM_") and key != "SLURM_CONF":
                del env[key]  # the tests may themselves run inside a Slurm job: never leak its variables
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=self.env())
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {out.returncode}: {out.stdout}{out.stderr}")
        return out

    def job_field(self, job_id: str, key: str) -> str:
        """One `Key=Value` of `scontrol show job` ("" once Slurm has forgotten the job)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        for item in out.split():
            k, _, v = item.partition("=")
            if k == key:
                return v
        return ""

    def stop(self) -> None:
        """SIGTERM to each daemon started here (slurmd first), SIGKILL to one that has not ended after 10 s."""
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _install() -> str | None:
    if not shutil.which("apt-get"):
        return "no apt-get to install slurm-wlm and munge"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], capture_output=True, text=True, env=env,
                          timeout=600)
    return None if done.returncode == 0 else f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr[-300:]}"


def missing_reason() -> str | None:
    """Why this machine cannot run a Slurm of its own (None: it can)."""
    if os.geteuid() != 0:
        return "the Slurm tests start munged, slurmctld and slurmd as root; not root here"
    missing = [d for d in DAEMONS if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    if missing and os.environ.get("MINILMD_SLURM_INSTALL") == "1":
        problem = _install()
        if problem:
            return problem
        missing = [d for d in DAEMONS if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install {' '.join(PACKAGES)}; .ci/run does)"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def write_conf(root: Path, node: str, cpus: int, munge_socket: Path) -> Path:
    ports = free_ports(2)
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=minilmdtest",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "ReturnToService=2",
        # between Slurm's SIGTERM and its SIGKILL when it ends a job. The supervisor reads it (scontrol show config)
        # and cuts a save or last sync still running REQUEUE_MARGIN_S (20 s) before that SIGKILL, keeping those 20 s
        # for state.json and the requeue whatever KillWait is: more only lengthens the wait for a trainer that never
        # saves (held at step 10 through an admin's requeue in test_slurm_jobs: cut 20 s after the SIGTERM, not 100;
        # still more than Slurm's default 30 s, which the supervisor takes while scontrol has not told it this one)
        "KillWait=40",
        "SchedulerParameters=sched_interval=1",
        "MinJobAge=300",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
        "",
    ]))
    return conf


def _dies_with_us() -> list[str]:
    """A prefix that has the kernel SIGTERM the daemon when the process that started it (the pytest worker) ends,
    however it ends: a test run interrupted with Ctrl-C ends its xdist workers before the session fixture's teardown
    can run `stop`, and munged, slurmctld and slurmd (each in a session of its own) went on after the suite."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


def start(root: Path) -> Cluster | str:
    """A running one-node cluster under `root`, or why there is none."""
    began = time.monotonic()
    reason = missing_reason()
    if reason:
        return reason
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(exist_ok=True)
    os.chmod(root / "munge", 0o700)
    node = socket.gethostname().split(".")[0]
    munge_socket = root / "munge" / "munge.socket"
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    cluster = Cluster(root, write_conf(root, node, os.cpu_count() or 1, munge_socket), node)
    munged = subprocess.Popen([*_dies_with_us(), _exe("munged"), "--foreground", "--force", f"--socket={munge_socket}",
                               f"--key-file={key}", f"--pid-file={root / 'munge' / 'munged.pid'}",
                               f"--log-file={root / 'munge' / 'munged.log'}",
                               f"--seed-file={root / 'munge' / 'munged.seed'}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    cluster.procs.append(munged)
    env = cluster.env()
    for name in ("slurmctld", "slurmd"):
        log = open(root / f"{name}.out", "ab")
        proc = subprocess.Popen([*_dies_with_us(), _exe(name), "-D", "-f", str(cluster.conf)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        cluster.procs.append(proc)
        time.sleep(0.5)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        out = cluster.run("sinfo", "-h", "-N", "-o", "%t", check=False)
        if out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc"):
            cluster.setup_s = time.monotonic() - began
            return cluster
        time.sleep(0.5)
    cluster.stop()
    logs = " | ".join((root / f"{n}.out").read_text(errors="replace")[-300:] for n in ("slurmctld", "slurmd"))
    return f"the local Slurm did not come up within {START_TIMEOUT_S:.0f}s: {logs}"


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """One local Slurm per test process, shared by every test that asks for it (conftest.py imports it)."""
    cluster = start(tmp_path_factory.mktemp("slurm"))
    if isinstance(cluster, str):
        print(f"\nSlurm tests skipped: {cluster}")
        pytest.skip(cluster)
    print(f"\nlocal Slurm up in {cluster.setup_s:.1f}s (node {cluster.node}, {cluster.conf})")
    yield cluster
    cluster.stop()
