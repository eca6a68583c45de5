"""Each checkpoint is validated and read once on the export and load paths, and what validation parses is exactly
what it hashed.

Reproduced on the code before: an export validated the checkpoint (`export_paths._validate`), then validated it
again to load its weights (`load_validated`), then read trainer_state.json once more for the model config (and a
LoRA export read it before validation too, to tell the kind): model.safetensors was hashed and scanned twice,
trainer_state.json read three or four times, and `minilmd export --format minimind` read the whole checkpoint again
for the command it prints. Inside the validation, trainer_state.json and optimizer.json were hashed, then read a
second time to be parsed: a file swapped between the two was parsed though no hash vouched for it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minilmd import checkpoint as ck
from minilmd.cli import app
from minilmd.names import TOKENIZER_CONFIG, TOKENIZER_FILE
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.model.adapter import export_peft
from minilmd.trainer.model.export import ExportError, export_hf, export_minimind, read_checkpoint
from open_counts import CHECKPOINT_FILES, each_once, opens  # noqa: F401 - opens: a fixture
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

LORA = {"rank": 2, "alpha": 4.0, "dropout": 0.0, "targets": ["q_proj", "v_proj"]}


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """A full-weights checkpoint with its tokenizer (what export_hf needs)."""
    tmp = tmp_path_factory.mktemp("full")
    return save_checkpoint(tmp / "ckpts", tiny_model(seed=1), step=1, tokenizer=train_tokenizer(tmp / "tok.json"))


@pytest.fixture(scope="module")
def lora(tmp_path_factory) -> Path:
    """A LoRA checkpoint as the trainer writes one: the adapters only, its trainer_state recording [lora]."""
    from minilmd.trainer.model.lora import adapter_state_dict, apply_lora

    model = tiny_model(seed=2)
    model_cfg = dataclasses.asdict(model.config)
    apply_lora(model, LORA)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model(ids, labels=ids).loss.backward()
    opt.step()
    state = {"step": 1, "config": {"model": model_cfg, "lora": LORA, "data": {"prepared": ""}},
             "init": {"path": "/the/base"}}
    return ckpt_io.save(tmp_path_factory.mktemp("lora"), 1, adapter_state_dict(model), opt.state_dict(), state)


def test_export_minimind_reads_each_file_of_the_checkpoint_once(full, tmp_path, opens):
    export_minimind(full, tmp_path / "m.pth")
    each_once(opens, full)


def test_export_hf_reads_each_file_of_the_checkpoint_once(full, tmp_path, opens):
    """The tokenizer and the chat template are looked for with the validated trainer_state, not a new read."""
    export_hf(full, tmp_path / "hf")
    each_once(opens, full)


def test_export_peft_reads_each_file_of_the_checkpoint_once(lora, tmp_path, opens):
    """The kind of checkpoint (LoRA or full) comes from the validated trainer_state, not a read before."""
    export_peft(lora, tmp_path / "peft")
    each_once(opens, lora)
    assert json.loads((tmp_path / "peft" / "adapter_config.json").read_text())["r"] == LORA["rank"]


def test_the_minimind_command_reads_the_checkpoint_once(full, tmp_path, opens):
    """`minilmd export --format minimind` prints the eval command from the export's own read of the config."""
    result = CliRunner().invoke(app, ["export", str(full), "--format", "minimind", "--out", str(tmp_path / "m.pth")])
    assert result.exit_code == 0, result.output
    assert "eval_llm.py" in result.output or "--format hf" in result.output
    each_once(opens, full)


def _swap_after_its_hash(monkeypatch, ckpt: Path, name: str, data: bytes) -> None:
    """`name` replaced by `data` (a rename, as a writer would) the moment validation has hashed it."""
    real = ck.table_problems

    def hashed_then_swapped(table, size_of, sha256_of=None, *args, **kwargs):
        def sha256_then_swap(n):
            digest = sha256_of(n)
            if n == name:
                (ckpt / f".{name}.new").write_bytes(data)
                os.replace(ckpt / f".{name}.new", ckpt / name)
            return digest

        return real(table, size_of, sha256_then_swap, *args, **kwargs)

    monkeypatch.setattr(ck, "table_problems", hashed_then_swapped)


@pytest.fixture
def ours(full, tmp_path) -> Path:
    import shutil

    return shutil.copytree(full, tmp_path / "theirs" / full.name)


@pytest.mark.parametrize("reader", ["validate", "read_checkpoint"])
def test_a_trainer_state_swapped_after_its_hash_is_not_what_is_parsed(ours, monkeypatch, reader):
    """Another trainer_state, as valid (the same step), put in place once it was hashed: the state validation
    answers, and the export uses, is the one hashed."""
    hashed = json.loads((ours / ck.TRAINER_STATE).read_text())
    other = {**hashed, "config": {**hashed["config"], "data": {"prepared": "/elsewhere"}}}
    _swap_after_its_hash(monkeypatch, ours, ck.TRAINER_STATE, json.dumps(other).encode())
    state = ck.validate(ours) if reader == "validate" else read_checkpoint(ours)[2]
    assert json.loads((ours / ck.TRAINER_STATE).read_text()) == other  # swapped indeed
    assert state == hashed


def test_an_optimizer_meta_swapped_after_its_hash_is_not_what_is_parsed(ours, monkeypatch):
    """Hostile JSON (nested past the depth bound) in place of optimizer.json once it was hashed: never parsed."""
    _swap_after_its_hash(monkeypatch, ours, ck.OPTIMIZER_META, b"[" * 100_000 + b"]" * 100_000)
    assert ck.validate(ours)["step"] == 1


def test_a_json_part_over_its_bound_is_refused_by_the_read_that_hashes_it(ours, monkeypatch):
    """The one read of a JSON part is bounded by MAX_JSON_PART as the parse was (the manifest's size is as
    untrusted as the file)."""
    monkeypatch.setattr(ck, "MAX_JSON_PART", 64)
    with pytest.raises(ck.CheckpointInvalid, match=r"cannot read (optimizer|trainer_state)\.json: over 64 bytes"):
        ck.validate(ours)


# --- the tokenizer files a checkpoint lists -------------------------------------------------------------------------
# Before: validation hashed tokenizer.json and tokenizer_config.json against the manifest, then export_hf opened
# them again to copy them: two opens each, and a file swapped between the two was exported though no hash vouched
# for it (a fingerprint in the trainer_state caught another tokenizer.json only when the run recorded one; nothing
# caught another chat template).

TOKENIZER_NAMES = (TOKENIZER_FILE, TOKENIZER_CONFIG)
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    """A full-weights checkpoint of a chat run: its manifest lists tokenizer.json and tokenizer_config.json."""
    from minilmd.corpus.chat_templates import tokenizer_config, write_beside

    tmp = tmp_path_factory.mktemp("chat")
    tok = train_tokenizer(tmp / "tokenizer.json")
    write_beside(tok, tokenizer_config(TEMPLATE), tok.read_text())
    ckpt = save_checkpoint(tmp / "ckpts", tiny_model(seed=3), step=1, tokenizer=tok)
    assert set(TOKENIZER_NAMES) <= set(json.loads((ckpt / ck.MANIFEST).read_text())["files"])
    return ckpt


@pytest.fixture
def ours_chat(chat, tmp_path) -> Path:
    import shutil

    return shutil.copytree(chat, tmp_path / "theirs" / chat.name)


def test_export_hf_reads_the_tokenizer_files_of_the_checkpoint_once(chat, tmp_path, opens):
    """The tokenizer and the chat template exported are the bytes the validation hashed, not a second read."""
    out = export_hf(chat, tmp_path / "hf")
    assert {name: opens[str(chat.absolute() / name)] for name in (*CHECKPOINT_FILES, *TOKENIZER_NAMES)} == \
        dict.fromkeys((*CHECKPOINT_FILES, *TOKENIZER_NAMES), 1)
    assert (out / TOKENIZER_FILE).read_bytes() == (chat / TOKENIZER_FILE).read_bytes()
    assert json.loads((out / TOKENIZER_CONFIG).read_text())["chat_template"] == TEMPLATE


def test_a_tokenizer_swapped_after_its_hash_is_not_what_is_exported(ours_chat, tmp_path, monkeypatch):
    hashed = (ours_chat / TOKENIZER_FILE).read_bytes()
    _swap_after_its_hash(monkeypatch, ours_chat, TOKENIZER_FILE, b'{"model": "swapped in after its hash"}')
    out = export_hf(ours_chat, tmp_path / "hf")
    assert (ours_chat / TOKENIZER_FILE).read_bytes() != hashed  # swapped indeed
    assert (out / TOKENIZER_FILE).read_bytes() == hashed


def test_a_chat_template_swapped_after_its_hash_is_not_what_is_exported(ours_chat, tmp_path, monkeypatch):
    _swap_after_its_hash(monkeypatch, ours_chat, TOKENIZER_CONFIG, b'{"chat_template": "SWAPPED {{ 1 }}"}')
    out = export_hf(ours_chat, tmp_path / "hf")
    assert b"SWAPPED" in (ours_chat / TOKENIZER_CONFIG).read_bytes()  # swapped indeed
    assert json.loads((out / TOKENIZER_CONFIG).read_text())["chat_template"] == TEMPLATE


def test_a_tokenizer_file_listed_over_its_bound_is_hashed_not_kept_and_not_exported(ours_chat, tmp_path,
                                                                                      monkeypatch):
    """A tokenizer file is kept no bigger than its bound (its listed size is untrusted); one listed over it is
    hashed all the same and the checkpoint stays valid (init.from and a LoRA base load its weights, never its
    tokenizer: before, it was CheckpointInvalid and such a run ended on a misleading "damaged"), and an export
    refuses to copy it."""
    monkeypatch.setitem(ck.TOKENIZER_FILES, TOKENIZER_CONFIG, 64)
    checked = ck.validated_weights(ours_chat)
    assert (checked.tokenizer_config, checked.over_bound) == (None, frozenset({TOKENIZER_CONFIG}))
    assert checked.tokenizer is not None
    with pytest.raises(ExportError, match=r"tokenizer_config\.json: listed over 64 bytes, the most a tokenizer "
                                          r"file is read: not read"):
        export_hf(ours_chat, tmp_path / "hf")
