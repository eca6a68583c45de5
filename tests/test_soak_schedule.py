"""The pipeline soak's fault scheduler (tests/soak/schedule.py): a fault is picked only where it can happen."""
from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest


def _load_schedule():
    """tests/soak/schedule.py by its path: `soak` may already name tests/soak/soak.py in this process."""
    spec = importlib.util.spec_from_file_location("soak_schedule", Path(__file__).parent / "soak" / "schedule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


_schedule = _load_schedule()
INJECTED, StageView, eligible, pick = _schedule.INJECTED, _schedule.StageView, _schedule.eligible, _schedule.pick


def view(name: str, phase: str = "training", **kw) -> StageView:
    base = {"trainer_alive": True, "supervisor_alive": True, "has_init": False, "has_probe": False,
            "successor_waiting": False, "settled": True}
    return StageView(name, phase, **{**base, **kw})


def test_trainer_faults_need_a_running_trainer():
    assert eligible("trainer_sigkill", view("pretrain"))
    assert not eligible("trainer_sigkill", view("pretrain", trainer_alive=False))
    assert not eligible("trainer_hang", view("sft", "waiting_init", trainer_alive=False))
    assert not eligible("trainer_sigbus", view("pretrain", settled=False))  # its last fault has not recovered
    assert not eligible("trainer_oom_kill", view("pretrain", "done"))


def test_outages_and_predecessor_kills_need_what_they_break():
    assert not eligible("init_source_unreachable", view("pretrain"))
    assert eligible("init_source_unreachable", view("sft", has_init=True))
    assert not eligible("probe_unreachable", view("pretrain"))
    assert eligible("probe_unreachable", view("lora", has_probe=True))
    assert not eligible("predecessor_sigkill", view("pretrain"))
    assert eligible("predecessor_sigkill", view("pretrain", successor_waiting=True))
    waiting = view("sft", "waiting_init", trainer_alive=False)
    assert eligible("supervisor_sigkill", waiting) and not eligible("supervisor_sigkill", view("sft", "done"))
    with pytest.raises(ValueError):
        eligible("cosmic_ray", waiting)


def test_pick_chooses_only_eligible_pairs_and_every_kind_comes_up():
    stages = [view("pretrain", successor_waiting=True), view("sft", "waiting_init", trainer_alive=False),
              view("lora", "waiting_init", trainer_alive=False)]
    rng = random.Random(0)
    picked = [pick(list(INJECTED), stages, rng) for _ in range(500)]
    assert all(p is not None and eligible(p[0], next(s for s in stages if s.name == p[1])) for p in picked)
    kinds = {p[0] for p in picked if p}
    assert kinds == set(INJECTED) - {"init_source_unreachable", "probe_unreachable"}
    assert {p[1] for p in picked if p and p[0] == "supervisor_sigkill"} == {"pretrain", "sft", "lora"}
    assert pick(["trainer_sigkill"], stages[1:], rng) is None


def test_a_kind_not_injected_yet_comes_first():
    stages = [view("pretrain", "done", trainer_alive=False), view("sft", has_init=True, has_probe=True)]
    rng = random.Random(1)
    seen = {kind: 1 for kind in INJECTED if kind != "probe_unreachable"}
    assert all(pick(list(INJECTED), stages, rng, seen) == ("probe_unreachable", "sft") for _ in range(20))
    seen["probe_unreachable"] = 1
    assert len({pick(list(INJECTED), stages, rng, seen)[0] for _ in range(300)}) > 5  # then all at random again
