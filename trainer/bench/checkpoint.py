"""`minilmd bench checkpoint`: what a checkpoint save costs the training loop, against a plain torch.save.

A real model of the given size with a real AdamW state (one update on random gradients, then one more between
saves so that every checkpoint validates) is saved `repeats` times in each way:
- async: AsyncCheckpointer, the way the trainer saves; the loop blocks only for the CPU snapshot, the write,
  hashing, fsync and retention run in a thread (reported separately);
- sync: checkpoint.save of the live tensors (write + hash + fsync in the caller);
- torch.save of {"model", "optimizer"} state dicts to one file, plus an fsync, as MiniMind's resume files are made.
Medians are reported, with the size on disk and the time of one torch-free validation. Every save goes into a fresh
directory of the bench's own (`work_dir`), the one thing it removes after.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from minilmd.protocol import COMMAND_FAILED


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def work_dir(parent: str | None) -> Path:
    """A new directory of this bench's own (mode 0700, a name mkdtemp made with O_EXCL) in `parent` (--dir), by
    default in scratch's base (/dev/shm, where a run's checkpoints are saved first: minilmd/scratch.py base) where
    it is a directory, else in the system's temporary directory. Never a fixed name: whatever another user or a
    link holds at one in a world-writable place is not the bench's to write into or delete. OSError when it cannot
    be made."""
    if parent is None:
        from minilmd import scratch

        parent = scratch.base() if os.path.isdir(scratch.base()) else None
    return Path(tempfile.mkdtemp(prefix="minilmd-bench-checkpoint-", dir=parent))


def main(out_dir: str | None = None, hidden: int = 768, layers: int = 8, repeats: int = 5) -> int:
    import torch

    from minilmd import checkpoint as ck
    from minilmd import checkpoint_select
    from minilmd.config import RunConfig
    from minilmd.trainer.checkpoint import save as ckpt_io
    from minilmd.trainer.model.minimind import MiniMindForCausalLM

    cfg = RunConfig()
    cfg.model.hidden_size, cfg.model.num_hidden_layers = hidden, layers
    torch.manual_seed(0)
    model = MiniMindForCausalLM(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    step = 0

    def update() -> None:
        nonlocal step
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1

    def state() -> dict:
        return {"step": step, "tokens_seen": 0, "epoch": 0, "config": cfg.to_dict(), "rng": ckpt_io.capture_rng(),
                "fingerprints": {"data": None, "tokenizer": None}}

    try:  # made just before the try that removes it
        out = work_dir(out_dir)
    except OSError as e:
        print(f"bench checkpoint: no directory can be made in {out_dir or 'the default place'}: {e.strerror or e}; "
              f"nothing was written", file=sys.stderr)
        return COMMAND_FAILED
    print(f"model {hidden} x {layers}: {model.num_parameters():,} parameters; {repeats} saves per method into {out}; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    try:
        saver = ckpt_io.AsyncCheckpointer(out / "async", keep=2, log=lambda s: None)
        blocking, background = [], []
        for _ in range(repeats):
            update()
            blocking.append(saver.save(step, model, opt, state()))
            saver.wait()
            background.append(saver.last_write_s)
        async_path = saver.last_path

        sync = []
        for _ in range(repeats):
            update()
            t0 = time.perf_counter()
            path = ckpt_io.save(out / "sync", step, model.state_dict(), opt.state_dict(), state())
            sync.append(time.perf_counter() - t0)
            checkpoint_select.prune(out / "sync", keep=1, log=lambda s: None)

        plain = []
        torch_file = out / "plain.pt"
        for _ in range(repeats):
            t0 = time.perf_counter()
            with open(torch_file, "wb") as f:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
            plain.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        ck.validate(path)
        validate_s = time.perf_counter() - t0

        med = statistics.median
        print(f"{'method':<44}{'median s':>10}{'min s':>9}{'size MB':>10}")
        rows = [("async save: loop blocked (CPU snapshot)", blocking, _dir_size(async_path) if async_path else None),
                ("async save: background write+hash+prune", background, None),
                ("sync checkpoint.save (write+hash+fsync)", sync, _dir_size(path)),
                ("plain torch.save + fsync", plain, torch_file.stat().st_size)]
        for name, times, size in rows:
            size_txt = f"{size / 1e6:10.1f}" if size is not None else f"{'':>10}"
            print(f"{name:<44}{med(times):10.3f}{min(times):9.3f}{size_txt}")
        print(f"torch-free validate (sha256 + finiteness + shapes) of one checkpoint: {validate_s:.3f} s")
        print(f"blocking time: {med(blocking) / med(plain):.2f}x of a plain torch.save; "
              f"sync save {med(sync) / med(plain):.2f}x")
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the bench's own directory, made above: nothing else
    return 0
