"""A start whose scratch holds a DPO run's step 0 saved by a stopped reference pass that the remote's step 0 is
further on than: the remote's is taken.

A machine comes back to a scratch it kept (a reboot into a local disk's scratch, a Slurm job requeued onto a node it
ran on earlier) that holds an older stop of the pass (400/3,000 pairs), while another machine went on meanwhile and
the sync put its further stop on run.remote (1,200/3,000: daemon/jobs/sync_pass.py). A start resumed from scratch
when it held any checkpoint, so it went on from 400 and computed again the 800 pairs done elsewhere. Now the one rule
of a scratch behind the remote (daemon/jobs/scratch_behind.py judge: `run --check` and staging alike) takes the
remote's step 0 when scratch's newest checkpoint is a stopped pass's step 0 and the remote's newest valid one, as the
fetch would take it (peek_latest), is a step 0 further on the same pairs (checkpoint_contents.further_pass, the sync's
rule, by the two manifests): staging fetches it in place of scratch's, downloaded, hashed and validated as any
fetched step. Scratch's stays when it is as far or further, and when the remote cannot be looked at now (no wait:
scratch has a checkpoint to go on from; said). What is here: the pass's own tests and words. Torch-free.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minilmd.checkpoint_contents import pass_words, reference_pass
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.names import step_name

PASS_STEP = step_name(0)
"""The step a stopped reference pass saves (the run's first checkpoint): resumed from here, synced from here."""


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
