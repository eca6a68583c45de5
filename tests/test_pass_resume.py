"""A machine that comes back to a scratch it kept (a reboot into a local disk's scratch, a Slurm job requeued onto a
node it ran on earlier) holding an older stop of a DPO run's reference pass than the one another machine synced to
run.remote meanwhile (daemon/jobs/pass_resume.py, by the rule of a scratch behind the remote:
daemon/jobs/scratch_behind.py). Found by a reviewer: a start resumed from scratch whenever it held a
checkpoint, so it went on from its own 100 pairs and computed again the 200 done elsewhere, and `run --check` named
scratch's step 0. Now staging fetches the remote's further step 0 in its place, verified as any fetched step, and
`run --check` names it, with the pairs, by the same rule; scratch's stays when it is as far or further, and a later
step on the remote is taken as newer (tests/test_scratch_behind.py). The end-to-end case, real processes stopped on
two machines: tests/test_dpo_reference_pass.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from minilmd import bounded
from minilmd import checkpoint as ck
from minilmd.config import load_config
from minilmd.daemon.jobs import pass_resume, resumefrom, scratch_behind
from minilmd.daemon.jobs.sync import Syncer
from minilmd.names import DPO_REFERENCE, MANIFEST, REFERENCE_PASS
from supervisor_helpers import write_config
from sync_helpers import EXPECTED, PAIRS, corrupt, save, save_pass, weights  # noqa: F401  (fixtures)

STEP0 = "step-00000000"


@pytest.fixture(autouse=True)
def remote_looks_wait_long(monkeypatch):
    """The looks at the remote (further_on_remote, run --check's) wait for it SHARED_STORAGE_PROBE_S (5 s) at most:
    on two cores under load a local one could take that long, and the start would be said to resume from scratch's.
    What these tests show is the choice once the remote answers: the bound is raised out of load's reach."""
    monkeypatch.setattr(bounded, "SHARED_STORAGE_PROBE_S", 600.0)


def fetch_further(syncer: Syncer, scratch: Path) -> scratch_behind.Taken | None:
    """Staging's side of the rule: what it fetched over scratch's."""
    return scratch_behind.fetch_over_scratch(syncer, scratch, EXPECTED).taken


def judged(syncer: Syncer, scratch: Path) -> scratch_behind.Taken | None:
    """The rule alone: what a start would take over scratch's."""
    return scratch_behind.judge(syncer, scratch, scratch_behind.scratch_newest(scratch, EXPECTED)).taken


def done(root: Path) -> int | None:
    return json.loads((root / STEP0 / MANIFEST).read_text()).get(REFERENCE_PASS, [None])[0]


def synced_elsewhere(tmp_path: Path, remote: str, weights, *steps: int | None) -> None:
    """Another machine's stops of the pass (`steps`: pairs done, None for the complete one), each synced."""
    other = tmp_path / "elsewhere"
    syncer = Syncer(other, remote, EXPECTED)
    for pairs in steps:
        save_pass(other, weights, pairs)
        syncer.sync_newest()


@pytest.mark.slow  # six checkpoints saved, synced and fetched
def test_staging_takes_the_remotes_further_pass_over_scratchs_and_keeps_one_as_far_or_further(tmp_path, weights):
    scratch, remote = tmp_path / "shm" / "checkpoints", tmp_path / "nfs" / "run"
    synced_elsewhere(tmp_path, str(remote), weights, 300)
    save_pass(scratch, weights, 100)  # the kept scratch: an older stop
    logs: list[str] = []
    taken = fetch_further(Syncer(scratch, str(remote), EXPECTED, log=logs.append), scratch)
    assert taken is not None and taken.name == STEP0, logs  # before: scratch's 100 resumed
    assert done(scratch) == 300 and ck.validate(scratch / STEP0, EXPECTED)
    assert (scratch / STEP0 / DPO_REFERENCE).read_bytes() == (remote / STEP0 / DPO_REFERENCE).read_bytes()
    assert taken.words() == (f"run.remote's step 0 is further on (reference pass 300/{PAIRS} pairs) than "
                                f"scratch's (reference pass 100/{PAIRS} pairs)")
    assert not [p for p in scratch.iterdir() if p.name.startswith(".tmp")]
    assert fetch_further(Syncer(scratch, str(remote), EXPECTED), scratch) is None  # as far: stays
    save_pass(scratch, weights, 500)
    assert fetch_further(Syncer(scratch, str(remote), EXPECTED), scratch) is None  # further: stays
    assert done(scratch) == 500
    save_pass(scratch, weights, 100)  # behind, and the remote has trained on (a later step): that one, newer
    synced_elsewhere(tmp_path, str(remote), weights, None)
    save(tmp_path / "elsewhere", 2, weights)
    Syncer(tmp_path / "elsewhere", str(remote), EXPECTED).sync_newest()
    taken = judged(Syncer(scratch, str(remote), EXPECTED), scratch)
    assert taken is not None and taken.name == "step-00000002" and taken.further is None


@pytest.mark.slow  # three checkpoints saved, synced and fetched
def test_a_remote_further_pass_that_does_not_validate_leaves_scratchs(tmp_path, weights):
    scratch, remote = tmp_path / "shm" / "checkpoints", tmp_path / "nfs" / "run"
    synced_elsewhere(tmp_path, str(remote), weights, 300)
    corrupt(remote / STEP0 / DPO_REFERENCE)  # same size: only the download's hash sees it
    save_pass(scratch, weights, 100)
    logs: list[str] = []
    assert fetch_further(Syncer(scratch, str(remote), EXPECTED, log=logs.append), scratch) is None
    assert done(scratch) == 100 and ck.validate(scratch / STEP0, EXPECTED)
    assert [m for m in logs if "is invalid" in m and "moved to" in m], logs  # set aside, as any fetch does


@pytest.mark.slow  # three checkpoints saved and synced
def test_run_check_names_the_step_0_staging_takes_with_its_pairs(tmp_path, corpus, weights, monkeypatch):
    """`run --check`'s line and staging's fetch, by the one rule (scratch_behind.judge)."""
    cfg = load_config(write_config(tmp_path, corpus, name="back"))
    monkeypatch.setattr(resumefrom, "expectation", lambda cfg: EXPECTED)  # the tiny model these checkpoints hold
    remote = Path(cfg.run.remote)
    synced_elsewhere(tmp_path, str(remote), weights, 300)
    save_pass(cfg.checkpoint_dir, weights, 100)
    start = resumefrom.find(cfg, str(remote))
    assert start.line() == (  # before: `resumes from step 0 (scratch: ...)`, 200 pairs behind
        f"resumes from step 0 (remote: {remote / STEP0}: run.remote's step 0 is further on (reference pass "
        f"300/{PAIRS} pairs) than scratch's (reference pass 100/{PAIRS} pairs); staging fetches it in place of "
        f"scratch's and verifies its weights there)")
    assert fetch_further(Syncer(cfg.checkpoint_dir, str(remote), EXPECTED), cfg.checkpoint_dir)
    assert resumefrom.find(cfg, str(remote)).line() == \
        f"resumes from step 0 (scratch: {cfg.checkpoint_dir / STEP0}, reference pass 300/{PAIRS} pairs)"


@pytest.mark.slow  # five checkpoints saved, synced and fetched
def test_on_an_object_store_the_further_of_scratch_and_the_kept_first_stop_is_resumed(tmp_path, weights):
    """A store without rename keeps the first stop's step 0 (tests/test_sync_pass.py): a start whose scratch kept a
    further stop goes on from scratch's, and one whose scratch is behind that first stop takes the store's."""
    url, scratch = f"memory://pass-resume-{tmp_path.name}", tmp_path / "shm" / "checkpoints"
    synced_elsewhere(tmp_path, url, weights, 300, 400)  # the store keeps 300
    save_pass(scratch, weights, 500)
    assert fetch_further(Syncer(scratch, url, EXPECTED), scratch) is None and done(scratch) == 500
    save_pass(scratch, weights, 100)
    taken = fetch_further(Syncer(scratch, url, EXPECTED), scratch)
    assert taken is not None and done(scratch) == 300 and ck.validate(scratch / STEP0, EXPECTED)


@pytest.mark.slow  # two checkpoints saved and synced
def test_run_check_says_how_far_the_pass_of_the_remotes_step_0_got_and_only_of_a_step_0(tmp_path, corpus, weights,
                                                                                       monkeypatch):
    """An empty scratch: the start fetches the remote's newest. Its pass's words come from the one test of a
    stopped pass's step 0 (pass_resume.stopped_pass), as scratch's do."""
    cfg = load_config(write_config(tmp_path, corpus, name="fresh"))
    monkeypatch.setattr(resumefrom, "expectation", lambda cfg: EXPECTED)
    remote = Path(cfg.run.remote)
    synced_elsewhere(tmp_path, str(remote), weights, 300)
    assert resumefrom.find(cfg, str(remote)).line() == (
        f"resumes from step 0 (remote: {remote / STEP0}, reference pass 300/{PAIRS} pairs; staging fetches it into "
        f"scratch and verifies its weights there)")
    save(tmp_path / "elsewhere", 2, weights)
    Syncer(tmp_path / "elsewhere", str(remote), EXPECTED).sync_newest()
    assert resumefrom.find(cfg, str(remote)).line() == (
        f"resumes from step 2 (remote: {remote / 'step-00000002'}; staging fetches it into scratch and verifies its "
        f"weights there)")


def test_only_a_step_0_is_read_for_a_stopped_pass():
    def never() -> dict:
        raise AssertionError("read")

    def unreadable() -> dict:
        raise ck.CheckpointInvalid(STEP0, "manifest.json: not valid JSON")

    stopped = {"step": 0, REFERENCE_PASS: [300, PAIRS]}
    assert pass_resume.stopped_pass(0, lambda: stopped) == stopped
    assert pass_resume.stopped_pass(2, never) is None and pass_resume.stopped_pass(None, never) is None
    assert pass_resume.stopped_pass(0, lambda: {"step": 0}) is None  # its pass complete
    assert pass_resume.stopped_pass(0, unreadable) is None
