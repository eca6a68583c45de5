"""The sweep behind the DPO default learning rates (minilmd/config.py, DPO_DEFAULTS; docs/training.md, "DPO").

On the test suite's real preference pairs (tests/conftest.py's chat_corpus and dpo_corpus, built the same way and
shared with the tests' fixture cache): for each model shape, a short SFT on the chat corpus, then from it one short
DPO run per learning rate, full and LoRA, every one a real `minilmd train` process on the CPU (one thread). Per run
it prints the last validation's reward accuracy (chosen's implicit reward above rejected's), val loss, and the change
of the chosen and the rejected replies' summed log-probabilities against the reference (reward / beta): a rate that
learns lifts the accuracy well above 0.5 while chosen's log-prob does not collapse (a large negative change).

    .venv/bin/python scripts/dpo_lr_sweep.py --out /tmp/dpo-sweep [--shapes tiny,small] [--steps 60]

Prints a markdown table (the one in docs/training.md) and writes OUT/results.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SHAPES = {  # hidden x layers; the SFT rate that trains each from scratch in 300 steps
    "tiny": ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}, 3e-3),
    "small": ({"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}, 1e-3),
    "minimind26m": ({"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                     "num_key_value_heads": 4}, 1e-3),
}
FULL_LRS = (1e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
LORA_LRS = (1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
BETA = 0.1


def corpora() -> tuple[tuple[Path, int], tuple[Path, int]]:
    """(chat corpus, preference corpus), each (directory, vocabulary): tests/conftest.py's, from its cache."""
    from chat_helpers import (
        chat_bpe,
        chat_tokenizer_dir,
        chatterbot_slice,
        preference_pairs,
        prepared_chat,
        read_conversations,
        write_jsonl,
    )
    from data_helpers import demo_slice
    from fixture_cache import as_ordered, built_once, in_order, vocab_of

    demo = [str(p) for p in as_ordered(built_once("demo-jsonl", lambda out: in_order(out, demo_slice(out, 300))))]
    chat = as_ordered(built_once("chat-jsonl", lambda out: in_order(out, chatterbot_slice(out))))
    tok = built_once("chat-tokenizer", lambda out: chat_tokenizer_dir(
        chat_bpe(demo, chat, out / "bpe" / "tokenizer.json"), out / "tok")) / "tok"
    chat_root = built_once("chat-corpus", lambda out: prepared_chat(chat, tok, out / "corpus")) / "corpus"
    pairs = built_once("dpo-jsonl", lambda out: write_jsonl(out / "pairs.jsonl",
                                                          preference_pairs(read_conversations(chat))))
    dpo_root = built_once("dpo-corpus", lambda out: prepared_chat([pairs / "pairs.jsonl"], tok, out / "corpus",
                                                                  val_fraction=0.1, data_format="dpo")) / "corpus"
    return (chat_root, vocab_of(chat_root)), (dpo_root, vocab_of(dpo_root))


def run(out: Path, corpus: tuple[Path, int], name: str, shape: dict, **sections) -> Path:
    from trainer_corpus import train, write_config

    config = write_config(out, corpus, name=name, model={**shape, "max_position_embeddings": 128}, **sections)
    t0 = time.monotonic()
    p = train(config, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"{name}: exit {p.returncode}\n{p.stderr[-3000:]}")
    print(f"  {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return config


def dpo_row(out: Path, dpo: tuple[Path, int], base: Path, shape_name: str, shape: dict, lr: float, lora: bool,
            steps: int) -> dict:
    from trainer_corpus import read_metrics, run_paths

    kind = "lora" if lora else "full"
    sections = {"init": {"from": str(run_paths(base)[1])}, "data": {"val_windows": 64}, "dpo": {"beta": BETA},
                "train": {"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "lr": lr, "warmup_steps": 2,
                          "max_steps": steps, "eval_every": steps // 3, "checkpoint_every": 10 * steps,
                          "log_every": 10}}
    if lora:
        sections["lora"] = {"rank": 8, "alpha": 16.0}
    config = run(out, dpo, f"{shape_name}-{kind}-{lr:g}", shape, **sections)
    evals = read_metrics(run_paths(config)[0], "eval")
    last = evals[-1]
    return {"shape": shape_name, "kind": kind, "lr": lr, "steps": steps,
            "val_reward_accuracy": [round(e["val_reward_accuracy"], 3) for e in evals],
            "val_loss": round(last["val_loss"], 4),
            "chosen_dlogp": round(last["val_reward_chosen"] / BETA, 2),
            "rejected_dlogp": round(last["val_reward_rejected"] / BETA, 2)}


def table(rows: list[dict]) -> str:
    lines = ["| model | DPO | lr | val reward accuracy (each eval) | val loss | chosen log-prob change | "
             "rejected log-prob change |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = " / ".join(f"{a:.3f}" for a in r["val_reward_accuracy"])
        lines.append(f"| {r['shape']} | {r['kind']} | {r['lr']:g} | {acc} | {r['val_loss']:.4f} | "
                     f"{r['chosen_dlogp']:+.2f} | {r['rejected_dlogp']:+.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--full", default=",".join(f"{x:g}" for x in FULL_LRS))
    ap.add_argument("--lora", default=",".join(f"{x:g}" for x in LORA_LRS))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    chat, dpo = corpora()
    rows: list[dict] = []
    for shape_name in args.shapes.split(","):
        shape, sft_lr = SHAPES[shape_name]
        base = run(args.out, chat, f"{shape_name}-sft", shape,
                   train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "lr": sft_lr, "max_steps": 300,
                          "checkpoint_every": 1000, "log_every": 50})
        for lora, lrs in ((False, args.full), (True, args.lora)):
            for lr in (float(x) for x in lrs.split(",") if x):
                rows.append(dpo_row(args.out, dpo, base, shape_name, shape, lr, lora, args.steps))
                (args.out / "results.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
