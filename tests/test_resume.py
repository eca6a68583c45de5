"""Bit-exact resume: real `minilmd train` processes, real SIGKILL at several points, resumed to N steps.

One chain of attempts per mode (packed and padded), each attempt killed somewhere else: inside a save after the
weights file, between the rename and LATEST, before a step (MINILMD_FAULT), before the rename, and at a random
moment from outside. The final weights and optimizer state must be bit-identical to an uninterrupted run, and every
loss logged along the way identical to the uninterrupted run's loss at that step. Also: resuming with another model
config or corpus is refused with the difference shown, not turned into a fresh start.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minilmd import checkpoint as ck
from minilmd.config import load_config
from minilmd.protocol import EXIT_CONFIG, EXIT_DATA, EXIT_DONE, FAULT_ENV, HEARTBEAT, METRICS
from trainer_corpus import real_text_prepared, synthetic_prepared

STEPS = 20
TINY_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, int]:
    return real_text_prepared(tmp_path_factory.mktemp("resume-corpus"), n_docs=600, vocab_size=384)


def write_config(tmp: Path, corpus, name: str, mode: str, **model) -> Path:
    prepared, vocab = corpus
    body = {
        "run": {"name": name, "dir": str(tmp / name / "run"), "scratch": str(tmp / name / "scratch")},
        "data": {"prepared": str(prepared), "mode": mode, "val_windows": 4},
        "model": {**TINY_MODEL, "vocab_size": vocab, **model},
        "train": {"seq_len": 32, "micro_batch_size": 4, "grad_accum": 2, "lr": 3e-3, "warmup_steps": 2,
                  "max_steps": STEPS, "log_every": 1, "eval_every": 0, "checkpoint_every": 3, "keep_local": 2,
                  "device": "cpu"},
    }
    text = "".join(f"[{s}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in kv.items()) for s, kv in body.items())
    path = tmp / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def env_with(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, ck.KILL_ENV)}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def start(config: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "minilmd.cli", "train", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_with(**env))


def attempt(config: Path, **env) -> tuple[int, str]:
    proc = start(config, **env)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def heartbeat_step(run_dir: Path) -> int:
    try:
        return int((run_dir / HEARTBEAT).read_text().strip() or -1)
    except (FileNotFoundError, ValueError):
        return -1


def kill_at_random(config: Path, rng: random.Random) -> tuple[int, str, int]:
    """SIGKILL from outside once the heartbeat reaches a random step, after a random extra delay."""
    run_dir = load_config(config).run_dir
    target = rng.randint(13, 17)
    proc = start(config)
    while proc.poll() is None and heartbeat_step(run_dir) < target:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.02))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out, target


def losses_by_step(run_dir: Path) -> dict[int, set[float]]:
    seen: dict[int, set[float]] = {}
    for line in (run_dir / METRICS).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train":
            seen.setdefault(rec["step"], set()).add(rec["loss"])
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_killed_anywhere_resumes_bit_identical(tmp_path, corpus, mode):
    straight = write_config(tmp_path, corpus, "straight", mode)
    code, out = attempt(straight)
    assert code == EXIT_DONE, out

    killed = write_config(tmp_path, corpus, "killed", mode)
    ckpt_dir = load_config(killed).checkpoint_dir
    # (environment of the attempt, checkpoint the NEXT attempt must resume from)
    chain = [({ck.KILL_ENV: "after_model@6"}, "step-00000003"),       # mid-save: weights written, rest not
             ({ck.KILL_ENV: "before_latest@9"}, "step-00000009"),     # renamed into place, LATEST still at 6
             ({FAULT_ENV: "sigkill@11"}, "step-00000009"),           # between two steps
             ({ck.KILL_ENV: "before_rename@15"}, "step-00000012")]    # complete temp dir, never renamed
    for i, (env, resume_from) in enumerate(chain):
        code, out = attempt(killed, **env)
        assert code == -signal.SIGKILL, f"attempt {i} ({env}) was not killed:\n{out}"
        if i == 1:
            assert ck.read_latest(ckpt_dir) == "step-00000006" and (ckpt_dir / "step-00000009").is_dir()
        assert ck.find_latest([ckpt_dir], log=lambda s: None).name == resume_from, f"after attempt {i}"
    seed = random.randrange(1 << 30)
    code, out, target = kill_at_random(killed, random.Random(seed))
    assert code in (-signal.SIGKILL, EXIT_DONE), f"random kill (seed {seed}, step {target}):\n{out}"
    code, out = attempt(killed)
    assert code == EXIT_DONE, out
    assert "resumed from" in out

    a, b = load_config(straight).checkpoint_dir / f"step-{STEPS:08d}", ckpt_dir / f"step-{STEPS:08d}"
    for name in (ck.MODEL_FILE, ck.OPTIMIZER_FILE):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        diff = [k for k in ta if not torch.equal(ta[k], tb[k])]
        assert not diff, f"{mode}: {name} differs after resume in {diff[:5]} (random kill seed {seed})"
    state_a, state_b = (json.loads((d / ck.TRAINER_STATE).read_text()) for d in (a, b))
    # torch's generator is the one the trainer draws from (Python's and NumPy's are not seeded nor used).
    assert state_a["tokens_seen"] == state_b["tokens_seen"] and state_a["rng"]["torch"] == state_b["rng"]["torch"]

    reference = losses_by_step(load_config(straight).run_dir)
    resumed = losses_by_step(load_config(killed).run_dir)
    assert sorted(reference) == list(range(1, STEPS + 1)) and sorted(resumed) == sorted(reference)
    for step, losses in resumed.items():
        assert losses == reference[step], f"{mode}: step {step} logged {losses}, uninterrupted {reference[step]}"
    # The debris of the killed saves is gone and nothing had to be quarantined: the protocol never left a
    # half-written checkpoint under a final name.
    assert not list(ckpt_dir.glob(".tmp-*")) and not (ckpt_dir / ck.QUARANTINE).exists()


def test_resume_with_another_model_or_corpus_is_refused(tmp_path, corpus):
    config = write_config(tmp_path, corpus, "run", "packed")
    # Saves are written in the background; the save of step 6 waits for that of step 3, so at step 8 step 3 is on disk.
    code, out = attempt(config, **{FAULT_ENV: "sigkill@8"})
    assert code == -signal.SIGKILL, out
    ckpt = load_config(config).checkpoint_dir / "step-00000003"
    assert ckpt.is_dir()

    wider = write_config(tmp_path, corpus, "run", "packed", hidden_size=128)
    code, out = attempt(wider)
    assert code == EXIT_CONFIG, out
    assert "model.hidden_size: checkpoint 64, run 128" in out

    prepared, vocab = corpus  # same tokenizer, other documents
    other = synthetic_prepared(tmp_path / "other-corpus", prepared / "tokenizer.json", vocab)
    moved = write_config(tmp_path, (other, vocab), "run", "packed")
    code, out = attempt(moved)
    assert code == EXIT_DATA, out
    assert "data fingerprint differs" in out
    assert ckpt.is_dir() and not (ckpt.parent / ck.QUARANTINE).exists()  # refused, nothing moved or lost
