"""`minilmd run --fresh` in a run.dir that already holds another timeline starts a new lineage there: `status` and
`plot` read only the current one (the records after the last fresh start's marker in metrics.jsonl,
daemon/base/timeline.py), and status says in one line that an earlier timeline is there, and to which step. A
resume from an older checkpoint (the same lineage, steps logged again) is no new lineage.

On main the views mixed both: a run at step 10 of its fresh lineage showed the sparkline "steps 1-30" of the old one,
and plot drew the old steps 11-30 after the new ones.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base import timeline
from minilmd.daemon.views import curves
from minilmd.daemon.views.fitwatch import fit_lines
from supervisor_helpers import cli, env_for, run_supervisor, run_whose_step_1_records, write_config


@pytest.mark.slow
def test_after_run_fresh_status_and_plot_read_the_new_lineage_only(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 30})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    cfg = load_config(config)
    shutil.rmtree(cfg.scratch_dir)  # the old timeline's checkpoints given up: scratch emptied, the remote gone
    Path(cfg.run.remote).rename(tmp_path / "old-remote")
    config = write_config(tmp_path, corpus, train={"max_steps": 10})
    out = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--fresh", str(config)], capture_output=True,
                         text=True, timeout=120, env=env_for())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    said = cli("status", str(cfg.run_dir)).stdout
    spark = next(line for line in said.splitlines() if line.startswith("  loss "))
    assert "steps 1-10:" in spark and spark.endswith("-> 0.9091"), said  # the fake's loss at step 10: 10 / 11
    assert "  an earlier timeline (to step 30) is in this run.dir, before the run --fresh start of " in said, said
    assert "status and plot show the current one only" in said, said

    drawn = curves.load(cfg.run_dir)
    assert [r["step"] for r in drawn.train] == list(range(1, 11)), [r["step"] for r in drawn.train]
    assert drawn.repeated_steps == 0 and drawn.restarts == [] and drawn.earlier.earlier_step == 30
    pytest.importorskip("matplotlib")
    plotted = cli("plot", str(cfg.run_dir), "--out", str(tmp_path / "p.png"))
    assert plotted.returncode == 0, plotted.stdout + plotted.stderr
    assert "s: an earlier timeline (to step 30) is in this run.dir" in plotted.stdout and "not drawn" in \
        plotted.stdout, plotted.stdout
    from minilmd.daemon.views.plot import plot

    summary = plot([cfg.run_dir], tmp_path / "q.png")
    assert summary.points == {"s": 10} and summary.restart_marks == [], summary  # on main: 30 points


def write_lines(path: Path, records: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(rec) + "\n" for rec in records)


def train(step: int, attempt: int, t0: float) -> dict:
    return {"kind": "train", "step": step, "loss": 5.0 - step / 20 + attempt / 1000, "lr": 1e-3,
            "tok_s": 500.0 + attempt, "tokens_seen": step * 128, "epoch": step // 25, "time": t0 + step}


def two_timelines(root: Path) -> Path:
    """An old timeline: steps 1-60 (epochs 0-2, a val loss at 50), a sigbus at 30 and a supervisor killed; then
    `run --fresh` (its supervisor's start, the fresh fetch event, the marker mark_fresh writes), and the new lineage:
    attempt 1 logs 1-20 and is killed at 20, attempt 2 resumes from its checkpoint at 10 and logs 11-30 again."""
    run_dir = root / "r"
    run_dir.mkdir()
    write_lines(run_dir / names.METRICS, [train(s, 1, 1000.0) for s in range(1, 61)]
                + [{"kind": "eval", "step": 50, "val_loss": 9.5, "epoch": 2, "time": 1050.0}])
    timeline.mark_fresh(run_dir, 2000.0)
    write_lines(run_dir / names.METRICS, [train(s, 1, 2000.0) for s in range(1, 21)]
                + [train(s, 2, 2010.0) for s in range(11, 31)])
    write_lines(run_dir / names.EVENTS, [
        {"time": 999.0, "event": "start", "message": "supervisor pid 1 owns ..."},
        {"time": 1030.5, "event": "child_exit", "message": "...", "cause": "sigbus", "exit": -7, "step": 30},
        {"time": 1041.0, "event": "start", "message": "supervisor pid 2 owns ..."},
        {"time": 1999.0, "event": "start", "message": "supervisor pid 3 owns ..."},
        {"time": 2000.0, "event": "fetch", "message": "... `--fresh` was given ...: starting from step 0",
         "lineage": "fresh"},
        {"time": 2020.5, "event": "child_exit", "message": "...", "cause": "sigkill", "exit": -9, "step": 20},
    ])
    return run_dir


def test_the_curves_fit_lines_and_sparkline_read_the_lineage_after_the_fresh_start_its_resumes_kept(tmp_path):
    """On main: steps 1-60 (the old 31-60 after the new 1-30), the old run's sigbus and supervisor restarts, its
    epoch 2 and val loss, the sparkline to step 60. A resume from an older step inside the new lineage (11-20 logged
    twice) stays one lineage: its repeated steps once, the last attempt's."""
    run_dir = two_timelines(tmp_path)
    run = curves.load(run_dir)
    assert [r["step"] for r in run.train] == list(range(1, 31)), [r["step"] for r in run.train]
    assert run.repeated_steps == 10 and {r["tok_s"] for r in run.train if r["step"] > 10} == {502.0}
    assert [(m.cause, m.step) for m in run.restarts] == [("sigkill", 20.0)] and run.epochs == [25]
    assert (run.earlier.earlier_step, run.earlier.fresh_since) == (30 * 2, 2000.0)
    assert curves.earlier_words(run.earlier).startswith("an earlier timeline (to step 60) is in this run.dir, before")
    shown = fit_lines(run_dir)
    assert [line.split(":")[0] for line in shown] == ["  epoch 0", "  epoch 1"] and "9.5" not in "".join(shown), shown
    spark = curves.sparkline_line(run_dir)
    assert spark is not None and " steps 1-30: " in spark, spark


def test_a_supervisor_started_again_after_the_fresh_start_is_a_restart_of_the_new_lineage(tmp_path):
    run_dir = two_timelines(tmp_path)
    write_lines(run_dir / names.EVENTS, [{"time": 2041.0, "event": "start", "message": "supervisor pid 4 owns ..."}])
    assert [(m.cause, m.step) for m in curves.load(run_dir).restarts] == [("sigkill", 20.0), ("supervisor", 30.0)]


def test_the_marker_is_a_line_of_its_own_after_a_torn_one_and_says_the_last_whole_step(tmp_path):
    path = tmp_path / names.METRICS
    write_lines(path, [train(s, 1, 1000.0) for s in range(1, 8)])
    with open(path, "a") as f:
        f.write('{"kind": "train", "step": 8')  # the old trainer killed mid-line
    timeline.mark_fresh(tmp_path, 3000.0)
    write_lines(path, [train(1, 1, 3000.0)])
    run = curves.load(tmp_path)
    assert [r["step"] for r in run.train] == [1] and (run.earlier.earlier_step, run.earlier.fresh_since) == (7, 3000.0)
    first = tmp_path / "first"
    first.mkdir()
    timeline.mark_fresh(first, 3000.0)  # a first run given --fresh: no earlier timeline, nothing said of one
    assert not (first / names.METRICS).exists() and curves.earlier_words(curves.load(first).earlier) is None


def test_a_marker_someone_wrote_with_wrong_types_still_cuts_saying_no_step(tmp_path):
    write_lines(tmp_path / names.METRICS, [train(s, 1, 1000.0) for s in range(1, 5)]
                + [{"kind": "lineage", "lineage": "fresh", "earlier_step": "lots", "time": "x"}, train(1, 1, 2000.0)])
    found = curves.read_timeline(tmp_path)
    assert [r["step"] for r in found.records] == [1] and found.earlier_step is None
    assert curves.earlier_words(found) == "an earlier timeline is in this run.dir, before the run --fresh start"


def test_the_supervisors_progress_forgets_the_earlier_timeline_at_the_marker_and_its_old_heartbeat(tmp_path):
    """The supervisor reads metrics.jsonl from its start: on main its state.json (status's step line, the
    Prometheus gauges) kept the old timeline's val loss until the new lineage's first eval, and its step until the
    new trainer's first line."""
    from minilmd.daemon.base.runstate import Heartbeat, RunState, new_state

    state = RunState(tmp_path / names.STATE, new_state("r", tmp_path, "/runs/r.toml"))
    old = [train(60, 1, 1000.0), {"kind": "eval", "step": 60, "val_loss": 9.5, "time": 1060.0}]
    state.apply_progress(old + [{"kind": "lineage", "lineage": "fresh", "earlier_step": 60, "time": 2000.0}],
                         Heartbeat(1060.0, 60, ""))  # the old trainer's heartbeat, still there
    assert (state.progress.step, state.progress.val_loss, state.progress.loss) == (None, None, None)
    state.apply_progress([train(5, 1, 2000.0)], Heartbeat(2006.0, 6, ""))
    assert (state.progress.step, state.progress.val_loss) == (6, None)


@pytest.mark.parametrize("kind", ["a FIFO", "a link"])
def test_a_metrics_file_that_is_not_a_regular_one_is_not_written_through(tmp_path, kind):
    path = tmp_path / names.METRICS
    target = tmp_path / "elsewhere.jsonl"
    if kind == "a FIFO":
        os.mkfifo(path)
    else:
        write_lines(target, [train(1, 1, 1000.0)])
        path.symlink_to(target)
    with pytest.raises(OSError):
        timeline.mark_fresh(tmp_path, 2000.0)
    assert kind == "a FIFO" or target.read_text().count("\n") == 1  # the link's target left as it was


def test_the_lineage_of_a_finished_run_is_read_from_its_remote_once_scratch_is_gone(tmp_path, corpus):
    """A run ends: its scratch is removed (or a reboot empties /dev/shm). Its `lineage:` line is read from the
    checkpoint state.json records synced to run.remote, as the one in scratch was (source_state); a recorded path
    outside the config's run.remote is not followed. On main the line disappeared once scratch was gone."""
    from minilmd.daemon.base.runstate import new_state
    from minilmd.daemon.base.statesections import StateJson
    from minilmd.daemon.views.run_context import RunContext

    base = tmp_path / "base" / names.step_name(6)
    base.mkdir(parents=True)
    (base / names.MANIFEST).write_text(json.dumps({"step": 6, "files": {}}))
    (base / names.TRAINER_STATE).write_text(json.dumps({"step": 6}))
    config = write_config(tmp_path, corpus, name="sft")
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    shutil.copyfile(config, cfg.run_dir / names.RUN_CONFIG_COPY)
    synced = Path(cfg.run.remote) / names.step_name(4)
    synced.mkdir(parents=True)
    (synced / names.MANIFEST).write_text(json.dumps({"step": 4, "files": {}}))
    init = {"kind": "checkpoint", "path": str(base), "step": 6, "manifest_sha256": "ab" * 32}
    (synced / names.TRAINER_STATE).write_text(json.dumps({"step": 4, "init": init}))
    state = new_state("sft", cfg.run_dir, str(config))
    state.update(phase="done", remote_checkpoint={"step": 4, "path": str(synced), "verified": True})
    (cfg.run_dir / names.STATE).write_text(json.dumps(state))
    assert not cfg.checkpoint_dir.exists()  # scratch gone

    line = f"  lineage: {base} (step 6, manifest sha256 abababababab)"
    assert RunContext(cfg.run_dir).lineage_lines(StateJson.from_dict(state)) == [line]
    shown = cli("status", str(cfg.run_dir)).stdout
    assert line in shown.splitlines(), shown
    elsewhere = {**state, "remote_checkpoint": {"step": 4, "path": str(tmp_path / "base"), "verified": True}}
    assert RunContext(cfg.run_dir).lineage_lines(StateJson.from_dict(elsewhere)) == []  # not on the config's run.remote


def test_a_planted_megabyte_lineage_path_is_shown_cut_saying_so(tmp_path, corpus):
    """Hostile audit 4 F4(a): the `lineage:` line is read from another run's trainer_state.json (often another
    user's); a 1 MB "init" path there made `minilmd status` print 1 MB. Each path is shown cut, saying how much was
    left out; a real path is shown whole."""
    from minilmd.daemon.views.run_context import RunContext

    planted = "/evil/" + "B" * 1_000_000
    init = {"kind": "checkpoint", "path": planted, "step": "7" * 100_000, "manifest_sha256": "ab" * 32}
    config, cfg = run_whose_step_1_records(tmp_path, corpus, init, name="sft")
    [line] = RunContext(cfg.run_dir).lineage_lines()
    assert len(line) < 1024 + 200, len(line)
    assert line.startswith("  lineage: /evil/BBBB"), line[:80]
    assert f"[... {1_000_006 - 1024:,} more characters left out] (step 7777" in line, line
    assert "[... 99,976 more characters left out], manifest sha256 abababababab)" in line, line
    from minilmd.daemon.base.runstate import new_state

    (cfg.run_dir / names.STATE).write_text(json.dumps(new_state("sft", cfg.run_dir, str(config))))
    shown = cli("status", str(cfg.run_dir)).stdout
    assert "more characters left out" in shown and len(shown) < 20_000, len(shown)


def test_a_lineage_path_that_is_not_a_string_ends_the_chain_without_a_traceback(tmp_path, corpus):
    """Review: a checkpoint's trainer_state.json whose "init" path is a number (another user's word) raised
    TypeError in Path() while the line was built: `status` showed a traceback."""
    from minilmd.daemon.views.run_context import RunContext

    init = {"kind": "checkpoint", "path": 5, "step": 3, "manifest_sha256": "ab" * 32}
    _, cfg = run_whose_step_1_records(tmp_path, corpus, init, name="sft")
    [line] = RunContext(cfg.run_dir).lineage_lines()
    assert line.startswith("  lineage: 5 (step 3"), line

