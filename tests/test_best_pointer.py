"""BEST works wherever a checkpoint does (issue 22): `verify`, `init.from`, `sample` and `export` take ROOT/BEST and
ROOT/LATEST as the step directory they name (checkpoint_dirs.named_checkpoint); the fetch from the remote brings
BEST's checkpoint back beside LATEST's; a stage whose init.from names an early-stopped run starts from its BEST
unless `[init] checkpoint = "last"`, and says which it took."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minilmd import checkpoint_dirs
from minilmd.cli import app
from minilmd.config import ConfigError, load_config
from minilmd.daemon.jobs.sync import Syncer
from minilmd.init_source import InitSourceError, fingerprint, resolve
from minilmd.names import BEST, LATEST, MANIFEST, TRAINER_STATE
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

pytestmark = pytest.mark.slow  # real runs and checkpoints behind each case

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def early_stopped(tmp_path_factory) -> Path:
    """A root as an early-stopped run leaves it: steps 1 and 2, LATEST naming 2, BEST naming 1."""
    root = tmp_path_factory.mktemp("best") / "ckpt"
    tok = train_tokenizer(root.parent / "tokenizer.json")
    save_checkpoint(root, tiny_model(seed=1), step=1, tokenizer=tok)
    save_checkpoint(root, tiny_model(seed=2), step=2, tokenizer=tok)
    (root / BEST).write_text("step-00000001\n")
    return root


def test_verify_takes_best_and_latest_as_the_checkpoint_they_name(early_stopped):
    runner = CliRunner()
    for pointer, step in ((BEST, "step-00000001"), (LATEST, "step-00000002")):
        result = runner.invoke(app, ["verify", str(early_stopped / pointer)])
        assert result.exit_code == 0, result.output
        assert result.output.strip() == f"{early_stopped / step}: ok"


def test_verify_of_a_pointer_naming_nothing_is_invalid_with_the_reason(tmp_path, early_stopped):
    root = tmp_path / "ckpt"
    shutil.copytree(early_stopped, root)
    (root / BEST).write_text("../../etc\n")
    result = CliRunner().invoke(app, ["verify", str(root / BEST)])
    assert result.exit_code == 1 and "INVALID" in result.output and "names no checkpoint" in result.output
    (root / BEST).write_text("step-00000007\n")
    result = CliRunner().invoke(app, ["verify", str(root / BEST)])
    assert result.exit_code == 1 and "names step-00000007, which holds no manifest.json" in result.output


def test_sample_and_export_take_best(tmp_path, early_stopped):
    runner = CliRunner()
    sampled = runner.invoke(app, ["sample", str(early_stopped / BEST), "--prompt", "hello", "--max-new-tokens", "3",
                                  "--temperature", "0"])
    assert sampled.exit_code == 0 and sampled.output.startswith("hello"), sampled.output
    exported = runner.invoke(app, ["export", str(early_stopped / BEST), "--format", "hf", "--out",
                                   str(tmp_path / "hf")])
    assert exported.exit_code == 0, exported.output


def test_init_from_a_root_takes_its_best_unless_last_and_records_which(early_stopped):
    best = resolve(str(early_stopped))
    assert best.path == early_stopped / "step-00000001" and best.pointer == BEST
    assert fingerprint(best)["pointer"] == BEST and fingerprint(best)["step"] == 1
    last = resolve(str(early_stopped), "last")
    assert last.path == early_stopped / "step-00000002" and last.pointer == LATEST


def test_init_from_a_pointer_file_is_the_checkpoint_it_names(early_stopped):
    assert resolve(str(early_stopped / BEST)).path == early_stopped / "step-00000001"
    assert resolve(str(early_stopped / BEST), "last").path == early_stopped / "step-00000001"  # named: as named
    assert resolve(str(early_stopped / LATEST)).path == early_stopped / "step-00000002"


def test_init_from_a_root_whose_best_names_nothing_is_refused(tmp_path, early_stopped):
    root = tmp_path / "ckpt"
    shutil.copytree(early_stopped, root)
    shutil.rmtree(root / "step-00000001")
    with pytest.raises(InitSourceError, match="holds no manifest.json.*init.checkpoint"):
        resolve(str(root))
    assert resolve(str(root), "last").path == root / "step-00000002"


def test_init_checkpoint_is_best_or_last(tmp_path, corpus):
    from supervisor_helpers import write_config

    assert load_config(write_config(tmp_path, corpus, name="a")).init.checkpoint == "best"
    assert load_config(write_config(tmp_path, corpus, name="b", init={"checkpoint": "last"})).init.checkpoint == "last"
    with pytest.raises(ConfigError, match='init.checkpoint = .newest.: must be "best" or "last"'):
        load_config(write_config(tmp_path, corpus, name="c", init={"checkpoint": "newest"}))


def test_the_fetch_brings_best_back_beside_latest(tmp_path, early_stopped):
    remote = tmp_path / "remote"
    shutil.copytree(early_stopped, remote)
    local = tmp_path / "scratch"
    logged: list[str] = []
    assert Syncer(local, str(remote), log=logged.append).fetch_latest() == local / "step-00000002"
    assert checkpoint_dirs.read_best(local) == "step-00000001" and checkpoint_dirs.read_latest(local) == \
        "step-00000002"
    assert (local / "step-00000001" / MANIFEST).read_bytes() == (remote / "step-00000001" / MANIFEST).read_bytes()
    assert any("fetched BEST" in line for line in logged), logged


def test_a_best_that_does_not_validate_is_not_fetched(tmp_path, early_stopped):
    remote = tmp_path / "remote"
    shutil.copytree(early_stopped, remote)
    (remote / "step-00000001" / TRAINER_STATE).write_text("[]")  # its hash no longer matches
    local = tmp_path / "scratch"
    logged: list[str] = []
    assert Syncer(local, str(remote), log=logged.append).fetch_latest() == local / "step-00000002"
    assert checkpoint_dirs.read_best(local) is None and not (local / "step-00000001").exists()
    assert any("BEST" in line and "not usable" in line for line in logged), logged


# --- real runs ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_early_stopped_run(tmp_path_factory, corpus):
    """A real pretraining run (6 steps, a checkpoint every 3) under `minilmd run`, finished, whose remote then says
    what an early stop would: BEST names step 3, LATEST step 6 (`patience` evals past the best)."""
    from supervisor_helpers import run_supervisor, write_config

    tmp = tmp_path_factory.mktemp("pipeline")
    config = write_config(tmp, corpus, name="pretrain", train={"max_steps": 6, "checkpoint_every": 3})
    assert run_supervisor(config, tmp, timeout=240, fake=False) == 0
    cfg = load_config(config)
    remote = Path(cfg.run.remote)
    assert checkpoint_dirs.read_latest(remote) == "step-00000006"
    if not (remote / "step-00000003").is_dir():  # the sync took only the newest: an early stop's sync copies BEST
        shutil.copytree(cfg.checkpoint_dir / "step-00000003", remote / "step-00000003")
    (remote / BEST).write_text("step-00000003\n")
    return tmp, config


def _next_stage(tmp: Path, corpus, before: Path, name: str, **init) -> tuple[Path, str]:
    from supervisor_helpers import run_supervisor, write_config

    config = write_config(tmp, corpus, name=name, init={"from": str(before), **init},
                          train={"max_steps": 2, "checkpoint_every": 2})
    assert run_supervisor(config, tmp, timeout=240, fake=False) == 0
    cfg = load_config(config)
    return config, (cfg.run_dir / "logs" / "attempt-0001.log").read_text()


@pytest.mark.slow
def test_the_next_stage_starts_from_the_best_of_an_early_stopped_run_and_says_so(finished_early_stopped_run, corpus):
    tmp, pretrain = finished_early_stopped_run
    remote = Path(load_config(pretrain).run.remote)
    config, log = _next_stage(tmp, corpus, pretrain, "sft")
    said = "(its BEST: its best validation by its early_stop.metric)"
    assert f"initialised from {remote / 'step-00000003'} (checkpoint) {said}" in log, log
    cfg = load_config(config)
    final = Path(cfg.run.remote) / "step-00000002"
    init = json.loads((final / TRAINER_STATE).read_text())["init"]
    assert (init["step"], init["pointer"]) == (3, BEST), init
    shown = subprocess.run([sys.executable, "-m", "minilmd.cli", "status", str(cfg.run_dir)], capture_output=True,
                           text=True).stdout
    lineage = next(line for line in shown.splitlines() if "lineage:" in line)
    assert "step-00000003 (step 3, its BEST" in lineage, shown


@pytest.mark.slow
def test_init_checkpoint_last_takes_the_latest_of_an_early_stopped_run(finished_early_stopped_run, corpus):
    tmp, pretrain = finished_early_stopped_run
    remote = Path(load_config(pretrain).run.remote)
    config, log = _next_stage(tmp, corpus, load_config(pretrain).run_dir, "sft-last", checkpoint="last")
    assert f"initialised from {remote / 'step-00000006'} (checkpoint) (its LATEST)" in log, log
    init = json.loads((Path(load_config(config).run.remote) / "step-00000002" / TRAINER_STATE).read_text())["init"]
    assert (init["step"], init["pointer"]) == (6, LATEST), init


@pytest.mark.slow
def test_a_run_resumed_on_a_new_machine_fetches_its_best_too(tmp_path, corpus):
    from reliability_helpers import remote_of_an_earlier_run
    from supervisor_helpers import run_supervisor

    # its budget raised past the remote's step 20 (a run done there is no launch: daemon/jobs/rundone.py)
    config, remote = remote_of_an_earlier_run(tmp_path, corpus, max_steps=25)
    cfg = load_config(config)
    (remote / BEST).write_text("step-00000010\n")

    assert run_supervisor(config, tmp_path, timeout=120) == 0
    assert checkpoint_dirs.read_best(cfg.checkpoint_dir) == "step-00000010"
    assert (cfg.checkpoint_dir / "step-00000010" / MANIFEST).is_file()
    verified = CliRunner().invoke(app, ["verify", str(cfg.checkpoint_dir / BEST)])
    assert verified.exit_code == 0, verified.output
    assert checkpoint_dirs.read_best(remote) == "step-00000010"
