"""A start whose scratch holds an older checkpoint than run.remote (daemon/jobs/scratch_behind.py): a machine back to
the /dev/shm it kept (step 2) after another machine trained the run on and synced step 5. Found by the lead: the
start resumed from scratch's 2 whenever scratch held a checkpoint, computed steps 3 to 5 again in silence, and its
syncs put a second history over the remote's. Now the one rule of `run --check` and staging takes the remote's newer
step (fetched beside scratch's, verified); scratch's newer unsynced steps stay; a remote that cannot be looked at
leaves scratch's, said; a newer one of another corpus is refused. The end-to-end case, a real supervisor and
trainer: tests/test_scratch_behind_run.py; the staging worker's words for it: the last test here."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from minilmd import bounded
from minilmd import checkpoint as ck
from minilmd.config import load_config
from minilmd.daemon.jobs import resumefrom, scratch_behind
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.names import LATEST, step_name
from supervisor_helpers import write_config
from sync_helpers import EXPECTED, save, weights  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def remote_looks_wait_long(monkeypatch):
    """The look at the remote waits SHARED_STORAGE_PROBE_S (5 s) at most: on two cores under load a local one could
    take that long. These tests show the choice once it answers (the one that does not answer sets its own)."""
    monkeypatch.setattr(bounded, "SHARED_STORAGE_PROBE_S", 600.0)


def synced_elsewhere(tmp_path: Path, remote: Path, weights, step: int, data: str | None = None) -> None:
    """Another machine's step, synced to the remote (`data`: another corpus's fingerprint)."""
    other = tmp_path / "elsewhere"
    save(other, step, weights, **({"data": data} if data else {}))
    Syncer(other, str(remote), None if data else EXPECTED).sync_newest()  # another corpus's: its own expectation


def verdict(scratch: Path, remote: Path | str) -> scratch_behind.Verdict:
    syncer = Syncer(scratch, str(remote), EXPECTED)
    return scratch_behind.judge(syncer, scratch, scratch_behind.scratch_newest(scratch, EXPECTED))


def test_a_newer_step_on_the_remote_is_fetched_beside_scratchs_and_an_older_one_leaves_scratchs(tmp_path, weights):
    scratch, remote = tmp_path / "shm" / "checkpoints", tmp_path / "nfs" / "run"
    synced_elsewhere(tmp_path, remote, weights, 5)
    save(scratch, 2, weights)  # the kept /dev/shm
    taken = verdict(scratch, remote).taken
    assert taken is not None and taken.name == step_name(5) and taken.held == 2  # before: scratch's 2 resumed
    assert taken.words() == "scratch held step 2; run.remote holds step 5, newer"
    logs: list[str] = []
    fetched = scratch_behind.fetch_over_scratch(Syncer(scratch, str(remote), EXPECTED, log=logs.append), scratch,
                                                EXPECTED)
    assert fetched.taken == taken, logs
    assert ck.validate(scratch / step_name(5), EXPECTED)["step"] == 5
    assert (scratch / step_name(2)).is_dir() and ck.validate(scratch / step_name(2), EXPECTED)  # never deleted
    assert (scratch / LATEST).read_text().strip() == step_name(5)
    assert verdict(scratch, remote) == scratch_behind.Verdict()  # as new now: scratch's

    save(scratch, 8, weights)  # scratch's own newer steps, not synced yet: scratch's, as ever
    assert verdict(scratch, remote) == scratch_behind.Verdict()
    assert scratch_behind.fetch_over_scratch(Syncer(scratch, str(remote), EXPECTED), scratch, EXPECTED) == \
        scratch_behind.Verdict()


class Stalled(Syncer):
    """A remote whose look does not answer (a stalled mount) until `release` is set."""

    release = threading.Event()

    def peek_latest(self, skip=frozenset()):
        self.release.wait(60)
        raise OSError(5, "Input/output error")


class Failing(Syncer):
    """A remote whose look fails (EIO)."""

    def peek_latest(self, skip=frozenset()):
        raise OSError(5, "Input/output error")


def test_a_remote_that_cannot_be_looked_at_leaves_scratchs_and_says_so(tmp_path, weights, monkeypatch):
    scratch, remote = tmp_path / "shm" / "checkpoints", tmp_path / "nfs" / "run"
    synced_elsewhere(tmp_path, remote, weights, 5)
    save(scratch, 2, weights)
    failed = scratch_behind.judge(Failing(scratch, str(remote), EXPECTED), scratch, 2)
    assert failed.taken is None and failed.refused is None
    assert failed.unlooked.startswith(f"run.remote {remote} cannot be read (") and "Input/output error" in \
        failed.unlooked and "not compared with scratch, and the start goes on from scratch's step 2" in failed.unlooked
    monkeypatch.setattr(bounded, "SHARED_STORAGE_PROBE_S", 0.2)
    try:
        stalled = scratch_behind.fetch_over_scratch(Stalled(scratch, str(remote), EXPECTED), scratch, EXPECTED)
    finally:
        Stalled.release.set()
    assert stalled.taken is None and "did not answer within 0.2 s (stalled): not compared" in stalled.unlooked
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("step-")) == [step_name(2)]


def test_a_newer_remote_step_of_another_corpus_is_refused_an_older_one_is_not(tmp_path, weights):
    scratch, remote = tmp_path / "shm" / "checkpoints", tmp_path / "nfs" / "run"
    save(scratch, 2, weights)
    synced_elsewhere(tmp_path, remote, weights, 5, data="e" * 64)
    refused = verdict(scratch, remote).refused
    assert refused is not None and refused.kind == "data" and Path(refused.path).name == step_name(5)
    with pytest.raises(ck.CheckpointMismatch):  # final at the launch, as the fetch's own refusal
        scratch_behind.fetch_over_scratch(Syncer(scratch, str(remote), EXPECTED), scratch, EXPECTED)
    assert not (scratch / step_name(5)).exists()
    save(scratch, 8, weights)  # scratch newer: today's start, the remote's older one not judged
    assert verdict(scratch, remote) == scratch_behind.Verdict()


def test_run_check_names_the_remotes_newer_step_and_the_remote_not_compared(tmp_path, corpus, weights, monkeypatch):
    """`run --check`'s start line by the same rule (scratch_behind.judge), and its note when the remote does not
    answer."""
    cfg = load_config(write_config(tmp_path, corpus, name="back"))
    monkeypatch.setattr(resumefrom, "expectation", lambda cfg: EXPECTED)  # the tiny model these checkpoints hold
    remote = Path(cfg.run.remote)
    save(cfg.checkpoint_dir, 2, weights)
    assert resumefrom.find(cfg, str(remote)).line() == \
        f"resumes from step 2 (scratch: {cfg.checkpoint_dir / step_name(2)})"  # an empty remote: scratch's
    synced_elsewhere(tmp_path, remote, weights, 5)
    assert resumefrom.find(cfg, str(remote)).line() == (  # before: `resumes from step 2 (scratch: ...)`
        f"resumes from step 5 (remote: {remote / step_name(5)}: newer than scratch's step 2; staging fetches it "
        f"beside scratch's and verifies its weights there)")
    monkeypatch.setattr(resumefrom, "_syncer", lambda cfg: Failing(cfg.checkpoint_dir, cfg.run.remote, EXPECTED))
    start = resumefrom.find(cfg, str(remote))
    assert start.line() == f"resumes from step 2 (scratch: {cfg.checkpoint_dir / step_name(2)})"
    assert start.unlooked.startswith(f"run.remote {remote} cannot be read")
    monkeypatch.setattr(resumefrom, "_syncer", lambda cfg: Syncer(cfg.checkpoint_dir, cfg.run.remote, EXPECTED))
    synced_elsewhere(tmp_path, remote, weights, 7, data="e" * 64)
    assert "(step 7, on the remote " in resumefrom.find(cfg, str(remote)).refused


class Infra:
    """Staging's infra, as far as the fetch asks it: the run's expectation (the tiny model these checkpoints hold)."""

    def expectation(self, cfg, staged):
        return EXPECTED


def test_staging_says_when_the_remote_was_not_compared_and_fetches_a_newer_one_saying_both_steps(tmp_path, corpus,
                                                                                                 weights):
    """The staging thread's fetch and the loop's words for it (daemon/jobs/stagingworker.py): an event naming both
    steps for a newer one fetched, a `note` event for a remote not looked at; scratch's own resumed then."""
    from minilmd import names, scratch
    from minilmd.daemon.base.runstate import RunState, new_state
    from minilmd.daemon.base.worker import Inbox
    from minilmd.daemon.jobs.stagingworker import Staged, StagingWorker
    from waiting import wait_until

    cfg = load_config(write_config(tmp_path, corpus, name="back"))
    cfg.run_dir.mkdir(parents=True)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)  # as the launch claims it
    remote = Path(cfg.run.remote)
    save(cfg.checkpoint_dir, 2, weights)
    synced_elsewhere(tmp_path, remote, weights, 5)
    emitted: list[tuple[str, str]] = []
    run_state = RunState(cfg.run_dir / names.STATE, new_state("back", cfg.run_dir, "back.toml"))

    def staged(failing: bool) -> Staged:
        kind = Failing if failing else Syncer
        emit = lambda event, message, **_: emitted.append((event, message))
        staging = StagingWorker(cfg, Infra(), run_state, emit, Inbox(emit),
                                lambda expected: kind(cfg.checkpoint_dir, str(remote), expected))
        staging.awaiting_remote, staging.fetch_retry_at = cfg.scratch_dir / names.STAGED_CORPUS, 0.0  # fetch only
        done = wait_until(lambda: staging.tick(), 120, "the fetch")
        assert isinstance(done, Staged), done
        return done

    assert staged(failing=True).fetched is None
    notes = [m for e, m in emitted if e == "note"]
    assert len(notes) == 1 and notes[0].startswith(f"run.remote {remote} cannot be read (") and \
        "not compared with scratch, and the start goes on from scratch's step 2" in notes[0]
    emitted.clear()
    assert staged(failing=False).fetched == cfg.checkpoint_dir / step_name(5)
    assert [m for e, m in emitted if e == "fetch" and "newer" in m] == [
        f"scratch held step 2; run.remote holds step 5, newer: fetched {cfg.checkpoint_dir / step_name(5)} from "
        f"{remote}"]
    assert not [m for e, m in emitted if e == "note"]


class FailsOnce(Syncer):
    """A remote whose first fetch of a step fails with EIO (a moment's NFS error), then works."""

    failed: list[str] = []

    def fetch_step(self, name, local_root, only_if):
        if not FailsOnce.failed:
            FailsOnce.failed.append(name)
            raise SyncError(f"fetch from {self.remote_url} failed") from OSError(5, "Input/output error")
        return super().fetch_step(name, local_root, only_if)


class NoRoom(Syncer):
    """A scratch without room for the remote's step (ENOSPC while it is downloaded)."""

    def fetch_step(self, name, local_root, only_if):
        raise SyncError(f"fetch from {self.remote_url} failed") from OSError(28, "No space left on device")


def damage(remote: Path, step: int) -> None:
    """A remote step whose manifest and trainer_state are whole (the look takes it) but whose weights are not."""
    files = [p for p in (remote / step_name(step)).iterdir() if p.suffix != ".json"]
    tensors = max(files, key=lambda p: p.stat().st_size)
    raw = bytearray(tensors.read_bytes())
    raw[-1] ^= 0xFF
    tensors.write_bytes(bytes(raw))


def test_a_damaged_newer_remote_step_is_set_aside_and_the_next_newer_one_taken_else_scratchs_said(tmp_path, weights):
    """Before: the first damaged step ended the look, and scratch's 2 was resumed under a remote holding a valid 5."""
    scratch, remote = tmp_path / "shm" / "checkpoints", tmp_path / "nfs" / "run"
    synced_elsewhere(tmp_path, remote, weights, 5)
    synced_elsewhere(tmp_path, remote, weights, 7)
    damage(remote, 7)
    save(scratch, 2, weights)
    logs: list[str] = []
    got = scratch_behind.fetch_over_scratch(Syncer(scratch, str(remote), EXPECTED, log=logs.append), scratch, EXPECTED)
    assert got.taken is not None and got.taken.name == step_name(5), logs
    assert (scratch / LATEST).read_text().strip() == step_name(5) and not (scratch / step_name(7)).exists()
    assert len(got.set_aside) == 1 and got.set_aside[0].startswith(
        f"run.remote's step 7 ({remote / step_name(7)}), newer than scratch's step 2, was not taken: it did not "
        f"validate")
    assert not (remote / step_name(7)).exists()  # set aside, as the fetch sets any invalid step aside

    synced_elsewhere(tmp_path, remote, weights, 9)  # the only newer one, damaged: scratch's (now 5), said
    damage(remote, 9)
    alone = scratch_behind.fetch_over_scratch(Syncer(scratch, str(remote), EXPECTED), scratch, EXPECTED)
    assert alone.taken is None and not alone.wait and len(alone.set_aside) == 1 and \
        alone.set_aside[0].startswith("run.remote's step 9 (") and "newer than scratch's step 5" in alone.set_aside[0]


def test_a_newer_remote_step_whose_fetch_fails_is_retried_never_scratchs_older_one_resumed(tmp_path, corpus, weights):
    """The fetch of the remote's newer 5 fails with EIO once: staging waits (`waiting_remote`) and retries it, and the
    run resumes from 5. Before: it went on from scratch's 2, said only in the sync log, and its syncs forked the
    remote's history. A remote that cannot be looked at on the retry is waited for too (its newer step was seen)."""
    from minilmd import names, scratch
    from minilmd.daemon.base.runstate import RunState, new_state
    from minilmd.daemon.base.worker import Inbox
    from minilmd.daemon.jobs.stagingworker import Staged, StagingWorker
    from waiting import wait_until

    cfg = load_config(write_config(tmp_path, corpus, name="back"))
    cfg.run_dir.mkdir(parents=True)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)
    remote = Path(cfg.run.remote)
    save(cfg.checkpoint_dir, 2, weights)
    synced_elsewhere(tmp_path, remote, weights, 5)
    emitted: list[tuple[str, str]] = []
    run_state = RunState(cfg.run_dir / names.STATE, new_state("back", cfg.run_dir, "back.toml"))
    kinds = [FailsOnce, Failing, NoRoom, Syncer]  # each try's remote: EIO fetching, then the look fails, no room, ok
    emit = lambda event, message, **_: emitted.append((event, message))
    staging = StagingWorker(cfg, Infra(), run_state, emit, Inbox(emit),
                            lambda expected: kinds[0](cfg.checkpoint_dir, str(remote), expected))
    staging.awaiting_remote, staging.fetch_retry_at = cfg.scratch_dir / names.STAGED_CORPUS, 0.0  # fetch only
    FailsOnce.failed.clear()
    staging.tick()  # the fetch starts
    for said in ("remote unavailable: scratch held step 2; run.remote holds step 5, newer, but it could not be "
                 f"fetched (fetch from {remote} failed)",
                 f"remote unavailable: run.remote {remote} cannot be read (",
                 "no room in scratch: scratch held step 2; run.remote holds step 5, newer, but it could not be "
                 "fetched"):
        wait_until(lambda: staging.worker is not None and staging.worker.done, 120, "the fetch")
        assert staging.tick() is None  # waiting for the remote's step, never scratch's
        assert run_state.staging.state == "waiting_remote" and run_state.staging.error.startswith(said), \
            run_state.staging.error
        assert emitted[-1][0] == "fetch" and "not going on from scratch's older step" in emitted[-1][1]
        assert staging.remote_newer == 5
        kinds.pop(0)
        staging.fetch_retry_at = 0.0
        staging.tick()  # the retry starts
    done = wait_until(lambda: staging.tick(), 120, "the fetch")
    assert isinstance(done, Staged) and done.fetched == cfg.checkpoint_dir / step_name(5), emitted
    assert (cfg.checkpoint_dir / LATEST).read_text().strip() == step_name(5)
    assert run_state.sync.state != "unavailable" and run_state.staging.state == "done"

    synced_elsewhere(tmp_path, remote, weights, 9)  # damaged: set aside, scratch's 5 resumed, said where status shows
    damage(remote, 9)
    staging.awaiting_remote, staging.fetch_retry_at = cfg.scratch_dir / names.STAGED_CORPUS, 0.0
    done = wait_until(lambda: staging.tick(), 120, "the fetch")
    assert isinstance(done, Staged) and done.fetched is None
    assert run_state.last_error.startswith("run.remote's step 9 (") and [m for e, m in emitted if e == "note"] == \
        [run_state.last_error]
