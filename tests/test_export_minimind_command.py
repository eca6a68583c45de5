"""`minilmd export --format minimind` prints the command that runs the .pth in MiniMind's eval_llm.py, every flag
spelled out (it printed "..." before), or says why eval_llm.py cannot load that model."""
from __future__ import annotations

import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import ModelSection
from minilmd.trainer.model.export import minimind_eval_command
from minilmd.trainer.model.minimind import MiniMindForCausalLM
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer


def test_a_model_of_minimind_shape_gets_the_whole_eval_llm_command(tmp_path):
    torch.manual_seed(0)
    model = MiniMindForCausalLM(ModelSection(hidden_size=64, num_hidden_layers=2))  # MiniMind's defaults otherwise
    save_checkpoint(tmp_path / "ckpt", model, step=1, tokenizer=train_tokenizer(tmp_path / "tokenizer.json"))
    out = CliRunner().invoke(app, ["export", str(tmp_path / "ckpt"), "--format", "minimind", "--out",
                                   str(tmp_path / "my model.pth")])
    assert out.exit_code == 0, out.output
    assert f"cp '{tmp_path / 'my model.pth'}' out/pretrain_64.pth" in out.output
    assert ("python eval_llm.py --load_from model --save_dir out --weight pretrain --hidden_size 64 "
            "--num_hidden_layers 2") in out.output
    assert "..." not in out.output


def test_a_model_eval_llm_cannot_build_is_named_with_its_differences():
    said = minimind_eval_command("m.pth", {**vars(tiny_model().config), "num_key_value_heads": 1})
    assert "eval_llm.py cannot load it" in said and "num_key_value_heads 1 (MiniMind: 4)" in said
    assert "--format hf" in said and "python eval_llm.py" not in said


def test_a_chat_template_that_cannot_be_looked_up_does_not_fail_an_export_already_published(tmp_path):
    """The .pth is written and renamed into place before the chat template is looked up for the advice printed:
    a template refused then (here: a tokenizer_config.json planted beside the checkpoint, not in its manifest) is
    said, and the export stands, exit 0 (before: exit 1 with the .pth published)."""
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "ckpt", tiny_model(), step=1,
                           tokenizer=train_tokenizer(tmp_path / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text('{"chat_template": "PLANTED"}')
    out = CliRunner().invoke(app, ["export", str(ckpt), "--format", "minimind", "--out", str(tmp_path / "m.pth")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "m.pth").is_file()
    assert "the chat template not looked up" in out.output and "does not list" in out.output
    assert "--weight pretrain" in out.output or "eval_llm.py cannot load it" in out.output
