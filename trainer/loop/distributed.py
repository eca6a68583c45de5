"""Where a training process sits under torchrun, and the set-up that follows from it (trainer/loop/train.py runs
it): torchrun's RANK/WORLD_SIZE/LOCAL_RANK, the device, the process group (nccl on CUDA, gloo on CPU) with a gloo
control group beside NCCL, and the DDP wrapping of the model. Without torchrun: one rank, no process group."""
from __future__ import annotations

import gc
import hashlib
import hmac
import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

# Imported before any process group exists, on purpose: its functions take `group=group.WORLD` as a default
# argument, evaluated at import. DDP imports it lazily, after init_process_group, and then those defaults hold
# the default group for ever: destroy_process_group cannot free it, its gloo threads outlive the training and
# race the C++ teardown at exit (an abort or SIGSEGV of one rank in about 150 finished runs).
import torch.distributed.nn.functional
from torch.distributed import PrefixStore, TCPStore
from torch.distributed.constants import default_pg_timeout

from minilmd.config import ConfigError, RunConfig
from minilmd.names import RDZV_SECRET_ENV


@dataclass
class Dist:
    """Where this process sits: rank of world_size (1 without torchrun) and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    control_group: Any = None
    """The process group of agree()'s flags: a CPU (gloo) group beside NCCL; None: the default group (gloo)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def resolve_device(cfg: RunConfig, local_rank: int) -> torch.device:
    want = cfg.train.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError(["train.device = \"cuda\" but torch finds no CUDA device"], cfg.source)
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(cfg: RunConfig) -> Dist:
    """Read torchrun's RANK/WORLD_SIZE/LOCAL_RANK; join the process group (nccl on CUDA, gloo on CPU), and on CUDA
    a gloo group beside it for the per-step control flags (agree())."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(cfg, local_rank)
    control_group = None
    if world_size > 1 and not torch_dist.is_initialized():
        store = workers_store(rank, world_size)  # None: torchrun's env:// (rank and world size -1: read there)
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=(
            device if device.type == "cuda" else None), store=store,
            rank=rank if store is not None else -1, world_size=world_size if store is not None else -1)
    if world_size > 1 and torch_dist.get_backend() != "gloo":
        control_group = torch_dist.new_group(backend="gloo")  # every rank calls it, in the same order
    return Dist(rank, world_size, local_rank, device, control_group)


def workers_store(rank: int, world_size: int) -> torch_dist.Store | None:
    """The store the ranks meet in, for a multi-node job of minilmd's rendezvous (RDZV_SECRET_ENV set; None
    otherwise: torchrun's env:// as it is). torchrun's workers meet in a TCPStore that rank 0's agent serves on a
    port the kernel picked, with keys of standard names (`default_pg/0//cpu//0/1`: a rank's address), and any user
    of the node can connect to it (its port is in /proc/net/tcp): one who set such a key before the ranks did
    had them connect to his address. Here every key the ranks read or write is under a prefix named by the
    attempt's secret and the restart: a key he sets blindly is never one they read. A client that lists the
    store's keys (TCPStore.list_keys) still learns the prefix once the ranks have written: the values are not
    authenticated (docs/operations.md, "Several nodes")."""
    secret = os.environ.get(RDZV_SECRET_ENV, "")
    if not secret:
        return None
    agent_serves = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    server = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                      is_master=rank == 0 and not agent_serves, multi_tenant=True, timeout=default_pg_timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return PrefixStore(f"minilmd.{workers_prefix(secret)}/attempt_{attempt}", server)


def workers_prefix(secret: str) -> str:
    """The name, derived from the attempt's secret, of the ranks' keys in their store (workers_store)."""
    return hmac.new(secret.encode(), b"workers", hashlib.sha256).hexdigest()[:32]


def release(dist: Dist | None) -> None:
    """Leave the process group at the end of a run, after the last reference to the DDP model is gone: DDP holds
    the group, so only then does destroy_process_group stop gloo's threads before the interpreter exits. The run's
    objects are unfrozen first (the loop froze them, gc.freeze) so that collect() frees the ones DDP's own hooks
    keep in reference cycles."""
    if dist is None or not dist.active or not torch_dist.is_initialized():
        return
    gc.unfreeze()
    gc.collect()
    torch_dist.destroy_process_group()


def wrap_ddp(model: torch.nn.Module, dist: Dist) -> torch.nn.Module:
    """The module the loop runs forward and backward through: `model` itself on one rank, under DDP on several."""
    if not dist.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    # No buffer broadcast: the only buffers are the RoPE tables, computed identically on every rank (and
    # non-persistent), so broadcasting them before every synced forward was pure traffic. torch 2.13 names it
    # forward_sync_buffers (broadcast_buffers is deprecated there, a FutureWarning on every rank; the new one
    # still syncs them once at init: the same tables). Gradients as views of the allreduce buckets: no copy into
    # and out of the buckets, and no second gradient-sized allocation.
    new_name = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    no_sync: dict[str, Any] = {"forward_sync_buffers" if new_name else "broadcast_buffers": False}
    return DistributedDataParallel(
        model, device_ids=[dist.local_rank] if dist.device.type == "cuda" else None,
        gradient_as_bucket_view=True, **no_sync)
