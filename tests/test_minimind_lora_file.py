"""A MiniMind LoRA adapter file (lora_*.pth, written by MiniMind's save_lora: only `<layer>.lora.A.weight` and
`.lora.B.weight`) given where minilmd takes a model (user7 #2): init.from printed raw lists of missing and unexpected
keys. Now `run --check` and the trainer say what it is and print the command that merges it into its base as
MiniMind's merge_lora does (torch alone, weights_only, into the user's own directory: tests/test_printed_commands_
safe.py); its output equals merge_lora's, run with MiniMind's own code (../shared, where there), and init.from takes
it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import ConfigError, ModelSection, load_config
from minilmd.init_model import minimind_lora
from minilmd.init_pth import pth_problems
from minilmd.init_source import resolve
from minilmd.protocol import SUPERVISOR_CONFIG
from trainer_corpus import TINY_MODEL, write_config

MINIMIND = Path(__file__).resolve().parents[1] / ".." / "shared" / "minimind"  # MiniMind's own code


def _adapter(hidden: int, layers: int, rank: int) -> dict:
    """What save_lora writes for MiniMind's apply_lora on a model of these sizes: the square Linears, fp16."""
    return {f"model.layers.{i}.self_attn.{proj}.lora.{part}.weight":
            torch.randn((rank, hidden) if part == "A" else (hidden, rank)).half()
            for i in range(layers) for proj in ("q_proj", "o_proj") for part in ("A", "B")}


@pytest.mark.slow  # run --check and the trainer's load: ~4 s
def test_a_minimind_lora_file_as_init_from_is_named_with_the_merge_command(tmp_path, corpus, monkeypatch):
    pth = tmp_path / "out" / "lora_identity_64.pth"
    pth.parent.mkdir()
    torch.save(_adapter(64, 2, 8), pth)
    torch.save({}, pth.parent / "full_sft_64.pth")  # the base beside the adapter, as train_lora.py keeps them
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    monkeypatch.chdir(mine)  # the merged file goes into the current directory, the user's own
    config = write_config(tmp_path, corpus, name="sft", init={"from": str(pth)}, model=TINY_MODEL)
    checked = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert checked.exit_code == SUPERVISOR_CONFIG, checked.output
    said = " ".join(checked.output.split())
    assert "a MiniMind LoRA adapter (model_lora.py's save_lora: rank 8 on 4 Linear layers), not a model" in said
    out = pth.parent
    assert ("(MiniMindConfig as the base was built, hidden_size=64, num_hidden_layers=2): python -c 'import os, sys, "
            "torch; o = os.path.abspath(sys.argv[-1]);" in said), said
    assert "b = torch.load(sys.argv[1], weights_only=True);" in said, said
    args = f"{out}/full_sft_64.pth {out}/lora_identity_64.pth {mine}/lora_identity_merged_64.pth"
    assert f"dir_fd=dfd)))' {args}" in said, said
    assert ("eval_llm.py cannot run it as it is (it applies rank 16 only, apply_lora's default, and this adapter is "
            "rank 8); it runs the merged file: python eval_llm.py --save_dir DIR --weight lora_identity_merged "
            "--hidden_size 64 --num_hidden_layers 2" in said), said
    assert "missing [" not in said and "unexpected [" not in said
    from minilmd.trainer.checkpoint.init_weights import load_init

    with pytest.raises(ConfigError) as refused:
        load_init(load_config(config))
    assert "a MiniMind LoRA adapter" in refused.value.problems[0] and "merge_lora" in refused.value.problems[0]


def test_only_a_state_dict_of_lora_keys_is_taken_for_an_adapter():
    assert minimind_lora(_adapter(64, 2, 16))
    assert not minimind_lora({})
    assert not minimind_lora({**_adapter(64, 2, 16), "model.embed_tokens.weight": (6400, 64)})


SETUP = """import torch
from model.model_minimind import MiniMindConfig, MiniMindForCausalLM
from model.model_lora import apply_lora, save_lora
torch.manual_seed(0)
m = MiniMindForCausalLM(MiniMindConfig(hidden_size=64, num_hidden_layers=2))
torch.save({k: v.half() for k, v in m.state_dict().items()}, 'out/full_sft_64.pth')
apply_lora(m, rank=8)
for name, p in m.named_parameters():
    if '.lora.B.' in name:
        torch.nn.init.normal_(p)
save_lora(m, 'out/lora_identity_64.pth')
"""
"""A base and an adapter as MiniMind's train_lora.py makes them (B trained away from its zero init)."""
MERGE = """import torch
from model.model_minimind import MiniMindConfig, MiniMindForCausalLM
from model.model_lora import apply_lora, merge_lora
m = MiniMindForCausalLM(MiniMindConfig(hidden_size=64, num_hidden_layers=2))
m.load_state_dict(torch.load('out/full_sft_64.pth'))
apply_lora(m, rank=8)
merge_lora(m, 'out/lora_identity_64.pth', 'out/minimind_merged.pth')
"""
"""MiniMind's own merge of the same files: what the printed command's merge must equal."""


@pytest.mark.slow  # MiniMind's code in two subprocesses (transformers' import): ~10 s
def test_the_printed_merge_runs_in_a_minimind_checkout_and_its_output_starts_a_run(tmp_path, monkeypatch):
    if not (MINIMIND / "model" / "model_lora.py").is_file():
        pytest.skip("no MiniMind checkout in ../shared to run the merge with")
    checkout = tmp_path / "minimind"
    shutil.copytree(MINIMIND / "model", checkout / "model", ignore=shutil.ignore_patterns("*.json", "__pycache__"))
    (checkout / "out").mkdir()
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    made = subprocess.run([sys.executable, "-c", SETUP], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr
    adapter = resolve(str(checkout / "out" / "lora_identity_64.pth"))
    model = vars(ModelSection(hidden_size=64, num_hidden_layers=2))  # MiniMindConfig's defaults otherwise
    monkeypatch.chdir(checkout / "out")  # where the merged file goes: the current directory, the user's own
    [said] = pth_problems(adapter, model, lambda key: True)
    command = next(line.strip() for line in said.splitlines() if line.strip().startswith("python -c "))
    merged = subprocess.run(["bash", "-ec", command], cwd=checkout, env={**env, "PATH": os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")])}, capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0, (command, merged.stderr)
    out = checkout / "out" / "lora_identity_merged_64.pth"  # a name eval_llm.py's --weight reads
    assert pth_problems(resolve(str(out)), model, lambda key: True) == []
    base, weights = torch.load(checkout / "out" / "full_sft_64.pth"), torch.load(out)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(base[q], weights[q])  # B A added
    theirs = subprocess.run([sys.executable, "-c", MERGE], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=300)  # MiniMind's own merge_lora, of the same files
    assert theirs.returncode == 0, theirs.stderr
    want = torch.load(checkout / "out" / "minimind_merged.pth")
    assert want.keys() == weights.keys() and all(torch.equal(want[k], weights[k]) for k in want)


def test_a_minimind_adapter_given_for_a_checkpoint_directory_is_said_to_be_one(tmp_path):
    """`sample --lora lora_identity_64.pth` said "no such checkpoint directory" of a file there."""
    from minilmd.trainer.model.export_paths import ExportError
    from minilmd.trainer.model.export_source import resolve_checkpoint

    pth = tmp_path / "lora_identity_64.pth"
    torch.save(_adapter(64, 2, 16), pth)
    with pytest.raises(ExportError) as e:
        resolve_checkpoint(pth)
    said = str(e.value)
    assert said.startswith(f"{pth}: a file, not a checkpoint directory; it is a MiniMind LoRA adapter"), said
    assert "merge_lora" in said
    assert ("eval_llm.py runs it as it is, with its base beside it: python eval_llm.py --save_dir DIR --weight "
            "full_sft --lora_weight lora_identity --hidden_size 64 --num_hidden_layers 2" in " ".join(said.split()))
    torch.save(_adapter(64, 2, 16), tmp_path / "my_adapter.pth")  # a name eval_llm.py's --lora_weight cannot read
    with pytest.raises(ExportError) as e:
        resolve_checkpoint(tmp_path / "my_adapter.pth")
    assert ("eval_llm.py cannot run it as it is (it reads --lora_weight NAME as NAME_64.pth, which this file's name "
            "is not); it runs the merged file: python eval_llm.py --save_dir DIR --weight my_adapter_merged"
            in " ".join(str(e.value).split())), str(e.value)
    with pytest.raises(ExportError, match="no such checkpoint directory"):
        resolve_checkpoint(tmp_path / "gone")
