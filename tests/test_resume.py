"""Bit-exact resume: real `minilmd train` processes, real SIGKILL at several points, resumed to the end (in the
test's own process: nothing kills that one).

Packed mode: one chain of attempts, each killed somewhere else: inside a save after the weights file, between the
rename and LATEST, between two steps (MINILMD_FAULT), and at a random moment from outside. Padded mode: one kill
inside a save (what the modes do differently is the sampler, whose position a resume must restore; the kill points
themselves are the same in both modes, and what each leaves on disk, before_rename and before_manifest included, is
test_checkpoint's test_sigkill_inside_save_leaves_a_usable_root). The final weights and optimizer state must be
bit-identical to the session's undisturbed run of that mode (conftest's `undisturbed`), and every loss logged along
the way identical to its loss at that step. Also: resuming with another model config or corpus is refused with the
difference shown, not turned into a fresh start.
"""
from __future__ import annotations

import json
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs, checkpoint_select, scratch
from minilmd.config import load_config
from minilmd.names import FAULT_ENV, QUARANTINE
from minilmd.protocol import EXIT_CONFIG, EXIT_DATA, EXIT_DONE
from resume_helpers import attempt, attempt_here, heartbeat_step, losses_by_step, start
from supervisor_helpers import BASELINE, write_config
from trainer_corpus import ONE_LAYER_MODEL, synthetic_prepared
from waiting import wait_until

pytestmark = pytest.mark.slow
STEPS = BASELINE["train"]["max_steps"]  # 16, a checkpoint every 4 steps, the newest 2 kept
# (environment of an attempt, checkpoint the NEXT attempt must resume from)
CHAINS = {
    "packed": [({ck.KILL_ENV: "after_model@8"}, "step-00000004"),     # mid-save: weights written, rest not
               ({ck.KILL_ENV: "before_latest@12"}, "step-00000012"),  # renamed into place, LATEST still at 8
               ({FAULT_ENV: "sigkill@14"}, "step-00000012")],         # between two steps
    "padded": [({ck.KILL_ENV: "after_model@8"}, "step-00000004")],
}


def kill_at_random(config: Path, rng: random.Random) -> tuple[int, str, int]:
    """SIGKILL from outside once the heartbeat reaches a random step, after a random extra delay."""
    run_dir = load_config(config).run_dir
    target = rng.randint(13, STEPS - 1)
    proc = start(config)
    wait_until(lambda: proc.poll() is not None or heartbeat_step(run_dir) >= target, 300,
               f"the heartbeat to reach step {target}", interval=0.002)
    time.sleep(rng.uniform(0, 0.02))  # the random moment of the kill itself, anywhere in the step or save
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out, target


def test_a_kill_between_the_last_save_and_its_prune_is_pruned_when_the_finished_run_is_resumed(tmp_path, corpus,
                                                                                              undisturbed):
    """The budget's last checkpoint saved whole, the process killed before the older ones were pruned: the resumed
    run finds nothing left to train and saves nothing, so it prunes there (keep_local 2), else the extra checkpoint
    stays for ever."""
    config = undisturbed("packed").config_like(tmp_path, "pruned")
    ckpt_dir = load_config(config).checkpoint_dir
    code, out = attempt(config, **{ck.KILL_ENV: f"before_prune@{STEPS}"})
    assert code == -signal.SIGKILL, out
    names = [f"step-{s:08d}" for s in (STEPS - 8, STEPS - 4, STEPS)]
    assert [d.name for d in checkpoint_dirs.list_checkpoints(ckpt_dir)] == names
    code, out = attempt_here(config)
    assert code == EXIT_DONE and "resumed from" in out, out
    assert [d.name for d in checkpoint_dirs.list_checkpoints(ckpt_dir)] == names[1:]


@pytest.mark.parametrize("mode", sorted(CHAINS))
def test_killed_anywhere_resumes_bit_identical(tmp_path, corpus, undisturbed, mode):
    straight = undisturbed(mode)
    killed = straight.config_like(tmp_path, "killed")
    ckpt_dir = load_config(killed).checkpoint_dir
    for i, (env, resume_from) in enumerate(CHAINS[mode]):
        code, out = attempt(killed, **env)
        assert code == -signal.SIGKILL, f"attempt {i} ({env}) was not killed:\n{out}"
        if "before_latest" in env.get(ck.KILL_ENV, ""):
            assert checkpoint_dirs.read_latest(ckpt_dir) == "step-00000008" and (ckpt_dir / "step-00000012").is_dir()
        assert checkpoint_select.find_latest([ckpt_dir], log=lambda s: None).name == resume_from, f"after attempt {i}"
    seed = random.randrange(1 << 30)
    if mode == "packed":
        code, out, target = kill_at_random(killed, random.Random(seed))
        assert code in (-signal.SIGKILL, EXIT_DONE), f"random kill (seed {seed}, step {target}):\n{out}"
    code, out = attempt_here(killed)
    assert code == EXIT_DONE, out
    assert "resumed from" in out

    a, b = straight.checkpoint, ckpt_dir / f"step-{STEPS:08d}"
    assert a.name == b.name
    for name in (ck.MODEL_FILE, ck.OPTIMIZER_FILE):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        diff = [k for k in ta if not torch.equal(ta[k], tb[k])]
        assert not diff, f"{mode}: {name} differs after resume in {diff[:5]} (random kill seed {seed})"
    state_a, state_b = (json.loads((d / ck.TRAINER_STATE).read_text()) for d in (a, b))
    # torch's generator is the one the trainer draws from (Python's and NumPy's are not seeded nor used).
    assert state_a["tokens_seen"] == state_b["tokens_seen"] and state_a["rng"]["torch"] == state_b["rng"]["torch"]

    reference = losses_by_step(straight.run_dir)
    resumed = losses_by_step(load_config(killed).run_dir)
    assert sorted(reference) == list(range(1, STEPS + 1)) and sorted(resumed) == sorted(reference)
    for step, losses in resumed.items():
        assert losses == reference[step], f"{mode}: step {step} logged {losses}, uninterrupted {reference[step]}"
    # The debris of the killed saves is gone and nothing had to be quarantined: the protocol never left a
    # half-written checkpoint under a final name.
    assert not list(ckpt_dir.glob(".tmp-*")) and not (ckpt_dir / QUARANTINE).exists()


def test_resume_with_another_model_or_corpus_is_refused(tmp_path, corpus, undisturbed):
    straight = undisturbed()
    config = straight.config_like(tmp_path, "run")
    cfg = load_config(config)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, False)  # this run's: a marker-less one is not adopted
    ckpt = cfg.checkpoint_dir / "step-00000012"  # a run part-way: a copy of the undisturbed one's
    shutil.copytree(straight.checkpoint.parent / ckpt.name, ckpt)

    hidden = ONE_LAYER_MODEL["hidden_size"]
    wider = straight.config_like(tmp_path, "run", model={"hidden_size": 2 * hidden})
    code, out = attempt_here(wider)
    assert code == EXIT_CONFIG, out
    assert f"model.hidden_size: checkpoint {hidden}, run {2 * hidden}" in out

    prepared, vocab = corpus  # same tokenizer, other documents
    other = synthetic_prepared(tmp_path / "other-corpus", prepared / "tokenizer.json", vocab)
    moved = write_config(tmp_path, (other, vocab), "run", remote=False, **BASELINE)
    code, out = attempt_here(moved)
    assert code == EXIT_DATA, out
    assert "data fingerprint differs" in out
    assert ckpt.is_dir() and not (ckpt.parent / QUARANTINE).exists()  # refused, nothing moved or lost
