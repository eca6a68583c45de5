"""More than one node under torchrun: only rank 0 reads a checkpoint, the other ranks receive it from rank 0.

Each node has a scratch of its own (a node's local disk or RAM) and only rank 0 writes checkpoints, into its own;
a rank on another node has no copy to read at resume. So when the job spans nodes (torchrun's LOCAL_WORLD_SIZE is
smaller than WORLD_SIZE), rank 0 loads the checkpoint (all of it a resume takes: a DPO run's reference sums too)
and broadcasts it over the process group; on one node every rank reads the files, as before (cheaper than sending).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch.distributed as torch_dist

Loaded = TypeVar("Loaded")


def spans_nodes() -> bool:
    """Whether this torchrun job has ranks on more than one node."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world))) < world


def load_checkpoint(path: Path, dist, read: Callable[[Path], Loaded]) -> Loaded:
    """What read(path) makes of the checkpoint rank 0 found (resume.read_checkpoint: all a resume takes from it):
    read by every rank on one node, by rank 0 alone and broadcast when the job spans nodes."""
    if not (dist.active and spans_nodes()):
        return read(path)
    loaded: list[Loaded | None] = [read(path) if dist.is_main else None]
    torch_dist.broadcast_object_list(loaded, src=0, device=dist.device if dist.device.type == "cuda" else None)
    assert loaded[0] is not None  # rank 0 sent it
    return loaded[0]
