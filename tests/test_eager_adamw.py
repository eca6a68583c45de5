"""The trainer's AdamW (trainer/loop/components.py EagerAdamW) is torch's, called without torch.optim's wrappers that
import torch._dynamo at their first call: the same parameters and optimizer state bit for bit as torch.optim.AdamW
over steps, a saved state and its load, and a trainer that does not compile never imports the compiler (about as
much CPU as torch itself, at every start and restart of a run)."""
from __future__ import annotations

import pytest
import torch

from minilmd.trainer.loop.components import EagerAdamW
from trainer_corpus import modules_after, write_config


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.LayerNorm(24), torch.nn.Linear(24, 5))


def _groups(model: torch.nn.Module) -> list[dict]:  # as build_optimizer splits them: decay on matrices only
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 / (1 + i)  # as train_step sets each step's rate
        x = torch.randn(16, 12, generator=gen)
        model(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _same(a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_eager_adamw_steps_saves_and_loads_as_torchs_adamw_bit_for_bit():
    runs = []
    for cls in (torch.optim.AdamW, EagerAdamW):
        model = _model()
        optimizer = cls(_groups(model), lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
        _steps(model, optimizer, 5, seed=1)
        saved = optimizer.state_dict()
        resumed = cls(_groups(model), lr=3e-3, betas=(0.9, 0.95), eps=1e-8)  # a resume: the state loaded
        resumed.load_state_dict(saved)
        _steps(model, resumed, 4, seed=2)
        assert all(resumed.state[p]["step"].item() == 9 for p in model.parameters())  # the loaded state went on
        runs.append((model.state_dict(), saved, resumed.state_dict()))
    (model_a, saved_a, end_a), (model_b, saved_b, end_b) = runs
    _same(model_a, model_b)
    _same(saved_a, saved_b)
    _same(end_a, end_b)


@pytest.mark.slow  # a real `minilmd train` in a fresh interpreter
def test_a_trainer_that_does_not_compile_never_imports_torchs_compiler(tmp_path, corpus):
    config = write_config(tmp_path, corpus, name="eager", train={"max_steps": 4, "checkpoint_every": 2})
    code, modules, proc = modules_after(tmp_path, "import runpy\n"
                                                  "code = 0\n"
                                                  f"sys.argv = ['minilmd', 'train', {str(config)!r}]\n"
                                                  "try:\n"
                                                  "    runpy.run_module('minilmd.cli', run_name='__main__')\n"
                                                  "except SystemExit as e:\n"
                                                  "    code = e.code")
    assert code == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "minilmd.trainer.loop.components" in modules and "torch" in modules  # it did train
    assert "step 4/4" in proc.stdout, proc.stdout[-2000:]
    assert not [m for m in modules if m.startswith("torch._dynamo")], proc.stdout[-2000:]
