"""The Trainer as parts that own their state (trainer/loop/parts.py, early_stop.py), resume() that only finds, the
step and the warm-up taking typed arguments, and the objective as a seam (trainer/loop/objective.py): an objective
other than cross-entropy trains through the unchanged loop, and its metrics reach metrics.jsonl."""
from __future__ import annotations

import ast
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from minilmd.config import load_config
from minilmd.protocol import EXIT_DONE
from minilmd.trainer.loop import train as train_mod
from minilmd.trainer.loop.objective import ChunkedCrossEntropy, DeviceBatch, Metrics, TrainingForward
from minilmd.trainer.loop.parts import RngState, TrainState
from minilmd.trainer.loop.resume import resume
from minilmd.trainer.loop.train import Dist, Trainer
from trainer_corpus import read_metrics, write_config

LOOP = Path(train_mod.__file__).parent
# What trainer_state.json has always held: a checkpoint of an older trainer resumes, a newer one reads the same.
TRAINER_STATE_KEYS = {"step", "tokens_seen", "rows_seen", "epoch", "early_stop", "config", "fingerprints", "init",
                      "data_segments", "rng", "world_size", "global_batch", "total_steps",
                      "kernels",  # the attention kernel a resume keeps (issue 41); an older checkpoint lacks it
                      "corpus",  # the corpus summary a later stage's update share counts by; an older one lacks it
                      "positions_seen",  # the token positions a token budget counts; an older one lacks it
                      "matmul"}  # bf16 or fp32, what a resume compares (batch_stream); an older one lacks it


def cpu() -> Dist:
    return Dist(0, 1, 0, torch.device("cpu"))


@pytest.mark.slow
def test_trainer_state_is_the_union_of_the_parts_and_keeps_its_keys(tmp_path, corpus):
    t = Trainer(load_config(write_config(tmp_path, corpus, train={"max_steps": 2})), cpu())
    state = t.trainer_state()
    assert set(state) == TRAINER_STATE_KEYS - {"step"}  # the step: the checkpoint writer's (trainer/checkpoint/save.py)
    for part in t.parts():
        fragment = part.state_dict()
        assert fragment and all(state[k] == v for k, v in fragment.items()), type(part).__name__


def test_train_state_round_trips_and_keeps_a_held_init_record():
    s = TrainState(global_batch=8, step=5, tokens_seen=300, rows_base=16, step_base=3, init_record={"path": "a"})
    assert s.first_row(5) == 16 + 2 * 8
    again = TrainState(global_batch=4)  # resumed with another global batch: the rows trained stay
    again.load_state_dict({**s.state_dict(), "step": 5})  # the step as the checkpoint writer adds it
    assert (again.step, again.tokens_seen, again.first_row(5), again.first_row(6)) == (5, 300, 32, 36)
    assert again.init_record == {"path": "a"}
    lora = TrainState(global_batch=8, init_record={"path": "the base now"})  # read anew at this start
    lora.load_state_dict({**s.state_dict(), "step": 5})
    assert lora.init_record == {"path": "the base now"}
    old = TrainState(global_batch=8)
    old.load_state_dict({"step": 3})  # a checkpoint from before rows_seen and tokens_seen were recorded
    assert (old.first_row(3), old.tokens_seen, old.init_record) == (24, 0, None)


def test_rng_state_puts_every_generator_back():
    rng = RngState()
    saved = rng.state_dict()
    want = (random.random(), float(np.random.rand()), float(torch.rand(())))
    rng.load_state_dict(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == want


@pytest.mark.slow
def test_resume_finds_and_returns_without_touching_the_trainer(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 3, "checkpoint_every": 3})
    first = Trainer(load_config(config), cpu())
    assert first.train() == EXIT_DONE
    weights = {k: v.clone() for k, v in first.model.state_dict().items()}
    fresh = Trainer(load_config(config), cpu())  # resumes as it is built
    assert fresh.step == 3 and fresh.resumed_from is not None
    assert all(torch.equal(v, weights[k]) for k, v in fresh.model.state_dict().items())
    cfg = load_config(config)
    found = resume(cfg, cpu(), fresh.expectation())
    assert found is not None and found.path == fresh.resumed_from and found.state["step"] == 3
    assert set(found.model_state) == set(weights) and found.optimizer_state["state"]


def _function_annotations(path: Path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            out += [(f"{node.name}({a.arg})", ast.unparse(a.annotation) if a.annotation else "") for a in args
                    if a.arg not in ("self", "cls")]
    return out


@pytest.mark.parametrize("module", ["step.py", "warmup.py", "resume.py", "parts.py", "objective.py"])
def test_the_steps_modules_take_typed_arguments_and_no_trainer(module):
    """mypy checks what they are given: every argument annotated, none `Any`, none a trainer."""
    for name, annotation in _function_annotations(LOOP / module):
        assert annotation and annotation != "Any" and "Trainer" not in annotation, (module, name, annotation)
        assert "(trainer)" not in name, (module, name)


class ScaledWithMetrics:
    """Another objective: cross-entropy at twice the weight, reporting the rows it saw and a constant."""

    name = "scaled"

    def __init__(self, chunk_rows: int):
        self.inner = ChunkedCrossEntropy(chunk_rows)
        self.calls = 0

    def loss(self, model, batch: DeviceBatch) -> tuple[torch.Tensor, Metrics]:
        self.calls += 1
        loss, _ = self.inner.loss(model, batch)
        rows = torch.tensor(float(batch.ids.shape[0]), device=loss.device)
        return 2 * loss, {"rows": rows, "half": torch.tensor(0.5, device=loss.device)}


@pytest.mark.slow
def test_another_objective_trains_through_the_same_loop_and_reports_its_metrics(tmp_path, corpus, monkeypatch):
    plain = Trainer(load_config(write_config(tmp_path, corpus, name="plain", train={"max_steps": 2})), cpu())
    made: list[ScaledWithMetrics] = []

    def build(cfg, data_format="text"):
        made.append(ScaledWithMetrics(8))
        return made[-1]

    monkeypatch.setattr(train_mod, "build_objective", build)
    config = write_config(tmp_path, corpus, name="scaled", train={"max_steps": 2, "eval_every": 1})
    t = Trainer(load_config(config), cpu())
    assert t.objective is made[0] and isinstance(t.step_setup.forward, TrainingForward)
    assert t.train() == EXIT_DONE
    assert made[0].calls >= 2 * 2  # two steps of two micro-batches, and the validations
    lines = read_metrics(t.cfg.run_dir)
    train_lines = [m for m in lines if m["kind"] == "train"]
    eval_lines = [m for m in lines if m["kind"] == "eval"]
    assert train_lines and all(m["rows"] == 4.0 and m["half"] == 0.5 for m in train_lines)  # micro-batches of 4
    assert eval_lines and all(m["val_half"] == 0.5 for m in eval_lines)

    scaled = Trainer(load_config(write_config(tmp_path, corpus, name="scaled2", train={"max_steps": 2})), cpu())
    assert scaled.evaluate() == pytest.approx(2 * plain.evaluate(), rel=1e-6)  # its loss, not the built-in one
