"""The evidence that a SIGKILLed trainer was the OOM killer's (daemon/child/death.py `_sigkill_death` asks): the
child's memory cgroup counter of OOM kills, read before and after its death, and the kernel log's records of the
OOM killer taking its pid since it started. Under torchrun the OOM killer takes a rank, not the agent the supervisor
started: each rank (a child of the agent, of this launch) is recorded while it lives, its pid, start time and memory
cgroup, since after the kill it is gone. Torch-free.
"""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from minilmd import procs

HIERARCHY_ROOTS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
"""The memory cgroup hierarchies' roots as mounted: a counter there (in a container, the container's own group)
counts the OOM kills of every group below it, so a child seen there only while it dies is not watched through it."""


def oom_counter_file(pid: int) -> Path | None:
    """The file whose `oom_kill N` line counts OOM kills in the process's memory cgroup (v2 or v1)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / rel / "memory.oom_control"
            if candidate.exists():
                return candidate
        if controllers == "":
            for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                candidate = base / rel / "memory.events"
                if candidate.exists():
                    return candidate
    return None


def read_oom_kills(counter: Path) -> int | None:
    try:
        for line in counter.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


OOM_COUNTER_LAG_S = 1.0
"""How long a dead child's cgroup oom_kill counter is re-read before it counts as not risen: the kernel signals the
victim before it counts the kill, and a supervisor can reap the victim in between."""


def oom_kills_after(before: dict[Path, int]) -> dict[Path, int | None]:
    """Each counter's value now, re-read for up to OOM_COUNTER_LAG_S until one has risen."""
    deadline = time.monotonic() + OOM_COUNTER_LAG_S
    while True:
        after = {counter: read_oom_kills(counter) for counter in before}
        risen = any(value is not None and value > before[counter] for counter, value in after.items())
        if risen or all(value is None for value in after.values()) or time.monotonic() >= deadline:
            return after
        time.sleep(0.05)


KERNEL_LOG_SLACK_S = 5.0
"""How long before the child's start a kernel log record still counts as of it: printk's clock and CLOCK_MONOTONIC
agree to far less, and no pid is handed out again within it."""
_STAMP = re.compile(r"\[\s*(\d+(?:\.\d+)?)\]")


def kernel_log_oom(pids: list[int], started: float) -> list[int] | None:
    """Those of `pids` the kernel log records the OOM killer taking since the child started (`started`: its
    wall-clock start; one read of the log for the agent and its ranks); None when it cannot be read (dmesg missing,
    or refused: kernel.dmesg_restrict) or its records carry no time. Only records stamped after the start count: a
    pid is used again, and the log keeps an OOM kill of an earlier process of the same pid for as long as the machine
    runs (the CI's second Ctrl-C test was called OOM-killed by the record of another test's child of that pid, 23
    minutes older)."""
    try:
        done = procs.run_bounded(["dmesg"], 5, text=True)  # past 5 s its process group killed, through procs
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    since = time.monotonic() - (time.time() - started) - KERNEL_LOG_SLACK_S  # the start, in the log's seconds
    lines = done.stdout.splitlines()
    stamped = [(float(m[1]), line) for line in lines if (m := _STAMP.match(line))]
    if lines and not stamped:
        return None
    recent = [line for at, line in stamped if at >= since]
    return [pid for pid in pids
            if any(re.search(rf"Killed process {pid}\b|oom-kill:.*pid={pid}\b", line) for line in recent)]


RANK_SCAN_S = 1.0
"""How often a torchrun agent's ranks are looked for (a scan of /proc) until as many as it starts are found: once
found they are only re-read (their cgroup), at every tick. A rank OOM-killed within this of its start may be missed."""


@dataclass(frozen=True)
class Rank:
    """A torchrun worker seen alive: its pid and start ticks (its identity), and "rank N" from its environment."""

    pid: int
    ticks: int
    name: str


def expected_ranks(command: list[str]) -> int | None:
    """How many ranks the torchrun command starts on this host (--nproc_per_node N, --nproc-per-node=N); None when
    it does not say a number ("gpu", "auto"): then they are looked for at every RANK_SCAN_S."""
    for i, arg in enumerate(command):
        key, eq, value = arg.partition("=")
        if key in ("--nproc_per_node", "--nproc-per-node"):
            value = value if eq else (command[i + 1] if i + 1 < len(command) else "")
            return int(value) if value.isdigit() else None
    return None


def ranks_among(agent: int, launch: list[tuple[int, int]], known: set[int]) -> list[Rank]:
    """The processes of this launch (procs.Launch's proof: its run directory and launch id) whose parent is the
    agent: its workers, not a worker's own children (torch.compile's), which inherit the same environment. A child
    with no RANK in its environment is not counted yet: between the agent's fork and its exec it shows the agent's
    environment, and named then it would stay "a worker" for good; the next scan finds it as the rank it is."""
    found = []
    for pid, ticks in launch:
        if pid == agent or pid in known:
            continue
        try:
            fields = procs.stat_fields(pid)
        except (OSError, ValueError):
            continue
        if fields is None or fields[1] != str(agent):
            continue
        rank = procs.process_environ(pid).get("RANK", "")
        if rank.isdigit():
            found.append(Rank(pid, ticks, f"rank {rank}"))
    return found
