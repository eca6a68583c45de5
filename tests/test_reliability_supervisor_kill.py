"""The supervisor itself SIGKILLed at random moments (while staging, while training, while syncing), then started
again, as systemd would: it must find the orphaned trainer (or its absence) and the half-done copies (a staging
temp directory in scratch, a `.tmp-step-*` on the remote), clean up, and finish the run with the weights of an
undisturbed run. Never two trainers on one run, never a remote LATEST naming an invalid checkpoint.

The corpus source and the remote live on the FUSE fault filesystem, so that a stall holds the supervisor inside a
staging copy or a sync exactly when it is killed. The trainer is the fake one (its weights are a hash chain).
"""
from __future__ import annotations

import random
import signal
import time

import pytest

from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.daemon.jobs.staging import verify_staged
from reliability_helpers import (
    RemoteWatcher,
    TrainerCounter,
    copy_corpus,
    expectation_for,
    fake_weights_of,
    undisturbed_fake_weights,
)
from supervisor_helpers import start_supervisor, state, step_of_state, wait_for, write_config

pytestmark = pytest.mark.slow  # four supervisors, killed while staging, training, syncing


def kill(sup, faultfs=None, rule=None) -> None:
    """SIGKILL the supervisor; lift the stall it sits in (a process in a FUSE call dies when the call returns)."""
    sup.send_signal(signal.SIGKILL)
    if rule is not None:
        faultfs.remove(rule)
    sup.wait(30)


def test_supervisor_killed_while_staging_training_and_syncing_finishes_identically(tmp_path, corpus, faultfs):
    rng = random.Random(6)
    copy_corpus(corpus[0], faultfs.backing / "corpus")
    config = write_config(tmp_path, (faultfs.root / "corpus", corpus[1]), remote=False,
                          run={"remote": str(faultfs.root / "remote")},
                          train={"max_steps": 120, "checkpoint_every": 10},
                          restart={"backoff_initial": "0.1s", "backoff_max": "0.5s", "hang_timeout": "30s"})
    cfg = load_config(config)
    out = tmp_path / "sup.out"
    counter = TrainerCounter(cfg.run_dir)
    counter.start()
    watcher = RemoteWatcher(faultfs.backing / "remote", expectation_for(config))
    watcher.start()
    env = {"FAKE_STEP_S": "0.05"}
    procs = []
    try:
        # 1. while staging: the copy of tokens.bin hangs on the source
        stall = faultfs.stall("corpus/train/tokens.bin", 600)
        procs.append(start_supervisor(config, out, **env))
        wait_for(lambda: faultfs.hits("stall"), 60, "staging to reach tokens.bin")
        time.sleep(rng.uniform(0, 0.5))
        kill(procs[-1], faultfs, stall)
        assert list(cfg.scratch_dir.glob(".tmp-corpus-*")), "expected a half-done staging copy"

        # 2. while training, at a random step. The trainers this kill and the next leave behind as orphans hold
        # (FAKE_HOLD) until the next supervisor has found them: a trainer that merely stepped slowly finished before
        # it was found on a loaded machine (the next supervisor's start took 27 s there)
        released = [tmp_path / "release-1", tmp_path / "release-2"]
        target = rng.randint(12, 40)
        procs.append(start_supervisor(config, out, **env, FAKE_HOLD=f"{target}:{released[0]}"))
        wait_for(lambda: step_of_state(cfg.run_dir) >= target, 60, f"training to step {target}")
        orphan = state(cfg.run_dir)["child"]["pid"]
        kill(procs[-1])

        # 3. while syncing: the copy of the weights to the remote hangs. This trainer holds at step 100, past the
        # first sync it stalls, until the last supervisor has found it
        procs.append(start_supervisor(config, out, **env, FAKE_HOLD=f"100:{released[1]}"))
        wait_for(lambda: any(e == [orphan] for e in orphan_pids(cfg.run_dir)), 60, "the orphan to be found")
        released[0].touch()  # the orphan goes on to the step boundary, where it saves and stops (SIGTERM)
        stall = faultfs.stall("remote/.tmp-step-*/model.safetensors", 600, op="write")
        wait_for(lambda: faultfs.hits("stall", "write"), 60, "a sync to reach the remote")
        time.sleep(rng.uniform(0, 0.3))
        kill(procs[-1], faultfs, stall)
        assert list((faultfs.backing / "remote").glob(".tmp-step-*")), "expected a half-done sync"

        # 4. the last one runs to the end
        procs.append(start_supervisor(config, out, **env))
        wait_for(lambda: len(orphan_pids(cfg.run_dir)) == 2, 60, "the second orphan to be found")
        released[1].touch()
        assert procs[-1].wait(120) == 0
    finally:
        faultfs.clear()
        for p in procs:
            if p.poll() is None:
                p.kill()
        for poller in (counter, watcher):  # passed or failed: none polls on into the worker's next tests
            poller.halt()
    assert counter.stop() == [] and counter.max_seen == 1
    assert watcher.stop() == []
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 3 + [0]
    assert len(orphan_pids(cfg.run_dir)) == 2  # found after the kills while training and while syncing
    assert not list(cfg.scratch_dir.glob(".tmp-corpus-*")) and verify_staged(cfg.scratch_dir / "corpus") == []
    remote = faultfs.backing / "remote"
    assert not list(remote.glob(".tmp-*"))
    assert checkpoint_dirs.read_latest(remote) == "step-00000120"
    assert fake_weights_of(remote / "step-00000120") == undisturbed_fake_weights(config)


def orphan_pids(run_dir) -> list[list[int]]:
    from supervisor_helpers import events

    return [e["pids"] for e in events(run_dir) if e.get("event") == "orphan" and "pids" in e]
