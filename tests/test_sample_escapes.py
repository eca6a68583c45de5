"""`minilmd sample`, `sample --chat` and `chat` print what a tokenizer's decoder and the model made, which a
tokenizer from elsewhere can fill with terminal escapes (hostile audit 3: mal's decoder added OSC 0, retitling the
terminal, and OSC 52, writing the clipboard). Their C0 and C1 controls are printed escaped (untrusted.printable,
lines=True); newlines and tabs, and every script's letters, stay as they are."""
from __future__ import annotations

import io
import json

import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.trainer.model.chat import converse
from weights_helpers import save_checkpoint, tiny_model

torch.set_num_threads(1)
OSC = "\x1b]0;PWNED\x07\x1b]52;c;cm0gLXJmIH4K\x07"


class ScriptedSession:
    def __init__(self, replies: list[str]):
        self.replies = list(replies)

    def reply(self, messages: list[dict]) -> str:
        return self.replies.pop(0)


def test_a_chat_reply_is_printed_with_its_controls_escaped():
    out = io.StringIO()
    converse(ScriptedSession([f"你好{OSC}\n\tnext\x9b2J\r"]), ["hi\n"], out)  # type: ignore[arg-type]
    assert out.getvalue() == "你好\\x1b]0;PWNED\\x07\\x1b]52;c;cm0gLXJmIH4K\\x07\n\tnext\\u009b2J\\r\n"


def test_sample_prints_a_hostile_decoders_escapes_escaped(tokenizer, tmp_path):
    hostile = json.loads(tokenizer.read_text())
    hostile["decoder"] = {"type": "Sequence", "decoders": [hostile["decoder"], {
        "type": "Replace", "pattern": {"Regex": "[\\s\\S]"}, "content": OSC}]}  # every character decoded: escapes
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(hostile))
    ckpt = save_checkpoint(tmp_path / "ckpt", tiny_model(seed=2, vocab_size=512), tokenizer=path)
    got = CliRunner().invoke(app, ["sample", str(ckpt), "--prompt", "x", "--max-new-tokens", "4", "--temperature",
                                   "0", "--device", "cpu"])
    assert got.exit_code == 0, got.output
    assert "\x1b" not in got.output and "\x07" not in got.output, repr(got.output)
    assert got.output.startswith("x\\x1b]0;PWNED\\x07"), repr(got.output)
