"""The curves of a run (daemon/views/curves.py) and their picture (daemon/views/plot.py), from metrics.jsonl and
events.jsonl
written as the trainer and the supervisor write them: a run resumed twice, a supervisor killed, a sync failing for a
while, an epoch boundary; two runs overlaid. The real run with a SIGBUS is tests/test_watch_real.py."""
from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.views import curves
from minilmd.metrics import MetricsLog


def write_lines(path: Path, records: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")


def train(step: int, attempt: int, t0: float = 1000.0, per_epoch: int = 25) -> dict:
    return {"kind": "train", "step": step, "tokens_seen": step * 128, "loss": 5.0 - step / 20 + attempt / 1000,
            "lr": 1e-3, "grad_norm": 1.0, "tok_s": 500.0 + attempt, "step_time": 0.5, "total_steps": 60,
            "epoch": step // per_epoch, "time": t0 + step}


def resumed_run(root: Path, name: str = "r") -> Path:
    """Attempt 1 logs 1-30 and dies of sigbus at 30; attempt 2 resumes from 20, logs 21-45, is killed with its
    supervisor (no child_exit); attempt 3 resumes from 40 and finishes at 60. The sync fails from step 10 to 15."""
    run_dir = root / name
    run_dir.mkdir()
    (run_dir / names.STATE).write_text(json.dumps({"run": name}))
    write_lines(run_dir / names.METRICS, [train(s, 1) for s in range(1, 31)] + [
        {"kind": "eval", "step": 20, "val_loss": 4.2, "time": 1020.0}, {"kind": "train", "step": 31}])
    with open(run_dir / names.METRICS, "a") as f:
        f.write('{"kind": "train", "step": 3')  # torn by the SIGBUS
    MetricsLog(run_dir)  # what the trainer's next attempt does first: ends the torn line
    write_lines(run_dir / names.METRICS, [train(s, 2) for s in range(21, 46)] + [train(s, 3) for s in range(41, 61)])
    write_lines(run_dir / names.EVENTS, [
        {"time": 999.0, "event": "start", "message": "supervisor pid 1 owns ..."},
        {"time": 1010.0, "event": "sync", "message": "sync failed (EIO); retry in 5s"},
        {"time": 1012.0, "event": "sync", "message": "the sync looks stalled (no progress); training goes on"},
        {"time": 1015.0, "event": "sync", "message": "synced step 15 to /remote (verified: True) in 0.1s"},
        {"time": 1030.5, "event": "child_exit", "message": "...", "cause": "sigbus", "exit": -7, "step": 30},
        {"time": 1041.0, "event": "start", "message": "supervisor pid 2 owns ..."},
        {"time": 1060.0, "event": "child_exit", "message": "...", "cause": "done", "exit": 0, "step": 60},
    ])
    return run_dir


def test_every_step_once_the_last_attempt_wins_restarts_sync_failures_and_epochs(tmp_path):
    run = curves.load(resumed_run(tmp_path))
    assert [r["step"] for r in run.train] == list(range(1, 61))
    assert [r["tok_s"] for r in run.train if r["step"] in (25, 42)] == [502.0, 503.0]  # attempt 2's, attempt 3's
    assert run.repeated_steps == 11 + 5  # 21-31 (31: a line without a loss), 41-45
    assert run.train[20]["tok_s"] == 502.0  # attempt 2's first line survived attempt 1's torn last one
    assert [(m.cause, m.step) for m in run.restarts] == [("sigbus", 30.0), ("supervisor", 41.0)]
    assert run.sync_failures == [(10.0, 15.0)]
    assert run.epochs == [25, 50]
    assert run.tokens_at(30) == 30 * 128 and run.tokens_at(30.5) == 30.5 * 128
    assert [r["val_loss"] for r in run.evals] == [4.2]


@pytest.mark.slow
def test_the_plot_draws_what_the_curves_hold_for_two_runs_against_tokens(tmp_path):
    pytest.importorskip("matplotlib")
    from minilmd.daemon.views.plot import plot

    a, b = resumed_run(tmp_path, "a"), resumed_run(tmp_path, "b")
    summary = plot([a, b], tmp_path / "ab.png", x="tokens")
    assert (tmp_path / "ab.png").read_bytes()[:4] == b"\x89PNG"
    assert summary.runs == ["a", "b"] and summary.points == {"a": 60, "b": 60}
    assert summary.restart_marks == [("a", 30 * 128.0, "sigbus"), ("a", 41 * 128.0, "supervisor"),
                                     ("b", 30 * 128.0, "sigbus"), ("b", 41 * 128.0, "supervisor")]
    assert summary.sync_spans == [("a", 10.0, 15.0), ("b", 10.0, 15.0)]  # in steps, as curves.py gave them
    assert summary.epoch_marks == [("a", 25 * 128.0), ("a", 50 * 128.0), ("b", 25 * 128.0), ("b", 50 * 128.0)]
    # issue 24: whose each restart is, one label where they coincide, and a legend over no panel
    assert summary.restart_labels == [(30 * 128.0, "a: sigbus, b: sigbus"),
                                      (41 * 128.0, "a: supervisor, b: supervisor")]
    assert summary.legend_overlaps == []
    with pytest.raises(ValueError, match="png or .svg"):
        plot([a], tmp_path / "ab.jpg")


def test_supervisor_restarts_sit_at_the_step_the_run_had_reached_when_a_resume_went_back(tmp_path):
    """Issue 39: killed with its supervisor after logging steps 100 and 250, each relaunch resumed from an earlier
    step (10, then 0) and logged those steps again; both restarts were drawn at step 10, the first step the last
    attempt logged, not where the run was when its supervisor started again."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    clock = iter(range(2000, 10_000, 2))
    lines = [dict(train(s, a), time=float(next(clock)))
             for a, steps in ((1, range(10, 101, 10)), (2, range(20, 253, 10)), (3, range(10, 456, 10)))
             for s in steps]
    write_lines(run_dir / names.METRICS, lines)
    first_of = {a: next(r["time"] for r in lines if r["tok_s"] == 500.0 + a) for a in (2, 3)}
    write_lines(run_dir / names.EVENTS, [{"time": t - 1, "event": "start", "message": "supervisor pid 1 owns ..."}
                                         for t in (1999.0, first_of[2], first_of[3])])
    run = curves.load(run_dir)
    assert [(m.cause, m.step) for m in run.restarts] == [("supervisor", 100.0), ("supervisor", 250.0)]
    assert run.step_at(1000.0) == 0.0 and run.step_at(first_of[2] + 1) == 25.0  # halfway from 20 to 30


def test_a_stopped_and_relaunched_run_is_marked_stop_and_a_killed_supervisor_supervisor(tmp_path):
    run_dir = resumed_run(tmp_path)
    write_lines(run_dir / names.EVENTS, [  # after the finish at 60: stopped at 70, then launched again
        {"time": 1061.0, "event": "exit", "message": "supervisor exits with status 0 (done)", "exit": 0},
        {"time": 1062.0, "event": "start", "message": "supervisor pid 3 owns ..."},
        {"time": 1070.0, "event": "child_exit", "message": "...", "cause": "stopped", "exit": 75, "step": 70},
        {"time": 1071.0, "event": "exit", "message": "supervisor exits with status 0 (done)", "exit": 0},
        {"time": 1072.0, "event": "start", "message": "supervisor pid 4 owns ..."},
        {"time": 1073.0, "event": "start", "message": "supervisor pid 5 owns ..."},  # pid 4 killed: no exit
    ])
    causes = [m.cause for m in curves.load(run_dir).restarts]
    assert causes == ["sigbus", "supervisor", "exit 0", "stop", "supervisor"]  # issue 24: a stop read "supervisor"


@pytest.mark.slow
def test_restarts_at_one_step_share_one_label_and_the_legend_covers_no_panel(tmp_path):
    pytest.importorskip("matplotlib")
    from minilmd.daemon.views.plot import plot

    run_dir = resumed_run(tmp_path)
    write_lines(run_dir / names.EVENTS, [
        {"time": 1050.0, "event": "child_exit", "message": "...", "cause": cause, "exit": -9, "step": 50}
        for cause in ("sigkill", "hang", "sigkill")] + [
        {"time": 1050.5, "event": "child_exit", "message": "...", "cause": "oom", "exit": 76, "step": 50.5}])
    summary = plot([run_dir], tmp_path / "r.svg")
    assert summary.restart_labels == [(30.0, "sigbus"), (41.0, "supervisor"), (50.0, "sigkill x2, hang, oom")]
    assert summary.legend_overlaps == []


def test_without_matplotlib_plot_says_how_to_install_it(tmp_path, monkeypatch):
    from minilmd.daemon.views import plot as plot_mod

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(plot_mod.PlotUnavailable, match=r"pip install 'minilmd\[plot\]'"):
        plot_mod.plot([resumed_run(tmp_path)], tmp_path / "x.png")


def test_the_status_sparkline_reads_the_end_of_metrics_and_gives_no_second_eta(tmp_path):
    run_dir = resumed_run(tmp_path)
    line = curves.sparkline_line(run_dir)
    assert line is not None and line.startswith("  loss ") and "steps " in line
    spark = line.split()[1]
    assert set(spark) <= set(curves.SPARKS) and spark[0] == curves.SPARKS[-1] and spark[-1] == curves.SPARKS[0]
    assert "ETA" not in line  # the step line above it has the run's one ETA (issue 24: two differed)
    assert curves.sparkline([1.0, 1.0]) == curves.SPARKS[0] * 2 and curves.sparkline([]) == ""
    assert curves.sparkline_line(tmp_path) is None  # nothing logged


def test_plot_help_shows_the_extra_to_install(monkeypatch):
    from typer.testing import CliRunner

    from minilmd.cli import app

    monkeypatch.setenv("COLUMNS", "200")  # one line, so the words are not wrapped apart
    result = CliRunner().invoke(app, ["plot", "--help"])
    assert result.exit_code == 0
    assert "pip install 'minilmd[plot]'" in result.output  # rich markup once ate "[plot]" (issue 24)


@pytest.mark.slow
def test_a_dpo_run_adds_its_rewards_under_trls_names_beside_a_run_without(tmp_path):
    """Two more panels once a run's lines carry rewards: rewards/accuracies, and rewards/margins, chosen and
    rejected; every train line a point of the train curve, every validation one of the val points; a run without
    rewards (the text run overlaid) draws none."""
    pytest.importorskip("matplotlib")
    from minilmd.daemon.views.plot import plot

    text = resumed_run(tmp_path, "text")
    dpo = tmp_path / "dpo"
    dpo.mkdir()
    rewards = lambda step, prefix="": {f"{prefix}reward_accuracy": min(1.0, 0.5 + step / 40),
                                       f"{prefix}reward_margin": step / 100, f"{prefix}reward_chosen": step / 200,
                                       f"{prefix}reward_rejected": -step / 200}
    write_lines(dpo / names.METRICS, [{**train(s, 1), "loss": 0.69 - s / 100, **rewards(s)} for s in range(1, 31)]
                + [{"kind": "eval", "step": s, "val_loss": 0.7 - s / 100, **rewards(s, "val_"), "time": 1000.0 + s}
                   for s in (10, 20, 30)])
    summary = plot([text, dpo], tmp_path / "dpo.png")
    assert (tmp_path / "dpo.png").read_bytes()[:4] == b"\x89PNG"
    names_drawn = ("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected")
    assert summary.rewards == {**{f"dpo:{n}:train": 30 for n in names_drawn},
                               **{f"dpo:{n}:val": 3 for n in names_drawn}}
    assert summary.points == {"text": 60, "dpo": 30} and summary.legend_overlaps == []
    without = plot([text], tmp_path / "text.png")
    assert without.rewards == {} and without.size_px == (1100, 700)  # the four panels as before
    assert summary.size_px == (1100, 1000)


def test_a_stop_is_marked_at_the_step_its_save_wrote_not_the_last_train_line_before_it(tmp_path):
    """The walk: `minilmd stop` reported "local checkpoint step 684", the plot put the stop at 682, the last train
    line logged (every 2 steps) before the trainer saved at 684 on SIGTERM. The stop sits at the checkpoint line the
    stop wrote (metrics.jsonl's, where status's local checkpoint comes from), where the next attempt resumed."""
    run_dir = tmp_path / "long"
    run_dir.mkdir()
    first = [dict(train(s, 1), time=1000.0 + s) for s in range(2, 683, 2)]
    saved = [{"kind": "checkpoint", "step": step, "blocking_s": 0.0, "path": f"/s/step_{step}", "time": 1000.0 + step}
             for step in (600, 684)]  # 684: the stop's save, after the train line of 682
    resumed = [dict(train(s, 2), time=2000.0 + s) for s in range(686, 701, 2)]
    write_lines(run_dir / names.METRICS, first + saved[:1] + saved[1:] + resumed)
    write_lines(run_dir / names.EVENTS, [
        {"time": 999.0, "event": "start", "message": "supervisor pid 1 owns ..."},
        {"time": 1684.5, "event": "child_exit", "message": "...", "cause": "stopped", "exit": 0, "step": 682},
        {"time": 1685.0, "event": "exit", "message": "supervisor exits with status 0 (done)", "exit": 0},
        {"time": 2000.0, "event": "start", "message": "supervisor pid 2 owns ..."},
        {"time": 2701.0, "event": "start", "message": "supervisor pid 3 owns ..."},  # pid 2 killed: no exit
    ])
    marks = [(m.cause, m.step) for m in curves.load(run_dir).restarts]
    assert marks == [("stop", 684.0), ("supervisor", 700.0)], marks


def test_a_runs_name_and_restart_causes_reach_the_terminal_escaped(tmp_path):
    """Another user's run directory holds what its owner wrote: the run's name (state.json) and its restarts'
    causes (events.jsonl) are printed in plot's last line, escaped (an OSC title, a screen clear, a fake red line
    reached the terminal raw)."""
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from minilmd.cli import app

    evil = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mFAKE\x1b[0m"
    run_dir = resumed_run(tmp_path, "bob")
    (run_dir / names.STATE).write_text(json.dumps({"run": "bob" + evil}))
    write_lines(run_dir / names.EVENTS, [{"time": 1061.0, "event": "child_exit", "message": "...", "cause": evil,
                                          "exit": evil, "step": 60}])
    result = CliRunner().invoke(app, ["plot", str(run_dir), "--out", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert "wrote " in result.output and "\x1b" not in result.output and "\x07" not in result.output
    assert "\\x1b]0;PWNED" in result.output  # said, escaped


def test_plot_takes_a_config_naming_its_run_as_status_does(tmp_path):
    """One resolver (daemon/views/runarg.py) for status, logs, stop and plot: a config file names its run.dir.
    Before, `plot CONFIG` was refused ("not a directory") where status took it."""
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from minilmd.cli import app

    run_dir = resumed_run(tmp_path, "r")
    config = tmp_path / "r.toml"
    config.write_text('[run]\nname = "r"\ndir = "r"\n')
    result = CliRunner().invoke(app, ["plot", str(config), "--out", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG") and f"{run_dir}:" not in result.output
    missing = CliRunner().invoke(app, ["plot", str(tmp_path / "none.toml"), "--out", str(tmp_path / "d.png")])
    assert missing.exit_code == 2 and "no such file or directory" in missing.output, missing.output
    assert not (tmp_path / "d.png").exists()
