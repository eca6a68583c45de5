"""`minilmd status` says whether the run is bit-reproducible: always on the CPU, on the GPU only with
train.deterministic (daemon/views/reproducible.py, from the run's copy of its config)."""
from __future__ import annotations

import io
import time
from pathlib import Path

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views import status as views
from minilmd.fsio import atomic_write_json


def status_of(tmp_path: Path, device: str, deterministic: bool | None, devices: list, done: bool = False) -> str:
    run_dir = tmp_path / f"run-{device}-{deterministic}-{done}-{len(devices)}"
    run_dir.mkdir()
    st = new_state("demo", run_dir, str(tmp_path / "demo.toml"))
    st.update(phase="training", since=time.time(), devices=devices,
              child={"pid": 4242, "attempt": 1, "log": "logs/attempt-0001.log"})
    if done:  # the trainer ended: no child, its progress and devices stay in state.json
        st.update(phase="done", child=None, progress={**st["progress"], "step": 240, "total_steps": 240})
    atomic_write_json(run_dir / "state.json", st)
    det = "" if deterministic is None else f"deterministic = {str(deterministic).lower()}\n"
    (run_dir / names.RUN_CONFIG_COPY).write_text(
        f'[run]\nname = "demo"\ndir = "{run_dir}"\n[data]\nprepared = "/nowhere"\n'
        f'[train]\nmax_steps = 10\ndevice = "{device}"\n{det}')
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    return out.getvalue()


def test_status_says_whether_the_run_is_bit_reproducible(tmp_path):
    assert "bit-reproducible: yes (train.deterministic" in status_of(tmp_path, "cuda", None, [0])  # the default
    assert "bit-reproducible: no on the GPU (train.deterministic = false" in status_of(tmp_path, "cuda", False, [0])
    assert "bit-reproducible: yes, on the CPU" in status_of(tmp_path, "cpu", False, [])
    assert "bit-reproducible: yes, on the CPU" in status_of(tmp_path, "auto", False, [])  # no card leased: CPU


def test_a_cpu_run_is_said_reproducible_on_the_cpu_whatever_train_deterministic_says(tmp_path):
    """train.deterministic is on by default and chooses GPU kernels: a CPU run was shown "yes (train.deterministic:
    deterministic kernels on the GPU ...)", for one that never touched a GPU."""
    for deterministic in (None, True):
        shown = status_of(tmp_path, "cpu", deterministic, [])
        assert "bit-reproducible: yes, on the CPU" in shown and "kernels on the GPU" not in shown, shown


def test_a_finished_run_of_device_auto_that_leased_no_card_is_said_reproducible_on_the_cpu(tmp_path):
    """The demo (train.device = "auto") finished on a machine without a GPU was shown "deterministic kernels on the
    GPU": with its trainer gone, only the devices it leased (none) say where it ran."""
    shown = status_of(tmp_path, "auto", None, [], done=True)
    assert "bit-reproducible: yes, on the CPU" in shown and "kernels on the GPU" not in shown, shown
    assert "bit-reproducible: yes (train.deterministic" in status_of(tmp_path, "auto", None, [0], done=True)


def test_the_rule_has_one_home_in_the_core_and_status_says_its_answer(tmp_path, monkeypatch):
    """minilmd/batch_stream.py bit_reproducible is the rule (before: a copy in trainer/loop/determinism.py nobody
    called, and the view's own): status's yes or no is its answer."""
    from minilmd.batch_stream import bit_reproducible
    from minilmd.daemon.views import reproducible
    from minilmd.trainer.loop import determinism

    assert bit_reproducible(True, False) and bit_reproducible(False, True) and not bit_reproducible(False, False)
    assert not bit_reproducible(True, True, ["train.seq_len 256 -> 512"])
    assert not hasattr(determinism, "bit_reproducible")
    monkeypatch.setattr(reproducible, "bit_reproducible", lambda *a: False)
    assert "bit-reproducible: no on the GPU" in status_of(tmp_path, "cuda", True, [0])
