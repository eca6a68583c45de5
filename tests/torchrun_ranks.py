"""Two real gloo ranks (CPU) under the one torchrun launcher (trainer/loop/torchrun.py), launched as the supervisor
launches an attempt (daemon/child/process.py launch: its own session, output to the attempt log), each rank
`minilmd train` behind a wrapper (RANKS) whose hooks the tests steer through the environment. Shared by
test_torchrun_stops.py, test_torchrun_grace.py and test_torchrun_exit_barrier.py."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from minilmd import names
from minilmd.config import RunConfig, load_config
from minilmd.daemon.base.runstate import read_heartbeat
from minilmd.daemon.child.process import Child, launch
from minilmd.scratch import claim
from trainer_corpus import write_config
from waiting import wait_until

RANKS = """
import atexit, os, sys, time
from pathlib import Path
rank = os.environ["RANK"]
pids = Path(os.environ["RANK_PIDS"])
(pids / ("rank" + rank)).write_text(str(os.getpid()))
if rank == "0" and os.environ.get("SLOW_SAVE_S"):
    from minilmd.trainer.checkpoint import save
    write = save.AsyncCheckpointer._write
    def slow_write(self, step, *args):
        print(f"rank 0: writing step {step} slowly", flush=True)
        time.sleep(float(os.environ["SLOW_SAVE_S"]))
        write(self, step, *args)
        print(f"rank 0: step {step} written", flush=True)
    save.AsyncCheckpointer._write = slow_write
if rank == "0" and os.environ.get("SLOW_FINISH_S"):
    from minilmd.trainer.loop import saving
    wait = saving.Saves.wait
    def slow_wait(self):
        print("rank 0: waiting for its last write, slowly", flush=True)
        time.sleep(float(os.environ["SLOW_FINISH_S"]))
        wait(self)
    saving.Saves.wait = slow_wait
if rank == "1":
    from minilmd.trainer.loop import saving
    barrier = saving.Saves.exit_barrier
    def watched_barrier(self):
        if os.environ.get("HOLD_EXIT_BARRIER"):
            print("rank 1: held before the exit barrier", flush=True)
            while not (pids / "go").exists():
                time.sleep(0.05)
        print("rank 1: in the exit barrier", flush=True)
        barrier(self)
    saving.Saves.exit_barrier = watched_barrier
atexit.register(lambda: print(f"rank {rank}: exiting", flush=True))
from minilmd.cli import main
sys.argv[0] = "minilmd"
main()
"""
"""`python -m minilmd.cli` for each rank, its pid in RANK_PIDS/rankN. With SLOW_SAVE_S, rank 0's checkpoint writes
(the background thread's) take that much longer, and say when they begin and end. With SLOW_FINISH_S, rank 0's
wait for its last write before an exit (Saves.wait, in Saves.finish: whether that step was saved before or not)
takes that much longer, and says so. Rank 1 says when it enters the exit barrier (Saves.exit_barrier); with
HOLD_EXIT_BARRIER it waits before it until RANK_PIDS/go exists. Every rank says when it exits (atexit: not on a
SIGKILL)."""

LAUNCHER = """
import os
from pathlib import Path
from torch.distributed.elastic.agent.server import local_elastic_agent
from torch.distributed.elastic.multiprocessing import api
if os.environ.get("TORCH_WAIT_S"):
    close = api.PContext.close
    def torch_wait_shortened(self, death_sig=None, timeout=30):
        close(self, death_sig, int(os.environ["TORCH_WAIT_S"]) if timeout == 30 else timeout)
    api.PContext.close = torch_wait_shortened
if os.environ.get("STORE_GONE"):
    monitor = local_elastic_agent.LocalElasticAgent._monitor_workers
    def failing_monitor(self, group):
        if (Path(os.environ["RANK_PIDS"]) / "store-gone").exists():
            raise RuntimeError("the rendezvous store is gone (injected)")
        return monitor(self, group)
    local_elastic_agent.LocalElasticAgent._monitor_workers = failing_monitor
from minilmd.trainer.loop import torchrun
torchrun.main()
"""
"""trainer/loop/torchrun.py with torch's agent changed, as the environment asks:
- TORCH_WAIT_S: torch's own 30 s between a close's SIGTERM to the ranks and its SIGKILL is that many seconds,
  wherever the close got it from (PContext.close's default, the agent's _shutdown's, LaunchConfig.shutdown_timeout's),
  below the launcher's own wrapper of the close (trainer/loop/torchrun.py _record_rank_ends), so that the run's
  grace that wrapper gives a stop's close, or any other wait than 30 s, is kept as asked. For the tests that wait
  torch's 30 s out, or need a rank SIGKILLed by it, racing nothing against it;
- STORE_GONE: the agent raises, once RANK_PIDS/store-gone exists, in its watch of the ranks, as it does when its
  rendezvous store fails: an exception other than a stop signal, with the ranks still running."""


def start(tmp_path: Path, corpus, extra: dict, attempt: int = 1, store_gone: bool = False,
          train: dict | None = None, torch_wait_s: int | None = None) -> tuple[Child, Path, RunConfig, Path]:
    """Launch the two ranks; `extra`: the hooks' environment (and names.TORCHRUN_GRACE_ENV). A later `attempt` in the
    same tmp_path is a restart of the same run. `store_gone`: the launcher whose agent raises once the pids
    directory holds `store-gone`; `torch_wait_s`: torch's 30 s before its SIGKILL that long (LAUNCHER, either).
    Returns (child, run dir, config, the pids directory)."""
    run_dir = tmp_path / "run"
    pids = tmp_path / "pids"
    if attempt == 1:
        run_dir.mkdir()
        pids.mkdir()
    config = write_config(tmp_path, corpus, run={"dir": str(run_dir)},
                          train={"max_steps": 100000, "checkpoint_every": 100000, "micro_batch_size": 2,
                                 **(train or {})})
    cfg = load_config(config)
    if attempt == 1:  # scratch made this run's, as the supervisor does before its first launch (a restart's check
        claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)  # adopts only a marked scratch)
    wrapper = tmp_path / "ranks.py"
    wrapper.write_text(RANKS)
    asks = {**({"STORE_GONE": "1"} if store_gone else {}),
            **({"TORCH_WAIT_S": str(torch_wait_s)} if torch_wait_s is not None else {})}
    if not asks:
        launcher = ["-m", names.TORCHRUN_LAUNCHER]
    else:
        (tmp_path / "launcher.py").write_text(LAUNCHER)
        launcher = [str(tmp_path / "launcher.py")]
    command = [sys.executable, *launcher, "--standalone", "--nproc_per_node", "2", "--max-restarts", "0",
               str(wrapper), "train", str(config)]
    child = launch(command, run_dir, attempt, devices="", extra_env={"RANK_PIDS": str(pids), **asks, **extra})
    return child, run_dir, cfg, pids


def step(run_dir: Path) -> int:
    beat = read_heartbeat(run_dir)
    return beat.step if beat is not None else 0


def ended(child: Child, stop, timeout: float = 300) -> tuple[int, str]:
    """Once both ranks are at step 2: `stop()`, then the launcher's exit status and the attempt log. Whatever is left
    is SIGKILLed at the end (the launcher's group, its ranks in sessions of their own)."""
    try:
        wait_until(lambda: step(child.run_dir) >= 2 or child.popen.poll() is not None, 300, "the two ranks at step 2")
        assert child.popen.poll() is None, child.log_path.read_text(errors="replace")[-4000:]
        stop()
        rc = child.popen.wait(timeout)
    finally:
        end(child)
    return rc, child.log_path.read_text(errors="replace")


def end(child: Child) -> None:
    if child.popen.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
        child.popen.wait(30)
    child.kill_rest()


def log_says(child: Child, text: str) -> bool:
    return text in child.log_path.read_text(errors="replace")
