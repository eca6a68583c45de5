"""Two "nodes" on loopback (tests/test_multinode.py, test_dpo_multinode.py): two torchrun processes on this machine
joined by torchrun's c10d rendezvous on 127.0.0.1, each in the restart loop docs/operations.md gives a server; and
the processes under a torchrun (`descendants`: its ranks run in sessions of their own)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ports import free_ports
from supervisor_helpers import env_for


def free_port() -> int:
    return free_ports(1)[0]


def node_command(config: Path, port: int, nnodes: int = 2, nproc: int = 1, local_addr: str | None = None) -> list[str]:
    """One server's torchrun in its restart loop, as docs/operations.md "More than one server" writes it. The
    rendezvous numbers the nodes in the order of their (local_addr, torchrun's pid): a test that needs rank 0 on one
    node gives the nodes addresses that sort ("127.0.0.1" before "localhost"); by default rank 0 goes to either."""
    addr = f"--local-addr {local_addr} " if local_addr else ""
    torchrun = (f"{sys.executable} -m torch.distributed.run --nnodes {nnodes} --nproc-per-node {nproc} "
                f"--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} --rdzv-id loopback --max-restarts 0 {addr}"
                f"-m minilmd.cli train {config}")
    return ["bash", "-c", f"trap 'echo \"stopped\"; exit 130' INT TERM; for attempt in 1 2 3; do {torchrun} && exit 0; "
                          f"echo \"restart $attempt\"; sleep 1; done; exit 1"]


NODES_END_S = 240
"""How long the nodes of one test get to end: 20-70 s on 2 cores beside other multi-node tests."""
STOP_S = 60
"""How long a torchrun SIGTERMed at the test's end gets to stop its ranks (torchrun's own grace is 30 s)."""
DUMP_S = 60
"""How long the processes SIGABRTed for their stacks (_dump_stacks) get to write them and die, at most."""


def run_nodes(commands: list[tuple[list[str], dict]], logs: Path) -> list[int]:
    """Each (command, extra environment) at once, output to logs/node<i>.log; their exit statuses. Nodes still
    running after NODES_END_S fail the test with the end of every log and, in it, the Python stack of every torchrun
    agent and rank still running (_dump_stacks: where each waited). Each runs in a
    session of its own, stopped as a whole at the end: a SIGKILL of bash alone left its torchrun, and torchrun's
    ranks (sessions of their own), training into the other tests' time."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for i, (command, env) in enumerate(commands):
            with open(logs / f"node{i}.log", "wb") as out:
                procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                              env=env_for(fake=False, PYTHONFAULTHANDLER="1", **env)))
        try:
            return [p.wait(NODES_END_S) for p in procs]
        except subprocess.TimeoutExpired:
            _dump_stacks(procs)
            _stop(procs)
            tails = "\n".join(f"--- {log.name} ---\n{log.read_text(errors='replace')[-8000:]}"
                               for log in sorted(logs.iterdir()))
            raise AssertionError(f"the nodes had not ended after {NODES_END_S} s; the end of each log, with the "
                                 f"Python stacks of their processes:\n{tails}") from None
    finally:
        _stop(procs)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each running node's session (bash's trap and torchrun, which stops its ranks), SIGKILL after
    STOP_S to whatever is left of it."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        os.killpg(p.pid, signal.SIGTERM)
    for p in running:
        try:
            p.wait(STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def descendants(pid: int) -> list[int]:
    """The processes under `pid` (Linux /proc), children before theirs; those that end meanwhile left out."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def _dump_stacks(procs: list[subprocess.Popen]) -> None:
    """SIGABRT to every Python process under each running node, its torchrun and ranks: each prints the stack of
    every thread into its node's log as it dies (faulthandler: PYTHONFAULTHANDLER=1 in their environment, and the
    trainer enables it too). A hang is then seen where it waited, not guessed at. Each is waited for until it has
    died of it (its dump written), up to DUMP_S: a fixed pause cut the dumps of a loaded machine short."""
    aborted = []
    for p in procs:
        if p.poll() is None:
            for pid in descendants(p.pid):
                try:
                    if Path(f"/proc/{pid}/exe").resolve().name.startswith("python"):
                        os.kill(pid, signal.SIGABRT)
                        aborted.append(pid)
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    pass
    deadline = time.monotonic() + DUMP_S
    while any(map(_running, aborted)) and time.monotonic() < deadline:  # no raise: the caller's failure is the news
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Not yet ended (a zombie has: its dump is written, it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"
