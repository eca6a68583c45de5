"""End to end through `minilmd run`: the corpus source, the remote, or scratch on a FUSE filesystem that misbehaves
like a flaky NFS server (tests/faultfs.py). The trainer is the fake one (tests/fake_trainer.py): it maps the staged
tokens.bin and reads it every step (a real page fault, a real SIGBUS), and its "weights" are a hash chain over what
it read, so a disturbed run must end with the weights of an undisturbed one.

What must hold: a stalled or failing remote never blocks or kills training and shows in `minilmd status`; a remote
that cannot be read at start-up is retried for as long as it takes, never replaced by a fresh start; a sync broken
at any point never leaves the remote LATEST naming a checkpoint that does not validate; staging from a source that
fails or shrinks mid-copy is retried and never yields an unverified staged corpus; a mapped staged file that starts
failing ends in re-staging and a finished run.
"""
from __future__ import annotations

import contextlib
import errno
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names, run_owner
from minilmd.config import load_config
from minilmd.daemon.jobs.staging import verify_staged
from minilmd.protocol import SUPERVISOR_GAVE_UP
from reliability_helpers import (
    RemoteWatcher,
    copy_corpus,
    event_texts,
    expectation_for,
    fake_weights_of,
    undisturbed_fake_weights,
)
from supervisor_helpers import (
    COPIES_THE_SAME,
    cli,
    start_supervisor,
    state,
    step_of_state,
    wait_for,
    wait_or_kill,
    write_config,
)
from trainer_corpus import synthetic_prepared

pytestmark = pytest.mark.slow  # every test runs a supervisor through FUSE faults

FAST = {"restart": {"backoff_initial": "0.1s", "backoff_max": "0.5s", "hang_timeout": "30s"}}


@contextlib.contextmanager
def supervised_under_faults(faultfs, config: Path, log: Path, **extra_env) -> Iterator[subprocess.Popen]:
    """The supervisor of `config` started; on leaving, every fault cleared (what it waits on answers again), then
    the supervisor killed if it still runs: a test leaves neither behind, whatever failed in it."""
    sup = start_supervisor(config, log, **extra_env)
    try:
        yield sup
    finally:
        faultfs.clear()
        if sup.poll() is None:
            sup.kill()


def status_text(run_dir: Path) -> str:
    out = cli("status", str(run_dir))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_stalled_then_failing_remote_never_blocks_training_and_shows_in_status(tmp_path, corpus, faultfs):
    source = copy_corpus(corpus[0], faultfs.backing / "corpus")
    config = write_config(tmp_path, (faultfs.root / "corpus", corpus[1]), remote=False,
                          run={"remote": str(faultfs.root / "remote")},
                          train={"max_steps": 200, "checkpoint_every": 10}, **FAST)
    cfg = load_config(config)
    assert source.is_dir()
    # held before its last step until the faults are cleared: a trainer that reached its end while the remote still
    # failed would end the run on a last sync that fails (exit 1, for a restart to sync again), however long the
    # test's own steps take under load; the waits below ask for no step past the hold
    release, held_at = tmp_path / "release", 199
    # a sync running for 2 x MINILMD_SYNC_STALLED_AFTER when the run ends is the last sync stalled (exit 1): at 1 s,
    # a sound sync of this 0.1 MB checkpoint through the FUSE mount took 2.2 to 2.9 s at a load of 16 on 2 cores.
    # At 10 s the stall shows after 10 s of steps (max_steps leaves room for the steps under the stall and the EIO)
    with RemoteWatcher(faultfs.backing / "remote", expectation_for(config)) as watcher, \
            supervised_under_faults(faultfs, config, tmp_path / "sup.out", FAKE_STEP_S="0.1",
                                    MINILMD_SYNC_STALLED_AFTER="10", FAKE_HOLD=f"{held_at}:{release}") as sup:
        wait_for(lambda: (state(cfg.run_dir).get("remote_checkpoint") or {}).get("step"), 60, "a first sync")
        stall = faultfs.stall("remote*", 600, op="*")
        wait_for(lambda: state(cfg.run_dir).get("sync", {}).get("state") == "stalled", 60, "the sync shown stalled")
        step_at_stall = step_of_state(cfg.run_dir)
        assert "sync: stalled" in status_text(cfg.run_dir)
        wait_for(lambda: step_of_state(cfg.run_dir) >= min(step_at_stall + 15, held_at), 60,
                 "training going on under the stall")
        # the held operation now fails: EIO from the remote, and every later sync fails too
        faultfs.add_rule("*", "remote*", "error", errno=errno.EIO)
        faultfs.remove(stall)
        wait_for(lambda: state(cfg.run_dir).get("sync", {}).get("state") == "failed", 60, "the sync shown failed")
        # each retry shows "running" for up to a second (state.json is written once a second): wait for "failed"
        text = wait_for(lambda: next((t for t in [status_text(cfg.run_dir)] if "sync: failed" in t), None), 60,
                        "status to show the sync failed")
        assert "Input/output error" in text, text
        step_at_failure = step_of_state(cfg.run_dir)
        wait_for(lambda: step_of_state(cfg.run_dir) >= min(step_at_failure + 10, held_at), 60,
                 "training going on under EIO")
        assert sup.poll() is None and state(cfg.run_dir)["restarts"] == []
        faultfs.clear()
        release.touch()
        assert wait_or_kill(sup) == 0
    assert watcher.stop() == [] and watcher.checks > 0
    remote = faultfs.backing / "remote"
    assert checkpoint_dirs.read_latest(remote) == "step-00000200"
    assert fake_weights_of(remote / "step-00000200") == undisturbed_fake_weights(config)
    assert {h["action"] for h in faultfs.hits()} >= {"stall", "error"}


def test_a_remote_unreadable_at_start_is_retried_without_giving_up_and_never_replaced_by_a_fresh_start(
        tmp_path, corpus, faultfs):
    """Scratch is empty (a new machine) and the remote, which holds step 20, fails every read: the supervisor
    must neither start from step 0 nor give up after restart.no_progress_limit; once the remote answers, it
    resumes from step 20."""
    earlier = write_config(tmp_path, corpus, name="earlier", remote=False, train={"max_steps": 20})
    undisturbed_fake_weights(earlier)  # writes earlier.undisturbed/scratch/checkpoints/step-00000020
    remote = faultfs.backing / "remote"
    remote.mkdir()
    ckpt = earlier.with_suffix(".undisturbed") / "scratch" / "checkpoints" / "step-00000020"
    import shutil

    shutil.copytree(ckpt, remote / ckpt.name)
    (remote / "LATEST").write_text(ckpt.name + "\n")
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(faultfs.root / "remote")},
                          train={"max_steps": 40}, restart={"no_progress_limit": 2, "backoff_initial": "0.1s",
                                                            "backoff_max": "0.3s", "hang_timeout": "30s"})
    cfg = load_config(config)
    claim = run_owner.record(cfg.run_dir, "s")  # synced by this run on the machine it left (a shared home's path)
    (remote / names.REMOTE_OWNER).write_bytes(run_owner.encode(claim))
    faultfs.add_rule("*", "remote*", "error", errno=errno.EIO)
    check = cli("run", "--check", str(config))  # an unreadable remote fails the fetch itself: waited for
    assert check.returncode == 0 and "waits: run.remote: " in check.stdout and "is unreadable (Input/output error)" \
        in check.stdout, check.stdout + check.stderr
    with supervised_under_faults(faultfs, config, tmp_path / "sup.out") as sup:
        wait_for(lambda: len([m for m in event_texts(cfg.run_dir, "fetch") if "remote unavailable" in m]) >= 5, 60,
                 "five failed fetches")
        assert sup.poll() is None, "the supervisor gave up because the remote was down"
        assert not (cfg.run_dir / "logs" / "attempt-0001.log").exists(), "a trainer was started from scratch"
        text = status_text(cfg.run_dir)
        assert "remote unavailable" in text and "Input/output error" in text, text
        faultfs.clear()
        assert wait_or_kill(sup) == 0
    st = state(cfg.run_dir)
    assert st["restarts"] == [] and st["sync"]["state"] == "ok"
    assert any("fetched" in m for m in event_texts(cfg.run_dir, "fetch"))
    assert "resuming at step 20" in (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
    assert fake_weights_of(remote / "step-00000040") == undisturbed_fake_weights(config)


@pytest.mark.parametrize("fault", ["eio_mid_copy", "shrunk_file"])
def test_staging_from_a_source_that_fails_or_shrinks_mid_copy_is_retried(tmp_path, corpus, faultfs, fault):
    copy_corpus(corpus[0], faultfs.backing / "corpus")
    size = (faultfs.backing / "corpus" / "train" / "tokens.bin").stat().st_size
    if fault == "eio_mid_copy":
        rule = faultfs.fail_reads("corpus/train/tokens.bin", from_offset=size // 2)
    else:
        rule = faultfs.shrink("corpus/train/tokens.bin", size // 2)
    config = write_config(tmp_path, (faultfs.root / "corpus", corpus[1]), remote=False, **FAST)
    cfg = load_config(config)
    staged = cfg.scratch_dir / "corpus"
    seen_staged_while_faulty = []

    def watching_staged(condition):  # a predicate that also records whether a staged copy exists yet
        def predicate():
            seen_staged_while_faulty.append(staged.exists())
            return condition()
        return predicate

    def lift_after_a_retry_under_the_fault():
        wait_for(watching_staged(faultfs.hits), 60, "the fault to fire", interval=0.05)
        wait_for(watching_staged(lambda: any("retrying train/tokens.bin" in m for m in event_texts(cfg.run_dir))),
                 60, "the copy to be retried", interval=0.05)
        hits = len(faultfs.hits())
        wait_for(watching_staged(lambda: len(faultfs.hits()) > hits), 60, "the retried copy to meet the fault",
                 interval=0.05)
        faultfs.remove(rule)

    lifter = threading.Thread(target=lift_after_a_retry_under_the_fault, daemon=True)
    lifter.start()
    with supervised_under_faults(faultfs, config, tmp_path / "sup.out") as sup:
        assert wait_or_kill(sup) == 0
    lifter.join(60)
    assert seen_staged_while_faulty and not any(seen_staged_while_faulty)
    assert any("retrying train/tokens.bin" in m for m in event_texts(cfg.run_dir))
    assert verify_staged(staged) == []
    assert fake_weights_of(checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]) == undisturbed_fake_weights(config)


def test_a_source_that_stays_short_is_never_staged_and_the_run_gives_up_clearly(tmp_path, corpus, faultfs):
    copy_corpus(corpus[0], faultfs.backing / "corpus")
    size = (faultfs.backing / "corpus" / "train" / "tokens.bin").stat().st_size
    faultfs.shrink("corpus/train/tokens.bin", size - 100)
    config = write_config(tmp_path, (faultfs.root / "corpus", corpus[1]), remote=False,
                          restart={"no_progress_limit": 1})
    cfg = load_config(config)
    sup = start_supervisor(config, tmp_path / "sup.out", quick=COPIES_THE_SAME)
    assert wait_or_kill(sup) == SUPERVISOR_GAVE_UP
    assert not (cfg.scratch_dir / "corpus").exists()
    assert not list(cfg.scratch_dir.glob(".tmp-corpus-*"))
    text = status_text(cfg.run_dir)
    assert "train/tokens.bin" in text and f"meta.json says {size}" in text, text


def test_a_mapped_staged_file_that_starts_failing_gives_sigbus_then_restaging_and_a_finished_run(
        tmp_path, corpus, faultfs):
    """Scratch itself on the flaky mount: the trainer maps the staged tokens.bin, then reads of it fail. The page
    fault the kernel cannot fill is a SIGBUS; the supervisor finds the staged copy damaged and stages it again."""
    big = synthetic_prepared(tmp_path / "big", corpus[0] / "tokenizer.json", corpus[1], n_docs=4000)
    config = write_config(tmp_path, (big, corpus[1]), remote=False, run={"scratch": str(faultfs.root / "scratch")},
                          train={"max_steps": 80},
                          restart={"backoff_initial": "1s", "backoff_max": "1s", "hang_timeout": "30s"})
    cfg = load_config(config)
    with supervised_under_faults(faultfs, config, tmp_path / "sup.out", FAKE_STEP_S="0.05") as sup:
        wait_for(lambda: step_of_state(cfg.run_dir) >= 5, 60, "training")
        rule = faultfs.fail_reads("scratch/corpus/train/tokens.bin")
        wait_for(lambda: any("fails verification" in m for m in event_texts(cfg.run_dir)), 60,
                 "the staged corpus found damaged")
        faultfs.remove(rule)
        assert wait_or_kill(sup) == 0
    st = state(cfg.run_dir)
    assert [(r["cause"], r["action"]) for r in st["restarts"]] == [("sigbus", "restage")]
    assert any(h["path"] == "scratch/corpus/train/tokens.bin" for h in faultfs.hits("error", "read"))
    assert fake_weights_of(checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]) == undisturbed_fake_weights(config)


SYNC_FAULTS = [  # (op, glob, action, params): each breaks the sync at another point of its protocol
    ("write", "remote/.tmp-step-*/model.safetensors", "error", {"errno": errno.EIO}),
    ("read", "remote/.tmp-step-*/model.safetensors", "error", {"errno": errno.EIO}),  # the read-back check
    ("create", "remote/.tmp-step-*/manifest.json", "error", {"errno": errno.ENOSPC}),
    ("write", "remote/.tmp-step-*/manifest.json", "error", {"errno": errno.EIO}),
    ("fsync", "remote/.tmp-step-*", "error", {"errno": errno.EIO}),
    ("rename", "remote/.tmp-step-*", "drop", {}),  # a rename acknowledged but not done
    ("write", "remote/.LATEST.*", "error", {"errno": errno.EIO}),
    ("rename", "remote/LATEST", "error", {"errno": errno.EIO}),
    ("mkdir", "remote/.tmp-step-*", "error", {"errno": errno.EIO}),
]


def test_a_sync_broken_at_any_point_never_leaves_latest_naming_an_invalid_checkpoint(tmp_path, corpus, faultfs):
    # a sync, and a failed one's retry, every 0.4 s (not 1 s): each fault fires at a sync and the next good one moves
    # LATEST on, whenever they come
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(faultfs.root / "remote")},
                          train={"max_steps": 100000, "checkpoint_every": 5}, sync={"every": "0.4s", "keep": 2},
                          **FAST)
    cfg = load_config(config)
    with RemoteWatcher(faultfs.backing / "remote", expectation_for(config), interval=0.02) as watcher, \
            supervised_under_faults(faultfs, config, tmp_path / "sup.out", FAKE_STEP_S="0.03") as sup:
        wait_for(lambda: (state(cfg.run_dir).get("remote_checkpoint") or {}).get("step"), 60, "a first sync")
        for op, glob, action, params in SYNC_FAULTS:
            rule = faultfs.add_rule(op, glob, action, **params)
            wait_for(lambda: any(h["id"] == rule for h in faultfs.hits()), 120, f"the fault {op} {glob} to fire")
            faultfs.remove(rule)
            synced = (state(cfg.run_dir).get("remote_checkpoint") or {}).get("step") or 0
            # the next sync after the fault goes through, and moves LATEST forward
            wait_for(lambda: ((state(cfg.run_dir).get("remote_checkpoint") or {}).get("step") or 0) > synced, 120,
                     f"a good sync after {op} {glob}")
        assert sup.poll() is None and state(cfg.run_dir)["restarts"] == []
        out = cli("stop", str(cfg.run_dir), timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert wait_or_kill(sup) == 0
    assert watcher.stop() == [] and len(watcher.seen) >= len(SYNC_FAULTS)
    newest = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert checkpoint_dirs.read_latest(faultfs.backing / "remote") == newest.name
    assert not list((faultfs.backing / "remote").glob(".tmp-*"))
    # ENOSPC is said as the remote full (what the checkpoint needs, what the remote had), every other as failed
    failures = [m for m in event_texts(cfg.run_dir, "sync") if m.startswith(("sync failed", "remote full"))]
    assert len(failures) >= len(SYNC_FAULTS)
