"""An attempt's progress, as the restart policy judges it at its end (daemon/child/trainerwatch.made_progress): a
DPO run's trainer killed over and over during its reference pass (an OOM kill, a hang) saves nothing but step 0
again, further on each time (the pass's periodic saves). That counted as no progress: `restart.no_progress_limit`
such kills in a row (5 by default) ended the run, though each attempt had kept its pairs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.child.process import Child
from minilmd.daemon.child.trainerwatch import launched, made_progress
from supervisor_helpers import write_config


def save_step(root: Path, step: int) -> None:
    """A step directory as a save publishes it: a new directory renamed into place (step 0 saved again included)."""
    fresh = root / f".tmp-{step}"
    fresh.mkdir(parents=True)
    (fresh / names.MANIFEST).write_text(json.dumps({"step": step, "files": {}}))
    final = root / names.step_name(step)
    if final.exists():
        shutil.rmtree(final)
    fresh.rename(final)


def child() -> Child:
    return Child(popen=None, attempt=1, log_path=Path("attempt.log"), command=[], started=0.0,  # type: ignore[arg-type]
                 start_ticks=None)


def test_step_0_saved_again_is_progress_and_nothing_saved_is_not(tmp_path, corpus):
    cfg = load_config(write_config(tmp_path, corpus))
    root = Path(cfg.checkpoint_dir)
    first = child()
    launched(first, cfg, -1)
    assert not made_progress(cfg, first)  # killed before any save
    save_step(root, 0)
    assert made_progress(cfg, first)  # the pass's first save

    second = child()
    launched(second, cfg, 0)
    assert not made_progress(cfg, second)  # killed before its next save of the pass
    save_step(root, 0)  # the pass saved further on: step 0 again
    assert made_progress(cfg, second)

    third = child()
    launched(third, cfg, 0)
    save_step(root, 1)
    assert made_progress(cfg, third)
    fourth = child()
    launched(fourth, cfg, 1)
    save_step(root, 0)  # an older step saved again is no progress past step 1
    assert not made_progress(cfg, fourth)
