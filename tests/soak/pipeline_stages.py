"""The pipeline soak's three stages (docs/operations.md, "A pipeline: pretrain, SFT, LoRA"), written as configs:
pretrain (packed, real Chinese text), SFT on a chat corpus (the SFT defaults: bucketed rows) with the pretraining
corpus as its probe, a LoRA on a second chat corpus with early stop and the SFT corpus as its probe; each later
stage's `[init] from` names the previous stage's config file. Used twice by tests/soak/pipeline.py: the faulted
pipeline (corpora and remotes on the FUSE fault filesystem) and the undisturbed reference (local copies)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from chat_synthetic import synthetic_chat_prepared
from minilmd.config import load_config
from supervisor_helpers import env_for
from trainer_corpus import ONE_LAYER_MODEL, read_metrics, real_text_prepared, write_config

STAGES = ("pretrain", "sft", "lora")
SHARES = {"pretrain": 0.4, "sft": 0.3, "lora": 0.3}  # of the steps budget; the LoRA stops early, near step 90
HANG_TIMEOUT_S = 5
CORPUS_OF = {"pretrain": "corpus-pretrain", "sft": "corpus-chat", "lora": "corpus-style"}
PROBE_OF = {"sft": "corpus-pretrain", "lora": "corpus-chat"}
BEFORE = {"sft": "pretrain", "lora": "sft"}


def make_corpora(root: Path) -> int:
    """The three prepared corpora under root (corpus-pretrain, corpus-chat, corpus-style), one tokenizer; returns
    the vocabulary size."""
    made, vocab = real_text_prepared(root / "build", n_docs=1500, vocab_size=512)
    shutil.copytree(made, root / "corpus-pretrain")
    tokenizer = root / "build" / "tok" / "tokenizer.json"
    synthetic_chat_prepared(root / "corpus-chat", tokenizer, vocab, n=160, seed=1, mean_len=30.0, max_len=64)
    synthetic_chat_prepared(root / "corpus-style", tokenizer, vocab, n=48, seed=2, mean_len=30.0, max_len=64)
    return vocab


def stage_sections(name: str, steps: int, data: Path, remote: Path, probe: Path | None, before: Path | None) -> dict:
    train = {"seq_len": 32 if name == "pretrain" else 64, "micro_batch_size": 1, "grad_accum": 4,
             "max_steps": steps, "checkpoint_every": 20, "keep_local": 2, "log_every": 5,
             "eval_every": 0 if name == "pretrain" else 10}
    body = {
        # micro-batch 1: an OOM has nothing to halve, so the weights stay comparable bit for bit
        "run": {"remote": str(remote), "keep_scratch": False},  # a finished run gives its scratch back
        "data": {"prepared": str(data), "val_windows": 2},
        "model": dict(ONE_LAYER_MODEL),
        "train": train,
        "sync": {"every": "3s", "keep": 3},
        "restart": {"backoff_initial": "0.2s", "backoff_max": "1s", "hang_timeout": f"{HANG_TIMEOUT_S}s",
                    "exit_timeout": "60s", "max_restarts": 100000, "no_progress_limit": 10},
    }
    if before is not None:
        body["init"] = {"from": str(before)}
    if probe is not None:
        body["eval"] = {"probe": str(probe)}
    if name == "lora":
        body["train"]["lr"] = 1e-3
        body["lora"] = {"rank": 4, "alpha": 8.0}
        body["early_stop"] = {"patience": 2, "min_delta": 0.003}  # random tokens: the val loss creeps down
    return body


def write_pipeline(where: Path, corpora: Path, remotes: Path, vocab: int, steps: int) -> dict[str, Path]:
    """The three stage configs in `where` (run dirs and scratch under it), reading corpora/<corpus> and syncing to
    remotes/remote-<stage>; returns {stage: config path}."""
    where.mkdir(parents=True, exist_ok=True)
    configs: dict[str, Path] = {}
    for name in STAGES:
        probe = corpora / PROBE_OF[name] if name in PROBE_OF else None
        before = configs[BEFORE[name]] if name in BEFORE else None
        sections = stage_sections(name, max(40, int(steps * SHARES[name]) // 20 * 20), corpora / CORPUS_OF[name],
                                  remotes / f"remote-{name}", probe, before)
        configs[name] = write_config(where, (corpora / CORPUS_OF[name], vocab), name, **sections)
    return configs


def calibrate(work: Path, corpora: Path, vocab: int, minutes: float) -> int:
    """Total steps such that the undisturbed pipeline alone would take about 60 % of the fault phase (restarts,
    hangs and outages take the rest; a pipeline that outlasts the phase finishes undisturbed), from a short plain
    `minilmd train` of the pretraining stage (noisy on a loaded machine: --steps overrides it)."""
    where = work / "calibrate"
    where.mkdir(parents=True, exist_ok=True)
    sections = stage_sections("pretrain", 40, corpora / CORPUS_OF["pretrain"], where / "remote", None, None)
    del sections["run"]["remote"]
    config = write_config(where, (corpora / CORPUS_OF["pretrain"], vocab), "calibrate", **sections)
    load_config(config).run_dir.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-m", "minilmd.cli", "train", str(config)], capture_output=True, text=True,
                         env=env_for(fake=False), timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"calibration run failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
    times = sorted(m["step_time"] for m in read_metrics(load_config(config).run_dir, "train"))
    per_step = times[len(times) // 2] * 1.6  # saves, evals and the SFT's longer rows on top of the median step
    startups = 3 * 15.0  # three trainer starts, staging and the final syncs
    return max(200, int((minutes * 60 * 0.6 - startups) / per_step))
