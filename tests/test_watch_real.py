"""Watching a real supervised run that a SIGBUS killed and the supervisor resumed: the plot of its curves (the restart
mark in the figure), TensorBoard's own reader on its event files (each step once), the Prometheus textfile through
prometheus_client's parser, the status sparkline. One run of the real trainer (tiny model, CPU) serves them all.

The trainer logs every step and saves every 4; MINILMD_FAULT=sigbus@10 kills it after it logged step 10; the next
attempt resumes from the newest checkpoint that was complete by then (step 8, or step 4 when the save of step 8 was
still in flight: the tests read which from the metrics) and logs the steps after it again, then goes on to 16.
"""
from __future__ import annotations

import json
import stat
import struct
from pathlib import Path

import numpy as np
import pytest

from minilmd.config import load_config
from minilmd.daemon.views import curves
from supervisor_helpers import cli, run_supervisor, state, write_config
from trainer_corpus import read_metrics

pytestmark = pytest.mark.slow
STEPS = 16
DEATH = 10


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, corpus):
    """(config, run config, textfile) of a finished real run with one SIGBUS restart, TensorBoard and Prometheus on."""
    tmp = tmp_path_factory.mktemp("watch")
    textfile = tmp / "textfile" / "minilmd-w.prom"
    textfile.parent.mkdir()
    config = write_config(tmp, corpus, name="w", remote=True,
                          train={"max_steps": STEPS, "checkpoint_every": 4, "log_every": 1, "eval_every": 4},
                          log={"tensorboard": True, "prometheus_textfile": str(textfile)})
    assert run_supervisor(config, tmp, timeout=300, fake=False, MINILMD_FAULT=f"sigbus@{DEATH}") == 0
    cfg = load_config(config)
    assert [r["cause"] for r in state(cfg.run_dir)["restarts"]] == ["sigbus"]
    return config, cfg, textfile


def attempts(run_dir: Path) -> list[list[dict]]:
    """metrics.jsonl's train lines cut where the step goes back: one list per attempt."""
    cut: list[list[dict]] = []
    for rec in read_metrics(run_dir, "train"):
        if not cut or rec["step"] <= cut[-1][-1]["step"]:
            cut.append([])
        cut[-1].append(rec)
    return cut


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_the_curve_keeps_every_attempt_and_the_plot_marks_the_sigbus_restart(resumed_run, tmp_path):
    pytest.importorskip("matplotlib")
    from minilmd.daemon.views.plot import plot

    _, cfg, _ = resumed_run
    first, second = attempts(cfg.run_dir)
    assert [r["step"] for r in first] == list(range(1, DEATH + 1))  # kept: a resume never truncates the file
    resumed = second[0]["step"] - 1
    assert resumed in (4, 8) and [r["step"] for r in second] == list(range(resumed + 1, STEPS + 1))
    run = curves.load(cfg.run_dir)
    assert [r["step"] for r in run.train] == list(range(1, STEPS + 1)) and run.repeated_steps == DEATH - resumed
    assert run.train[DEATH - 1] == second[DEATH - resumed - 1]  # of a repeated step, the attempt that went on wins
    assert [(m.cause, m.step) for m in run.restarts] == [("sigbus", float(DEATH))]

    summary = plot([cfg.run_dir], tmp_path / "w.png")
    assert png_size(tmp_path / "w.png") == summary.size_px and summary.size_px[0] >= 800
    assert summary.restart_marks == [("w", float(DEATH), "sigbus")]
    assert summary.points == {"w": STEPS}

    by_tokens = cli("plot", str(cfg.run_dir), str(cfg.run_dir), "--x", "tokens", "--out", str(tmp_path / "t.svg"))
    assert by_tokens.returncode == 0, by_tokens.stderr
    assert "restarts: sigbus at " in by_tokens.stdout and (tmp_path / "t.svg").read_text().startswith("<?xml")
    tokens_at_death = run.train[DEATH - 1]["tokens_seen"]
    assert f"sigbus at {tokens_at_death:,}" in by_tokens.stdout  # the mark moved to the tokens axis


def test_tensorboard_reads_back_each_step_once_with_the_resumed_attempts_values(resumed_run):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    _, cfg, _ = resumed_run
    files = sorted((cfg.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 2  # one per attempt
    acc = event_accumulator.EventAccumulator(str(cfg.run_dir / "tensorboard"))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, STEPS + 1))
    first, second = attempts(cfg.run_dir)
    resumed = second[0]["step"] - 1
    kept = first[:resumed] + second  # the steps the first attempt logged after the checkpoint are the second's
    assert [e.value for e in loss] == [float(np.float32(r["loss"])) for r in kept]  # TensorBoard keeps float32
    assert [e.step for e in acc.Scalars("val/loss")] == [4, 8, 12, 16]
    restarts = {e.step: e.value for e in acc.Scalars("run/restarts")}
    assert sorted(restarts) == list(range(1, STEPS + 1))
    assert {restarts[s] for s in range(1, resumed + 1)} == {0.0}
    assert {restarts[s] for s in range(resumed + 1, STEPS + 1)} == {1.0}
    for tag in ("train/lr", "train/grad_norm", "train/tok_s", "train/epoch"):
        assert [e.step for e in acc.Scalars(tag)] == list(range(1, STEPS + 1)), tag


def test_the_prometheus_textfile_parses_and_says_how_the_run_ended(resumed_run):
    parser = pytest.importorskip("prometheus_client.parser")

    _, cfg, textfile = resumed_run
    assert stat.S_IMODE(textfile.stat().st_mode) == 0o644  # node_exporter's own user reads it
    samples = {}
    for family in parser.text_string_to_metric_families(textfile.read_text()):
        assert family.type == "gauge" and family.name.startswith("minilmd_")
        for s in family.samples:
            assert s.labels["run"] == "w"
            samples[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "run")))] = s.value
    st = state(cfg.run_dir)
    assert samples[("minilmd_up", ())] == 0  # written at exit
    assert samples[("minilmd_phase", (("phase", "done"),))] == 1
    assert samples[("minilmd_phase", (("phase", "training"),))] == 0
    assert samples[("minilmd_step", ())] == STEPS == samples[("minilmd_total_steps", ())]
    assert samples[("minilmd_loss", ())] == st["progress"]["loss"]
    assert samples[("minilmd_val_loss", ())] == st["progress"]["val_loss"]
    assert samples[("minilmd_restarts", (("cause", "sigbus"),))] == 1 == samples[("minilmd_restarts",
                                                                                 (("cause", "all"),))]
    assert samples[("minilmd_last_sync_timestamp_seconds", ())] >= st["supervisor"]["started"]
    assert samples[("minilmd_sync_failing", ())] == 0
    assert samples[("minilmd_remote_checkpoint_timestamp_seconds", ())] == st["remote_checkpoint"]["time"]
    assert ("minilmd_gpu_waited_seconds", ()) in samples  # train.device = "cpu": no wait, but the gauge is there


def test_status_shows_a_sparkline_of_the_loss_and_the_registry_lists_the_run(resumed_run):
    config, cfg, _ = resumed_run
    text = cli("status", str(cfg.run_dir)).stdout
    spark = next(line for line in text.splitlines() if line.startswith("  loss "))
    assert f"steps 1-{STEPS}:" in spark and any(c in spark for c in curves.SPARKS), text
    listing = json.loads(cli("status", "--all", "--json").stdout)
    assert [(r["run"], r["phase"], r["step"], r["restarts"]) for r in listing
            if r["run_dir"] == str(cfg.run_dir.resolve())] == [("w", "done", STEPS, 1)]
