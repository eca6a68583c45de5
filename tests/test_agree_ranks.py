"""agree() with two real gloo ranks under torchrun: any rank's stop stops both, rank 0's clock alone decides a
save, any rank's full run.dir is both ranks' (each then exits 73), over the default group (CPU) and over a separate
gloo group (Dist.control_group, what runs beside NCCL)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainer_corpus import child_env

RANKS = """
import json
import sys
import torch
import torch.distributed as dist
from minilmd.trainer.loop.distributed import Dist
from minilmd.trainer.loop.guards import agree

dist.init_process_group("gloo")
rank = dist.get_rank()
control = dist.new_group(backend="gloo")
rounds = [(False, True, False), (rank == 1, False, False), (False, rank == 1, False), (False, False, False),
          (rank == 1, False, rank == 1)]
agreed = {}
for name, group in (("default", None), ("control", control)):
    me = Dist(rank, 2, rank, torch.device("cpu"), group)
    agreed[name] = [agree(me, stop, save, full) for stop, save, full in rounds]
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump(agreed, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_agree_on_stop_and_save_over_either_group(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(script), str(tmp_path)], capture_output=True, text=True, timeout=180, env=child_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # round 1: rank 0's save; round 2: rank 1's stop stops both; round 3: rank 1's clock says nothing; round 5:
    # rank 1's full run.dir stops both, and both know it is full
    want = [[False, True, False], [True, False, False], [False, False, False], [False, False, False],
            [True, False, True]]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == {"default": want, "control": want}
