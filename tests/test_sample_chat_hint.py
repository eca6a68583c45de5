"""`minilmd sample` of a model trained on conversations says --chat (user6 #11: `sample runs/sft` without --chat
printed a raw continuation of an SFT model's prompt, and nothing said that the model was trained on chat). Told by the
corpus a checkpoint records (Validated.trained_on_conversations), else by its chat template."""
from __future__ import annotations

import dataclasses
import json

import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.trainer.checkpoint import save as ckpt_io
from weights_helpers import tiny_model

torch.set_num_threads(1)
NOTE = "minilmd sample: note: this model was trained on conversations (SFT or DPO): pass --chat"


def checkpoint(root, tokenizer, data_format=None, template=False):
    """A real checkpoint of a tiny model, the corpus summary of `data_format` recorded (None: none, as before the
    record), a chat template beside its tokenizer when `template`."""
    model = tiny_model(seed=3, vocab_size=512)
    state = {"step": 1, "config": {"model": dataclasses.asdict(model.config), "data": {"prepared": ""}}}
    if data_format:
        state["corpus"] = {"data_format": data_format, "splits": {"train": {"documents": 10, "tokens": 100}}}
    files = {"tokenizer.json": tokenizer.read_bytes()}
    if template:
        files["tokenizer_config.json"] = json.dumps({"chat_template": "{{ messages }}"}).encode()
    opt = torch.optim.AdamW(model.parameters())
    return ckpt_io.save(root, 1, model.state_dict(), opt.state_dict(), state, tokenizer=files)


def sample(ckpt) -> str:
    got = CliRunner().invoke(app, ["sample", str(ckpt), "--prompt", "x", "--max-new-tokens", "2", "--temperature",
                                   "0", "--device", "cpu"])
    assert got.exit_code == 0, got.output
    return " ".join(got.output.split())


def test_sample_of_a_chat_model_says_chat_and_of_a_text_model_does_not(tokenizer, tmp_path):
    assert NOTE in sample(checkpoint(tmp_path / "sft", tokenizer, "chat", template=True))
    assert NOTE in sample(checkpoint(tmp_path / "dpo", tokenizer, "dpo", template=True))
    assert NOTE not in sample(checkpoint(tmp_path / "pt", tokenizer, "text"))
    # before checkpoints recorded their corpus: the chat template a text corpus's checkpoints never carry
    assert NOTE in sample(checkpoint(tmp_path / "old-sft", tokenizer, template=True))
    assert NOTE not in sample(checkpoint(tmp_path / "old-pt", tokenizer))
