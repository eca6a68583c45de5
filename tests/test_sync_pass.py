"""A DPO run's step 0 saved by a stopped reference pass on the remote, replaced by a further one
(daemon/jobs/sync_pass.py). Found by a reviewer: the remote kept the first step 0 it was given, so the progress of
every later stop of the pass (and the complete step 0) stayed in scratch, and a start on a new machine went on from
the first stop; and a resume from scratch and a local run.remote took scratch's step 0 however far behind. The
end-to-end case, real processes stopped on new machines: tests/test_dpo_reference_pass.py."""
from __future__ import annotations

import errno
import json

import pytest

from minilmd import checkpoint as ck
from minilmd.checkpoint_contents import further_pass
from minilmd.checkpoint_select import find_latest
from minilmd.daemon.jobs.sync import Syncer
from minilmd.dirfd import Dir
from minilmd.names import DPO_REFERENCE, MANIFEST, REFERENCE_PASS
from sync_helpers import EXPECTED, PAIRS, dirs, names, save, save_pass, weights  # noqa: F401  (fixtures)

STEP0 = "step-00000000"


def remote_done(remote) -> int | None:
    return json.loads((remote / STEP0 / MANIFEST).read_text()).get(REFERENCE_PASS, [None])[0]


@pytest.mark.slow  # three checkpoints saved and synced, each way
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "nfs-aside"])
def test_a_further_pass_replaces_the_remote_stopped_one_whole_and_the_complete_one_in_the_end(
        dirs, weights, monkeypatch, exchange):
    local, remote = dirs
    if not exchange:  # a file system that cannot swap (NFS): what stands there is renamed aside, then replaced
        monkeypatch.setattr(Dir, "exchange", lambda self, a, b: False)
    logs: list[str] = []
    syncer = Syncer(local, str(remote), EXPECTED, log=logs.append)
    save_pass(local, weights, 100)
    assert syncer.sync_newest().copied and remote_done(remote) == 100
    save_pass(local, weights, 300)  # a second stop of the pass: further on
    syncer.sync_newest()
    assert remote_done(remote) == 300  # before: 100, the first step 0 the remote was given
    assert (remote / STEP0 / DPO_REFERENCE).read_bytes() == (local / STEP0 / DPO_REFERENCE).read_bytes()
    assert any("in place of the stopped reference pass there (reference pass 100/761 pairs)" in m for m in logs), logs
    save_pass(local, weights, None)  # the pass's end: every sum
    syncer.sync_newest()
    assert REFERENCE_PASS not in json.loads((remote / STEP0 / MANIFEST).read_text())
    assert (remote / STEP0 / DPO_REFERENCE).read_bytes() == (local / STEP0 / DPO_REFERENCE).read_bytes()
    ck.validate(remote / STEP0, EXPECTED)
    assert [n for n in names(remote) if n.startswith(".tmp") or n == "quarantine"] == []  # the replaced removed


@pytest.mark.slow  # four checkpoints saved and synced
def test_a_pass_not_further_than_the_remote_one_is_not_copied_over_it(dirs, weights):
    local, remote = dirs
    syncer = Syncer(local, str(remote), EXPECTED)
    save_pass(local, weights, 300)
    syncer.sync_newest()
    held = (remote / STEP0 / MANIFEST).read_bytes()
    save_pass(local, weights, 200)  # a scratch left behind by another machine's further stop
    assert not syncer.sync_newest().copied
    assert (remote / STEP0 / MANIFEST).read_bytes() == held
    save_pass(local, weights, None)  # complete: further than any stopped pass
    syncer.sync_newest()
    assert REFERENCE_PASS not in json.loads((remote / STEP0 / MANIFEST).read_text())
    save_pass(local, weights, 500)  # nothing replaces a complete step 0
    syncer.sync_newest()
    assert REFERENCE_PASS not in json.loads((remote / STEP0 / MANIFEST).read_text())


def test_a_store_without_rename_keeps_the_first_stopped_pass_and_says_so_once(tmp_path, weights):
    local, url = tmp_path / "scratch", f"memory://sync-pass-{tmp_path.name}"
    logs: list[str] = []
    syncer = Syncer(local, url, EXPECTED, log=logs.append)
    save_pass(local, weights, 100)
    syncer.sync_newest()
    for done in (200, 300):
        save_pass(local, weights, done)
        syncer.sync_newest()
    assert json.loads(syncer.remote.read_text(STEP0, MANIFEST) or "{}")[REFERENCE_PASS] == [100, PAIRS]
    said = [m for m in logs if "keeps the DPO reference pass it was given first" in m]
    assert len(said) == 1 and "no rename" in said[0], logs


def test_a_manifest_and_reference_file_that_disagree_on_the_pass_do_not_validate(tmp_path, weights):
    with pytest.raises(ck.CheckpointInvalid, match="no dpo_reference.safetensors it lists holds one"):
        ck.validate(save_pass(tmp_path / "b", weights, None, notes={REFERENCE_PASS: [100, PAIRS]}), EXPECTED)
    with pytest.raises(ck.CheckpointInvalid, match="is not \\[pairs done, pairs in all\\]"):
        ck.validate(save_pass(tmp_path / "c", weights, 100, notes={REFERENCE_PASS: [900, PAIRS]}), EXPECTED)


def test_which_step_0_is_further():
    def at(done):
        return {"step": 0, **({} if done is None else {REFERENCE_PASS: [done, PAIRS]})}
    assert further_pass(at(300), at(100)) and further_pass(at(None), at(100))
    assert not further_pass(at(100), at(100)) and not further_pass(at(50), at(100))
    assert not further_pass(at(300), at(None)) and not further_pass(at(None), at(None))
    assert not further_pass({"step": 0, REFERENCE_PASS: [300, PAIRS + 1]}, at(100))  # other pairs: not comparable
    assert not further_pass({**at(None), "step": 2}, at(100))


def test_a_resume_takes_the_further_of_two_stopped_passes(tmp_path, weights):
    """A trainer on its own resumes from its scratch or its (local) run.remote, on equal steps scratch's: of two
    step 0s of a stopped pass, the further one now (a remote synced from another machine's later stop)."""
    scratch, remote = tmp_path / "scratch", tmp_path / "remote"
    save_pass(scratch, weights, 100)
    save_pass(remote, weights, 300)
    assert find_latest([scratch, remote], EXPECTED) == remote / STEP0  # before: scratch's, 200 pairs behind
    save_pass(scratch, weights, None)
    assert find_latest([scratch, remote], EXPECTED) == scratch / STEP0


def test_a_stop_in_the_last_batch_and_a_stop_saved_before_the_manifest_said_it_are_valid(tmp_path, weights):
    """Review: a stop during the pass's last batch saves [all pairs, all pairs], which validation refused (the next
    start quarantined it and computed the whole pass again); and a stopped pass saved by the minilmd before the
    manifest said how far (the `pass` tensor alone) was refused as well: a run preempted mid-pass across the upgrade
    lost its pass."""
    ck.validate(save_pass(tmp_path / "last", weights, PAIRS), EXPECTED)
    ck.validate(save_pass(tmp_path / "older", weights, 100, notes={}), EXPECTED)
    assert further_pass({"step": 0}, {"step": 0, REFERENCE_PASS: [PAIRS, PAIRS]})  # the complete one may replace it


@pytest.mark.slow  # two checkpoints saved and synced
def test_a_remote_with_a_later_step_keeps_its_step_0_and_a_failed_replacement_fails_no_sync(dirs, weights):
    """Review: the replacement ran after the newest step was copied and before retention, and its failure (a full
    remote) failed the whole sync, retention skipped, every later sync failing for good. Once the remote holds a
    later step nothing resumes from its step 0, so it is not replaced; and one that fails is said, the sync done."""
    local, remote = dirs
    logs: list[str] = []
    syncer = Syncer(local, str(remote), EXPECTED, log=logs.append)
    save_pass(local, weights, 100)
    syncer.sync_newest()
    save_pass(local, weights, 300)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    syncer._copy_up = full  # type: ignore[method-assign]  # the remote full for the replacement's copy
    assert syncer.sync_newest().step == 0
    assert remote_done(remote) == 100
    assert [m for m in logs if "not copied over the remote's: [Errno 28] No space left" in m], logs
    del syncer._copy_up
    save_pass(local, weights, 500)
    save(local, 2, weights)
    assert syncer.sync_newest().step == 2
    assert remote_done(remote) == 100  # held behind step 2: not replaced
