"""`make demo-dpo`: MiniMind's chain on CPU, three of its stages under the supervisor: the demo-sft pipeline
(daemon/demo_sft.py: pretraining with a SIGBUS, SFT with a SIGKILL), then DPO, the fourth stage, then a chat.

10. preference pairs from the same real chat corpus (`minilmd demo-corpus --dpo`: each chatterbot-corpus dialog's
   real reply chosen, another dialog's reply rejected), prepared with `--format dpo` under the SFT stage's tokenizer
   and template;
11. `minilmd run` of a DPO config: `[init] from` the SFT run's config (its final checkpoint, on its 'NFS' share;
   the form that waits for a run still training; its reference, computed once at the first start and kept in every
   checkpoint), a SIGKILL injected into the trainer: the restart reads the reference
   back from the checkpoint it resumes; then `status` (its dpo line) and the val reward accuracy at each evaluation;
12. `minilmd chat` with the DPO model.

In its own directory, demo-dpo-run/ by default (make demo's demo-run/ and make demo-sft's demo-sft-run/ stay).

A target of its own rather than a step of `make demo-sft`: it adds about two minutes to demo-sft's seven on a shared
2-core machine, most of it the reference's one pass over 2,446 pairs (docs/training.md, DPO). Every step is a real
`minilmd` command, printed before it runs. Torch-free.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from minilmd import pychild
from minilmd.daemon import demo, demo_sft
from minilmd.daemon.demo import minilmd, say

DPO_CONFIG = """\
# The demo's preference run: the fine-tuned demo model, on pairs of replies, under the same supervisor.
[run]
name = "demo-dpo"
dir = "{root}/dpo-run"
scratch = "{scratch}"
remote = "{root}/nfs-dpo"

[data]
prepared = "{root}/dpo-prepared"   # a preference corpus: pairs, both sides always in one micro-batch
val_windows = 128                  # validation pairs (reward accuracy is the share of them preferred)

[init]
from = "{root}/demo-sft.toml"      # the SFT run, by its config: its final checkpoint (on its remote, nfs-sft) is the
                                   # policy's start and the frozen reference; a launch while it trains waits for it

[model]                            # the SFT model's (run --check names any difference)
{model}
[dpo]
beta = 0.1                         # the default (the DPO paper's and TRL's), written out

[train]
seq_len = 128
micro_batch_size = 8               # pairs: 16 rows, each micro-batch padded to its longest row, never to seq_len
grad_accum = 1
lr = 1e-4                          # above DPO's default 1e-5, so that 60 steps of the demo's small model learn visibly
warmup_steps = 5
max_steps = {steps}
device = "cpu"
log_every = 10
eval_every = 20
checkpoint_every = 20

""" + demo.SYNC_AND_RESTART


def dpo_config(root_path: Path, scratch: Path, steps: int) -> str:
    return DPO_CONFIG.format(root=root_path, scratch=scratch, steps=steps, model=demo.MODEL_LINES)


def prepare_pairs(root_path: Path, max_docs: int | None = None) -> Path:
    """`demo-corpus --dpo` into <root>/dpo, then `prepare --format dpo` under <root>/sft-tokenizer (the SFT stage's
    tokenizer and template) into <root>/dpo-prepared; returns the pairs' JSONL."""
    cmd = ["demo-corpus", str(root_path / "dpo"), "--dpo", *(["--max-docs", str(max_docs)] if max_docs else [])]
    made = pychild.run(pychild.module_argv("minilmd.cli", *cmd), stdout=subprocess.PIPE, text=True)
    if made.returncode != 0:
        sys.exit(f"demo: `minilmd demo-corpus --dpo` failed with exit status {made.returncode}")
    pairs = Path(made.stdout.splitlines()[-1])
    print(f"  {pairs}: {sum(1 for _ in open(pairs, encoding='utf-8')):,} pairs")
    minilmd("prepare", str(pairs), "--tokenizer", str(root_path / "sft-tokenizer"), "--format", "dpo", "--out",
            str(root_path / "dpo-prepared"), "--seq-len", "128", "--batch-size", "8", "--val-fraction", "0.1")
    return pairs


def report_lines(run_dir: Path) -> list[str]:
    """Each start's reference (computed, or read back from the checkpoint it resumed), then the val reward accuracy
    (and margin, loss) of each evaluation, the last attempt's for a step logged twice."""
    from minilmd.daemon.base.runstate import json_records
    from minilmd.logread import tail_lines
    from minilmd.names import METRICS

    records = json_records(tail_lines(run_dir / METRICS, 10_000)[0])
    lines = [f"  reference at the start from step {m['step']}: computed over {m['pairs']:,} pairs in "
             f"{m['seconds']:.1f} s" if m.get("source") == "computed" else
             f"  reference at the start from step {m['step']}: read back from its checkpoint ({m['pairs']:,} pairs)"
             for m in records if m.get("kind") == "dpo_reference"]
    evals = {m["step"]: m for m in records if m.get("kind") == "eval" and "val_reward_accuracy" in m}.values()
    return lines + [f"  step {m['step']:>3}: val reward accuracy {m['val_reward_accuracy']:.3f}, margin "
                    f"{m.get('val_reward_margin', float('nan')):.4f}, val loss {m.get('val_loss', float('nan')):.4f}"
                    for m in sorted(evals, key=lambda m: m["step"])]


def main(root: str = "demo-dpo-run", pretrain_steps: int = 240, epochs: int = 3, dpo_steps: int = 60) -> None:
    started = time.monotonic()
    demo_sft.main(root, pretrain_steps, epochs)
    dpo_started = time.monotonic()
    config = dpo_stage(Path(root).resolve(), dpo_steps)
    now = time.monotonic()
    print(f"\ndemo-dpo finished in {now - started:.0f} s, its DPO stage (steps 10-12) in {now - dpo_started:.0f} s; "
          f"everything is under {Path(root).resolve()}/ (the DPO config: {config})")


def dpo_stage(root_path: Path, dpo_steps: int) -> Path:
    """Steps 10-12 in a demo-sft directory (its sft-tokenizer/ and nfs-sft/); returns the DPO config."""
    scratch = demo.stage_scratch(root_path, "demo-dpo", "dpo-")

    say("10. Preference pairs from the same chat corpus: the real reply chosen, another dialog's reply rejected")
    prepare_pairs(root_path)

    say("11. DPO under the supervisor from the fine-tuned model; a SIGKILL hits the trainer at step 30")
    print("  at step 0 the policy is its reference: every margin is 0, the loss ln 2 = 0.6931 and no pair preferred")
    config = root_path / "demo-dpo.toml"
    config.write_text(dpo_config(root_path, scratch, dpo_steps), encoding="utf-8")
    demo.run_stage(config, "sigkill@30", root_path / "dpo-run", root_path / "nfs-dpo", "the DPO run")
    print("The reference, once; the val reward accuracy (the share of validation pairs whose chosen reply the model "
          "now prefers more than its reference did):")
    print("\n".join(report_lines(root_path / "dpo-run")) or "  (nothing logged)")

    say("12. Talking to the DPO model (each line on stdin is a user message)")
    demo.chat(root_path / "nfs-dpo")
    return config


if __name__ == "__main__":
    main(demo.directory_argument(sys.argv[1:], "demo-dpo-run", __doc__))
