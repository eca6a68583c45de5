"""The supervisor with the real trainer (`minilmd train`) on a tiny model, on the CPU: what the fake cannot show.

The real trainer's own fault injection (MINILMD_FAULT) produces the deaths: a real SIGBUS, a CUDA OOM through the
trainer's handler, a hang. A supervised run with a death in it must end with the same weights, bit for bit, as an
unsupervised run straight through, and leave a remote LATEST that validates against the run's expectations.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from minilmd import checkpoint, checkpoint_dirs
from minilmd.config import load_config
from supervisor_helpers import (
    cli,
    events,
    model_sha,
    run_supervisor,
    start_supervisor,
    state,
    step_of_state,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.slow
REAL = {"train": {"max_steps": 16, "checkpoint_every": 4, "micro_batch_size": 4, "grad_accum": 1}}
"""The real trainer's runs of the tests that do not compare weights (the one that does runs conftest's baseline)."""



def expectation(config: Path) -> checkpoint.Expectation:
    from minilmd.corpus.format import open_prepared

    cfg = load_config(config)
    corpus = open_prepared(cfg.data.prepared)
    return checkpoint.Expectation(cfg.model_dict(), corpus.data_fingerprint, corpus.tokenizer_fingerprint)


def test_a_real_sigbus_is_survived_with_identical_weights_and_a_valid_remote(tmp_path, undisturbed):
    straight = undisturbed()
    config = straight.config_like(tmp_path, "sup", remote=True)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, timeout=300, fake=False, MINILMD_FAULT="sigbus@6") == 0
    st = state(cfg.run_dir)
    assert [(r["cause"], r["exit"]) for r in st["restarts"]] == [("sigbus", -signal.SIGBUS)]
    remote = Path(cfg.run.remote)
    assert checkpoint_dirs.read_latest(remote) == "step-00000016"
    checkpoint.validate(remote / "step-00000016", expectation(config))
    assert model_sha(remote / "step-00000016") == model_sha(straight.checkpoint)


def test_a_real_cuda_oom_halves_the_micro_batch(tmp_path, corpus):
    config = write_config(tmp_path, corpus, **REAL)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, timeout=300, fake=False, MINILMD_FAULT="oom@3") == 0
    st = state(cfg.run_dir)
    assert [r["cause"] for r in st["restarts"]] == ["cuda_oom"]
    assert st["overrides"] == {"train.micro_batch_size": 2, "train.grad_accum": 2}
    final = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    saved = json.loads((final / "trainer_state.json").read_text())["config"]["train"]
    assert (saved["micro_batch_size"], saved["grad_accum"]) == (2, 2)
    second = (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    assert "train.micro_batch_size=2" in second and "train.grad_accum=2" in second


def test_a_real_hang_is_dumped_and_killed(tmp_path, corpus):
    config = write_config(tmp_path, corpus, restart={"hang_timeout": "2s", "backoff_initial": "0.1s"}, **REAL)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, timeout=300, fake=False, MINILMD_FAULT="hang@5") == 0
    st = state(cfg.run_dir)
    assert [r["cause"] for r in st["restarts"]] == ["hang"]
    first = (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
    assert " in _hang" in first or "_hang (" in first  # the hung trainer's stack (faulthandler or py-spy)


def test_a_killed_supervisor_and_its_orphan_then_stop_leaves_a_synced_checkpoint(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 100000, "checkpoint_every": 20})
    cfg = load_config(config)
    first = start_supervisor(config, tmp_path / "sup.out", fake=False)
    wait_for(lambda: step_of_state(cfg.run_dir) >= 3, 120, "training")
    orphan = state(cfg.run_dir)["child"]["pid"]
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = start_supervisor(config, tmp_path / "sup.out", fake=False)
    try:
        wait_for(lambda: state(cfg.run_dir).get("phase") == "training"
                 and (state(cfg.run_dir).get("child") or {}).get("pid") != orphan, 120, "the second trainer")
        assert not Path(f"/proc/{orphan}").exists() or "Z" in Path(f"/proc/{orphan}/stat").read_text().split()[2]
        # the orphan stops by itself once its supervisor is gone (minilmd/supervisor_gone.py), and the second one's
        # hunt finds it only while it is still saving; the hunt of one that trains on: tests/test_orphan_saved_again
        orphan_exit = [e for e in events(cfg.run_dir) if e["event"] == "orphan"]
        assert not orphan_exit or orphan_exit[0]["pids"] == [orphan]
        out = cli("stop", str(cfg.run_dir), timeout=200)
        assert out.returncode == 0, out.stdout + out.stderr
        assert second.wait(30) == 0
    finally:
        if second.poll() is None:
            second.kill()
    newest = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert checkpoint_dirs.read_latest(cfg.run.remote) == newest.name
    checkpoint.validate(Path(cfg.run.remote) / newest.name, expectation(config))
    # the orphan saved on SIGTERM, and the second trainer resumed from that save
    second_log = (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    assert "resum" in second_log.lower()
