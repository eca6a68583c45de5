"""The Slurm multi-node rendezvous against another user's listener on its port (issue 40): torch's c10d backend
falls back to a client of whatever listens on the endpoint, so a user who listened there first received the job's
rendezvous state (and with a corrupt value pre-set, crash-looped it to `failed`, 79).

Each case builds the attempt's command as the supervisor does (daemon/slurm/job.py `SlurmJob.command`, the
multi-node script's srun path, the first node being 127.0.0.1), runs its torchrun part on the CPU with a tiny
worker script in place of the trainer, and a real second user (`nobody`, tests/second_user.py) holds a TCPStore
on the port the command names before it starts (as one who guessed the old `29400 + job id % 2000`, or won the
race for the port picked now):
- on the first node the agent refuses to join that store: it fails saying the port is taken, no worker runs,
  and the other user's store holds no key of hers;
- on another node the agent refuses the store (it shows no proof of the job's secret), with the same result;
- without a listener two nodes meet on that port and their workers run (the job's own rendezvous works).
Two more attack the job's real stores as a client (any user of the node can connect to a listening port):
- he lists the rendezvous store's keys (TCPStore.list_keys) and writes a pickle of his own as the state: her agent
  refuses it unread (it carries no seal of her secret); before, her agent ran his code;
- he sets the ranks' keys in the workers' store (the agent's, on a port the kernel picked) by torch's names before
  the ranks start: they never read them and their all-reduce is right; before, they connected where he said.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd.daemon.slurm import job as slurm
from ports import free_ports
from second_user import shared, user_python  # noqa: F401 - `shared` is a fixture
from slurm_helpers import launch_cfg

pytestmark = pytest.mark.slow

ATTACKER = """
import sys, time
from pathlib import Path
import torch.distributed as dist
port, out = int(sys.argv[1]), Path(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True)
(out / "listening").write_text("yes")
while not (out / "stop").exists():
    time.sleep(0.1)
(out / "keys.tmp").write_text(str(store.num_keys()))
(out / "keys.tmp").rename(out / "keys")  # whole when the test sees it
"""
"""The other user: a TCPStore on the port, until told to stop; then how many keys others wrote into it."""

WORKER = "import os, pathlib, sys; pathlib.Path(sys.argv[1], 'joined-' + os.environ['RANK']).write_text('1')\n"


def free_job_id() -> str:
    """A job id whose port under the old rule (29400 + id % 2000) is free here: the case reads the same on the
    code that derived the port from the job id."""
    for port in range(29400, 31400):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return str(port - 29400)
    pytest.skip("no free port in 29400-31399")


def attempt(tmp_path: Path, monkeypatch, nodes: list[str]) -> tuple[list[str], dict[str, str], int]:
    """(the torchrun part of attempt 1's command, with the worker script as its entry point; the environment the
    supervisor launches it with; the rendezvous port it names)."""
    monkeypatch.setenv("MINILMD_SLURM_SRUN", "1")
    # the product's port is one the kernel gives (bind to 0, released): a good neighbour on a shared node (a long-lived
    # listener never sits on a port some service is configured for), and a client connection that takes it in the
    # moment before the store listens costs the job one attempt. Here that client may be another xdist worker's, and
    # the case would fail: the port comes from tests/ports.py instead, below the kernel's range
    given: list[int] = []

    def outside_the_kernels_range() -> int:
        given.append(free_ports(1)[0])
        return given[-1]

    monkeypatch.setattr(slurm, "rendezvous_port", outside_the_kernels_range)
    job_id = free_job_id()
    alloc = slurm.Allocation(job_id, nodes, [])
    job = slurm.SlurmJob(alloc, {}, lambda *a, **k: None, runner=lambda args: "")

    train = [sys.executable, "-m", "minilmd.cli", "train", "/r/run.toml"]
    command = job.command(train, 1, launch_cfg(tmp_path), None)
    torchrun = command[command.index("--") + 1:]
    torchrun = torchrun[:torchrun.index("minilmd.cli") - 1]  # up to the entry point: the worker script instead
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    endpoint = torchrun[torchrun.index("--rdzv-endpoint") + 1]
    env = {**os.environ, **getattr(job, "launch_env", {}), "PYTHONUNBUFFERED": "1"}
    conf = ["--rdzv-conf", "read_timeout=5,join_timeout=120"]
    port = int(endpoint.split(":")[1])
    assert [port] == given, (endpoint, given)  # the command names the port tests/ports.py gave
    return [*torchrun, *conf, str(script), str(tmp_path)], env, port


def wait_file(path: Path, what: str) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert time.monotonic() < deadline, f"no {what} after 120 s"
        time.sleep(0.1)


@pytest.mark.parametrize("node", ["127.0.0.1", "node02"], ids=["first-node", "other-node"])
def test_a_foreign_listener_on_the_rendezvous_port_gets_nothing_of_the_job(tmp_path, monkeypatch, shared, node):
    command, env, port = attempt(tmp_path, monkeypatch, ["127.0.0.1", "node02"])
    command[command.index("--nnodes") + 1] = "1"  # one agent is the whole rendezvous: on his store, it would run
    env["SLURMD_NODENAME"] = node  # which node of the allocation this agent is (Slurm sets it for each task)
    attacker = subprocess.Popen(user_python(ATTACKER, str(port), str(shared)), cwd="/")
    try:
        wait_file(shared / "listening", "listener of the other user")
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    finally:
        (shared / "stop").write_text("1")
        attacker.wait(60)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert not list(tmp_path.glob("joined-*")), out[-3000:]  # no worker ran on his rendezvous
    wait_file(shared / "keys", "key count from the listener")
    assert (shared / "keys").read_text() == "0", out[-3000:]  # her agent wrote nothing into his store
    if node == "127.0.0.1":
        assert f"cannot listen on port {port}" in out and "another process holds it" in out, out[-3000:]
    else:
        assert f"the rendezvous store at 127.0.0.1:{port} shows no proof" in out, out[-3000:]


def test_the_jobs_own_rendezvous_joins_two_nodes(tmp_path, monkeypatch):
    command, env, _ = attempt(tmp_path, monkeypatch, ["127.0.0.1", "node02"])
    nodes = [subprocess.Popen(command, env={**env, "SLURMD_NODENAME": name}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for name in ("node02", "127.0.0.1")]
    outs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-2000:] for o in outs)
    assert sorted(p.name for p in tmp_path.glob("joined-*")) == ["joined-0", "joined-1"]


POISONER = """
import base64, pickle, sys
import torch.distributed as dist
port, marker = int(sys.argv[1]), sys.argv[2]

class Payload:
    def __reduce__(self):
        return (exec, (f"open({marker!r}, 'w').write('run by the victim')",))

store = dist.TCPStore("127.0.0.1", port, is_master=False)
keys = [key for key in store.list_keys() if key.startswith("torch.rendezvous.")]
for key in keys:  # named from the job's secret, yet listed by any client
    store.set(key, base64.b64encode(pickle.dumps(Payload())).decode())
print("poisoned", keys)
"""
"""The other user: lists the store's keys (TCPStore.list_keys), and writes a pickle of his own as the state."""


def test_a_foreign_client_cannot_make_the_agents_unpickle_its_state(tmp_path, monkeypatch, shared):
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.api import RendezvousStateError

    from minilmd.trainer.loop import rendezvous

    monkeypatch.setenv("MINILMD_RDZV_SECRET", "s" * 40)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    params = RendezvousParameters(backend=rendezvous.BACKEND, endpoint=f"127.0.0.1:{port}", run_id="job1",
                                  min_nodes=1, max_nodes=1, is_host=True, read_timeout=5)
    handler = rendezvous.create_handler(params)  # the host's agent: serves the store, writes the empty state
    marker = tmp_path / "owned"  # her directory: he cannot write there, only her process can
    attack = subprocess.run(user_python(POISONER, str(port), str(marker)), cwd="/", capture_output=True,
                            text=True, timeout=120)
    assert attack.returncode == 0 and "torch.rendezvous." in attack.stdout, attack.stdout + attack.stderr
    with pytest.raises(Exception) as refused:
        handler.is_closed()  # an agent reading the state, as each does at every heartbeat and join
    assert not marker.exists(), "the other user's pickle ran in her agent"
    assert isinstance(refused.value, RendezvousStateError), repr(refused.value)
    assert "no seal of this job's secret" in str(refused.value), str(refused.value)


RANK = """
import os, pathlib, sys, time, types
import torch, torch.distributed as dist
from minilmd.trainer.loop.distributed import init_distributed
out, shared = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
if os.environ["RANK"] == "0":  # the port of the workers' store, public anyway (/proc/net/tcp)
    (shared / "port.tmp").write_text(os.environ["MASTER_PORT"])  # whole when the other user sees it (a rename)
    os.replace(shared / "port.tmp", shared / "port")
deadline = time.monotonic() + 120
while not (shared / "poisoned").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
dist_info = init_distributed(types.SimpleNamespace(train=types.SimpleNamespace(device="cpu"), source=None))
total = torch.ones(1) * (dist_info.rank + 1)
dist.all_reduce(total)
(out / f"sum-{dist_info.rank}").write_text(str(int(total.item())))
dist.destroy_process_group()
"""
"""A rank as the trainer's: the process group joined by trainer/loop/distributed.py, once the other user acted."""

PRESETTER = """
import pathlib, sys, time
import torch.distributed as dist
shared = pathlib.Path(sys.argv[1])
deadline = time.monotonic() + 120
while not (shared / "port").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
store = dist.TCPStore("127.0.0.1", int((shared / "port").read_text()), is_master=False)
for rank in (0, 1):  # each rank's gloo address, by its standard name, before the ranks write theirs
    store.set(f"default_pg/0//cpu//0/{rank}", b"not an address of hers")
(shared / "poisoned").write_text("1")
"""
"""The other user: connects to the workers' store (the agent's, on the port the kernel gave it) and sets the keys
the ranks read, by torch's names, before they do."""


def test_a_foreign_client_on_the_workers_store_cannot_preset_what_the_ranks_read(tmp_path, shared):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    command = [sys.executable, "-m", "minilmd.trainer.loop.rendezvous", "--nnodes", "1", "--nproc-per-node", "2",
               "--rdzv-backend", "minilmd-c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-conf", "is_host=1,read_timeout=5", str(script), str(tmp_path), str(shared)]
    env = {**os.environ, "MINILMD_RDZV_SECRET": "s" * 40, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    attacker = subprocess.Popen(user_python(PRESETTER, str(shared)), cwd="/", stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    finally:
        said = attacker.communicate(timeout=120)[0]
    assert (shared / "poisoned").exists(), said  # he did set them
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert {p.name: p.read_text() for p in tmp_path.glob("sum-*")} == {"sum-0": "3", "sum-1": "3"}, out[-3000:]
