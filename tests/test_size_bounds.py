"""Every reader of one file format reads it up to the same size (minilmd/names.py: one `<FORMAT>_MAX_BYTES` each).

Before, the bounds were spelled in each reader, and two formats had readers that disagreed:
- manifest.json: validation (minilmd/checkpoint.py), the sync's remote scan and its size estimate read up to 1 MiB,
  init.from's fingerprint and staging up to 16 MiB: a checkpoint whose manifest was between the two was
  fingerprinted and staged for init.from, then refused by the trainer's validation of the staged copy.
- trainer_state.json: validation and init.from read up to 64 MiB, `run --check`'s update share and the lineage
  `status` shows up to 16 MiB: a checkpoint validation accepts had its update share skipped and ended the lineage.
- tokenizer_config.json: `tokenizer train --chat-template FILE` read it up to 1 MiB, `prepare`'s tokenizer, a
  checkpoint and an export up to 64 MiB: a template one took, the other refused.
Each test below writes one file just over the smaller of the old bounds (valid JSON, padded with spaces) and asks
every reader of it: all refuse it or all read it.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from minilmd import init_source, names
from minilmd.checkpoint import MAX_JSON_PART, CheckpointInvalid, read_manifest
from minilmd.corpus import chat_files, chat_templates
from minilmd.daemon.jobs import checkpoint_room, remote_local
from minilmd.daemon.phases import initwait
from minilmd.plan import update_share

STEP = names.step_name(7)


def padded(body: dict, size: int) -> bytes:
    """`body` as JSON, padded with spaces inside its braces to exactly `size` bytes (still the same object)."""
    raw = json.dumps(body).encode()
    return raw[:-1] + b" " * (size - len(raw)) + b"}"


def manifest_of(size: int) -> bytes:
    return padded({"format": "minilmd-checkpoint", "version": 1, "step": 7, "created": 0, "files": {}}, size)


def manifest_verdicts(root: Path) -> dict[str, bool]:
    """Whether each reader of root/STEP/manifest.json read it (True) or refused it as unreadable (False)."""
    ckpt = root / STEP
    verdicts = {}
    try:
        read_manifest(ckpt)
        verdicts["validation"] = True
    except CheckpointInvalid:
        verdicts["validation"] = False
    try:
        init_source.fingerprint(init_source.InitSource("checkpoint", ckpt))
        verdicts["init.from fingerprint"] = True
    except init_source.InitSourceError:
        verdicts["init.from fingerprint"] = False
    verdicts["sync size estimate"] = checkpoint_room.checkpoint_bytes(ckpt) is not None
    _, problems = remote_local.open_remote(str(root)).manifest_or_problems(STEP)
    verdicts["remote scan"] = not any("cannot read" in p for p in problems)
    return verdicts


@pytest.mark.parametrize("size", [1 << 20, (1 << 20) + 1, 2 << 20])
def test_every_reader_of_a_manifest_reads_the_same_sizes(tmp_path, size):
    (tmp_path / STEP).mkdir()
    (tmp_path / STEP / names.MANIFEST).write_bytes(manifest_of(size))
    verdicts = manifest_verdicts(tmp_path)
    assert len(set(verdicts.values())) == 1, f"a manifest of {size} bytes: {verdicts}"
    assert verdicts["validation"] == (size <= names.MANIFEST_MAX_BYTES)


def base_with_trainer_state(root: Path, size: int) -> Path:
    """A checkpoint directory whose trainer_state.json is `size` bytes and records rows and an init.from source."""
    ckpt = root / STEP
    ckpt.mkdir(parents=True)
    (ckpt / names.MANIFEST).write_bytes(manifest_of(200))
    state = {"step": 7, "rows_seen": 56, "config": {"model": {"hidden_size": 8}},
             "init": {"kind": "minimind", "path": "/base.pth", "sha256": "ab" * 32}}
    (ckpt / names.TRAINER_STATE).write_bytes(padded(state, size))
    return ckpt


@pytest.mark.parametrize("size", [(2 << 20) + 1])
def test_every_reader_of_a_trainer_state_that_validation_accepts_reads_it(tmp_path, size):
    assert size <= MAX_JSON_PART  # validation reads it
    ckpt = base_with_trainer_state(tmp_path, size)
    assert init_source.source_model(init_source.InitSource("checkpoint", ckpt)) == {"hidden_size": 8}
    cfg = SimpleNamespace(init=SimpleNamespace(from_=str(ckpt), checkpoint="last"))
    assert update_share.base_rows(cfg) == (ckpt, 56, json.loads((ckpt / names.TRAINER_STATE).read_bytes()))
    assert initwait.lineage(tmp_path) == [
        "/base.pth (a .pth: weights alone, no step nor source recorded; sha256 abababababab)"]


def test_a_tokenizer_config_beside_a_tokenizer_is_taken_as_a_chat_template_file_too(tmp_path):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (tmp_path / names.TOKENIZER_CONFIG).write_bytes(padded({"chat_template": template}, 2 << 20))
    assert chat_files.read_tokenizer_config(tmp_path)["chat_template"] == template
    assert chat_templates.template_text(str(tmp_path / names.TOKENIZER_CONFIG)) == template
