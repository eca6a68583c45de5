"""The rate and ETA of a DPO run's reference pass, in `minilmd status` and the overview (found by a new user: during
the pass status said "step 0  DPO reference pass 488/2,431 pairs", no rate nor ETA, and the overview's ETA column was
"-": no step had been logged, so there was no steps' ETA). The trainer's heartbeat says the pairs done of all, those
done when this attempt's pass began and its seconds since ("1200/2446/200/40"); status and the overview give the
pass's rate and time left from them."""
from __future__ import annotations

import io

from minilmd import names
from minilmd.daemon.base.runstate import Heartbeat, RunState, new_state, reference_pass_rate
from minilmd.daemon.base.statesections import ChildInfo, StateJson
from minilmd.daemon.host import registry
from minilmd.daemon.views import overview
from minilmd.daemon.views.status import summary_lines
from minilmd.fsio import atomic_write_json
from minilmd.trainer.loop.dpo_reference import PassProgress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_trainers_heartbeat_gives_the_pass_its_rate_and_eta_in_status(tmp_path):
    clock = Clock()
    progress = PassProgress(2446, printing=False, clock=clock, done=200)  # a pass going on from 200 kept pairs
    clock.now += 40.0
    progress.advance(1000)
    beat = Heartbeat(clock.now, 0, names.HEARTBEAT_REFERENCE, progress.note())
    assert beat.reference_pass() == [1200, 2446, 200, 40]
    rate, left = reference_pass_rate(beat.reference_pass())
    assert rate == 25.0 and left == (2446 - 1200) / 25.0  # this attempt's 1,000 pairs in 40 s, 1,246 to go
    running = StateJson(child=ChildInfo(pid=4242, attempt=1, started=1.0)).to_dict()  # its trainer runs
    held = RunState(tmp_path / names.STATE, running)  # the supervisor's fold of the heartbeat
    held.apply_progress([], beat)
    shown = "\n".join(summary_lines(StateJson.from_dict(held.to_dict()), alive=True))
    assert "  step 0  DPO reference pass 1,200/2,446 pairs, 25.0 pairs/s, ETA 50s" in shown, shown
    # an older trainer's two numbers, or a pass in its first second: the pairs alone, as before
    assert Heartbeat(1.0, 0, names.HEARTBEAT_REFERENCE, "488/2431").reference_pass() == [488, 2431]
    assert reference_pass_rate([488, 2431]) is None and reference_pass_rate([488, 2431, 0, 0]) is None


def test_the_overview_shows_the_passs_eta_where_no_step_gives_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "no-system-registry"))
    run_dir = tmp_path / "dpo"  # its state.json as its supervisor (this process, alive) writes it during the pass
    run_dir.mkdir()
    state = new_state("dpo", run_dir, str(run_dir) + ".toml")
    state.update(phase="training", devices=[0],
                 progress={"step": 0, "total_steps": 60, "reference_pass": [1200, 2446, 200, 40]})
    atomic_write_json(run_dir / names.STATE, state)
    registry.register("dpo", run_dir, str(run_dir) + ".toml")
    out = io.StringIO()
    overview.status_all(out=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith("dpo "))
    assert " pass 50s " in line, out.getvalue()
    out = io.StringIO()
    overview.status_all(as_json=True, out=out)
    assert '"reference_pass_eta_s": 49.84' in out.getvalue(), out.getvalue()
