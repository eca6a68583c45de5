"""An orphaned trainer SIGTERMed during a DPO reference pass it had resumed saves step 0 again, over the step 0 its
first stop saved: the supervisor judged "saved" by the newest step's number alone (0 > 0 is false) and said the
pass was lost, the next attempt computing it again, when it was kept. The newest checkpoint's directory (a save
publishes a new one) tells a step saved again from the same step left as it was."""
from __future__ import annotations

import shutil
from pathlib import Path

from minilmd import names
from minilmd.daemon.child.trainerwatch import newest_mark


class Cfg:
    def __init__(self, checkpoint_dir: Path):
        self.checkpoint_dir = checkpoint_dir


def _save(root: Path, step: int) -> None:
    """A save as the checkpoint writer publishes one: a new directory in place of the old."""
    made = root / f".tmp-{step}"
    made.mkdir()
    (made / "manifest.json").write_text("{}")
    old = root / names.step_name(step)
    if old.exists():
        shutil.rmtree(old)
    made.rename(old)


def test_step_zero_saved_again_reads_as_saved_and_left_alone_does_not(tmp_path):
    cfg = Cfg(tmp_path)
    assert newest_mark(cfg) is None
    _save(tmp_path, 0)
    before = newest_mark(cfg)
    assert newest_mark(cfg) == before  # nothing saved since
    _save(tmp_path, 0)
    assert newest_mark(cfg) != before and newest_mark(cfg)[0] == 0
    _save(tmp_path, 10)
    assert newest_mark(cfg)[0] == 10
