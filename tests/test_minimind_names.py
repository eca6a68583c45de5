"""MiniMind's hyperparameter names (user7 #4): each unknown key that is one says the minilmd key and how it differs,
the table covers every flag of MiniMind's trainers (where ../shared has them), names only real config keys, and
docs/operations.md's table is the table in minilmd/minimind_names.py, row for row."""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from minilmd.config import ConfigError, RunConfig, config_from_dict, toml_key
from minilmd.minimind_names import MINIMIND_NAMES

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
    assert any(p.startswith("unknown section [batch_size]: did you mean train.micro_batch_size?") for p in said)
    assert any(p.startswith("unknown key train.bogus (known: seq_len, micro_batch_size") for p in said), said


def test_the_table_names_only_real_config_keys():
    assert {name.key for name in MINIMIND_NAMES.values() if name.key} <= KEYS


def test_the_table_covers_every_flag_of_minimind_trainers():
    scripts = sorted(TRAINERS.glob("train_*.py")) if TRAINERS.is_dir() else []
    if not scripts:
        pytest.skip("no MiniMind checkout in ../shared to read its trainers' flags from")
    flags = {flag for script in scripts
             for flag in re.findall(r"add_argument\(\s*['\"]--(\w+)", script.read_text(encoding="utf-8"))}
    assert {"batch_size", "learning_rate", "epochs", "accumulation_steps", "max_seq_len", "use_moe"} <= flags
    assert flags - set(MINIMIND_NAMES) == set()


def doc_row(name: str) -> str:
    found = MINIMIND_NAMES[name]
    return f"| `{name}` | {f'`{found.key}`' if found.key else 'none'} | {found.note} |"


def test_the_docs_table_is_the_modules_table():
    text = DOC.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if re.match(r"\| `\w+` \| (`[a-z_]+\.[a-z_]+`|none) \|", line)]
    assert rows == [doc_row(name) for name in MINIMIND_NAMES], "\n".join(doc_row(n) for n in MINIMIND_NAMES)
