"""A LoRA run with checkpoints whose init.from is edited (another run's config, another .pth): its checkpoints hold
adapters alone, which resume only on the base they were trained on, and the copy of that base staged in scratch
(`<scratch>/init`) is the only one when there is no run.remote. `run --check` refuses the edit (exit 2, naming both
bases and the way on) and the launch refuses it before staging anything: `<scratch>/init` stays byte for byte;
init.from put back resumes the run. Before (a new user's report), `--check` said OK with a note that "[init] is read
only at a run's first start" (true of a full fine-tune, not of LoRA), the launch staged the new base over the old
one, the trainer refused it (exit 2), and the end said it kept "the LoRA base its adapters were trained on"."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from base_copy_helpers import files_of
from minilmd import checkpoint_dirs, names, protocol
from minilmd.config import load_config
from minilmd.daemon.jobs import basecopy, initstage, lorabase
from minilmd.init_moved import lora_base_refused
from minilmd.init_source import STAGED_RECORD, InitSourceError, fingerprint, resolve, same_source
from minilmd.model_shapes import expected_state_shapes
from supervisor_helpers import cli, run_supervisor, start_supervisor, wait_or_kill, write_config

pytestmark = pytest.mark.slow  # real supervisors and real trainers

LORA = {"rank": 4, "alpha": 8.0}


def _base(path: Path, config: Path, seed: int) -> Path:
    """A MiniMind .pth of the run's model: random weights drawn from `seed`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    shapes = expected_state_shapes(load_config(config).model)
    torch.save({k: torch.randn(s, generator=gen) * 0.02 for k, s in shapes.items()}, path)
    return path


def _config(tmp_path: Path, corpus, remote: bool, base: Path, steps: int) -> Path:
    return write_config(tmp_path, corpus, remote=remote, init={"from": str(base)}, lora=LORA,
                        train={"max_steps": steps, "checkpoint_every": 2}, restart={"hang_timeout": "120s"})


def _out(tmp_path: Path) -> str:
    return (tmp_path / "supervisor.out").read_text()


@pytest.mark.parametrize("remote", [False, True], ids=["no remote", "remote"])
def test_an_edited_init_from_is_refused_before_the_staged_base_is_touched_and_put_back_resumes(tmp_path, corpus,
                                                                                               remote):
    sft = tmp_path / "share" / "sft.pth"
    config = _config(tmp_path, corpus, remote, sft, 4)
    _base(sft, config, seed=1)
    pretrain = _base(tmp_path / "share" / "pretrain.pth", config, seed=2)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, timeout=300, fake=False) == 0, _out(tmp_path)[-3000:]
    staged, ckpts = cfg.scratch_dir / names.INIT_DIR, cfg.checkpoint_dir
    trained_on = json.loads((staged / STAGED_RECORD).read_text())
    before = {"init": files_of(staged), "checkpoints": files_of(ckpts)}
    if remote:
        before["remote init"] = files_of(Path(cfg.run.remote) / basecopy.REMOTE_BASE)

    done = cli("run", "--check", str(_config(tmp_path, corpus, remote, pretrain, 4)), timeout=180)
    assert done.returncode == 0 and "run is done" in done.stdout, done.stdout + done.stderr  # stages nothing
    edited = _config(tmp_path, corpus, remote, pretrain, 8)  # the user's edit: another run's base
    check = cli("run", "--check", str(edited), timeout=180)
    said = check.stdout + check.stderr
    assert check.returncode == protocol.SUPERVISOR_CONFIG, said
    assert f"init.from = '{pretrain}'" in check.stderr and f"init.from = '{sft}'" in check.stderr, said
    assert "step 4" in check.stderr and "new run.dir" in check.stderr, said
    assert "read only at a run's first start" not in said and "\nOK" not in check.stdout, said

    launch = tmp_path / "edited.out"
    assert wait_or_kill(start_supervisor(edited, launch, fake=False), 300) == protocol.SUPERVISOR_CONFIG
    said = launch.read_text()
    assert f"init.from = '{sft}'" in said and "staging" not in said, said
    after = {"init": files_of(staged), "checkpoints": files_of(ckpts)}
    if remote:
        after["remote init"] = files_of(Path(cfg.run.remote) / basecopy.REMOTE_BASE)
    assert after == before  # the base the adapters were trained on, byte for byte; nothing staged, nothing trained

    back = _config(tmp_path, corpus, remote, sft, 8)  # init.from put back
    assert run_supervisor(back, tmp_path, timeout=300, fake=False) == 0, _out(tmp_path)[-3000:]
    newest = checkpoint_dirs.list_checkpoints(ckpts)[-1]
    assert newest.name == "step-00000008"
    assert same_source(trained_on, json.loads((newest / names.TRAINER_STATE).read_text())["init"])


def _checkpoint_recording(cfg, init: dict, step: int = 4) -> Path:
    """A checkpoint in scratch whose trainer_state records the base `init` (what staging and the rule read of it)."""
    ckpt = cfg.checkpoint_dir / f"step-{step:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / names.MANIFEST).write_text("{}")
    (ckpt / names.TRAINER_STATE).write_text(json.dumps({"step": step, "init": init}))
    return ckpt


def test_staging_asks_the_same_rule_and_replaces_no_staged_base(tmp_path, corpus):
    """Where the launch's look at the checkpoint could not read its record (a remote that did not answer then), the
    staging thread asks the rule itself, with the checkpoint it fetched: refused for good (exit 2, InitSourceError),
    before `<scratch>/init` is touched."""
    sft = tmp_path / "share" / "sft.pth"
    config = _config(tmp_path, corpus, False, sft, 8)
    _base(sft, config, seed=1)
    pretrain = _base(tmp_path / "share" / "pretrain.pth", config, seed=2)
    cfg = load_config(config)
    staged = initstage.stage_init(str(sft), cfg.scratch_dir)
    _checkpoint_recording(cfg, json.loads((staged / STAGED_RECORD).read_text()))
    before = files_of(staged)

    edited = load_config(_config(tmp_path, corpus, False, pretrain, 8))
    with pytest.raises(InitSourceError) as e:
        initstage.stage_inputs(edited)
    assert str(e.value) == lora_base_refused(edited, json.loads((staged / STAGED_RECORD).read_text()),
                                             f"step 4, in scratch {cfg.checkpoint_dir}")
    assert files_of(staged) == before
    assert initstage.stage_inputs(cfg)["init.staged"] == str(staged) and files_of(staged) == before


def test_the_rule_refuses_only_a_lora_run_whose_checkpoint_records_another_init_from(tmp_path, corpus):
    sft, other = tmp_path / "sft.pth", tmp_path / "other.pth"
    cfg = load_config(_config(tmp_path, corpus, False, other, 8))
    record = {"from": str(sft), "kind": "minimind", "path": str(sft), "sha256": "ab" * 32}
    refused = lora_base_refused(cfg, record, "step 4, in scratch /s")
    assert refused.startswith(f"init.from = '{other}', but this LoRA run's checkpoints (step 4, in scratch /s) "
                              f"hold adapters trained on the base init.from = '{sft}' gave: {sft} (a .pth: weights "
                              f"alone, no step nor source recorded; sha256 ab"), refused
    assert refused.endswith(f"Put init.from = '{sft}' back to resume this run; for adapters on '{other}', give the "
                            f"config a new run.dir (and run.remote)"), refused
    assert lora_base_refused(cfg, {**record, "from": str(other)}, "step 4") == ""  # the base it was trained on
    assert lora_base_refused(cfg, None, "step 4") == "" and lora_base_refused(cfg, {"kind": "x"}, "step 4") == ""
    cfg.lora.rank = 0  # a full fine-tune resumes its own weights: a note (init_moved.names_another), no refusal
    assert lora_base_refused(cfg, record, "step 4") == ""


def test_the_same_base_moved_to_another_path_is_no_other_base(tmp_path, corpus):
    """The base's bytes at another path (a share remounted elsewhere, a directory renamed) are the base the adapters
    were trained on: told by its fingerprint, as the trainer tells it, not by init.from's text."""
    sft = tmp_path / "share" / "sft.pth"
    config = _config(tmp_path, corpus, False, sft, 8)
    _base(sft, config, seed=1)
    record = {**fingerprint(resolve(str(sft))), "from": str(sft)}
    moved = tmp_path / "moved" / "sft.pth"
    moved.parent.mkdir()
    shutil.copyfile(sft, moved)
    assert lora_base_refused(load_config(_config(tmp_path, corpus, False, moved, 8)), record, "step 4") == ""
    other = _base(tmp_path / "share" / "pretrain.pth", config, seed=2)
    assert lora_base_refused(load_config(_config(tmp_path, corpus, False, other, 8)), record, "step 4")
    moved.unlink()  # not there now: cannot be told the same, so refused (put it back)
    assert lora_base_refused(load_config(_config(tmp_path, corpus, False, moved, 8)), record, "step 4")


def test_a_failed_run_keeps_its_staged_base_saying_it_is_the_adapters_base_only_when_it_is(tmp_path, corpus):
    """On main the end of a LoRA run that failed for good said it kept "the LoRA base its adapters were trained on"
    of whatever stood in `<scratch>/init`: after the launch above, the new base staged over theirs."""
    sft = tmp_path / "share" / "sft.pth"
    config = _config(tmp_path, corpus, False, sft, 8)
    _base(sft, config, seed=1)
    cfg = load_config(config)
    record = json.loads((initstage.stage_init(str(sft), cfg.scratch_dir) / STAGED_RECORD).read_text())
    ckpt = _checkpoint_recording(cfg, record)
    said = "the LoRA base its adapters were trained on (there is no run.remote: the only copy)"
    assert lorabase.kept_why(cfg) == said
    (ckpt / names.TRAINER_STATE).write_text(json.dumps({"step": 4, "init": {**record, "sha256": "0" * 64}}))
    assert lorabase.kept_why(cfg) == ""  # a copy of another base: given back with the other inputs
    (ckpt / names.TRAINER_STATE).write_text(json.dumps({"step": 4}))  # a checkpoint that records no base
    assert lorabase.kept_why(cfg).startswith("the LoRA base its adapters may have been trained on (what the newest "
                                             "checkpoint records of its base, or the copy's record, cannot be read)")
