"""Every node's scratch is locked, not only node 0's (minilmd/trainer_lock.py): two "nodes" of one torchrun job on
loopback (two real torchrun agents, c10d rendezvous on 127.0.0.1, the way tests/multinode_helpers.py starts them),
each rank a small worker that takes the trainer lock as the trainer does (trainer_lock.hold_for, torchrun's own
RANK, LOCAL_RANK, TORCHELASTIC_RUN_ID, MASTER_ADDR and MASTER_PORT) and then waits to be let go.

- each node with its own scratch (a real multi-node job's shape: a node's RAM or disk): each node's local rank 0
  holds its scratch's lock, so a `minilmd train` by hand on the node without rank 0 is refused naming that rank
  (before: only rank 0 took the lock, and the hand trainer on node 1 took node 1's unrefused);
- both nodes on one scratch (a by-hand rendezvous of two "nodes" on one host): both start, the second local rank 0
  finding the lock held by its own job, and a hand trainer is refused all the same.
A lock held by another job's rank is refused (unit test with real holder processes), and global rank 0 going on
beside its job's holder takes the lock once that holder exits."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import names, trainer_lock
from multinode_helpers import free_port
from supervisor_helpers import env_for
from waiting import wait_until

WORKER = """
import os, sys, time
from pathlib import Path
from types import SimpleNamespace
from minilmd import trainer_lock
out = Path(os.environ["LOCK_TEST_OUT"])
cfg = SimpleNamespace(scratch_dir=Path(os.environ["LOCK_TEST_SCRATCH"]), run_dir=Path(os.environ["LOCK_TEST_RUN"]))
trainer_lock.hold_for(cfg)
part = out / ("rank" + os.environ["RANK"] + ".part")  # renamed into place: a reader never sees it half written
part.write_text(f"{os.getpid()} {os.environ['LOCAL_RANK']} {len(trainer_lock._held)}")
part.rename(out / ("rank" + os.environ["RANK"]))
while not (out / "go").exists():
    time.sleep(0.05)
"""
"""A rank: the lock taken as the trainer takes it, then out/rankN = "pid local_rank held" (held: 1 if it holds a
lock), then it waits for out/go."""


def start_node(tmp_path: Path, port: int, addr: str, scratch: Path, out: Path) -> subprocess.Popen:
    """One node's torchrun of 2 ranks; `addr` orders the nodes ("127.0.0.1" before "localhost": node 0)."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "lockjob",
               "--max-restarts", "0", "--local-addr", addr, str(worker)]
    log = open(tmp_path / f"node-{addr}.log", "wb")
    with log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env_for(
            fake=False, LOCK_TEST_OUT=str(out), LOCK_TEST_SCRATCH=str(scratch), LOCK_TEST_RUN=str(tmp_path / "run")))


def hand_hold(scratch: Path, run_dir: Path) -> subprocess.CompletedProcess:
    """`minilmd train`'s lock by hand on that node (no torchrun): its own process."""
    return subprocess.run([sys.executable, "-c", "from pathlib import Path; from minilmd import trainer_lock; "
                           f"trainer_lock.hold(Path({str(scratch)!r}), Path({str(run_dir)!r}), False)"],
                          capture_output=True, text=True, timeout=120, env=env_for(fake=False))


def ranks(out: Path) -> dict[int, tuple[int, int, int]]:
    """rank: (pid, local rank, locks held) of each rank that has taken its lock."""
    found = {}
    for rank in range(4):
        if (out / f"rank{rank}").exists():
            pid, local, held = (int(x) for x in (out / f"rank{rank}").read_text().split())
            found[rank] = (pid, local, held)
    return found


def run_job(tmp_path: Path, scratches: tuple[Path, Path]):
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    nodes = [start_node(tmp_path, port, "127.0.0.1", scratches[0], out),
             start_node(tmp_path, port, "localhost", scratches[1], out)]
    return out, nodes, lambda: "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("node-*.log")))


def end_job(out: Path, nodes: list[subprocess.Popen], logs) -> None:
    (out / "go").write_text("")
    try:
        codes = [node.wait(120) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    assert codes == [0, 0], logs()[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["a-scratch-per-node", "one-scratch"])
def test_each_nodes_scratch_is_locked_and_a_hand_trainer_on_either_node_is_refused(tmp_path, shared):
    node0, node1 = tmp_path / "node0-scratch", tmp_path / "node1-scratch"
    scratches = (node0, node0) if shared else (node0, node1)
    for scratch in set(scratches):
        scratch.mkdir(mode=0o700)
    out, nodes, logs = run_job(tmp_path, scratches)
    try:
        wait_until(lambda: len(ranks(out)) == 4 or any(n.poll() is not None for n in nodes), 180, "the 4 ranks")
        taken = ranks(out)
        assert sorted(taken) == [0, 1, 2, 3], logs()[-4000:]  # every rank went on, none refused by its own job
        assert [taken[rank][1] for rank in range(4)] == [0, 1, 0, 1], taken  # node 0: ranks 0, 1 ("127.0.0.1")
        holders = sorted(rank for rank, (_, _, held) in taken.items() if held)
        # a scratch each: both local ranks 0 hold their own; one scratch: one of them holds it, for the job
        assert holders == [0, 2] if not shared else holders in ([0], [2]), taken
        for scratch, holder in ((scratches[0], holders[0]), (scratches[1], holders[-1])):
            hand = hand_hold(scratch, tmp_path / "run")
            assert hand.returncode != 0 and "another trainer already trains this run" in hand.stderr, hand.stderr
            assert f"pid {taken[holder][0]}" in hand.stderr, (hand.stderr, taken)
    finally:
        end_job(out, nodes, logs)


def hold_as_rank(scratch: Path, rank: int, local_rank: int, run_id: str) -> subprocess.Popen:
    """A torchrun rank's process (its environment as torchrun gives it) holding, or going on beside, the lock
    until its stdin closes; returns once it has taken it or gone on."""
    code = ("import sys; from pathlib import Path; from types import SimpleNamespace; "
            "from minilmd import trainer_lock; "
            f"trainer_lock.hold_for(SimpleNamespace(scratch_dir=Path({str(scratch)!r}), run_dir=Path('/r'))); "
            "print('on', flush=True); sys.stdin.read()")
    env = env_for(fake=False, RANK=str(rank), LOCAL_RANK=str(local_rank), TORCHELASTIC_RUN_ID=run_id,
                  MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
    assert child.stdout.readline().strip() == "on"
    return child


def test_a_node_rank_zero_of_another_job_is_refused_and_other_local_ranks_take_nothing(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    first = hold_as_rank(scratch, rank=2, local_rank=0, run_id="job-a")  # node 1's local rank 0 of job a
    try:
        for name, value in (("RANK", "2"), ("LOCAL_RANK", "0"), ("TORCHELASTIC_RUN_ID", "job-b"),
                            ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29999")):
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(trainer_lock, "JOB_BODY_WAIT_S", 0.2, raising=False)  # short: job b is refused
        with pytest.raises(trainer_lock.TrainerLockHeld, match=f"pid {first.pid}"):  # job b's node rank 0
            trainer_lock.hold_for(SimpleCfg(scratch))
        monkeypatch.setenv("RANK", "3")
        monkeypatch.setenv("LOCAL_RANK", "1")  # not a local rank 0: takes nothing, reads nothing
        trainer_lock.hold_for(SimpleCfg(scratch))
        assert not trainer_lock._held
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
        monkeypatch.setenv("RANK", "0")  # job a's rank 0 on this scratch: goes on, its node holds it for the job
        monkeypatch.setenv("LOCAL_RANK", "0")
        trainer_lock.hold_for(SimpleCfg(scratch))
        assert not trainer_lock._held  # not yet: rank 2 holds it
        first.stdin.close()  # rank 2 ends first (it has nothing to save); rank 0 still saves
        first.wait(60)
        # rank 0, the checkpoints' writer, holds the lock the moment rank 2 let go (review11a F2: before, nobody
        # held it while rank 0 saved, and a `minilmd train` by hand took it)
        wait_until(lambda: len(trainer_lock._held) == 1, 60, "rank 0 to hold the lock")
        hand = hand_hold(scratch, Path("/r"))
        assert hand.returncode != 0 and f"pid {os.getpid()}" in hand.stderr, hand.stderr
    finally:
        first.stdin.close()
        first.wait(60)
        trainer_lock.release_all()
    assert names.TRAINER_LOCK in os.listdir(scratch)


class SimpleCfg:
    def __init__(self, scratch: Path):
        self.scratch_dir, self.run_dir = scratch, Path("/r")
