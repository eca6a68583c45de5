"""Another user's run directory may name any place as its run.remote, the reader's own private one too (hostile
audit of stop 64, finding 1): `minilmd export HIS_RUN_DIR --out TEAM/x.pth --share all` as her exported her own
weights "as his run's" into a place he reads, and her stage with `[init] from = HIS_RUN_DIR` took her own
checkpoint as its base. Another user's run is now read only from a remote of that user's, or from one whose owner
record (owner.json, the sync's claim) names that very run (minilmd/run_owner.py remote_not_the_runs): the reader's
own runs are read as before, their config being hers."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from minilmd import names, run_owner
from minilmd.config import load_config
from minilmd.init_source import InitSourceError, predecessor
from minilmd.trainer.model.export_paths import ExportError
from minilmd.trainer.model.export_source import resolve_checkpoint
from trainer_corpus import write_config
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

torch.set_num_threads(1)

HIS = 64127
"""The other user: no passwd entry needed to own a file."""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: gives a run directory to another uid")


def _chown_tree(root: Path, uid: int) -> None:
    for path in (root, *root.rglob("*")):
        os.lchown(path, uid, uid)


@pytest.fixture
def his_run_naming_my_remote(tmp_path, corpus) -> tuple[Path, Path]:
    """(his run directory, whose run.toml names my remote; my remote, holding my checkpoint step 2)."""
    mine = tmp_path / "mine" / "remote"
    save_checkpoint(mine, tiny_model(seed=2), step=2, tokenizer=train_tokenizer(tmp_path / "tokenizer.json"))
    (mine / names.REMOTE_OWNER).write_text(json.dumps(run_owner.record(tmp_path / "mine" / "run", "mine")))
    (tmp_path / "his").mkdir()
    config = write_config(tmp_path / "his", corpus, "brun", run={"remote": str(mine)})
    run_dir = load_config(config).run_dir
    run_dir.mkdir(parents=True)
    shutil.copyfile(config, run_dir / names.RUN_CONFIG_COPY)
    (run_dir / names.STATE).write_text(json.dumps({"run": "brun", "phase": "done", "outcome": {
        "time": 1, "exit": 0, "reason": "the run finished", "ended": "finished"}}))
    _chown_tree(tmp_path / "his", HIS)
    return run_dir, mine


def test_another_users_run_naming_my_remote_is_neither_exported_nor_taken_as_a_base(his_run_naming_my_remote):
    run_dir, mine = his_run_naming_my_remote
    with pytest.raises(ExportError) as refused:
        resolve_checkpoint(run_dir)
    said = str(refused.value)
    assert f"{run_dir}: a run directory of uid {HIS}: its run.remote {mine} belongs to user root (uid 0), not to " \
           f"the run directory's owner (uid {HIS})" in said, said
    assert f"its owner record names the run directory {mine.parent / 'run'}" in said, said
    with pytest.raises(InitSourceError) as refused:
        predecessor(str(run_dir))
    assert f"its run.remote {mine} belongs to user root (uid 0)" in str(refused.value), refused.value


def test_his_run_is_read_from_his_remote_or_one_that_records_his_run(his_run_naming_my_remote):
    run_dir, mine = his_run_naming_my_remote
    (mine / names.REMOTE_OWNER).write_text(json.dumps(run_owner.record(run_dir, "brun")))  # claimed by his run
    assert resolve_checkpoint(run_dir) == mine / "step-00000002"
    assert predecessor(str(run_dir)).root == mine
    (mine / names.REMOTE_OWNER).unlink()
    _chown_tree(mine, HIS)  # his own remote, no record (an older minilmd's, or none written yet)
    assert resolve_checkpoint(run_dir) == mine / "step-00000002"
    assert predecessor(str(run_dir)).root == mine


def test_my_own_run_is_read_from_the_remote_its_config_names_whoever_owns_it(his_run_naming_my_remote):
    """A reader's own run directory names what she chose (a root-squashed share's remote is another uid's)."""
    run_dir, mine = his_run_naming_my_remote
    _chown_tree(run_dir.parent, os.geteuid())
    _chown_tree(mine, HIS)
    assert resolve_checkpoint(run_dir) == mine / "step-00000002"
