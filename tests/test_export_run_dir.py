"""`minilmd sample`, `chat` and `export` given a run directory, as every other command takes one
(trainer/model/export_source.py resolve_checkpoint): the checkpoint a resume of the run would take (the newest that
validates, of its scratch's and its run.remote's, checkpoint_select), said on stderr, nothing moved; a run
directory without its run.toml is told as one, with where checkpoints are kept. Before: `RUN_DIR: not a
checkpoint (no model.safetensors) and no LATEST or step-* checkpoint under it`, and no word of where they are.
`minilmd verify RUN_DIR` verifies every checkpoint of those same roots (checkpoint_select.run_roots), each with its
root, and names the one a resume would take; before, it found `no checkpoint at RUN_DIR` and exited 1."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import load_config
from minilmd.names import MODEL_FILE, RUN_CONFIG_COPY, STATE
from minilmd.trainer.model.export_paths import ExportError
from minilmd.trainer.model.export_source import resolve_checkpoint
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


def test_sample_of_a_run_directory_resolves_it_once_and_loads_the_checkpoint_it_judged(run, monkeypatch):
    """The owner note judges the checkpoint the run directory resolves to, and the load validates that directory:
    find_latest's validation, then the load's, each of step 3 once. Before: the note's resolution, the loader's own
    (find_latest again: every byte hashed again, LATEST free to have moved on) and its validation, three."""
    from minilmd import checkpoint as ck

    run_dir, cfg = run
    validated: list[Path] = []
    real = ck.validate_keeping
    monkeypatch.setattr(ck, "validate_keeping", lambda path, *args, **kwargs: validated.append(path) or
                        real(path, *args, **kwargs))
    done = CliRunner().invoke(app, ["sample", str(run_dir), "--prompt", "hello", "--max-new-tokens", "2",
                                    "--temperature", "0"])
    assert done.exit_code == 0, done.output
    assert validated == [cfg.checkpoint_dir / "step-00000003"] * 2, validated


def test_export_with_an_unknown_format_looks_for_no_checkpoint(run, monkeypatch, tmp_path):
    from minilmd import checkpoint as ck

    run_dir, _ = run
    monkeypatch.setattr(ck, "validate_keeping", lambda *_a, **_k: pytest.fail("a checkpoint validated"))
    done = CliRunner().invoke(app, ["export", str(run_dir), "--format", "gguf", "--out", str(tmp_path / "o")])
    assert done.exit_code == 1 and "--format 'gguf': use minimind, hf or peft" in done.output, done.output


def test_a_run_directory_without_its_run_toml_says_where_checkpoints_are(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / STATE).write_text(json.dumps({"phase": "done"}))
    with pytest.raises(ExportError, match=r"a run directory without its run\.toml, which says where its checkpoints "
                                          r"are: give its run\.remote, or its scratch's checkpoints directory"):
        resolve_checkpoint(run_dir)


def _damage(step_dir: Path) -> None:
    with open(step_dir / MODEL_FILE, "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\xff" * 8)


def _verify(*args: str):
    return CliRunner().invoke(app, ["verify", *args])


def test_minilmd_verify_takes_a_run_directory_every_checkpoint_of_its_scratch_and_run_remote(run):
    """Every checkpoint of the run's scratch and of its run.remote, each said with its root, and the one a resume
    would take (the scratch's step 3, the newest); exit 0: all valid."""
    run_dir, cfg = run
    remote = run_dir.parent / "remote"
    done = _verify(str(run_dir))
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        f"{run_dir}: a run directory; its checkpoints in {cfg.checkpoint_dir} (scratch) and {remote} (run.remote)",
        f"{cfg.checkpoint_dir / 'step-00000002'}: ok (scratch)",
        f"{cfg.checkpoint_dir / 'step-00000003'}: ok (scratch)",
        f"{remote / 'step-00000002'}: ok (run.remote)",
        f"a resume of the run would take {cfg.checkpoint_dir / 'step-00000003'}",
    ]


def test_a_run_whose_scratch_was_removed_at_its_end_names_it_gone_not_as_where_its_checkpoints_are(run, capsys):
    """A finished run's scratch is removed once its last checkpoint is on run.remote: verify, sample, chat and
    export name the remote alone as where the checkpoints are, and the scratch as gone."""
    run_dir, cfg = run
    remote = run_dir.parent / "remote"
    shutil.rmtree(cfg.scratch_dir)
    gone = f"; its scratch {cfg.checkpoint_dir} is gone (removed at the run's end, or by a reboot)"
    done = _verify(str(run_dir))
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        f"{run_dir}: a run directory; its checkpoints in {remote} (run.remote){gone}",
        f"{remote / 'step-00000002'}: ok (run.remote)",
        f"a resume of the run would take {remote / 'step-00000002'}",
    ]
    assert resolve_checkpoint(run_dir) == remote / "step-00000002"
    assert f"the newest valid checkpoint of {remote} (the one a resume would take){gone}\n" in capsys.readouterr().err


@pytest.mark.parametrize("damaged", ["scratch step 3", "run.remote step 2"])
def test_minilmd_verify_of_a_run_directory_exits_1_naming_the_invalid_checkpoint_and_its_root(run, damaged):
    """One damaged checkpoint in either root: exit 1, it is INVALID with its reason and its root, nothing moved;
    the one a resume would take is the next valid (the scratch's step 2 before the remote's of the same step)."""
    run_dir, cfg = run
    remote = run_dir.parent / "remote"
    bad = cfg.checkpoint_dir / "step-00000003" if damaged == "scratch step 3" else remote / "step-00000002"
    _damage(bad)
    before = sorted(p.name for root in (cfg.checkpoint_dir, remote) for p in root.iterdir())
    done = _verify(str(run_dir), "--json")
    assert done.exit_code == 1, done.output
    report = json.loads(done.output)
    [invalid] = [entry for entry in report["checkpoints"] if not entry["ok"]]
    assert invalid["path"] == str(bad) and invalid["root"] == damaged.split()[0], invalid
    assert any("sha256 mismatch" in problem for problem in invalid["problems"]), invalid
    assert len(report["checkpoints"]) == 3
    want = cfg.checkpoint_dir / ("step-00000002" if damaged == "scratch step 3" else "step-00000003")
    assert report["run"]["resume"] == str(want)
    assert [root["kind"] for root in report["run"]["roots"]] == ["scratch", "run.remote"]
    assert sorted(p.name for root in (cfg.checkpoint_dir, remote) for p in root.iterdir()) == before  # none moved
    shown = _verify(str(run_dir))
    assert shown.exit_code == 1 and f"{bad}: INVALID ({damaged.split()[0]})" in shown.output, shown.output


def test_minilmd_verify_of_a_run_directory_whose_run_toml_is_unusable_says_so(run):
    """A run.toml that cannot be read (here not TOML): exit 1, naming it and what it is for."""
    run_dir, _ = run
    (run_dir / RUN_CONFIG_COPY).write_text("[run\n")
    done = _verify(str(run_dir))
    assert done.exit_code == 1
    assert f"{run_dir}: INVALID" in done.output and "a run directory whose run.toml, which says where its " \
        "checkpoints are, cannot be used" in done.output, done.output


def test_a_run_whose_best_names_another_step_says_so_and_how_to_take_it(run, capsys):
    """An early-stopped run: the run directory (or a root) stands for LATEST, as documented, but a next stage's
    init.checkpoint = "best" takes BEST; one line on stderr says which step BEST names and how to export it."""
    import dataclasses

    from minilmd.names import BEST, LATEST, TRAINER_STATE
    from minilmd.trainer.checkpoint import save as ckpt_io
    from minilmd.trainer.model import export_source

    run_dir, cfg = run
    remote = Path(cfg.run.remote)
    model = tiny_model(seed=1)
    state = {"step": 1, "config": {"model": dataclasses.asdict(model.config), "data": {"prepared": ""}},
             "early_stop": {"metric": "val_loss", "best_step": 1, "best_value": 2.5, "since_best": 0}}
    ckpt_io.save(remote, 1, model.state_dict(), torch.optim.AdamW(model.parameters()).state_dict(), state)
    assert json.loads((remote / "step-00000001" / TRAINER_STATE).read_text())["early_stop"]["best_value"] == 2.5
    (remote / LATEST).write_text("step-00000002\n")  # as the early stop left it: its newest
    (remote / BEST).write_text("step-00000001\n")
    assert resolve_checkpoint(run_dir) == cfg.checkpoint_dir / "step-00000003"
    said = capsys.readouterr().err
    assert f"BEST names step 1 (best val loss 2.5000): export {remote / BEST} for it" in said, said
    export_source._say_once.cache_clear()  # said once a process: the same line again below
    assert resolve_checkpoint(remote) == remote / "step-00000002"  # the root's LATEST: the same line
    assert f"BEST names step 1 (best val loss 2.5000): export {remote / BEST} for it" in capsys.readouterr().err
    (remote / BEST).write_text("step-00000002\n")  # BEST is the one taken: nothing to say
    resolve_checkpoint(remote)
    assert "BEST names" not in capsys.readouterr().err
