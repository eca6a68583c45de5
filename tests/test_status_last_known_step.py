"""`status` during a restart (staging, a fetch, a compile) shows the step and total of the trainer before it as
"last known", not as the run's progress (user9 F11: `step 753/3,000` while staging a run whose config now says 900
and that resumed from the remote's 715); once the restarted trainer beats, its step is shown as before."""
from __future__ import annotations

from minilmd.daemon.base.statesections import Progress
from minilmd.daemon.views.status import _progress_lines


def test_the_step_before_a_restart_is_said_as_last_known_until_the_new_trainer_beats():
    before = Progress(step=753, total_steps=3_000, heartbeat=90.0, rates_awaited_since=100.0)
    [line] = _progress_lines(before, alive=True)
    assert line.startswith("  last known step 753 (of 3,000 then)"), line
    beaten = Progress(step=715, total_steps=3_000, heartbeat=110.0, rates_awaited_since=100.0)  # resumed at 715
    [line] = _progress_lines(beaten, alive=True)
    assert line.startswith("  step 715/3,000 (23.8%)"), line
    logged = Progress(step=720, total_steps=900, heartbeat=90.0)  # a train line: rates no longer awaited
    assert _progress_lines(logged, alive=True)[0].startswith("  step 720/900 (80.0%)")
