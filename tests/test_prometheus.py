"""The Prometheus textfile (daemon/host/prometheus.py) of a run waiting for a GPU with its sync failing, read back with
prometheus_client's own parser; the writer's GPU-wait clock, its atomic rewrite, a directory it cannot write. The
textfile of a real finished run is checked in tests/test_watch_real.py."""
from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host import prometheus

parser = pytest.importorskip("prometheus_client.parser")


def parse(text: str) -> dict:
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        assert family.type == "gauge" and family.documentation
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


class Held:
    def __init__(self, data: dict):
        self.data = data


def waiting_state(t: float) -> dict:
    st = new_state("big-run", Path("/runs/big"), "/runs/big.toml")
    st.update(phase="waiting_gpu", gpu_wait={"since": t - 60, "devices": []},
              progress={**st["progress"], "step": 1200, "total_steps": 5000, "loss": 2.75, "updated": t - 2000},
              sync={"state": "failed", "error": "EIO", "last_ok": t - 4000, "since": t - 100},
              local_checkpoint={"step": 1200, "time": t - 1900}, remote_checkpoint={"step": 1000, "time": t - 4000},
              restarts=[{"cause": "sigbus"}, {"cause": "cuda_oom"}, {"cause": "sigbus"}])
    return st


def test_the_gauges_of_a_run_waiting_for_a_gpu_with_a_failing_sync():
    t = 1_800_000_000.0
    samples = parse(prometheus.render(waiting_state(t), t, gpu_waited_s=61.5))
    run = (("run", "big-run"),)
    assert samples[("minilmd_phase", (("phase", "waiting_gpu"),) + run)] == 1
    assert sum(v for (name, _), v in samples.items() if name == "minilmd_phase") == 1
    assert samples[("minilmd_step", run)] == 1200 and samples[("minilmd_loss", run)] == 2.75
    assert ("minilmd_val_loss", run) not in samples  # not known yet: no sample rather than a made-up 0
    assert samples[("minilmd_restarts", (("cause", "sigbus"),) + run)] == 2
    assert samples[("minilmd_restarts", (("cause", "cuda_oom"),) + run)] == 1
    assert samples[("minilmd_restarts", (("cause", "all"),) + run)] == 3
    assert samples[("minilmd_sync_failing", run)] == 1
    assert samples[("minilmd_last_sync_age_seconds", run)] == 4000
    assert samples[("minilmd_progress_timestamp_seconds", run)] == t - 2000  # the "no progress" alert's input
    assert samples[("minilmd_local_checkpoint_age_seconds", run)] == 1900
    assert samples[("minilmd_gpu_waited_seconds", run)] == 61.5
    assert samples[("minilmd_up", run)] == 1

    for state in ("none_valid", "unavailable", "stalled"):  # every trouble of run_states.SYNC_TROUBLE, one rule
        st = waiting_state(t)
        st["sync"]["state"] = state
        assert parse(prometheus.render(st, t))[("minilmd_sync_failing", run)] == 1, state

    never = waiting_state(t)
    never.update(sync={"state": "idle"}, remote_checkpoint=None)
    never["supervisor"]["started"] = t - 5000
    fresh = parse(prometheus.render(never, t))
    assert fresh[("minilmd_last_sync_timestamp_seconds", run)] == t - 5000  # no sync yet: "no sync for 1 h" fires
    assert ("minilmd_remote_checkpoint_timestamp_seconds", run) not in fresh
    off = waiting_state(t)
    off["sync"] = {"state": "off"}
    assert not [k for k in parse(prometheus.render(off, t)) if "sync" in k[0]]  # no remote: no sync gauges


def test_a_dpo_runs_rewards_are_gauges_by_split_under_trls_names(tmp_path):
    """The supervisor folds a DPO run's train and eval lines into state.json (progress.rewards), the textfile shows
    them as TRL names them, the latest of each split; a run of another objective has neither."""
    from minilmd.daemon.base.runstate import RunState

    t = 1_800_000_000.0
    state = RunState(tmp_path / "state.json", new_state("dpo", tmp_path, "/runs/dpo.toml"))
    rewards = ("reward_accuracy", "reward_margin", "reward_chosen", "reward_rejected")
    state.apply_progress([
        {"kind": "train", "step": 10, "loss": 0.6, **dict(zip(rewards, (0.5, 0.1, 0.05, -0.05), strict=True))},
        {"kind": "eval", "step": 10, "val_loss": 0.62,
         **dict(zip(("val_" + r for r in rewards), (0.75, 0.2, 0.1, -0.1), strict=True))},
        {"kind": "train", "step": 11, "loss": 0.58, **dict(zip(rewards, (0.625, 0.15, 0.07, -0.08), strict=True))},
    ], None)
    samples = parse(prometheus.render(state.data, t))

    def gauge(name, split):
        return samples[(name, (("run", "dpo"), ("split", split)))]

    assert [gauge(f"minilmd_rewards_{n}", "train") for n in ("accuracies", "margins", "chosen", "rejected")] == [
        0.625, 0.15, 0.07, -0.08]
    assert [gauge(f"minilmd_rewards_{n}", "val") for n in ("accuracies", "margins", "chosen", "rejected")] == [
        0.75, 0.2, 0.1, -0.1]
    assert samples[("minilmd_val_loss", (("run", "dpo"),))] == 0.62
    text = RunState(tmp_path / "state.json", new_state("text", tmp_path, "/runs/text.toml"))
    text.apply_progress([{"kind": "train", "step": 1, "loss": 9.0}, {"kind": "eval", "step": 1, "val_loss": 8.0}],
                        None)
    assert "rewards" not in text.data["progress"]  # state.json as it always was
    assert not [k for k in parse(prometheus.render(text.data, t)) if "rewards" in k[0]]


def test_the_writer_counts_the_gpu_wait_rewrites_atomically_and_says_once_when_it_cannot_write(tmp_path,
                                                                                                 monkeypatch):
    said = []
    state = Held(waiting_state(time.time()))
    path = tmp_path / "big-run.prom"
    clock = [100.0]
    writer = prometheus.Textfile(str(path), state, lambda kind, msg: said.append(msg), clock=lambda: clock[0])
    writer.tick("waiting_gpu")
    clock[0] += prometheus.WRITE_EVERY_S / 2
    writer.tick("waiting_gpu")  # within WRITE_EVERY_S: not rewritten
    assert parse(path.read_text())[("minilmd_gpu_waited_seconds", (("run", "big-run"),))] == 0
    clock[0] += 1
    writer.tick("staging")  # a phase change writes at once
    waited = prometheus.WRITE_EVERY_S / 2 + 1
    assert parse(path.read_text())[("minilmd_gpu_waited_seconds", (("run", "big-run"),))] == waited
    clock[0] += 100
    writer.tick("staging", force=True)  # no longer waiting: the count stays
    assert parse(path.read_text())[("minilmd_gpu_waited_seconds", (("run", "big-run"),))] == waited
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big-run.prom"]  # no temp file left

    monkeypatch.setattr(prometheus, "_write", _refuse)  # a full or read-only textfile directory
    for _ in range(3):
        clock[0] += 10
        writer.tick("training")
        writer.tick("backoff")
    assert len(said) == 1 and "cannot write the Prometheus textfile" in said[0]
    monkeypatch.undo()
    writer.close("done")
    assert parse(path.read_text())[("minilmd_up", (("run", "big-run"),))] == 0
    assert said[-1].endswith("is written again")


def _refuse(*args, **kwargs):
    raise OSError(28, "No space left on device")
