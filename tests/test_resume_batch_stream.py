"""A resume with other batch stream settings (train.seq_len, micro_batch_size, grad_accum, seed, data.mode:
minilmd/batch_stream.py) is not refused (lengthening seq_len mid-run is a legitimate practice) but said: by `run
--check` and the trainer at the resume, by staging's event "data_shape", and by `minilmd status`, whose
bit-reproducible line says no from then on. Before, `--check` said only "resumes from step N", the trainer went on
with rows of the new length, and status still said the run ends as an undisturbed one would."""
from __future__ import annotations

import shutil
import time

import pytest

from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.reproducible import reproducibility_lines
from supervisor_helpers import cli, events, run_supervisor, write_config

SAID = ("the resume from step 4 changes the batch stream, the lr schedule or the update: train.seq_len = 64 (was 32), "
        "train.grad_accum = 2 (was 1)")


@pytest.mark.slow  # two real supervised runs of a one-layer model
def test_a_resume_with_a_longer_seq_len_is_said_by_the_check_the_trainer_the_events_and_status(tmp_path, corpus):
    first = write_config(tmp_path, corpus, name="grow", remote=False,
                         train={"seq_len": 32, "max_steps": 4, "checkpoint_every": 2})
    assert run_supervisor(first, tmp_path, fake=False, timeout=300) == 0
    longer = write_config(tmp_path, corpus, name="grow", remote=False,
                          train={"seq_len": 64, "grad_accum": 2, "max_steps": 6, "checkpoint_every": 2})
    run_dir = load_config(longer).run_dir

    check = cli("run", "--check", str(longer))
    assert check.returncode == 0 and "resumes from step 4" in check.stdout, check.stdout + check.stderr
    assert f"note: {SAID}" in check.stdout, check.stdout

    assert run_supervisor(longer, tmp_path, fake=False, timeout=300) == 0
    said = [e for e in events(run_dir) if e["event"] == "data_shape"]
    assert [(e["step"], e["message"].startswith(SAID)) for e in said] == [(4, True)], said
    logs = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("attempt-*.log")))
    assert f"minilmd: note: {SAID}" in logs
    shown = cli("status", str(run_dir)).stdout
    assert "bit-reproducible: no (a resume changed the batch stream, the lr schedule or the update: step 4: " \
        "train.seq_len = 64 " \
        "(was 32)" in shown

    # Its newest checkpoint has the new settings: a launch that only trains longer changes no batch, but the budget
    # its cosine decays over (the rate of every step from here on), and says that alone.
    again = write_config(tmp_path, corpus, name="grow", remote=False,
                         train={"seq_len": 64, "grad_accum": 2, "max_steps": 8, "checkpoint_every": 2})
    check = cli("run", "--check", str(again))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "the lr schedule or the update: train.max_steps = 8 (was 6): " in check.stdout, check.stdout
    assert "seq_len =" not in check.stdout, check.stdout
    assert "bit-reproducible: no" in cli("status", str(run_dir)).stdout  # the run's history: changed once


@pytest.mark.slow  # two real supervised runs of a one-layer model
def test_a_resume_from_the_remote_on_a_new_machine_with_a_longer_seq_len_is_said_too(tmp_path, corpus):
    first = write_config(tmp_path, corpus, name="moved", train={"seq_len": 32, "max_steps": 4, "checkpoint_every": 2})
    assert run_supervisor(first, tmp_path, fake=False, timeout=300) == 0
    shutil.rmtree(load_config(first).scratch_dir)  # a new machine: only the remote holds its checkpoints
    longer = write_config(tmp_path, corpus, name="moved",
                          train={"seq_len": 64, "grad_accum": 2, "max_steps": 6, "checkpoint_every": 2})
    run_dir = load_config(longer).run_dir

    check = cli("run", "--check", str(longer))
    assert check.returncode == 0 and "resumes from step 4 (remote:" in check.stdout, check.stdout + check.stderr
    assert f"note: {SAID}" in check.stdout, check.stdout

    assert run_supervisor(longer, tmp_path, fake=False, timeout=300) == 0
    assert [e["step"] for e in events(run_dir) if e["event"] == "data_shape"] == [4]  # once fetched into scratch
    said = cli("status", str(run_dir)).stdout
    assert "bit-reproducible: no (a resume changed the batch stream, the lr schedule or the update" in said


def test_status_says_a_run_whose_batch_stream_changed_is_not_bit_reproducible(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text(f'[run]\nname = "demo"\ndir = "{run_dir}"\n[data]\nprepared = "/nowhere"\n'
                                      f'[train]\nmax_steps = 10\ndevice = "cpu"\n')
    st = new_state("demo", run_dir, str(tmp_path / "demo.toml"))
    st.update(phase="training", since=time.time(), shape_changes=["step 702: train.seq_len = 512 (was 256)"])
    lines = reproducibility_lines(run_dir, StateJson.from_dict(st))
    assert lines == ["  bit-reproducible: no (a resume changed the batch stream, the lr schedule or the update: "
                     "step 702: "
                     "train.seq_len = 512 (was 256); the run is the same as an undisturbed run of neither config)"]


def test_a_key_left_to_the_stage_is_no_change_and_a_rate_the_config_sets_anew_is_one():
    """An SFT run's config leaves data.mode out: its checkpoints record the stage's "bucketed", never a change
    against the schema's "packed" (on every restart status said an SFT run was not bit-reproducible); a train.lr or
    a budget the config sets anew changes every step's rate from the resume on, and is said."""
    from minilmd.batch_stream import stream_changes
    from minilmd.config import RunConfig

    cfg = RunConfig()
    recorded = {"data": {"mode": "bucketed"}, "train": {"lr": 1e-5, "max_steps": cfg.train.max_steps}}
    assert stream_changes(cfg, recorded) == []
    cfg.override("train.lr", 3e-3)
    cfg.override("train.max_steps", recorded["train"]["max_steps"] + 100)
    was = recorded["train"]["max_steps"]
    assert stream_changes(cfg, recorded) == ["train.lr = 0.003 (was 1e-05)",
                                             f"train.max_steps = {was + 100} (was {was})"]


@pytest.mark.slow  # two real supervised runs of a one-layer model
def test_a_resume_under_another_dtype_is_said_by_the_check_the_trainer_and_status(tmp_path, corpus):
    """An fp32 CPU run (train.dtype "auto") given dtype = "bf16" at step 4: before, nothing said anywhere, the steps
    after ran under bf16 autocast and status said `bit-reproducible: yes, on the CPU`."""
    first = write_config(tmp_path, corpus, name="dt", remote=False, train={"max_steps": 4, "checkpoint_every": 2})
    assert run_supervisor(first, tmp_path, fake=False, timeout=300) == 0
    run_dir = load_config(first).run_dir
    assert "bit-reproducible: yes, on the CPU" in cli("status", str(run_dir)).stdout
    bf16 = write_config(tmp_path, corpus, name="dt", remote=False,
                        train={"max_steps": 6, "checkpoint_every": 2, "dtype": "bf16"})
    said = "train.dtype = 'bf16' (bf16 matmuls, was fp32)"
    check = cli("run", "--check", str(bf16))
    assert check.returncode == 0 and said in check.stdout, check.stdout + check.stderr
    assert run_supervisor(bf16, tmp_path, fake=False, timeout=300) == 0
    logs = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("attempt-*.log")))
    assert "minilmd: note: the resume from step 4 changes" in logs and said in logs, logs
    line = next(ln for ln in cli("status", str(run_dir)).stdout.splitlines() if "bit-reproducible" in ln)
    assert line.startswith("  bit-reproducible: no (a resume changed") and "step 4: " in line and said in line, line
