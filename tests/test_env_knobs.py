"""The supervisor's environment knobs (daemon/base/knobs.py) are read where the run starts, in the duration forms a
config takes, range-checked, and a bad one is a config error naming it: before, syncworker did float() of them at
import, so `MINILMD_SYNC_STALLED_AFTER=2m` (the form every config duration takes) crashed `minilmd run` with a
ValueError traceback before it said anything."""
from __future__ import annotations

import subprocess
import sys

import pytest

from minilmd import names
from minilmd.config import ConfigError
from minilmd.daemon import preflight
from minilmd.daemon.base import knobs
from minilmd.protocol import SUPERVISOR_CONFIG
from supervisor_helpers import cli, env_for, write_config


def test_a_duration_in_minutes_is_taken_and_the_supervisor_imports():
    env = env_for(**{names.SYNC_STALLED_AFTER_ENV: "2m", names.PRUNE_UNSYNCED_AFTER_ENV: "5m"})
    imported = subprocess.run([sys.executable, "-c", "import minilmd.daemon.supervisor"], capture_output=True,
                              text=True, env=env, timeout=120)
    assert imported.returncode == 0, imported.stderr
    read = knobs.read({names.SYNC_STALLED_AFTER_ENV: "2m", names.PRUNE_UNSYNCED_AFTER_ENV: "90"})
    assert (read.sync_stalled_after_s, read.prune_unsynced_after_s) == (120.0, 90.0)
    assert knobs.read({}) == knobs.Knobs(sync_stalled_after_s=120.0, prune_unsynced_after_s=60.0)


@pytest.mark.parametrize(("value", "words"), [("soon", "not a duration"), ("0", "between 1s and 86400s"),
                                              ("2d", "between 1s and 86400s")])
def test_run_check_refuses_a_bad_knob_naming_it(tmp_path, corpus, monkeypatch, value, words):
    config = write_config(tmp_path, corpus, remote=False)
    monkeypatch.setenv(names.SYNC_STALLED_AFTER_ENV, value)
    with pytest.raises(ConfigError) as err:
        preflight.check_with_waits(str(config))
    assert f"{names.SYNC_STALLED_AFTER_ENV}={value!r}" in str(err.value) and words in str(err.value)


@pytest.mark.slow  # a real launch
def test_a_launch_with_a_bad_knob_exits_2_without_a_traceback(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False)
    launched = cli("run", str(config), timeout=120, **{names.PRUNE_UNSYNCED_AFTER_ENV: "an hour"})
    text = launched.stdout + launched.stderr
    assert launched.returncode == SUPERVISOR_CONFIG, text
    assert names.PRUNE_UNSYNCED_AFTER_ENV in text and "Traceback" not in text, text
    assert not (tmp_path / "s" / "run" / "state.json").exists()
