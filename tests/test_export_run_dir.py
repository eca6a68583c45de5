"""`minilmd sample`, `chat` and `export` given a run directory, as every other command takes one
(trainer/model/export_paths.py resolve_checkpoint): the checkpoint a resume of the run would take (the newest that
validates, of its scratch's and its run.remote's, checkpoint_select), said on stderr, nothing moved; a run
directory without its run.toml is told as one, with where checkpoints are kept. Before: `RUN_DIR: not a
checkpoint (no model.safetensors) and no LATEST or step-* checkpoint under it`, and no word of where they are."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import load_config
from minilmd.names import MODEL_FILE, RUN_CONFIG_COPY, STATE
from minilmd.trainer.model.export_paths import ExportError, resolve_checkpoint
from trainer_corpus import write_config
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

torch.set_num_threads(1)


@pytest.fixture
def run(tmp_path, corpus):
    """(run directory holding its run.toml, its config): step 2 on the remote, steps 2 and 3 in scratch."""
    config = write_config(tmp_path, corpus, "r", run={"remote": str(tmp_path / "r" / "remote")})
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    shutil.copyfile(config, cfg.run_dir / RUN_CONFIG_COPY)
    tok = train_tokenizer(tmp_path / "tokenizer.json")
    for root, steps in ((tmp_path / "r" / "remote", (2,)), (cfg.checkpoint_dir, (2, 3))):
        for step in steps:
            save_checkpoint(root, tiny_model(seed=step), step=step, tokenizer=tok)
    return cfg.run_dir, cfg


def test_a_run_directory_stands_for_the_checkpoint_a_resume_would_take_said_and_nothing_moved(run, capsys):
    run_dir, cfg = run
    newest = cfg.checkpoint_dir / "step-00000003"
    assert resolve_checkpoint(run_dir) == newest  # the scratch's, newer than the remote's
    assert f"{run_dir}: a run directory: {newest}, the newest valid checkpoint of {cfg.checkpoint_dir} and " \
           f"{run_dir.parent / 'remote'}" in capsys.readouterr().err
    before = sorted(p.name for p in cfg.checkpoint_dir.iterdir())
    with open(newest / MODEL_FILE, "r+b") as f:  # damaged: the next older is taken, the damaged one left where it is
        f.seek(-8, 2)
        f.write(b"\xff" * 8)
    assert resolve_checkpoint(run_dir) == cfg.checkpoint_dir / "step-00000002"
    assert newest.is_dir() and sorted(p.name for p in cfg.checkpoint_dir.iterdir()) == before  # not quarantined


def test_minilmd_sample_takes_a_run_directory(run):
    run_dir, _ = run
    done = CliRunner().invoke(app, ["sample", str(run_dir), "--prompt", "hello", "--max-new-tokens", "3",
                                    "--temperature", "0"])
    assert done.exit_code == 0, done.output
    assert "the newest valid checkpoint of" in done.output and "hello" in done.output


def test_a_run_directory_without_its_run_toml_says_where_checkpoints_are(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / STATE).write_text(json.dumps({"phase": "done"}))
    with pytest.raises(ExportError, match=r"a run directory without its run\.toml, which says where its checkpoints "
                                          r"are: give its run\.remote, or its scratch's checkpoints directory"):
        resolve_checkpoint(run_dir)
