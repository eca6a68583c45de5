"""A resume that changes the loss or the update of every step, the batches and the rate kept (dpo.beta,
train.weight_decay, train.grad_clip, a LoRA run's alpha and dropout: minilmd/batch_stream.py UPDATE_KEYS), is said
as a batch stream change is: a note at `run --check` and in the trainer's log at the resume (both change_note over
stream_changes), and `status`'s bit-reproducible line says no with the change. Before, none of them was compared:
a DPO run resumed with beta 0.1 -> 0.5 said nothing anywhere and status said `bit-reproducible: yes`."""
from __future__ import annotations

import time

import pytest

from minilmd.batch_stream import UPDATE_KEYS, change_note, stream_changes, stream_record
from minilmd.config import RunConfig
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.reproducible import reproducibility_lines

CHANGED = {"train.weight_decay": 0.0, "train.grad_clip": 0.5, "dpo.beta": 0.5, "lora.alpha": 32.0,
           "lora.dropout": 0.1}


def _checkpoint_state(data_format: str, lora_rank: int) -> dict:
    """A trainer_state.json as a checkpoint of a run with the schema's values records it (trainer/loop/train.py)."""
    cfg = RunConfig()
    cfg.override("lora.rank", lora_rank)
    return {"config": cfg.to_dict(), "world_size": 1, "step": 25, "corpus": {"data_format": data_format}}


def _status_line(tmp_path, shape_changes: list[str]) -> list[str]:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    (run_dir / "run.toml").write_text(f'[run]\nname = "demo"\ndir = "{run_dir}"\n[data]\nprepared = "/nowhere"\n'
                                      f'[train]\nmax_steps = 40\ndevice = "cpu"\n')
    st = new_state("demo", run_dir, str(tmp_path / "demo.toml"))
    st.update(phase="done", since=time.time(), shape_changes=shape_changes)
    return reproducibility_lines(run_dir, StateJson.from_dict(st))


def test_every_update_key_is_covered():
    assert set(CHANGED) == set(UPDATE_KEYS)


@pytest.mark.parametrize("key", sorted(CHANGED))
def test_a_resume_changing_an_update_key_gets_its_note_and_status_says_not_bit_reproducible(tmp_path, key):
    recorded = stream_record(_checkpoint_state("dpo", lora_rank=8))
    cfg = RunConfig()
    cfg.override("lora.rank", 8)
    assert stream_changes(cfg, recorded) == []  # the same config: nothing said
    section, name = key.split(".")
    was = getattr(getattr(cfg, section), name)
    cfg.override(key, CHANGED[key])
    changes = stream_changes(cfg, recorded)
    assert changes == [f"{key} = {CHANGED[key]!r} (was {was!r})"]
    note = change_note(25, changes)  # what `run --check` and the trainer's log say at the resume
    assert f"{key} = {CHANGED[key]!r} (was {was!r})" in note and "from step 25 on" in note, note
    assert _status_line(tmp_path, []) == [
        "  bit-reproducible: yes, on the CPU (a resumed run ends as an undisturbed one would)"]
    lines = _status_line(tmp_path, [f"step 25: {', '.join(changes)}"])  # staging's record of it
    assert len(lines) == 1 and lines[0].startswith("  bit-reproducible: no (") and f"step 25: {key} = " in lines[0], \
        lines


def test_a_key_the_checkpoints_run_never_used_is_no_change():
    """beta is DPO's alone, alpha and dropout a LoRA run's: changing them under a pretraining run changes nothing."""
    recorded = stream_record(_checkpoint_state("text", lora_rank=0))
    cfg = RunConfig()
    for key in ("dpo.beta", "lora.alpha", "lora.dropout"):
        cfg.override(key, CHANGED[key])
    assert stream_changes(cfg, recorded) == []
    cfg.override("train.grad_clip", 0.5)  # used by every run
    assert stream_changes(cfg, recorded) == ["train.grad_clip = 0.5 (was 1.0)"]


def _state_with_dtype(dtype: str, device_type: str, matmul: str | None) -> dict:
    """A checkpoint's trainer_state.json of a run with train.dtype `dtype` on `device_type`; `matmul`: its record of
    the resolved dtype (None: saved before that was recorded)."""
    state = _checkpoint_state("text", lora_rank=0)
    state["config"]["train"]["dtype"] = dtype
    state["kernels"] = {"device_type": device_type}
    if matmul is not None:
        state["matmul"] = matmul
    return state


@pytest.mark.parametrize("matmul", ["fp32", None])
def test_a_resume_that_runs_another_matmul_dtype_is_said_and_not_bit_reproducible(tmp_path, matmul):
    """An fp32 CPU run (train.dtype "auto") resumed with dtype = "bf16": before, not compared at all."""
    recorded = stream_record(_state_with_dtype("auto", "cpu", matmul))
    cfg = RunConfig()
    assert stream_changes(cfg, recorded, on_cuda=False) == []
    cfg.override("train.dtype", "fp32")  # "auto" on the CPU is fp32 already: no change
    assert stream_changes(cfg, recorded, on_cuda=False) == []
    cfg.override("train.dtype", "bf16")
    changes = stream_changes(cfg, recorded)  # `run --check`, staging: train.device "auto", an explicit dtype
    assert changes == ["train.dtype = 'bf16' (bf16 matmuls, was fp32)"]
    assert stream_changes(cfg, recorded, on_cuda=False) == changes  # the trainer on its device
    lines = _status_line(tmp_path, [f"step 30: {', '.join(changes)}"])
    assert len(lines) == 1 and lines[0].startswith("  bit-reproducible: no (") and "train.dtype" in lines[0], lines


def test_auto_is_resolved_on_the_device_it_runs_on():
    """A bf16 GPU checkpoint resumed on the CPU under "auto" runs fp32: said where the device is known."""
    recorded = stream_record(_state_with_dtype("auto", "cuda", "bf16"))
    cfg = RunConfig()
    assert stream_changes(cfg, recorded, on_cuda=True) == []
    assert stream_changes(cfg, recorded, on_cuda=False) == ["train.dtype = 'auto' (fp32 matmuls, was bf16)"]
    assert stream_changes(cfg, recorded) == []  # train.device "auto" at --check: not known, not guessed
    cfg.override("train.device", "cpu")
    assert stream_changes(cfg, recorded) == ["train.dtype = 'auto' (fp32 matmuls, was bf16)"]
