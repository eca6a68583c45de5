"""`minilmd export --format minimind` prints the command that runs the .pth in MiniMind's eval_llm.py, every flag
spelled out (it printed "..." before), or says why eval_llm.py cannot load that model."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
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
    assert f"'{tmp_path / 'my model.pth'}' pretrain_64.pth" in out.output and '"xb"' in out.output
    assert ("echo 0 | python eval_llm.py --load_from model --save_dir out --weight pretrain --hidden_size 64 "
            "--num_hidden_layers 2 --max_new_tokens 100") in out.output
    assert "..." not in out.output


def test_the_eval_llm_command_runs_unattended_with_flags_eval_llm_has():
    """user7 #7: eval_llm.py asks "[0] auto test [1] manual input" on stdin and answers up to 8192 tokens a prompt
    (minutes on a CPU): the command printed answered neither. Now it pipes the choice and bounds the answer, with
    flags MiniMind's own eval_llm.py declares (read from ../shared, where there is one)."""
    said = minimind_eval_command("m.pth", vars(ModelSection(hidden_size=64, num_hidden_layers=2)))
    command = next(line.strip() for line in said.splitlines() if "eval_llm.py --" in line)
    assert command.startswith("echo 0 | python eval_llm.py ") and "--max_new_tokens 100" in command
    if not (MINIMIND / "eval_llm.py").is_file():
        pytest.skip("no MiniMind checkout in ../shared to read eval_llm.py's flags from")
    source = (MINIMIND / "eval_llm.py").read_text(encoding="utf-8")
    declared = set(re.findall(r"add_argument\(\s*['\"](--\w+)", source))
    assert set(re.findall(r"--\w+", command)) <= declared, declared
    assert "input('[0] " in source  # the one question `echo 0` answers: its own test prompts


MINIMIND = Path(__file__).resolve().parents[1] / ".." / "shared" / "minimind"  # MiniMind's own code
LOADS = "ckp = f'./{args.save_dir}/{args.weight}_{args.hidden_size}{moe_suffix}.pth'"
"""Where MiniMind's eval_llm.py reads the weights from: relative to where it runs, under --save_dir."""
FAKE_EVAL_LLM = f"""import argparse
import pytest
import torch
parser = argparse.ArgumentParser()
for flag in ("--load_from", "--save_dir", "--weight"):
    parser.add_argument(flag, type=str)
for flag in ("--hidden_size", "--num_hidden_layers", "--use_moe", "--max_new_tokens"):
    parser.add_argument(flag, default=0, type=int)
args = parser.parse_args()
assert int(input('[0] auto test [1] manual input')) == 0 and 0 < args.max_new_tokens <= 1000
moe_suffix = '_moe' if args.use_moe else ''
{LOADS}
state = torch.load(ckp, map_location="cpu")
assert state["model.embed_tokens.weight"].shape[1] == args.hidden_size
print("eval_llm loaded", ckp, len(state), "tensors")
"""


@pytest.mark.slow  # a whole export in a subprocess, then bash: about 3 s on an idle machine
def test_the_advice_runs_as_pasted_in_a_checkout_without_out_from_an_export_made_elsewhere(tmp_path, monkeypatch):
    """Issue 39: exported with a relative --out, the advice said `cp my.pth out/...`, a path relative to where export
    ran, into an out/ a MiniMind checkout does not have: it failed as printed. Pasted in a checkout (a fake one whose
    eval_llm.py reads the weights where MiniMind's does), it now runs."""
    if (MINIMIND / "eval_llm.py").is_file():  # the fake reads where the real one does
        assert LOADS in (MINIMIND / "eval_llm.py").read_text(encoding="utf-8")
    torch.manual_seed(0)
    model = MiniMindForCausalLM(ModelSection(hidden_size=64, num_hidden_layers=2))
    save_checkpoint(tmp_path / "ckpt", model, step=1, tokenizer=train_tokenizer(tmp_path / "tokenizer.json"))
    (tmp_path / "exports").mkdir()
    monkeypatch.chdir(tmp_path / "exports")
    out = CliRunner().invoke(app, ["export", str(tmp_path / "ckpt"), "--format", "minimind", "--out", "my model.pth"])
    assert out.exit_code == 0, out.output
    commands = [line.strip() for line in out.output.splitlines() if line.startswith("  ")]
    assert len(commands) == 2 and commands[1].startswith("echo 0 | python eval_llm.py"), out.output
    checkout = tmp_path / "minimind"
    (checkout / "model").mkdir(parents=True)
    (checkout / "eval_llm.py").write_text(FAKE_EVAL_LLM, encoding="utf-8")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    ran = subprocess.run(["bash", "-ec", "\n".join(commands)], cwd=checkout, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL,
                         env={**os.environ, "PATH": path}, timeout=300)
    assert ran.returncode == 0, (out.output, ran.stderr)
    assert "eval_llm loaded ./out/pretrain_64.pth" in ran.stdout, ran.stdout
    assert (checkout / "out" / "pretrain_64.pth").read_bytes() == (tmp_path / "exports" / "my model.pth").read_bytes()


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
