"""scripts/gpu_check_plan.py, the device check's time plan: `scripts/gpu-check-device run` holds issue 41's figures
(both shapes' MFU first), its --budget fits the 600 s command and its parts' estimates fit that budget 1.15x; the
parts 41 does not ask for are in `run second`, with the DPO part's ~100 s; each part's timeout under the budget is its
share, so one part overrunning is cut there and the parts after it keep theirs; a part whose seconds
(MINILMD_GPU_CHECK_PART_S) cannot hold a planned extra leaves it out and says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_check_scripts import load_scripts

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def device_order(variable: str = "order") -> list[str]:
    """A part list of scripts/gpu-check-device: `order` (its `run`) or `second` (its `run second`)."""
    text = (SCRIPTS / "gpu-check-device").read_text(encoding="utf-8")
    return text.split(f'\n{variable}="', 1)[1].split('"', 1)[0].split(",")


def device_value(variable: str) -> int:
    text = (SCRIPTS / "gpu-check-device").read_text(encoding="utf-8")
    return int(text.split(f"\n{variable}=", 1)[1].split("\n", 1)[0])


def test_the_first_call_holds_issue_41s_figures_in_a_budget_that_fits_its_command():
    check, plan = load_scripts()
    order, second = device_order(), device_order("second")
    # every part in one of the two calls; the second's own corpus first (a new working directory)
    assert sorted(set(order) | set(second)) == sorted(check.PARTS) and len(order) == len(set(order))
    assert second[0] == "0 corpus" and not set(second[1:]) & set(order)
    # the second shape's MFU (a must-show of 41) right after part 4 compiled, in the first call; what 41 does not ask
    # for (the attention backends forced one by one: part 4 shows the one chosen by measurement) in the second
    assert order[order.index("4 compiled") + 1] == "4 second shape"
    assert {"2 admission", "3 attention", "7 oom", "9 dpo"} <= set(second)
    # 5 run carries part 4 compiled's run on, 5 determinism compares it and part 4 eager's, bench step part 4's loop
    for before, after in (("4 eager", "5 determinism"), ("4 compiled", "5 run"), ("5 run", "5 determinism"),
                          ("4 eager", "4 bench step"), ("4 compiled", "4 bench step"), ("4 compiled", "6 minimind")):
        assert order.index(before) < order.index(after), (before, after)
    assert plan.ESTIMATE_S.keys() == check.PARTS.keys() == plan.TIMEOUTS.keys()
    # the budgets: each call's seconds less the setup and the reserve, as the device script computes them
    assert (device_value("command_s"), device_value("second_command_s"), device_value("reserve_s")) == \
        (plan.COMMAND_S["order"], plan.COMMAND_S["second"], plan.RESERVE_S)
    assert plan.BUDGET_S == {"order": 540, "second": 240}
    total = sum(plan.ESTIMATE_S[n] for n in order)
    assert total * 1.15 <= plan.BUDGET_S["order"], plan.table(order, plan.BUDGET_S["order"])
    assert sum(plan.ESTIMATE_S[n] for n in second) * 1.5 <= plan.BUDGET_S["second"]
    # the DPO part's share in the second call: room for MiniMind's train_dpo.py (it needs 40 s of the part's left)
    assert check.part_timeout("9 dpo", plan.BUDGET_S["second"] - plan.ESTIMATE_S["0 corpus"], second[1:]) >= 100
    # the model's calibration: the parts 0-7 as they ran on issue 41's lease took 389 s together
    assert abs(plan.estimate_old() - 389) <= 0.15 * 389
    # what the parts run is what the plan counts: the GPU's step counts are the plan's
    assert {k: check.GPU[k] for k in plan.SHAPE} == plan.SHAPE


def test_the_plan_counts_what_the_parts_compile_and_start():
    _, plan = load_scripts()
    items = plan.estimate()
    # 5 run: the fault fires after attempt 1's first resumed step, which compiles (its graph cached)
    assert dict(items["5 run"])["attempt 1: start, warm compile, killed after its first step"] == \
        plan.START_S + plan.WARM_COMPILE_S
    # the default kernels' compiled run: another inductor cache key (are_deterministic_algorithms_enabled), cold
    cost = [s for what, s in items["5 determinism"] if what.startswith("compiled, default kernels")]
    assert cost and cost[0] >= plan.START_S + plan.COLD_COMPILE_S
    # bench sft: four Trainers, each timing the attention backends on CUDA
    sft = [s for what, s in items["8 sft"] if what.startswith("bench sft")]
    assert sft and sft[0] >= plan.START_S + 3 * plan.TRAINER_S


def test_under_the_budget_each_part_gets_at_least_its_estimate_and_an_overrun_is_cut_at_its_share():
    check, plan = load_scripts()
    order = device_order()
    for overrun in [None, *order]:  # every part on its estimate; then each one in turn using its whole timeout
        left = plan.BUDGET_S["order"]
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
    clock = plan.PartClock(started=time.monotonic())
    assert clock.fits("a 20 s thing", 20.0) and clock.note() == ""
    assert not clock.fits("MiniMind eager", plan.OPTIONAL_S["minimind eager"] + 40)
    assert clock.note().startswith("; left out: MiniMind eager (planned ") and "s of the part's left)" in clock.note()


PLANNED_AS = """import runpy, sys
sys.path.insert(0, sys.argv[1])
import gpu_check_plan
gpu_check_plan.OPTIONAL_S["bench step's other modes"] = float(sys.argv[2])
sys.argv = sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""scripts/gpu-check run with the other modes of bench step planned at argv[2] seconds (then its own arguments)."""


@pytest.mark.slow
def test_bench_step_whose_seconds_cannot_hold_its_other_modes_runs_the_trainers_two_and_says_what_it_left_out(
        tmp_path):
    # The part's seconds are 600 both times (its commands are cut there): what differs is the other modes' plan.
    # A plan they cannot hold (its + 30 s over the part's 600) leaves them out whatever the machine's speed, and
    # the trainer's two modes keep all the part's time. (A share just under the real plan + 35 s, as before, left
    # the two modes what the part's start-up had not taken: under load that race could cut them, exit 124.)
    def part(name: str, other_modes_planned_s: float | None = None) -> dict:
        script = [str(SCRIPTS / "gpu-check"), "--dry-run", "--work", str(tmp_path), "--part", name]
        planned = [] if other_modes_planned_s is None else \
            ["-c", PLANNED_AS, str(SCRIPTS), str(other_modes_planned_s)]
        done = subprocess.run([sys.executable, *planned, *script], capture_output=True, text=True, timeout=900,
                              env={**os.environ, "MINILMD_GPU_CHECK_PART_S": "600", "OMP_NUM_THREADS": "1"})
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("GPU-CHECK-RESULT ")), None)
        assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(line[len("GPU-CHECK-RESULT "):])

    assert part("0 corpus")["status"] == "ok"
    short = part("4 bench step", other_modes_planned_s=600)
    assert short["status"] == "ok", short
    assert short["figures"].startswith("3 timed steps a mode: loop / bench step tok/s ")  # the planned steps
    assert " | eager in model " in short["figures"]
    assert "compiled/eager tok/s: " in short["figures"] and "masked/unmasked" not in short["figures"]
    assert "; left out: the loss-outside and doc-mask modes (planned 630s, " in short["figures"], short
    full = part("4 bench step")  # the real plan: 600 s hold it
    assert "masked/unmasked" in full["figures"] and "left out" not in full["figures"], full
