"""[log]: the config keys, and the trainer's TensorBoard tee (trainer/loop/tensorboard.py) on its own: off by default
and then not imported at all, a missing package as a config error with the install line, purge_step on resume. The
read-back of a real killed and resumed run with TensorBoard's own reader is in tests/test_watch_real.py."""
from __future__ import annotations

import builtins
import subprocess
import sys

import pytest

from minilmd.config import ConfigError, config_from_dict
from minilmd.metrics import MetricsLog
from minilmd.probes import tensorboard_problems
from minilmd.trainer.loop import tensorboard
from supervisor_helpers import write_config


def config(tmp_path, **log):
    raw = {"run": {"name": "t", "dir": str(tmp_path / "run")}, "data": {"prepared": str(tmp_path / "p")},
           "train": {"max_steps": 4}, "log": log}
    return config_from_dict(raw)


def test_the_log_section_is_checked_like_the_others(tmp_path):
    assert config(tmp_path).log.tensorboard is False and config(tmp_path).log.prometheus_textfile == ""
    with pytest.raises(ConfigError) as e:
        config(tmp_path, tensorboard="yes", prometheus_textfile=str(tmp_path / "x.txt"), grafana=True)
    text = str(e.value)
    assert "log.tensorboard = 'yes': expected true or false" in text and "unknown key log.grafana" in text
    assert "reads only *.prom files" in text


def test_off_it_is_the_plain_log_and_on_a_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
    log = MetricsLog(tmp_path / "run")
    assert tensorboard.tee(log, config(tmp_path), 0) is log
    other_rank = MetricsLog(tmp_path / "run", active=False)
    assert tensorboard.tee(other_rank, config(tmp_path, tensorboard=True), 0) is other_rank  # rank 0 alone writes
    real_import = builtins.__import__

    def without_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("TensorBoard logging requires TensorBoard")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    monkeypatch.setattr(builtins, "__import__", without_tensorboard)
    with pytest.raises(ConfigError, match=r"pip install 'minilmd\[tensorboard\]'"):
        tensorboard.tee(log, config(tmp_path, tensorboard=True), 0)


@pytest.mark.slow
def test_on_it_writes_the_lines_and_a_resume_purges_what_came_after_its_step(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    cfg = config(tmp_path, tensorboard=True)
    first = tensorboard.tee(MetricsLog(cfg.run_dir), cfg, 0)
    for step in range(1, 7):
        first.write("train", step=step, loss=10.0 - step, lr=0.1, tok_s=5.0, epoch=0)
    first.write("eval", step=6, val_loss=3.5)
    first.write("checkpoint", step=4, path="x")  # not a scalar
    resumed = tensorboard.tee(MetricsLog(cfg.run_dir), cfg, 4)  # a new attempt from the checkpoint of step 4
    for step in range(5, 9):
        resumed.write("train", step=step, loss=100.0 + step)
    acc = event_accumulator.EventAccumulator(str(cfg.run_dir / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [
        (1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0), (5, 105.0), (6, 106.0), (7, 107.0), (8, 108.0)]
    assert acc.Scalars("val/loss") == []  # step 6's eval came after the resumed step: purged
    assert [e.step for e in acc.Scalars("train/lr")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_dpo_runs_rewards_are_tagged_by_trls_names(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    cfg = config(tmp_path, tensorboard=True)
    log = tensorboard.tee(MetricsLog(cfg.run_dir), cfg, 0)
    log.write("train", step=1, loss=0.69, reward_accuracy=0.25, reward_margin=0.01, reward_chosen=0.02,
              reward_rejected=0.01)
    log.write("eval", step=1, val_loss=0.68, val_reward_accuracy=0.75, val_reward_margin=0.03,
              val_reward_chosen=-0.01, val_reward_rejected=-0.04)
    acc = event_accumulator.EventAccumulator(str(cfg.run_dir / "tensorboard"))
    acc.Reload()
    got = {tag: acc.Scalars(tag)[0].value for tag in acc.Tags()["scalars"]}
    expected = {"train/rewards/accuracies": 0.25, "train/rewards/margins": 0.01, "train/rewards/chosen": 0.02,
                "train/rewards/rejected": 0.01, "val/rewards/accuracies": 0.75, "val/rewards/margins": 0.03,
                "val/rewards/chosen": -0.01, "val/rewards/rejected": -0.04, "val/loss": 0.68}
    for tag, value in expected.items():
        assert got.get(tag) == pytest.approx(value), (tag, got)


CHECK_WITHOUT_TENSORBOARD = """
import sys
sys.modules["tensorboard"] = None  # what an environment without the package looks like to the import system
sys.argv[0] = "minilmd"
from minilmd.cli import main
main()
"""


def test_run_check_says_a_missing_tensorboard_before_any_launch(tmp_path, corpus):
    """Found by a new user: `run --check` passed `[log] tensorboard = true` without the package; the launch then
    staged, started the trainer, and failed there for good (exit 2), after the GPU wait on a server. Now --check,
    and the launch with it, say it first; with the package there, nothing is said."""
    path = write_config(tmp_path, corpus, log={"tensorboard": True})
    check = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_TENSORBOARD, "run", "--check", str(path)],
                           capture_output=True, text=True, timeout=120)
    said = check.stdout + check.stderr
    assert check.returncode == 2, said
    assert "log.tensorboard = true, but the tensorboard package is not installed" in said, said
    assert "pip install 'minilmd[tensorboard]'" in said, said
    assert tensorboard_problems() == []  # installed in the test environment: the check is silent
