"""The restart streak (`restarts: N (...; K in a row without progress)`) and the last error through restarts of the
trainer and of the supervisor. Real supervisors with the fake trainer (tests/fake_trainer.py): FAKE_REFERENCE holds a
trainer in a DPO reference pass at step 0, FAKE_HOLD holds one that is training.

The walk: a DPO stage's trainer SIGKILLed in its reference pass, then its supervisor SIGKILLed, then `minilmd run`
again; at step 250, checkpoints up to 225 saved, status still said `restarts: 1 (last: killed at step 0, ... ;
1 in a row without progress)` and had lost the `last error` line; the orphan the new supervisor SIGTERMed lost its
reference pass without a word.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from minilmd.config import load_config
from minilmd.daemon.base.runstate import Heartbeat
from minilmd.daemon.child.trainerwatch import orphan_loss
from supervisor_helpers import cli, events, start_supervisor, state, wait_for, wait_or_kill, write_config


def status(run_dir: Path) -> str:
    out = cli("status", str(run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def heartbeat(run_dir: Path) -> str:
    try:
        return (run_dir / "heartbeat").read_text()
    except FileNotFoundError:
        return ""


def beat_step(run_dir: Path) -> str:
    """The step of the heartbeat's "STEP/TOTAL[ PHASE]" body (the real and the fake trainer's)."""
    words = heartbeat(run_dir).split(maxsplit=1)  # read once: the trainer replaces it whole between two reads
    return words[0].split("/")[0] if words else ""


def local_step(run_dir: Path) -> int:
    return (state(run_dir).get("local_checkpoint") or {}).get("step") or 0


def in_reference_pass(run_dir: Path, attempt: int) -> bool:
    """Attempt `attempt` runs and beats in its reference pass."""
    child = state(run_dir).get("child") or {}
    return child.get("attempt") == attempt and " reference " in heartbeat(run_dir) and \
        os.stat(run_dir / "heartbeat").st_mtime > child.get("started", float("inf"))


@pytest.mark.slow  # a real supervisor through a restart
def test_a_restart_that_trains_on_shows_no_streak_once_it_saves(tmp_path, corpus):
    """No supervisor restart: the trainer killed at step 3 before any checkpoint (1 in a row), the next one saves
    steps 5 and 10 and trains on: 0 in a row while it trains, not only once it ends."""
    config = write_config(tmp_path, corpus, train={"max_steps": 400, "checkpoint_every": 5, "log_every": 1})
    cfg = load_config(config)
    release = tmp_path / "release"
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.02", MINILMD_FAULT="sigkill@3",
                           FAKE_HOLD=f"12:{release}")
    try:
        wait_for(lambda: len(state(cfg.run_dir).get("restarts") or []) == 1 or sup.poll() is not None, 120,
                 "the restart after the kill")
        assert state(cfg.run_dir)["no_progress_streak"] == 1  # attempt 1 saved nothing
        wait_for(lambda: local_step(cfg.run_dir) >= 10 and (state(cfg.run_dir).get("child") or {}).get("attempt") == 2
                 or sup.poll() is not None, 120, "attempt 2's save of step 10")
        assert sup.poll() is None, (tmp_path / "sup.out").read_text()[-3000:]
        wait_for(lambda: state(cfg.run_dir)["no_progress_streak"] == 0, 30, "the streak reset in state.json")
        said = status(cfg.run_dir)
        assert "restarts: 1 (last: killed at step " in said and "; 0 in a row without progress)" in said, said
        assert "last error (" in said and "training went on to step" in said, said
        release.touch()
        sup.send_signal(signal.SIGTERM)
        assert wait_or_kill(sup, 60) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


@pytest.mark.slow  # two real supervisors
def test_after_a_supervisor_restart_the_streak_resets_the_last_error_stays_and_the_lost_pass_is_said(tmp_path,
                                                                                                    corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 400, "checkpoint_every": 5, "log_every": 1})
    cfg = load_config(config)
    never = tmp_path / "never"  # the reference pass is never released: only a new supervisor's trainer skips it
    first = start_supervisor(config, tmp_path / "first.out", FAKE_STEP_S="0.02", FAKE_REFERENCE=str(never))
    try:
        wait_for(lambda: in_reference_pass(cfg.run_dir, 1) or first.poll() is not None, 120,
                 "attempt 1 in its reference pass")
        os.killpg(state(cfg.run_dir)["child"]["pid"], signal.SIGKILL)  # the trainer killed in the pass
        wait_for(lambda: in_reference_pass(cfg.run_dir, 2) or first.poll() is not None, 120,
                 "attempt 2 in its reference pass")
        assert first.poll() is None, (tmp_path / "first.out").read_text()[-3000:]
        before = state(cfg.run_dir)
        assert before["no_progress_streak"] == 1 and before["last_error"].startswith("killed"), before
        first.send_signal(signal.SIGKILL)  # then its supervisor: attempt 2 trains on, an orphan
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # FAKE_HOLD_STOPS: the stop at the end ends the hold, as in a live trainer (else the stop waits its 30 s grace)
    sup = start_supervisor(config, tmp_path / "second.out", FAKE_STEP_S="0.02", FAKE_HOLD=f"12:{never}",
                           FAKE_HOLD_STOPS="1")
    try:
        wait_for(lambda: local_step(cfg.run_dir) >= 10 and beat_step(cfg.run_dir) == "12"
                 or sup.poll() is not None, 120, "attempt 3 held at step 12, step 10 saved")
        assert sup.poll() is None, (tmp_path / "second.out").read_text()[-3000:]
        gone = [e for e in events(cfg.run_dir) if e.get("event") == "orphan" and "are gone" in e.get("message", "")]
        assert len(gone) == 1 and gone[0]["lost"].startswith("it had run ") and \
            "s and saved no checkpoint: its DPO reference pass (" in gone[0]["message"] and \
            "/1,000 pairs) is lost, the next attempt computes it again" in gone[0]["message"], gone
        log = (cfg.run_dir / "supervisor.log").read_text()
        assert "its DPO reference pass (" in log, log[-3000:]
        wait_for(lambda: state(cfg.run_dir)["no_progress_streak"] == 0, 30, "the streak reset in state.json")
        said = status(cfg.run_dir)
        assert "restarts: 1 (last: killed at step 0, " in said and "; 0 in a row without progress)" in said, said
        assert "last error (" in said and "at step 0; training went on to step 12): killed" in said, said
        shown = json.loads(cli("status", "--json", str(cfg.run_dir)).stdout)["state"]
        assert shown["last_error"] == before["last_error"] and shown["last_error_at"] == before["last_error_at"]
        sup.send_signal(signal.SIGTERM)
        assert wait_or_kill(sup, 60) == 0, (tmp_path / "second.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_what_an_orphan_stopped_without_a_save_lost_is_read_from_its_own_last_heartbeat():
    launched, stopped = 1000.0, 1041.4
    assert orphan_loss(Heartbeat(1040.0, 0, "reference", "1200/3000"), launched, -1, stopped) == \
        "it had run 41s and saved no checkpoint: its DPO reference pass (1,200/3,000 pairs) is lost, the next " \
        "attempt computes it again"
    assert orphan_loss(Heartbeat(1040.0, 225, "compiling"), launched, 225, stopped) == \
        "it had run 41s and saved no checkpoint: it was compiling its first step (at step 225), the next attempt " \
        "compiles again"
    assert orphan_loss(Heartbeat(1040.0, 240, ""), launched, 225, stopped) == \
        "it had run 41s and saved no checkpoint: its steps after 225 (to step 240) are lost, the next attempt " \
        "trains them again"
    assert orphan_loss(Heartbeat(1040.0, 225, ""), launched, 225, stopped) == ""  # at its checkpoint: nothing lost
    assert orphan_loss(Heartbeat(999.0, 0, "reference", "5/3000"), launched, -1, stopped) == ""  # an earlier one's
    assert orphan_loss(None, launched, -1, stopped) == "" and \
        orphan_loss(Heartbeat(1040.0, 3, ""), None, -1, stopped) == ""


def test_what_an_orphan_in_its_reference_pass_lost_counts_from_the_pass_step_0_holds():
    """The DPO reference pass saves step 0 with the sums so far every train.checkpoint_every: an orphan killed at
    the grace loses the pass since that save (before: the message said all of it was lost, computed again)."""
    launched, stopped = 1000.0, 1041.4
    beat = Heartbeat(1040.0, 0, "reference", "1200/3000")
    assert orphan_loss(beat, launched, 0, stopped, kept=800) == \
        "it had run 41s: its DPO reference pass since the 800 pairs saved at step 0 (to 1,200/3,000) is lost, the " \
        "next attempt goes on from 800"
    assert orphan_loss(beat, launched, 0, stopped, kept=1200) == ""  # saved at its last batch: nothing lost


@pytest.mark.slow  # two real supervisors, a real `minilmd stop` between them
def test_a_clean_stop_starts_a_new_restart_count_and_status_keeps_the_runs(tmp_path, corpus):
    """The trainer killed once (restarts: 1), `minilmd stop`, `minilmd run` again: restart.max_restarts counts this
    start's restarts from 0 (a run that gave up can be started again), and status says which count that is, with
    the run's own beside it. On main status said nothing of the first start's restart after it: the stop had reset
    the count, `restarts:` gone."""
    config = write_config(tmp_path, corpus, train={"max_steps": 400, "checkpoint_every": 5, "log_every": 1})
    cfg = load_config(config)
    never = tmp_path / "never"  # the holds end only with a stop (FAKE_HOLD_STOPS)
    first = start_supervisor(config, tmp_path / "first.out", FAKE_STEP_S="0.02", MINILMD_FAULT="sigkill@3",
                             FAKE_HOLD=f"12:{never}", FAKE_HOLD_STOPS="1")
    try:
        wait_for(lambda: beat_step(cfg.run_dir) == "12" and len(state(cfg.run_dir).get("restarts") or []) == 1
                 or first.poll() is not None, 120, "attempt 2 held at step 12 after the restart")
        assert first.poll() is None, (tmp_path / "first.out").read_text()[-3000:]
        assert "restarts: 1 (last: killed at step " in status(cfg.run_dir)
        stopped = cli("stop", str(cfg.run_dir), timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert wait_or_kill(first, 60) == 0, (tmp_path / "first.out").read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    ended = state(cfg.run_dir)
    assert ended["outcome"]["exit"] == 0 and len(ended["restarts"]) == 1, ended
    second = start_supervisor(config, tmp_path / "second.out", FAKE_STEP_S="0.02")  # on to step 400, done
    try:
        assert wait_or_kill(second, 180) == 0, (tmp_path / "second.out").read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    done = state(cfg.run_dir)
    assert done["restarts"] == [] and done["earlier_restarts"] == 1, done
    assert done["restarts_since"] >= ended["outcome"]["time"], done
    said = status(cfg.run_dir)
    assert "  restarts: 0 since the start at " in said and " (1 since the run began)" in said, said
