"""scripts/gpu_check_plan.py, the device check's time plan: the parts of `scripts/gpu-check-device run`'s order fit
its --budget of 480 s on an H200 by their estimates, with room to spare; each part's timeout under the budget is its
share, so one part overrunning is cut there and the parts after it keep theirs; a part told few seconds
(MINILMD_GPU_CHECK_PART_S) leaves work out and says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_check_scripts import load_scripts

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BUDGET = 480.0


def device_order(variable: str = "order") -> list[str]:
    """A part list of scripts/gpu-check-device: `order` (its `run`) or `second` (its `run second`)."""
    text = (SCRIPTS / "gpu-check-device").read_text(encoding="utf-8")
    return text.split(f'\n{variable}="', 1)[1].split('"', 1)[0].split(",")


def test_every_part_is_in_the_device_order_and_their_estimates_fit_the_budget_with_margin():
    check, plan = load_scripts()
    order, second = device_order(), device_order("second")
    # every part in one of the two calls; the second's own corpus first (a new working directory)
    assert sorted(set(order) | set(second)) == sorted(check.PARTS) and len(order) == len(set(order))
    assert second[0] == "0 corpus" and not set(second[1:]) & set(order)
    assert sum(plan.ESTIMATE_S[n] for n in second) <= 0.95 * BUDGET, plan.table(second)
    # 5 run carries part 4 compiled's run on, 5 determinism compares it, bench step finds its compiled graph cached
    for before, after in (("4 eager", "5 determinism"), ("4 compiled", "5 run"), ("5 run", "5 determinism"),
                          ("5 determinism", "4 bench step")):
        assert order.index(before) < order.index(after), (before, after)
    assert plan.ESTIMATE_S.keys() == check.PARTS.keys() == check.TIMEOUTS.keys()
    total = sum(plan.ESTIMATE_S[n] for n in order)
    assert total <= 0.95 * BUDGET, plan.table(order)  # 24 s or more of the 480 spare
    # the model's calibration: the parts 0-7 as they ran on issue 41's lease took 389 s together
    assert abs(plan.estimate_old() - 389) <= 0.15 * 389
    # what the parts run is what the plan counts: the GPU's step counts are the plan's
    assert {k: check.GPU[k] for k in plan.SHAPE} == plan.SHAPE


def test_under_the_budget_each_part_gets_at_least_its_estimate_and_an_overrun_is_cut_at_its_share():
    check, plan = load_scripts()
    order = device_order()
    for overrun in [None, *order]:  # every part on its estimate; then each one in turn using its whole timeout
        left = BUDGET
        for i, name in enumerate(order):
            timeout = check.part_timeout(name, left, order[i:])
            assert timeout is not None and timeout >= plan.ESTIMATE_S[name], (overrun, name, timeout)
            left -= timeout if name == overrun else plan.ESTIMATE_S[name]
        assert left >= 0
    # a part alone gets all that is left (up to its own timeout), as before the plan
    assert check.part_timeout("4 compiled", 75.5) == 75.5 and check.part_timeout("4 compiled", None) == 300


def test_a_parts_clock_leaves_out_what_its_seconds_do_not_hold(monkeypatch):
    _, plan = load_scripts()
    monkeypatch.setenv(plan.PART_S_ENV, "40")
    clock = plan.PartClock()
    assert clock.fits("a 20 s thing", 20.0) and clock.note() == ""
    assert not clock.fits("MiniMind eager", plan.OPTIONAL_S["minimind eager"] + 40)
    assert clock.note().startswith("; left out: MiniMind eager (planned ") and "s of the part's left)" in clock.note()


@pytest.mark.slow
def test_bench_step_given_few_seconds_runs_the_trainers_two_modes_and_says_what_it_left_out(tmp_path):
    def part(name: str, seconds: str) -> dict:
        done = subprocess.run([sys.executable, str(SCRIPTS / "gpu-check"), "--dry-run", "--work", str(tmp_path),
                               "--part", name], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "MINILMD_GPU_CHECK_PART_S": seconds, "OMP_NUM_THREADS": "1"})
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("GPU-CHECK-RESULT "))
        return json.loads(line[len("GPU-CHECK-RESULT "):])

    assert part("0 corpus", "600")["status"] == "ok"
    short = part("4 bench step", "40")
    assert short["status"] == "ok", short
    assert short["figures"].startswith("3 timed steps a mode: eager in model ")  # the dry run's planned steps
    assert "compiled/eager tok/s: " in short["figures"] and "masked/unmasked" not in short["figures"]
    assert "; left out: the loss-outside and doc-mask modes (planned " in short["figures"], short
    full = part("4 bench step", "600")
    assert "masked/unmasked" in full["figures"] and "left out" not in full["figures"], full
