"""A MiniMind .pth saved from a DistributedDataParallel or torch.compile wrapper (its keys `module.` or
`_orig_mod.` prefixed, or both) initialises a run as the plain file does: `run --check` and the trainer read it
without the prefix (init_model.unwrapped), and the check says what the file is. Before (user report 9, finding 7),
the check counted no `model.layers.` key and advised `[model] num_hidden_layers = 0`, advice that cannot work."""
from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import load_config
from minilmd.init_model import unwrapped
from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY, expected_state_shapes
from minilmd.trainer.checkpoint.init_weights import load_init
from trainer_corpus import write_config


def _pth(path, model: dict, prefix: str = ""):
    """A .pth as MiniMind's trainers save one (fp16, the tied head among the tensors), each key after `prefix`."""
    torch.manual_seed(0)
    state = {k: torch.randn(shape) for k, shape in expected_state_shapes(model).items()}
    state[TIED_HEAD_KEY] = state[EMBED_KEY]
    torch.save({prefix + k: v.half() for k, v in state.items()}, path)
    return path


def test_the_rule():
    assert unwrapped({"module.a": 1, "module.b": 2}) == ({"a": 1, "b": 2}, ["module."])
    assert unwrapped({"module._orig_mod.a": 1}) == ({"a": 1}, ["module.", "_orig_mod."])
    assert unwrapped({"module.a": 1, "b": 2}) == ({"module.a": 1, "b": 2}, [])  # not every key: not a wrapper's
    assert unwrapped({}) == ({}, [])


@pytest.mark.parametrize("prefix, said", [("module.", "`module.` (saved from a DistributedDataParallel wrapper"),
                                          ("_orig_mod.", "`_orig_mod.` (saved from a torch.compile wrapper"),
                                          ("module._orig_mod.", "`module.` and `_orig_mod.` (saved from a "
                                                                "DistributedDataParallel and torch.compile wrapper")])
def test_check_and_trainer_read_a_wrapped_save_as_the_plain_one(tmp_path, corpus, prefix, said):
    model = load_config(write_config(tmp_path, corpus, name="pre")).model_dict()
    plain = _pth(tmp_path / "plain.pth", model)
    wrapped = _pth(tmp_path / "wrapped.pth", model, prefix)
    stage = write_config(tmp_path, corpus, name="sft", init={"from": str(wrapped)})
    result = CliRunner().invoke(app, ["run", "--check", str(stage)])
    assert result.exit_code == 0, result.output
    assert "num_hidden_layers" not in result.output
    assert f"init.from = {str(wrapped)!r}: its keys carry the prefix {said}" in result.output, result.output
    got, _ = load_init(load_config(stage))
    want, _ = load_init(load_config(write_config(tmp_path, corpus, name="sft2", init={"from": str(plain)})))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
