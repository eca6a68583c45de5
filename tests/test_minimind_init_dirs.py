"""Directories a MiniMind user names as init.from (user7 #3): a model MiniMind saved in transformers format
(save_pretrained: config.json of model_type "minimind" and model.safetensors) was taken for a minilmd export and
told to run `minilmd export`, which cannot apply; MiniMind's out/ was "a directory without manifest.json" without
naming the .pth files in it. Now the first gets the one-line conversion to the .pth init.from takes (run here, its
output starts a run), and the second the names of its .pth files, those that are no model said as such."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from minilmd.config import ModelSection
from minilmd.init_pth import pth_problems
from minilmd.init_source import InitSourceError, resolve
from minilmd.model_shapes import expected_state_shapes

MODEL = vars(ModelSection(hidden_size=64, num_hidden_layers=2))


def _saved_pretrained(where: Path, **config) -> Path:
    """What MiniMindForCausalLM.save_pretrained writes: its config (model_type minimind) and its tensors under the
    .pth's names, the tied head left out (transformers saves a tied tensor once)."""
    where.mkdir(parents=True)
    (where / "config.json").write_text(json.dumps({"architectures": ["MiniMindForCausalLM"], "model_type": "minimind",
                                                   "hidden_size": 64, "num_hidden_layers": 2, **config}))
    save_file({k: torch.randn(shape) for k, shape in expected_state_shapes(MODEL).items()},
              str(where / "model.safetensors"))
    return where


def _refusal(path: Path) -> str:
    with pytest.raises(InitSourceError) as e:
        resolve(str(path))
    return str(e.value)


@pytest.mark.slow  # the conversion in a subprocess (torch's import): ~5 s
def test_a_minimind_transformers_directory_gets_a_conversion_whose_pth_starts_a_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the command writes into the current directory, the user's own
    said = _refusal(_saved_pretrained(tmp_path / "hf-minimind"))
    assert said.startswith("a MiniMind model saved in transformers format (config.json: model_type \"minimind\")")
    assert "minilmd export" not in said, said
    command = said.splitlines()[1].strip()
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    ran = subprocess.run(["bash", "-ec", command], cwd=tmp_path, env={**os.environ, "PATH": path},
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, (command, ran.stderr)
    assert pth_problems(resolve(str(tmp_path / "hf-minimind.pth")), MODEL, lambda key: True) == []


def test_a_moe_minimind_transformers_directory_is_said_to_be_moe(tmp_path):
    said = _refusal(_saved_pretrained(tmp_path / "hf-moe", use_moe=True))
    assert "a MiniMind model saved in transformers format" in said and "minilmd trains the dense model only" in said


def test_minilmds_own_hf_export_is_still_said_to_be_an_export(tmp_path):
    said = _refusal(_saved_pretrained(tmp_path / "hf-qwen3", model_type="qwen3"))
    assert "an export (`minilmd export --format hf`, for transformers)" in said, said


def test_minimind_out_directory_names_its_pth_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("pretrain_64.pth", "full_sft_64.pth", "lora_identity_64.pth", "notes.txt"):
        (out / name).write_bytes(b"x")
    said = _refusal(out)
    assert said.startswith("a directory without manifest.json (not a checkpoint) and without LATEST"), said
    assert f"name one as init.from, {out / 'full_sft_64.pth'}, {out / 'pretrain_64.pth'}; not a model: " \
           f"{out / 'lora_identity_64.pth'} (a LoRA adapter)" in said, said
    assert "notes.txt" not in said
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _refusal(empty) == "a directory without manifest.json (not a checkpoint) and without LATEST (not a " \
                              "checkpoint root)"


MINIMIND = Path(__file__).resolve().parents[1] / ".." / "shared" / "minimind"  # MiniMind's own code
SAVE = """from model.model_minimind import MiniMindConfig, MiniMindForCausalLM
MiniMindForCausalLM(MiniMindConfig(hidden_size=64, num_hidden_layers=2)).save_pretrained('hf-minimind')
"""


@pytest.mark.slow  # MiniMind's save_pretrained and the conversion in subprocesses (transformers' import): ~10 s
def test_minimind_own_save_pretrained_converts_as_printed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the command writes into the current directory, the user's own
    if not (MINIMIND / "model" / "model_minimind.py").is_file():
        pytest.skip("no MiniMind checkout in ../shared to save a model with")
    checkout = tmp_path / "minimind"  # a copy: importing it writes __pycache__ beside it, never in ../shared
    shutil.copytree(MINIMIND / "model", checkout / "model", ignore=shutil.ignore_patterns("*.json", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(checkout),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    saved = subprocess.run([sys.executable, "-c", SAVE], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert saved.returncode == 0, saved.stderr
    command = _refusal(tmp_path / "hf-minimind").splitlines()[1].strip()
    ran = subprocess.run(["bash", "-ec", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, (command, ran.stderr)
    assert pth_problems(resolve(str(tmp_path / "hf-minimind.pth")), MODEL, lambda key: True) == []
