"""A start whose scratch holds a DPO run's step 0 saved by a stopped reference pass that the remote's step 0 is
further on than: the remote's is taken.

A machine comes back to a scratch it kept (a reboot into a local disk's scratch, a Slurm job requeued onto a node it
ran on earlier) that holds an older stop of the pass (400/3,000 pairs), while another machine went on meanwhile and
the sync put its further stop on run.remote (1,200/3,000: daemon/jobs/sync_pass.py). A start resumes from scratch
when it holds any checkpoint, so it went on from 400 and computed again the 800 pairs done elsewhere. Now
`further_on_remote` decides, for `run --check` (daemon/jobs/resumefrom.py) and staging (`fetch_further`) alike: when
scratch's one checkpoint is a stopped pass's step 0 and the remote's newest valid checkpoint, as the fetch would take
it (peek_latest), is a step 0 further on the same pairs (checkpoint_contents.further_pass, the sync's rule, by the two
manifests), staging fetches it in place of scratch's, downloaded, hashed and validated as any fetched step. Scratch's
stays when it is as far or further, when the remote holds a later step (a scratch behind the remote's steps is no
question of the pass: a start resumes from scratch, as ever), and when the remote cannot be looked at now (no wait:
scratch has a checkpoint to go on from). Torch-free.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd.checkpoint_contents import further_pass, pass_words, reference_pass
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.names import step_name
from minilmd.probes import bounded_probe

if TYPE_CHECKING:
    from minilmd.daemon.jobs.sync import Syncer

PASS_STEP = step_name(0)


@dataclass(frozen=True)
class FurtherPass:
    """The remote's step 0 a start takes in place of scratch's: their manifests."""

    held: dict
    """Scratch's step 0's manifest (a stopped pass's)."""
    found: dict
    """The remote's, further on."""

    def words(self) -> str:
        return f"run.remote's step 0 is further on ({pass_words(self.found)}) than scratch's ({pass_words(self.held)})"


def scratch_pass(checkpoint_dir: Path) -> dict | None:
    """The manifest of scratch's step 0 when it is scratch's one checkpoint and saved by a stopped reference pass
    (read bounded, as validation reads it); else None."""
    from minilmd.checkpoint import read_manifest  # numpy: only where a checkpoint is read

    if local_checkpoint_steps(checkpoint_dir) != [0]:
        return None
    return stopped_pass(0, lambda: read_manifest(checkpoint_dir / PASS_STEP))


def stopped_pass(step: int | None, read: Callable[[], object]) -> dict | None:
    """The manifest of a checkpoint at `step` when it is a step 0 saved by a stopped reference pass, read by `read`
    (scratch's or the remote's: only at step 0); else None, also for a manifest that cannot be read (the trainer's
    validation or the fetch says why). The one test of `scratch_pass`, and of `run --check`'s words for the step
    a start resumes (daemon/jobs/resumefrom.py)."""
    from minilmd.checkpoint import CheckpointError

    if step != 0:
        return None
    try:
        manifest = read()
    except CheckpointError:
        return None
    return manifest if isinstance(manifest, dict) and reference_pass(manifest) is not None else None


def further_on_remote(syncer: Syncer, checkpoint_dir: Path) -> FurtherPass | None:
    """The rule (module docstring): the remote's step 0 and scratch's when a start takes the remote's, else None.
    The remote is looked at for SHARED_STORAGE_PROBE_S at most."""
    held = scratch_pass(checkpoint_dir)
    if held is None:
        return None
    answered, found, _ = bounded_probe(_remote_step_0, syncer)
    return FurtherPass(held, found) if answered and found is not None and further_pass(found, held) else None


def _remote_step_0(syncer: Syncer) -> dict | None:
    """The manifest of the checkpoint the fetch would take (peek_latest) when it is step 0; None when it is another,
    none, or the remote is another run's (its claim) or of another model or corpus (the trainer's validation of
    scratch's judges that). Raises nothing but OSError (bounded_probe: no answer), which it would lose."""
    try:
        if syncer._claim_refused():
            return None
        name, _ = syncer.peek_latest()
        return syncer.remote.read_manifest(name).manifest if name == PASS_STEP else None
    except OSError:
        raise
    except Exception:  # noqa: BLE001 - a mismatch, a store that cannot be opened: scratch's stays
        return None


def fetch_further(syncer: Syncer, checkpoint_dir: Path) -> tuple[Path, FurtherPass] | None:
    """Staging's side: the remote's further step 0 fetched in place of scratch's (Syncer.fetch_step, only while the
    remote's manifest is still further than scratch's), with why; None when scratch's stays, also when the fetch
    fails or the remote's does not validate (the fetch sets it aside; the sync log says why)."""
    further = further_on_remote(syncer, checkpoint_dir)
    if further is None:
        return None
    try:
        fetched = syncer.fetch_step(PASS_STEP, checkpoint_dir, lambda manifest: further_pass(manifest, further.held))
    except Exception as e:  # noqa: BLE001 - a remote failing now: scratch's step 0 is a checkpoint to go on from
        syncer.log(f"sync: {further.words()}, but it could not be fetched ({e}): going on from scratch's")
        return None
    return (fetched, further) if fetched is not None else None
