"""A bucketed SFT run, as `minilmd train` processes: from [init] from, killed at random points, resumed bit-exactly.

One chain of attempts on the real chat corpus (chatterbot-corpus's dialogs, `prepare --format chat`: conftest's
chat_corpus), the config leaving data.mode and the rates to the SFT defaults and the budget in epochs: SIGKILL
inside a save (after the weights file), then the init source deleted, then SIGKILL from outside at a random moment
(those in processes of their own), then to the end (in the test's process, as the undisturbed run). The final
weights and optimizer state must be bit-identical to an undisturbed run's, every logged loss identical at its step,
and every checkpoint must record the source's fingerprint (the resumes never read init.from again: it is gone).
"""
from __future__ import annotations

import json
import math
import random
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs, checkpoint_select
from minilmd.config import load_config
from minilmd.protocol import EXIT_DONE
from minilmd.untrusted import sha256_regular
from resume_helpers import attempt, attempt_here, heartbeat_step, losses_by_step, start
from trainer_corpus import write_config
from waiting import wait_until
from weights_helpers import save_checkpoint, tiny_model

pytestmark = pytest.mark.slow
EPOCHS = 0.17  # of about 700 conversations in global batches of 8 rows: 15 or so steps


def sft_config(tmp_path, chat, name: str, source) -> Path:
    """No data.mode, lr nor min_lr_ratio: the SFT defaults decide them."""
    path = write_config(tmp_path, chat, name=name, init={"from": str(source)},
                        train={"seq_len": 128, "micro_batch_size": 4, "grad_accum": 2, "max_steps": 0,
                               "max_epochs": EPOCHS, "warmup_steps": 0, "checkpoint_every": 4, "keep_local": 2},
                        data={"val_windows": 4})
    path.write_text(re.sub(r"^lr = .*\n", "", path.read_text(), flags=re.M))
    return path


def test_bucketed_sft_killed_anywhere_resumes_bit_identical(tmp_path, chat_corpus):
    chat, (prepared, vocab) = chat_corpus, chat_corpus
    conversations = json.loads((prepared / "meta.json").read_text())["splits"]["train"]["documents"]
    steps = math.ceil(EPOCHS * (conversations - conversations % 4) / 8)
    assert 12 < steps < 20, conversations
    source = save_checkpoint(tmp_path / "pretrain" / "checkpoints", tiny_model(seed=9, vocab_size=vocab), step=2)
    doomed = tmp_path / "doomed-copy"
    shutil.copytree(source.parent, doomed)
    straight, killed = sft_config(tmp_path, chat, "straight", source.parent), sft_config(tmp_path, chat, "killed",
                                                                                        doomed)
    code, out = attempt_here(straight)
    assert code == EXIT_DONE, out
    assert "SFT defaults: data.mode = 'bucketed', train.lr = 1e-05" in out and "initialised from" in out

    code, out = attempt(killed, **{ck.KILL_ENV: "after_model@8"})  # inside the save of step 8
    assert code == -signal.SIGKILL, out
    ckpt_dir = load_config(killed).checkpoint_dir
    assert checkpoint_select.find_latest([ckpt_dir], log=lambda s: None).name == "step-00000004"
    shutil.rmtree(doomed)  # the init source is gone: the run must not need it any more
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    target = rng.randint(9, steps - 1)
    proc = start(killed)
    run_dir = load_config(killed).run_dir
    wait_until(lambda: proc.poll() is not None or heartbeat_step(run_dir) >= target, 300,
               f"the heartbeat to reach step {target}", interval=0.002)
    time.sleep(rng.uniform(0, 0.02))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode in (-signal.SIGKILL, EXIT_DONE), f"random kill (seed {seed}, step {target}):\n{out}"
    assert "initialised from" not in out
    code, out = attempt_here(killed)
    assert code == EXIT_DONE, out
    assert "resumed from" in out and "initialised from" not in out

    a = load_config(straight).checkpoint_dir / f"step-{steps:08d}"
    b = ckpt_dir / a.name
    for name in (ck.MODEL_FILE, ck.OPTIMIZER_FILE):
        ta, tb = load_file(a / name), load_file(b / name)
        diff = [k for k in ta if not torch.equal(ta[k], tb[k])]
        assert ta.keys() == tb.keys() and not diff, f"{name} differs in {diff[:5]} (random kill seed {seed})"
    assert losses_by_step(run_dir) == losses_by_step(load_config(straight).run_dir)
    states = [json.loads((d / ck.TRAINER_STATE).read_text()) for d in checkpoint_dirs.list_checkpoints(ckpt_dir)]
    assert len(states) == 2 and states[-1]["step"] == steps and states[0]["step"] >= 8
    want = json.loads((a / ck.TRAINER_STATE).read_text())["init"]
    assert want["manifest_sha256"] == sha256_regular(source / ck.MANIFEST) and want["step"] == 2
    assert all({**s["init"], "from": None, "path": None} == {**want, "from": None, "path": None} for s in states)
    assert all(s["config"]["data"]["mode"] == "bucketed" and s["config"]["train"]["lr"] == 1e-5 for s in states)
