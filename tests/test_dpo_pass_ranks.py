"""DPO's reference pass saved periodically on two ranks (trainer/loop/dpo_reference.py): every rank computes the whole
pass and takes part in each save (a barrier each side of rank 0's write), so they must save at the same batch: rank
0's clock decides, agreed with the stop flag between two batches (guards.agree). A rank deciding by its own clock
would wait at a barrier while the other went on to the next batch's agreement."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from in_process import train_in_process
from minilmd.names import DPO_REFERENCE, MANIFEST, REFERENCE_PASS
from minilmd.protocol import EXIT_DONE
from multinode_helpers import descendants
from trainer_corpus import child_env, read_metrics, run_paths, write_config

pytestmark = pytest.mark.slow  # two torchrun jobs of two ranks, one SIGKILLed in its (slowed) reference pass

SLOW_REFERENCE_TRAINER = Path(__file__).with_name("slow_reference_trainer.py")
VALUES = dict(data={"val_windows": 16},
              train={"seq_len": 128, "micro_batch_size": 2, "max_steps": 2, "checkpoint_every": "1s"})


def _torchrun(script: list[str], config: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *script,
            "train", str(config)]


def _pass_saved(ckpt_dir: Path) -> int | None:
    try:
        return json.loads((ckpt_dir / "step-00000000" / MANIFEST).read_text()).get(REFERENCE_PASS, [None])[0]
    except FileNotFoundError:
        return None


def test_two_ranks_save_the_pass_at_the_same_batch_and_a_killed_job_goes_on_from_it(tmp_path, small_dpo_corpus):
    config = write_config(tmp_path, small_dpo_corpus, name="ranks", **VALUES)
    run_dir, ckpt_dir = run_paths(config)
    job = subprocess.Popen(_torchrun([str(SLOW_REFERENCE_TRAINER)], config), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=child_env(), start_new_session=True)
    try:
        while job.poll() is None and not _pass_saved(ckpt_dir):
            time.sleep(0.1)
        if job.poll() is None:  # else it ended with no save of its pass seen (asserted below)
            ranks = descendants(job.pid)  # torchrun starts its ranks in sessions of their own
            for pid in [job.pid, *ranks]:  # the agent first (it restarts nothing), then both ranks: a node lost
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    kept = _pass_saved(ckpt_dir)
    assert kept, out  # before: the pass saved nothing until its end (the job then trained on)
    assert not read_metrics(run_dir, "dpo_reference"), out

    again = subprocess.run(_torchrun(["-m", "minilmd.cli"], config), capture_output=True, text=True, env=child_env(),
                           timeout=600)
    assert again.returncode == EXIT_DONE, again.stdout[-3000:] + again.stderr[-3000:]
    made = read_metrics(run_dir, "dpo_reference")
    assert [(m["source"], m.get("resumed_at")) for m in made] == [("computed", kept)], made
    straight = write_config(tmp_path, small_dpo_corpus, name="straight", **VALUES)  # one rank: the same batches
    assert train_in_process(straight).returncode == EXIT_DONE
    # every checkpoint carries the pass's result: the last step's is compared, which no pruning takes. Step 0's may be
    # gone: with checkpoint_every 1s, a step slower than that (a loaded machine) saves step 1 too, and keep_local
    # (2) then prunes step 0, of no use any more (a resume reads the reference its own checkpoint carries)
    name = f"step-00000002/{DPO_REFERENCE}"
    assert (ckpt_dir / name).read_bytes() == (run_paths(straight)[1] / name).read_bytes()
