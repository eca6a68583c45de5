"""The val loss of masked vs unmasked packed pretraining: a short run pair, same seed, same tokens.

    .venv/bin/python scripts/docmask_val_pair.py --config CFG [--prepared DIR] [--steps N] [--set KEY=VALUE ...]

Two real trainings in one process, through the trainer's own step (Trainer.train_step): the same model config and
seeded init, the same packed windows in the same order (data.mode = "packed"), one with data.doc_mask = false
("unmasked"), one with true ("masked"); each writes only under a temporary directory. After N optimizer steps both
models are scored on the same three fixed validation sets of the val split: packed windows as the unmasked run
trains, the same windows with the document mask as the masked run trains, and one document per row (padded mode's
val rows: what inference sees). The val loss each run logs is its own column; the last one compares the two on
equal terms. Prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile

VAL_SETS = ("packed", "masked", "padded")
"""The validation rows scored: packed windows, the same windows masked, one document per row."""


def run_pair(cfg, steps: int) -> dict[str, dict[str, float]]:
    """{trained mode: {val set: loss}} after `steps` optimizer steps of each trained mode."""
    from minilmd.trainer.bench.packing import build_trainer

    with tempfile.TemporaryDirectory(prefix="minilmd-valpair-") as tmp:
        trainers = {mode: build_trainer(cfg, mode, steps, tmp) for mode in VAL_SETS}
        val = {mode: t.val_batches for mode, t in trainers.items()}
        del trainers["padded"]  # built for its validation rows only
        losses = {}
        for mode, trainer in trainers.items():
            for _ in range(steps):
                loss, _, _ = trainer.train_step()
                float(loss)
                trainer.step += 1
            losses[mode] = {name: trainer.evaluate(batches) for name, batches in val.items()}
    return {"unmasked" if mode == "packed" else mode: row for mode, row in losses.items()}


def table(losses: dict[str, dict[str, float]], cfg, steps: int) -> str:
    t = cfg.train
    head = f"{'trained':10} {'val: packed':>12} {'val: masked':>12} {'val: 1 doc/row':>15}"
    return "\n".join([
        f"docmask val pair: {cfg.data.prepared}, model {cfg.model.hidden_size}x{cfg.model.num_hidden_layers}, "
        f"seq_len {t.seq_len}, {t.micro_batch_size * t.grad_accum} rows/step, {steps} steps, seed {t.seed}",
        head,
        *(f"{mode:10} {row['packed']:12.4f} {row['masked']:12.4f} {row['padded']:15.4f}"
          for mode, row in losses.items()),
    ])


def main(argv: list[str] | None = None) -> int:
    from minilmd.config import ConfigError
    from minilmd.probes import load_checked
    from minilmd.protocol import EXIT_CONFIG

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--prepared", help="the prepared corpus (default: the config's data.prepared)")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps of each run (default: train.max_steps)")
    p.add_argument("--set", dest="sets", action="append", default=[], help="override a config key: KEY=VALUE")
    args = p.parse_args(argv)
    overrides = [*args.sets, *([f"data.prepared={json.dumps(args.prepared)}"] if args.prepared else [])]
    try:
        cfg = load_checked(args.config, overrides)
    except ConfigError as e:
        print(f"docmask_val_pair: {e}", file=sys.stderr)
        return EXIT_CONFIG
    steps = args.steps or cfg.train.max_steps
    if steps < 1:
        print("docmask_val_pair: --steps (or train.max_steps) must be at least 1", file=sys.stderr)
        return EXIT_CONFIG
    print(table(run_pair(cfg, steps), cfg, steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
