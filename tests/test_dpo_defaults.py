"""DPO's default learning rates (issue 42; minilmd/config.py stage_defaults, minilmd/plan/budget.py lr_line): a
preference run whose config leaves train.lr out runs at DPO's default (LoRA DPO's when [lora] is on), which `run
--check`, the plan and the trainer agree on; a resumed run keeps the rate its checkpoints record; lr 0 is a sanity
run that `run --check` warns about."""
from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from in_process import train_in_process
from minilmd.cli import app
from minilmd.config import (
    DPO_DEFAULTS,
    DPO_LORA_DEFAULTS,
    SFT_DEFAULTS,
    SFT_LORA_DEFAULTS,
    apply_stage_defaults,
    keep_recorded_schedule,
    load_config,
)
from minilmd.plan.budget import as_trained, lr_line, planned
from minilmd.plan.schedule import lr_at
from minilmd.protocol import EXIT_DONE
from trainer_corpus import read_metrics, write_config

DPO_LR = DPO_DEFAULTS["train.lr"]
LORA_LR = DPO_LORA_DEFAULTS["train.lr"]


def without_lr(config):
    """The config with its train.lr line taken out (write_config always writes one): left to the defaults."""
    config.write_text(re.sub(r"^lr = .*\n", "", config.read_text(encoding="utf-8"), flags=re.M), encoding="utf-8")
    return config


def _dpo(tmp_path, corpus, name, **sections):
    train_values = {"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, **sections.pop("train", {})}
    return write_config(tmp_path, corpus, name=name, data={"val_windows": 64}, train=train_values, **sections)


def test_a_preference_run_that_leaves_lr_out_runs_at_the_dpo_default_and_the_plan_says_so(tmp_path, dpo_corpus,
                                                                                         chat_corpus):
    full = load_config(without_lr(_dpo(tmp_path, dpo_corpus, "full")))
    assert not full.is_set("train.lr") and full.train.lr == 5e-4  # the schema's (pretraining's) default, as read
    assert as_trained(full).train.lr == DPO_LR and full.train.lr == 5e-4  # a copy: the config is left as it is
    assert planned(full).lr == DPO_LR
    assert lr_line(full).startswith(f"lr {DPO_LR:g} (DPO default; set train.lr to change)")
    lora = load_config(without_lr(_dpo(tmp_path, dpo_corpus, "lora", lora={"rank": 8},
                                       init={"from": str(tmp_path / "base")})))
    assert as_trained(lora).train.lr == LORA_LR and LORA_LR > DPO_LR
    assert lr_line(lora).startswith(f"lr {LORA_LR:g} (LoRA DPO default; set train.lr to change)")
    set_here = load_config(_dpo(tmp_path, dpo_corpus, "set", train={"lr": 2e-6}))
    assert as_trained(set_here).train.lr == 2e-6 and lr_line(set_here).startswith("lr 2e-06 (set in the config)")
    sft = load_config(without_lr(write_config(tmp_path, chat_corpus, name="sft")))
    assert lr_line(sft).startswith(f"lr {SFT_DEFAULTS['train.lr']:g} (SFT default; set train.lr to change)")


def test_a_lora_run_on_a_chat_corpus_runs_at_the_lora_sft_default_which_check_the_plan_and_trainer_say(
        tmp_path, chat_corpus):
    """Walk 4 #1: a LoRA stage on an SFT corpus ran at the full model's SFT rate (1e-5), its adapters barely moved;
    it has a row of its own (MiniMind's train_lora.py's 1e-4), bucketed and cosine to a tenth as SFT."""
    from trainer.loop.resume import start_lines

    lora_lr = SFT_LORA_DEFAULTS["train.lr"]
    cfg = load_config(without_lr(write_config(tmp_path, chat_corpus, name="lora", lora={"rank": 4},
                                              init={"from": str(tmp_path / "base")})))
    assert lora_lr == 1e-4 and as_trained(cfg).train.lr == lora_lr and planned(cfg).lr == lora_lr
    assert as_trained(cfg).data.mode == "bucketed"
    assert lr_line(cfg).startswith(f"lr {lora_lr:g} (LoRA SFT default; set train.lr to change), cosine down to "
                                   f"{lora_lr / 10:g}")
    applied = apply_stage_defaults(cfg, "chat")  # as the trainer applies them: the config its checkpoints record
    assert applied["train.lr"] == lora_lr and cfg.train.lr == lora_lr
    said = start_lines(cfg, 1000, 10, "cpu x 1", (0, 8), 8, "chat", applied)
    assert f"chat corpus, LoRA SFT defaults: data.mode = 'bucketed', train.lr = {lora_lr!r}" in said[-1]
    # a LoRA SFT run begun at the old default (1e-5) goes on at it
    assert keep_recorded_schedule(cfg, {"train": {"lr": 1e-5, "min_lr_ratio": 0.1}}) == {
        "train.lr": f"train.lr = 1e-05 kept from the checkpoint (a fresh start would use {lora_lr!r})"}
    assert cfg.train.lr == 1e-5


def test_a_resume_keeps_the_recorded_rates_the_config_leaves_to_a_default_and_a_set_one_wins(tmp_path, dpo_corpus):
    cfg = load_config(without_lr(_dpo(tmp_path, dpo_corpus, "r")))
    said = keep_recorded_schedule(cfg, {"train": {"lr": 5e-4, "min_lr_ratio": 0.1}})
    assert cfg.train.lr == 5e-4 and said == {}  # the same as now: nothing to say
    cfg.train.lr = DPO_LR  # as the trainer's stage defaults set it, before the resume
    said = keep_recorded_schedule(cfg, {"train": {"lr": 5e-4, "min_lr_ratio": 0.1}})
    assert cfg.train.lr == 5e-4 and said == {"train.lr": f"train.lr = 0.0005 kept from the checkpoint (a fresh start "
                                                          f"would use {DPO_LR!r})"}
    explicit = load_config(_dpo(tmp_path, dpo_corpus, "e", train={"lr": 2e-6}))
    said = keep_recorded_schedule(explicit, {"train": {"lr": 5e-4}})
    assert explicit.train.lr == 2e-6 and said == {"train.lr": "train.lr = 2e-06 as the config sets it (the "
                                                               "checkpoint's run used 0.0005)"}
    assert keep_recorded_schedule(explicit, {"train": {"lr": "fast"}}) == {}  # a damaged record is no rate


@pytest.mark.slow  # two config checks, each with its storage probe threads
def test_check_says_the_rate_and_where_it_comes_from_and_warns_of_lr_0(tmp_path, dpo_corpus):
    out = CliRunner().invoke(app, ["run", "--check", str(without_lr(_dpo(tmp_path, dpo_corpus, "d",
                                                                         train={"max_steps": 4})))])
    assert out.exit_code == 0, out.output
    assert f"lr {DPO_LR:g} (DPO default; set train.lr to change)" in out.output
    out = CliRunner().invoke(app, ["run", "--check", str(_dpo(tmp_path, dpo_corpus, "z", train={"lr": 0.0}))])
    assert out.exit_code == 0, out.output  # accepted: a sanity run
    assert "WARNING: train.lr = 0: a sanity run, the weights will not move" in out.output


@pytest.mark.slow  # two short DPO runs in real processes
def test_the_trainer_runs_at_the_dpo_default_and_a_resume_keeps_the_rate_it_started_with(tmp_path,
                                                                                        small_dpo_corpus):
    config = without_lr(_dpo(tmp_path, small_dpo_corpus, "default", train={"max_steps": 2, "warmup_steps": 0}))
    p = train_in_process(config)
    assert p.returncode == EXIT_DONE, p.stderr
    assert f"dpo corpus, DPO defaults: train.lr = {DPO_LR!r}" in p.stdout
    lines = read_metrics(load_config(config).run_dir, "train")
    assert [m["lr"] for m in lines] == [lr_at(s, 2, DPO_LR, 0.1) for s in range(2)]

    started = _dpo(tmp_path, small_dpo_corpus, "kept", train={"lr": 2e-3, "max_steps": 4, "warmup_steps": 0,
                                                        "checkpoint_every": 4})
    assert train_in_process(started).returncode == EXIT_DONE
    again = train_in_process(without_lr(started), "train.max_steps=6")  # the rate now left to the DPO default
    assert again.returncode == EXIT_DONE, again.stderr
    assert f"train.lr = 0.002 kept from the checkpoint (a fresh start would use {DPO_LR!r})" in again.stdout
    assert "DPO defaults: train.lr" not in again.stdout  # the default it did not apply is not said
    lines = read_metrics(load_config(started).run_dir, "train")
    assert [m["lr"] for m in lines if m["step"] > 4] == [lr_at(s, 6, 2e-3, 0.1) for s in (4, 5)]
