"""`minilmd status` of a run whose scratch is gone: a finished run removes it once run.remote holds its last
checkpoint (run.keep_scratch = false, the default), and `export`, `sample` and `verify` of the run directory say so
(`its scratch ... is gone (removed at the run's end, or by a reboot)`). Found by a new user: status went on
saying `local checkpoint: step 600 (3m ago)`, a copy on the RAM disk that was no longer there."""
from __future__ import annotations

import re

import pytest

from minilmd.config import load_config
from supervisor_helpers import cli, run_supervisor, write_config


def _local_words(config) -> str:
    out = cli("status", str(load_config(config).run_dir))
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if "local checkpoint:" in ln]
    return line.split("remote:")[0]


@pytest.mark.slow  # a real supervisor trains each run to its end (the fake trainer)
@pytest.mark.parametrize("keep", [False, True])
def test_status_of_a_finished_run_says_its_scratch_checkpoint_is_gone(tmp_path, corpus, keep):
    config = write_config(tmp_path, corpus, run={"remote": str(tmp_path / "remote"), "keep_scratch": keep},
                          train={"max_steps": 6, "checkpoint_every": 3})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    cfg = load_config(config)
    assert cfg.checkpoint_dir.exists() == keep  # the run's end removed scratch unless kept
    words = _local_words(config)
    assert re.search(r"local checkpoint: step 6 \(\d+s ago", words), words
    if keep:
        assert "gone" not in words, words
    else:
        assert "gone from scratch (removed at the run's end, or by a reboot)" in words, words
