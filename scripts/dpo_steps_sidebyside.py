"""minilmd's DPO beside MiniMind's own trainer/train_dpo.py (unmodified) at steps 1 and 2, on the CPU in fp32, where
the two can be made to see the same thing (issue 42): the same weights, the same pairs, the same targets, the same
first update. Prints the table of docs/training.md's DPO side-by-side section; tests/test_dpo_steps_sidebyside.py
runs it.

- Weights: a 64 x 2 MiniMind model (its own class and init, seed 0) saved as out/full_sft_64.pth; MiniMind reads it
  through --from_weight full_sft, minilmd through `[init] from`.
- Batch: N single-turn pairs and a batch of all N (MiniMind --batch_size N, one iteration an epoch, --epochs 2;
  minilmd micro_batch_size N, grad_accum 1), so both steps see every pair on both sides whatever the order (the
  loss is a mean over pairs).
- Rendering: every reply has a non-empty reasoning part, so MiniMind's template writes no empty think block and its
  DPODataset has none to drop at random: both render each side to the same tokens (MiniMind's tokenizer and
  template, ../shared/minimind/model).
- Targets: MiniMind's mask runs from after `<|im_start|>assistant\\n` through `<|im_end|>\\n`, the newline after
  `<|im_end|>` included; minilmd's through `<|im_end|>` (docs/formats.md). Every side is made to render to the same
  length L and both cut at L - 1 tokens (MiniMind --max_seq_len, minilmd train.seq_len and prepare --seq-len), which
  drops that final newline: the targets are then the same tokens on both sides (`--mask full` keeps the newline,
  so MiniMind has one target more per side than minilmd: the difference that makes).
- Update: MiniMind's lr at its first step is get_lr(1, 2, lr) = 0.55 lr (trainer_utils.py, cosine over 2 steps),
  AdamW with its default weight_decay 0.01, grad_clip 1.0; minilmd runs at that lr with warmup 0, weight_decay 0.01,
  grad_clip 1.0 (minilmd does not decay 1-D parameters, the norms; MiniMind decays all). `--minilmd-lr-scale`
  multiplies minilmd's lr (a test shows the step-2 losses then differ).
- Precision: MiniMind prints its loss to 4 decimals; the gradients of both steps are compared at full precision
  through Adam's first moment after step 2, read from MiniMind's resume file and minilmd's step-2 checkpoint.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_sidebyside import copy_minimind  # beside this script

from minilmd import procs, pychild
from minilmd.corpus.prepare.block import split_is_val
from minilmd.corpus.prepare.dpo_encode import pair_canonical
from minilmd.protocol import EXIT_CONFIG

HIDDEN, LAYERS = 64, 2
WORDS = [" green", " light", " water", " music", " table", " friend", " word", " other", " some", " one", " up",
         " out", " all", " there", " each", " use"]
"""Words of one token each under MiniMind's tokenizer (checked): a side is padded with them to the common length."""
LN2 = math.log(2)
VAL_FRACTION = 0.5
"""minilmd needs a val split: the pairs are sorted by its split rule, MiniMind reads only the train split's."""


def minimind_lr1(lr: float, total: int) -> float:
    """MiniMind's rate at its first step: get_lr(1, total, lr) of trainer/trainer_utils.py."""
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * 1 / total)))


def render(tok, messages: list[dict]) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert "<think>\n\n</think>" not in text, "an empty think block: MiniMind would drop it at random"
    return tok(text, add_special_tokens=False).input_ids


def make_pairs(tok, n: int) -> tuple[list[dict], int]:
    """n single-turn pairs whose sides all render to one length L (each reply padded with one-token words);
    returns (pairs, L)."""
    raw = []
    for i in range(n):
        prompt = [{"role": "user", "content": f"Tell me about the{WORDS[i % len(WORDS)]} and the{WORDS[-1 - i]}."}]
        chosen = {"role": "assistant", "reasoning_content": f"The user asks about{WORDS[i % len(WORDS)]}.",
                  "content": f"The{WORDS[i % len(WORDS)]} is near the{WORDS[(i + 3) % len(WORDS)]}."}
        rejected = {"role": "assistant", "reasoning_content": "Something else.",
                    "content": f"I like{WORDS[(i + 7) % len(WORDS)]}."}
        raw.append((prompt, chosen, rejected))
    length = max(len(render(tok, p + [r])) for p, c, rj in raw for r in (c, rj)) + 1
    pairs = []
    for k, (prompt, *replies) in enumerate(raw):
        sides = []
        for j, reply in enumerate(replies):
            reply = dict(reply)
            pad = length - len(render(tok, prompt + [reply]))
            reply["content"] += "".join(WORDS[(k + j + m) % len(WORDS)] for m in range(pad))
            assert len(render(tok, prompt + [reply])) == length, "a padding word is not one token"
            sides.append(prompt + [reply])
        pairs.append({"chosen": sides[0], "rejected": sides[1]})
    return pairs, length


def minilmd(*args: str) -> str:
    done = pychild.run(pychild.module_argv("minilmd.cli", *args), keep_cwd=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"minilmd {' '.join(args)}: exit {done.returncode}\n{done.stdout[-3000:]}")
    return done.stdout


def write_weights(copy: Path, python: str) -> Path:
    """MiniMind's own 64 x 2 model, its init under seed 0, as out/full_sft_64.pth."""
    out = copy / "out" / f"full_sft_{HIDDEN}.pth"
    out.parent.mkdir(parents=True, exist_ok=True)
    code = ("import sys, torch; sys.path.insert(0, '..'); from model.model_minimind import MiniMindConfig, "
            "MiniMindForCausalLM; torch.manual_seed(0); "
            f"m = MiniMindForCausalLM(MiniMindConfig(hidden_size={HIDDEN}, num_hidden_layers={LAYERS})); "
            f"torch.save(m.state_dict(), {str(out)!r})")
    subprocess.run([python, "-c", code], cwd=copy / "trainer", check=True, capture_output=True, text=True)
    return out


def run_minimind(copy: Path, python: str, pairs: Path, seq_len: int, n: int, lr: float, beta: float,
                 epochs: int) -> list[float]:
    """MiniMind's train_dpo.py, unmodified, from the copy's trainer/ folder: its logged loss at each step."""
    cmd = [python, "train_dpo.py", "--data_path", str(pairs), "--save_dir", str(copy / "out"), "--save_weight",
           "dpo_steps", "--from_weight", "full_sft", "--hidden_size", str(HIDDEN), "--num_hidden_layers",
           str(LAYERS), "--max_seq_len", str(seq_len), "--batch_size", str(n), "--learning_rate", repr(lr),
           "--beta", repr(beta), "--accumulation_steps", "1", "--grad_clip", "1.0", "--epochs", str(epochs),
           "--dtype", "float32", "--num_workers", "0", "--log_interval", "1", "--save_interval", "1000000",
           "--use_compile", "0", "--from_resume", "0", "--device", "cpu"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    done = procs.run_bounded(cmd, 600, cwd=copy / "trainer", stderr=subprocess.STDOUT, text=True, env=env)
    losses = [float(m.group(1)) for m in re.finditer(r"\(1/1\), loss: ([\d.]+)", done.stdout)]
    if done.returncode != 0 or len(losses) != epochs:
        raise SystemExit(f"MiniMind train_dpo.py: exit {done.returncode}, losses {losses}\n{done.stdout[-3000:]}")
    return losses


def run_minilmd(work: Path, tokenizer: Path, pairs: Path, weights: Path, seq_len: int, n: int, lr: float,
                beta: float, steps: int) -> tuple[list[float], int]:
    prepared = work / "prepared"
    minilmd("prepare", str(pairs), "--tokenizer", str(tokenizer), "--format", "dpo", "--out", str(prepared),
            "--seq-len", str(seq_len), "--val-fraction", str(VAL_FRACTION), "--workers", "0")
    meta = json.loads((prepared / "meta.json").read_text(encoding="utf-8"))
    if meta["splits"]["train"]["pairs"] != n:
        raise SystemExit(f"minilmd's train split has {meta['splits']['train']['pairs']} pairs, not MiniMind's {n}")
    sections = {
        "run": {"name": "dpo-steps", "dir": str(work / "run"), "scratch": str(work / "scratch")},
        "data": {"prepared": str(prepared)},
        "model": {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "vocab_size": meta["vocab_size"]},
        "train": {"seq_len": seq_len, "micro_batch_size": n, "grad_accum": 1, "lr": lr, "warmup_steps": 0,
                  "weight_decay": 0.01, "grad_clip": 1.0, "max_steps": steps, "log_every": 1, "eval_every": 0,
                  "dtype": "fp32", "device": "cpu", "compile": False},
        "dpo": {"beta": beta},
        "init": {"from": str(weights)},
    }
    config = work / "dpo-steps.toml"
    config.write_text("".join(f"[{s}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()) + "\n"
                              for s, values in sections.items()), encoding="utf-8")
    minilmd("train", str(config))
    lines = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
             if line.strip()]
    return [m["loss"] for m in lines if m.get("kind") == "train"][:steps], meta["vocab_size"]


def first_moments(work: Path, vocab_size: int) -> float:
    """The largest difference of Adam's first moment after step 2 (0.09 g1 + 0.1 g2 on both sides: beta1 0.9 on
    both; its second moment differs, beta2 0.999 in MiniMind, 0.95 in minilmd), relative to the largest value, over
    every parameter: the gradients of both steps at full fp32 precision, where the losses are printed to 4 decimals.
    MiniMind's from its resume file (its optimizer state in model.parameters() order), minilmd's from its step-2
    checkpoint (the decayed matrices first, then the 1-D parameters: trainer/loop/components.py)."""
    import torch
    from safetensors.torch import load_file

    from minilmd.config import ModelSection
    from minilmd.trainer.model.minimind import MiniMindForCausalLM

    model = MiniMindForCausalLM(ModelSection(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=8,
                                             num_key_value_heads=4, vocab_size=vocab_size))
    params = list(model.named_parameters())
    order = [n for n, p in params if p.dim() >= 2] + [n for n, p in params if p.dim() < 2]
    ours = load_file(str(work / "minilmd" / "scratch" / "checkpoints" / "step-00000002" / "optimizer.safetensors"))
    theirs = torch.load(work / "minimind" / "checkpoints" / f"dpo_steps_{HIDDEN}_resume.pth", map_location="cpu")
    names = [k for k in theirs["model"] if k != "lm_head.weight"]  # tied to the embedding: one parameter
    worst = 0.0
    for j, name in enumerate(names):
        a, b = theirs["optimizer"]["state"][j]["exp_avg"], ours[f"state.{order.index(name)}.exp_avg"]
        worst = max(worst, float((a - b).abs().max() / a.abs().max()))
    return worst


def compare(work: Path, src: Path, python: str, n: int, lr: float, beta: float, mask: str,
            minilmd_lr_scale: float) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src / "model"))
    candidates, length = make_pairs(tok, 4 * n)
    is_val = [split_is_val(pair_canonical(p["chosen"], p["rejected"]), VAL_FRACTION) for p in candidates]
    train = [p for p, v in zip(candidates, is_val, strict=True) if not v][:n]
    val = [p for p, v in zip(candidates, is_val, strict=True) if v][:1]
    seq_len = length - 1 if mask == "equal" else length + 8
    work.mkdir(parents=True, exist_ok=True)
    data, both = work / "pairs.jsonl", work / "pairs-and-val.jsonl"  # MiniMind trains on all it reads
    data.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in train), encoding="utf-8")
    both.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in train + val), encoding="utf-8")
    copy = work / "minimind"
    copy_minimind(src, copy)
    weights = write_weights(copy, python)
    theirs = run_minimind(copy, python, data, seq_len, n, lr, beta, epochs=2)
    lr1 = minimind_lr1(lr, 2)
    ours, vocab_size = run_minilmd(work / "minilmd", src / "model", both, weights, seq_len, n, lr1 * minilmd_lr_scale,
                                   beta, 2)
    moment = first_moments(work, vocab_size)
    return {"moment": moment, "pairs": n, "length": length, "seq_len": seq_len, "mask": mask, "lr": lr, "lr1": lr1,
            "minilmd_lr": lr1 * minilmd_lr_scale, "beta": beta, "minimind": theirs, "minilmd": ours}


def table(r: dict) -> str:
    rows = ["| | MiniMind train_dpo.py | minilmd | difference |", "|---|---|---|---|"]
    for i in range(2):
        a, b = r["minimind"][i], r["minilmd"][i]
        rows.append(f"| loss at step {i + 1} | {a:.4f} | {b:.6f} | {b - a:+.6f} |")
    rows.append(f"| Adam's first moment after step 2, largest difference / largest value | | | {r['moment']:.1e} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="a folder for both runs (default: a temporary one, removed)")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3, help="MiniMind's --learning_rate (its first step runs at 0.55x)")
    ap.add_argument("--beta", type=float, default=0.15)
    ap.add_argument("--mask", choices=("equal", "full"), default="equal",
                    help="equal: cut the newline after <|im_end|> so both have the same targets; full: keep it")
    ap.add_argument("--minilmd-lr-scale", type=float, default=1.0)
    ap.add_argument("--python", default=os.environ.get("MINILMD_MINIMIND_PYTHON", sys.executable),
                    help="the python MiniMind runs under, with its datasets (default $MINILMD_MINIMIND_PYTHON, else "
                         "this one)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line after the table")
    args = ap.parse_args(argv)
    from gpu_check_sidebyside import find_minimind

    src = find_minimind()
    if src is None:
        print("MiniMind's source not found (../shared/minimind or MINILMD_MINIMIND)")
        return EXIT_CONFIG
    work = args.work or Path(tempfile.mkdtemp(prefix="dpo-steps-"))
    try:
        r = compare(work, src, args.python, args.pairs, args.lr, args.beta, args.mask, args.minilmd_lr_scale)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{r['pairs']} pairs, every side {r['length']} tokens, cut at {r['seq_len']} ({r['mask']} targets), "
          f"beta {r['beta']}, MiniMind --learning_rate {r['lr']:g} (step 1 at {r['lr1']:.6g}), minilmd lr "
          f"{r['minilmd_lr']:.6g}, fp32 CPU; ln 2 = {LN2:.6f}")
    print(table(r))
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
