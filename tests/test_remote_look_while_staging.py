"""User F9: while staging waits for the corpus share, the supervisor never looked at run.remote, so a remote moved
away at that moment was shown by its last verified sync alone (`remote: step 10 (8s ago, verified)`), as if it were
there. Staging's wait now looks at it, the bounded look `run --check` takes (remote_claim.root_words_now), and
status says it does not answer beside that sync; once it is back, the sync section is what it was.

A real supervisor with the fake trainer: a first start trains and syncs, then supervisor and trainer are killed and
scratch emptied (a reboot), the corpus's share and the remote taken away, and the run started again.
"""
from __future__ import annotations

import os
import shutil
import signal

import pytest

from minilmd.config import load_config
from reliability_helpers import copy_corpus
from supervisor_helpers import cli, remote_step, start_supervisor, state, wait_for, write_config


def status(run_dir) -> str:
    out = cli("status", str(run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.slow  # two real supervisors
def test_a_remote_moved_away_while_staging_waits_for_the_corpus_is_said_not_answering(tmp_path, corpus):
    share = tmp_path / "share"  # the corpus's share: emptied below, as a mount point whose share is gone
    copy_corpus(corpus[0], share / "corpus")
    config = write_config(tmp_path, (share / "corpus", corpus[1]), train={"max_steps": 400, "checkpoint_every": 5})
    cfg = load_config(config)
    first = start_supervisor(config, tmp_path / "first.out", FAKE_HOLD=f"12:{tmp_path / 'never'}")
    try:
        wait_for(lambda: remote_step(cfg.run_dir) >= 10 or first.poll() is not None, 120, "step 10 synced")
        assert first.poll() is None, (tmp_path / "first.out").read_text()[-3000:]
        trainer = state(cfg.run_dir)["child"]["pid"]
        first.send_signal(signal.SIGKILL)  # a reboot: the supervisor, its trainer and scratch gone
        first.wait()
        os.killpg(trainer, signal.SIGKILL)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    shutil.rmtree(cfg.scratch_dir)
    (share / "corpus").rename(tmp_path / "corpus.away")
    remote = tmp_path / "s" / "remote"
    assert cfg.run.remote == str(remote)
    remote.rename(tmp_path / "remote.away")
    second = start_supervisor(config, tmp_path / "second.out")
    try:
        wait_for(lambda: (state(cfg.run_dir).get("sync") or {}).get("state") == "unavailable"
                 or second.poll() is not None, 120, "the remote looked at while staging waits for the corpus")
        assert second.poll() is None, (tmp_path / "second.out").read_text()[-3000:]
        said = status(cfg.run_dir)
        assert "corpus source unreachable since" in said, said
        assert "remote: step 10 (verified " in said and "; run.remote does not answer now since " in said, said
        assert state(cfg.run_dir)["sync"]["error"].startswith("remote unavailable: "), state(cfg.run_dir)["sync"]
        (tmp_path / "remote.away").rename(remote)  # the remote's share back, the corpus's still gone
        wait_for(lambda: (state(cfg.run_dir).get("sync") or {}).get("state") != "unavailable"
                 or second.poll() is not None, 120, "the remote answering again at the next look")
        said = status(cfg.run_dir)
        assert "corpus source unreachable since" in said and "does not answer now" not in said, said
        (tmp_path / "corpus.away").rename(share / "corpus")
        second.send_signal(signal.SIGTERM)
        assert second.wait(120) == 0, (tmp_path / "second.out").read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
