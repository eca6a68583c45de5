"""MiniMind's hyperparameter names (user7 #4): each unknown key that is one says the minilmd key and how it differs,
the table covers every flag of MiniMind's trainers (where ../shared has them), names only real config keys, and
docs/operations.md's table is the table in minilmd/minimind_names.py, row for row."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from minilmd.config import ConfigError, RunConfig, config_from_dict, toml_key
from minilmd.minimind_names import FOREIGN_NAMES, MINIMIND_FORK_NAMES, MINIMIND_NAMES

REPO = Path(__file__).resolve().parents[1]
TRAINERS = REPO / ".." / "shared" / "minimind" / "trainer"  # MiniMind's own trainers
DOC = REPO / "docs" / "operations.md"
KEYS = {f"{s.name}.{toml_key(f.name)}" for s in fields(RunConfig) if s.name != "source"
        for f in fields(s.default_factory())}


def problems_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    return e.value.problems


def test_minimind_names_in_a_config_say_the_minilmd_key_and_the_difference():
    said = problems_of({"train": {"learning_rate": 5e-4, "batch_size": 16, "epochs": 1, "hidden_size": 64},
                        "data": {"data_path": "pretrain_hq.jsonl"}, "model": {"use_moe": 1}})
    assert any(p.startswith("unknown key train.learning_rate: did you mean train.lr? (MiniMind's learning_rate: the "
                            "peak") for p in said)
    assert any(p.startswith("unknown key train.batch_size: did you mean train.micro_batch_size?") for p in said)
    assert any(p.startswith("unknown key train.epochs: did you mean train.max_epochs?") and "train.max_steps" in p
               for p in said)
    assert any(p.startswith("unknown key train.hidden_size: did you mean model.hidden_size?") for p in said)
    assert any(p.startswith("unknown key data.data_path: did you mean data.prepared?") and "minilmd prepare" in p
               for p in said)
    assert "unknown key model.use_moe: MiniMind's use_moe: minilmd has no such key: minilmd trains the dense model " \
           "only" in said


def test_a_minimind_name_outside_any_section_is_named_too_and_other_typos_keep_the_known_list():
    said = problems_of({"batch_size": 16, "train": {"bogus": 1}})
    assert any(p.startswith("key batch_size outside any section: did you mean train.micro_batch_size?") for p in said)
    assert any(p.startswith("unknown key train.bogus (known: seq_len, micro_batch_size") for p in said), said


def test_a_typo_a_key_in_the_wrong_section_and_a_key_above_every_header_are_given_their_likely_key():
    """user10 #4: `train.log_evry` had no "did you mean", `[model] lr` no pointer to train.lr, and a config whose
    [run] header was missing said "unknown section [name]" of each key above the first header."""
    said = problems_of({"name": "x", "dir": "/tmp/r", "trian": {"lr": 1e-3},
                        "train": {"log_evry": 10, "max_epoch": 2}, "model": {"lr": 1e-3, "seq_lenn": 64},
                        "eval": {"every": 100}})
    assert "key name outside any section: did you mean run.name (a missing [run] header?)" in said, said
    assert "key dir outside any section: did you mean run.dir (a missing [run] header?)" in said, said
    assert "unknown section [trian]: did you mean [train]?" in said, said
    assert "unknown key train.log_evry: did you mean train.log_every?" in said, said
    assert "unknown key train.max_epoch: did you mean train.max_epochs?" in said, said
    assert "unknown key model.lr: did you mean train.lr?" in said, said
    assert "unknown key model.seq_lenn: did you mean train.seq_len?" in said, said
    assert "unknown key eval.every: did you mean train.eval_every?" in said, said
    assert not any("staged" in p for p in problems_of({"init": {"stage": "x"}}))  # the supervisor's keys: never
    said = problems_of({"train": {"dynamic_pad": True, "length_bucket": True}})
    for key in ("dynamic_pad", "length_bucket"):
        assert (f"unknown key train.{key}: a MiniMind fork's {key}: minilmd has no such key: minilmd packs "
                f"pretraining (no padding) and length-buckets SFT/DPO by default (data.mode = \"bucketed\": each "
                f"micro-batch padded to its longest row): nothing to set") in said, said


@pytest.mark.parametrize("argv, said", [
    (["run", "cfg.toml", "--epochs", "2"], "no such option --epochs: MiniMind's epochs is train.max_epochs here: "
                                           "use --set train.max_epochs=2 ("),
    (["run", "cfg.toml", "--check", "--learning-rate=5e-4"], "use --set train.lr=5e-4 ("),
    (["train", "cfg.toml", "--batch_size", "16"], "use --set train.micro_batch_size=16 ("),
    (["run", "cfg.toml", "--dynamic_pad", "1"], "no such option --dynamic_pad: a MiniMind fork's dynamic_pad: "
                                                "minilmd has no such key: minilmd packs pretraining (no padding) and "
                                                "length-buckets SFT/DPO by default"),
    (["run", "cfg.toml", "--length_bucket", "1"], "a MiniMind fork's length_bucket: minilmd has no such key: minilmd "
                                                  "packs"),
    (["run", "cfg.toml", "--data_path", "sft.jsonl"], "MiniMind's data_path is a .jsonl; minilmd trains on a prepared "
                                                      "corpus: run `minilmd prepare sft.jsonl --out DIR` (with "
                                                      "--format chat for SFT data, --format dpo for "
                                                      "preference pairs), then use --set data.prepared=DIR"),
])
def test_a_minimind_flag_on_the_command_line_is_given_its_set_override(argv, said, tmp_path):
    """user10 #5: `minilmd run cfg.toml --epochs 2` got typer's bare "No such option: --epochs"."""
    proc = subprocess.run([sys.executable, "-m", "minilmd.cli", *argv], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr


def test_the_table_names_only_real_config_keys():
    assert {name.key for table in FOREIGN_NAMES.values() for name in table.values() if name.key} <= KEYS


def test_peft_and_hf_trainer_names_say_the_minilmd_key():
    """user9 F11: PEFT's and the HF Trainer's names were a plain "unknown key", though example.toml names PEFT's."""
    said = problems_of({"lora": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]},
                        "train": {"gradient_accumulation_steps": 2, "num_train_epochs": 3, "warmup_ratio": 0.1,
                                  "per_device_train_batch_size": 8, "learning_rate": 1e-4}})
    for wrote, key, whose in (("lora.r", "lora.rank", "PEFT's r"), ("lora.lora_alpha", "lora.alpha", "PEFT's"),
                              ("lora.target_modules", "lora.targets", "PEFT's"),
                              ("train.gradient_accumulation_steps", "train.grad_accum", "the HF Trainer's"),
                              ("train.num_train_epochs", "train.max_epochs", "the HF Trainer's"),
                              ("train.warmup_ratio", "train.warmup_steps", "the HF Trainer's"),
                              ("train.per_device_train_batch_size", "train.micro_batch_size", "the HF Trainer's"),
                              ("train.learning_rate", "train.lr", "MiniMind's")):
        assert any(p.startswith(f"unknown key {wrote}: did you mean {key}? ({whose}") for p in said), (wrote, said)


def test_the_table_covers_every_flag_of_minimind_trainers():
    scripts = sorted(TRAINERS.glob("train_*.py")) if TRAINERS.is_dir() else []
    if not scripts:
        pytest.skip("no MiniMind checkout in ../shared to read its trainers' flags from")
    flags = {flag for script in scripts
             for flag in re.findall(r"add_argument\(\s*['\"]--(\w+)", script.read_text(encoding="utf-8"))}
    assert {"batch_size", "learning_rate", "epochs", "accumulation_steps", "max_seq_len", "use_moe"} <= flags
    assert flags - set(MINIMIND_NAMES) == set()
    assert not flags & set(MINIMIND_FORK_NAMES), "MiniMind's own trainers have these now: they are MiniMind's"


def doc_row(name: str, table: dict = MINIMIND_NAMES) -> str:
    found = table[name]
    return f"| `{name}` | {f'`{found.key}`' if found.key else 'none'} | {found.note} |"


def test_the_docs_table_is_the_modules_table():
    text = DOC.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if re.match(r"\| `\w+` \| (`[a-z_]+\.[a-z_]+`|none) \|", line)]
    tables = [(name, table) for table in FOREIGN_NAMES.values() for name in table]  # MiniMind's, its fork's, ...
    assert rows == [doc_row(name, table) for name, table in tables], "\n".join(doc_row(*t) for t in tables)
