"""MiniMind's hyperparameter names (the argparse flags of its trainer/train_*.py, and the MiniMindConfig fields a
config copies) and what each is in a minilmd run config: the one table of them. A user migrating writes
`batch_size`, `learning_rate`, `epochs`... and got only "unknown key" (user7 #4); config.py's unknown-key message
now says the minilmd key and the difference in units (`unknown_key_hint`), and docs/operations.md's table is
checked against MINIMIND_NAMES by tests/test_minimind_names.py. The flags a MiniMind fork adds (`dynamic_pad`,
`length_bucket`: MINIMIND_FORK_NAMES), PEFT's LoraConfig and the HF Trainer's names (user9 F11: `lora.r`,
`gradient_accumulation_steps`) are looked up the same way (FOREIGN_NAMES), and their docs tables are checked
too. Torch-free, imports nothing of minilmd."""
from __future__ import annotations

from typing import NamedTuple


class MiniMindName(NamedTuple):
    key: str
    """The minilmd config key ("section.key"), or "" where minilmd has none."""
    note: str
    """How the value differs (units, meaning), or why there is no key."""


MINIMIND_NAMES: dict[str, MiniMindName] = {
    "batch_size": MiniMindName("train.micro_batch_size", "rows per device per forward/backward, as MiniMind's"),
    "learning_rate": MiniMindName("train.lr", "the peak of a cosine schedule down to lr x train.min_lr_ratio "
                                              "(0.1, as MiniMind's get_lr)"),
    "epochs": MiniMindName("train.max_epochs", "passes over the prepared train split, fractions allowed; or a "
                                               "budget in steps (train.max_steps) or tokens (train.max_tokens)"),
    "accumulation_steps": MiniMindName("train.grad_accum", "micro-batches per optimizer step; MiniMind's "
                                                           "train_pretrain.py defaults to 8 (its SFT, LoRA and DPO "
                                                           "trainers to 1), minilmd to 1 for every stage: "
                                                           "grad_accum = 8 for MiniMind's pretraining batch"),
    "max_seq_len": MiniMindName("train.seq_len", "tokens per row; the corpus is cut at prepare's --seq-len"),
    "data_path": MiniMindName("data.prepared", "a directory `minilmd prepare FILE.jsonl --out DIR` wrote, not "
                                               "the .jsonl"),
    "grad_clip": MiniMindName("train.grad_clip", "the same"),
    "dtype": MiniMindName("train.dtype", "\"auto\", \"bf16\" or \"fp32\""),
    "device": MiniMindName("train.device", "\"auto\", \"cpu\" or \"cuda\"; the GPU is chosen by [gpu]"),
    "log_interval": MiniMindName("train.log_every", "steps, the same"),
    "save_interval": MiniMindName("train.checkpoint_every", "steps (an integer) or a duration (\"5m\")"),
    "save_dir": MiniMindName("run.remote", "where checkpoints are kept (step directories; `minilmd export "
                                           "--format minimind` writes MiniMind's .pth)"),
    "from_weight": MiniMindName("init.from", "the path of a .pth or of a minilmd checkpoint, run or config"),
    "use_compile": MiniMindName("train.compile", "true, false or \"auto\""),
    "hidden_size": MiniMindName("model.hidden_size", "the same"),
    "num_hidden_layers": MiniMindName("model.num_hidden_layers", "the same"),
    "beta": MiniMindName("dpo.beta", "the same (MiniMind's train_dpo.py: 0.15; here 0.1)"),
    "lora_name": MiniMindName("", "a LoRA run is one with lora.rank above 0 (MiniMind's: 16); its adapter is "
                                  "kept in its checkpoints"),
    "flash_attn": MiniMindName("model.attention", "\"auto\" picks the fastest kernel there is"),
    "use_wandb": MiniMindName("log.tensorboard", "TensorBoard files in run.dir, not wandb"),
    "wandb_project": MiniMindName("", "no wandb; log.tensorboard writes TensorBoard files"),
    "use_moe": MiniMindName("", "minilmd trains the dense model only"),
    "dropout": MiniMindName("", "no dropout in the model (lora.dropout is the adapters')"),
    "from_resume": MiniMindName("", "a run resumes from its newest checkpoint by itself"),
    "save_weight": MiniMindName("", "checkpoints are step directories; `minilmd export --format minimind --out "
                                    "FILE.pth` names the .pth"),
    "num_workers": MiniMindName("", "the prepared corpus is memory-mapped: no loader workers"),
}
"""MiniMind's name -> its minilmd key and how it differs. Names minilmd spells the same (grad_clip, hidden_size)
are here too: written in another section (`[train] hidden_size`) they are unknown there."""

NO_PADDING_TO_SET = ("minilmd packs pretraining (no padding) and length-buckets SFT/DPO by default (data.mode = "
                     "\"bucketed\": each micro-batch padded to its longest row): nothing to set")

MINIMIND_FORK_NAMES: dict[str, MiniMindName] = {
    "dynamic_pad": MiniMindName("", NO_PADDING_TO_SET),
    "length_bucket": MiniMindName("", NO_PADDING_TO_SET),
}
"""Flags of a modified MiniMind trainer, not of MiniMind's own (its train_*.py have neither: ../shared/minimind): a
published reproduction patched MiniMind's data loading to pad each batch to its longest row and group rows of like
length, `--dynamic_pad 1 --length_bucket 1`, and people bring its commands along. Said as a fork's, never as
MiniMind's (tests/test_minimind_names.py checks that MiniMind's trainers still lack them)."""


PEFT_NAMES: dict[str, MiniMindName] = {
    "r": MiniMindName("lora.rank", "the same; 0 (the default) is no LoRA"),
    "lora_alpha": MiniMindName("lora.alpha", "the same: the bypass is scaled by alpha / rank"),
    "lora_dropout": MiniMindName("lora.dropout", "the same"),
    "target_modules": MiniMindName("lora.targets", "a list among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                                   "down_proj (no regex, no \"all-linear\")"),
    "bias": MiniMindName("", "no bias is trained (PEFT's \"none\")"),
    "task_type": MiniMindName("", "a causal LM always; `minilmd export --format peft` writes CAUSAL_LM"),
}
"""PEFT's LoraConfig names (what `--format peft` exports, docs/formats.md) -> the minilmd key."""

HF_TRAINER_NAMES: dict[str, MiniMindName] = {
    "per_device_train_batch_size": MiniMindName("train.micro_batch_size", "rows per device per forward/backward"),
    "gradient_accumulation_steps": MiniMindName("train.grad_accum", "the same"),
    "num_train_epochs": MiniMindName("train.max_epochs", "passes over the prepared train split, fractions allowed"),
    "warmup_ratio": MiniMindName("train.warmup_steps", "in steps, not a share of the run"),
    "max_grad_norm": MiniMindName("train.grad_clip", "the same"),
    "logging_steps": MiniMindName("train.log_every", "the same"),
    "eval_steps": MiniMindName("train.eval_every", "the same"),
    "save_steps": MiniMindName("train.checkpoint_every", "steps (an integer) or a duration (\"5m\")"),
    "save_total_limit": MiniMindName("train.keep_local", "checkpoints kept in scratch (sync.keep: on run.remote)"),
    "output_dir": MiniMindName("run.remote", "where checkpoints are kept; run.dir holds the logs and state"),
    "bf16": MiniMindName("train.dtype", "dtype = \"bf16\" (or \"auto\": bf16 where the card has it)"),
    "fp16": MiniMindName("train.dtype", "no fp16: dtype = \"bf16\", \"fp32\" or \"auto\""),
    "max_seq_length": MiniMindName("train.seq_len", "tokens per row; the corpus is cut at prepare's --seq-len"),
    "lr_scheduler_type": MiniMindName("", "always a cosine from train.lr down to lr x train.min_lr_ratio after "
                                          "train.warmup_steps"),
}
"""The HF Trainer's (and TRL's) TrainingArguments names -> the minilmd key; learning_rate is MiniMind's too."""

FOREIGN_NAMES: dict[str, dict[str, MiniMindName]] = {
    "MiniMind's": MINIMIND_NAMES, "a MiniMind fork's": MINIMIND_FORK_NAMES, "PEFT's": PEFT_NAMES,
    "the HF Trainer's": HF_TRAINER_NAMES}
"""Whose names, in the order an unknown key is looked up (a name in two, MiniMind's wins)."""


def unknown_key_hint(section: str, key: str) -> str:
    """What an unknown `section.key` is, when `key` is a MiniMind (or MiniMind fork's), PEFT or HF Trainer name:
    "did you mean train.lr? (MiniMind's learning_rate: ...)", or "MiniMind's use_moe: minilmd has no such key: ...";
    "" for any other name."""
    whose, found = next(((whose, table[key]) for whose, table in FOREIGN_NAMES.items() if key in table),
                        ("", None))
    if found is None or found.key == f"{section}.{key}":
        return ""
    if not found.key:
        return f"{whose} {key}: minilmd has no such key: {found.note}"
    return f"did you mean {found.key}? ({whose} {key}: {found.note})"


def foreign_flag_hint(args: list[str]) -> tuple[str, str] | None:
    """The first `--name` in a command's arguments that is a MiniMind (MiniMind fork's, PEFT, HF Trainer) name, and
    what to write instead: `--epochs 2` -> ("--epochs", "MiniMind's epochs is train.max_epochs here: use --set
    train.max_epochs=2 (...)") (user10 #5: typer said only "No such option"). None without one."""
    for i, arg in enumerate(args):
        if arg == "--":
            return None
        if not arg.startswith("--"):
            continue
        flag, eq, value = arg.partition("=")
        name = flag[2:].replace("-", "_")
        whose, found = next(((whose, table[name]) for whose, table in FOREIGN_NAMES.items() if name in table),
                            ("", None))
        if found is None:
            continue
        if not found.key:
            return flag, f"{whose} {name}: minilmd has no such key: {found.note}"
        if not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else "VALUE"
        if name == "data_path":  # a .jsonl is no prepared corpus: --set data.prepared=X.jsonl would be refused
            return flag, (f"{whose} {name} is a .jsonl; minilmd trains on a prepared corpus: run `minilmd prepare "
                          f"{value} --out DIR` (with --format chat for SFT data, --format dpo for preference pairs), "
                          f"then use --set {found.key}=DIR")
        return flag, f"{whose} {name} is {found.key} here: use --set {found.key}={value} ({found.note})"
    return None
