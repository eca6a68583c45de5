"""The staging of the probe and init.from as the supervisor's staging thread runs it (daemon/jobs/stagingworker.py):
initstage's copies, init.from's notes against the corpus, and a LoRA base's copy from the remote. Torch-free."""
from __future__ import annotations

from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.worker import ReadWatch
from minilmd.daemon.jobs import initstage
from minilmd.stage_notes import init_from_notes


def base_from_remote(cfg, trained_on, log, reads, synced_before: bool = True) -> bool:
    """basecopy.stage_from_remote, imported only in the staging thread: it reads checkpoints (numpy), which the
    supervisor never imports before staging (tests/test_import_budget.py)."""
    from minilmd.daemon.jobs import basecopy

    return basecopy.stage_from_remote(cfg, trained_on, log, reads, synced_before)


def stage_inputs(cfg, log, reads: ReadWatch, base_from_remote) -> tuple[dict[str, str], list[str] | None]:
    """initstage.stage_inputs (the `--set`s naming the staged copies), and, when it staged init.from's checkpoint
    for a run with none of its own (a fresh start from it), what that checkpoint says against the corpus
    (stage_notes.init_from_notes, `run --check`'s notes, read here in the staging thread as `--check` reads them:
    bounded, shared storage): a predecessor still training at `--check` had no checkpoint to compare, and a launch
    without `--check` says nothing. None when nothing was said: a LoRA run stages its base at every start, and what
    its first start noted stands."""
    sets = initstage.stage_inputs(cfg, log, reads, base_from_remote)
    fresh = "init.staged" in sets and not local_checkpoint_steps(cfg.checkpoint_dir)
    return sets, init_from_notes(cfg) if fresh else None
