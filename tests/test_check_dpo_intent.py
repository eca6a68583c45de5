"""`run --check` says, as `note:` lines, what a DPO (or SFT) config would do that its user does not mean
(minilmd/stage_notes.py stage_notes): an init.from checkpoint root of a run still training (a launch starts from its
half-trained newest checkpoint; only the run's config or directory waits), DPO without init.from or from a model
trained on text, a corpus prepared with another tokenizer or chat template than init.from's checkpoint, and settings
the corpus's stage ignores. On main each of these passed `--check` without a word, and the trainer trained DPO from
random weights without one too. The checkpoints are fakes: their
manifest.json, trainer_state.json (the model of the run's config, so that init.from is accepted) and tokenizer
files, all `--check` reads of them."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from in_process import train_in_process
from minilmd.cli import app
from minilmd.config import load_config
from minilmd.protocol import EXIT_DONE
from trainer_corpus import write_config


def _check(config) -> str:
    result = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def _dpo(tmp_path, corpus, name="dpo", **sections):
    train = {"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, **sections.pop("train", {})}
    return write_config(tmp_path, corpus, name=name, data={"val_windows": 16, **sections.pop("data", {})},
                        train=train, **sections)


def _source_root(tmp_path, config, corpus_dir, step, total, template=True, tokenizer=None, **state_extra):
    """A checkpoint root of the SFT run "sft" (run.dir tmp_path/sft-run) whose LATEST names step `step` of a run of
    `total` steps, with the model of `config`, the tokenizer fingerprint and tokenizer files of `corpus_dir` (the
    chat template `template` when a string, the corpus's when True, none when False)."""
    meta = json.loads((corpus_dir / "meta.json").read_text(encoding="utf-8"))
    run_cfg = load_config(config).to_dict()
    run_cfg["run"]["dir"] = str(tmp_path / "sft-run")
    run_cfg["train"]["max_steps"] = total
    root = tmp_path / "nfs-sft"
    ckpt = root / f"step-{step:08d}"
    ckpt.mkdir(parents=True)
    state = {"step": step, "total_steps": total, "config": run_cfg,
             "fingerprints": {"data": "d" * 64, "tokenizer": tokenizer or meta["tokenizer_sha256"]}, **state_extra}
    (ckpt / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    (ckpt / "manifest.json").write_text(json.dumps({"step": step, "files": {}}), encoding="utf-8")
    shutil.copy(corpus_dir / "tokenizer.json", ckpt / "tokenizer.json")
    if template:
        config_json = json.loads((corpus_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        if isinstance(template, str):
            config_json["chat_template"] = template
        (ckpt / "tokenizer_config.json").write_text(json.dumps(config_json), encoding="utf-8")
    (root / "LATEST").write_text(ckpt.name, encoding="utf-8")
    return root


def test_init_from_the_root_of_a_run_still_training_is_said_and_a_finished_one_is_not(tmp_path, dpo_corpus):
    config = _dpo(tmp_path, dpo_corpus, init={"from": str(tmp_path / "nfs-sft")})
    _source_root(tmp_path, config, dpo_corpus[0], step=620, total=3000)
    said = _check(config)
    assert (f"note: init.from = '{tmp_path / 'nfs-sft'}': its newest checkpoint, step 620 of 3,000, is of a run "
            f"that has not finished: a launch now starts from that half-trained model. Name the run's config or run "
            f"directory ({tmp_path / 'sft-run'}) in init.from to wait for it to finish") in said, said
    best = tmp_path / "nfs-sft" / "step-00000400"  # its BEST, the checkpoint init.checkpoint = "best" takes
    shutil.copytree(tmp_path / "nfs-sft" / "step-00000620", best)
    (tmp_path / "nfs-sft" / "BEST").write_text(best.name, encoding="utf-8")
    assert ("its newest checkpoint, step 620 of 3,000, is of a run that has not finished; it takes step-00000400, its "
            "BEST: a launch now starts") in _check(config)
    shutil.rmtree(tmp_path / "nfs-sft")
    _source_root(tmp_path, config, dpo_corpus[0], step=3000, total=3000)
    assert "has not finished" not in _check(config)
    shutil.rmtree(tmp_path / "nfs-sft")  # stopped by early_stop: finished, below its total
    _source_root(tmp_path, config, dpo_corpus[0], step=800, total=3000,
                 early_stop={"metric": "val_loss", "best_step": 600, "best_value": 1.0, "since_best": 2})
    run_cfg = json.loads((tmp_path / "nfs-sft/step-00000800/trainer_state.json").read_text(encoding="utf-8"))
    run_cfg["config"]["early_stop"]["patience"] = 2
    (tmp_path / "nfs-sft/step-00000800/trainer_state.json").write_text(json.dumps(run_cfg), encoding="utf-8")
    assert "has not finished" not in _check(config)


def test_dpo_without_init_from_or_from_a_model_trained_on_text_is_said(tmp_path, dpo_corpus):
    said = _check(_dpo(tmp_path, dpo_corpus, name="alone"))
    # a WARNING as the update share's, not a `note:` (user10 #9)
    assert " WARNING: no [init] from on a preference corpus: DPO trains from randomly initialised weights" in said, \
        said
    config = _dpo(tmp_path, dpo_corpus, init={"from": str(tmp_path / "nfs-sft")})
    _source_root(tmp_path, config, dpo_corpus[0], step=100, total=100, template=False)
    said = _check(config)
    assert (f"{tmp_path / 'nfs-sft' / 'step-00000100'} holds no chat template (tokenizer_config.json): it was "
            f"trained on a text corpus (pretraining), not SFT") in said, said
    assert "no [init] from" not in said


@pytest.mark.slow  # a trainer and its reference pass
def test_the_trainer_warns_of_dpo_without_init_from(tmp_path, small_dpo_corpus):
    run = train_in_process(_dpo(tmp_path, small_dpo_corpus, name="alone", train={"max_steps": 1, "eval_every": 0}))
    assert run.returncode == EXIT_DONE, run.stderr[-2000:]
    assert "minilmd train: warning: no [init] from on a preference corpus: DPO trains from randomly initialised " \
           "weights" in run.stdout + run.stderr, run.stdout[-2000:]


def test_a_corpus_of_another_tokenizer_or_chat_template_than_init_froms_checkpoint_is_said(tmp_path, dpo_corpus):
    config = _dpo(tmp_path, dpo_corpus, init={"from": str(tmp_path / "nfs-sft")})
    _source_root(tmp_path, config, dpo_corpus[0], step=100, total=100)
    said = _check(config)  # the same tokenizer and template: nothing to say
    assert "another tokenizer" not in said and "another chat template" not in said and "no chat template" not in said
    template = json.loads((dpo_corpus[0] / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    shutil.rmtree(tmp_path / "nfs-sft")  # one character different
    _source_root(tmp_path, config, dpo_corpus[0], step=100, total=100, template=template.replace("\n", " ", 1))
    said = _check(config)
    assert (f"{tmp_path / 'nfs-sft' / 'step-00000100'} was trained with another chat template than the corpus "
            f"{dpo_corpus[0]} was rendered with") in said, said
    assert "another tokenizer" not in said
    shutil.rmtree(tmp_path / "nfs-sft")
    _source_root(tmp_path, config, dpo_corpus[0], step=100, total=100, tokenizer="e" * 64)
    said = _check(config)
    assert (f"was trained with another tokenizer than the corpus {dpo_corpus[0]} was prepared with (tokenizer.json "
            f"sha256 eeeeeeeeeeee") in said, said


def test_settings_the_corpus_stage_ignores_are_said(tmp_path, dpo_corpus):
    for mode in ("packed", "padded"):
        said = _check(_dpo(tmp_path, dpo_corpus, name=mode, data={"mode": mode}))
        assert f"note: data.mode = '{mode}' has no effect on a preference corpus" in said, said
    said = _check(_dpo(tmp_path, dpo_corpus, name="masked", data={"doc_mask": True}))
    assert "note: data.doc_mask = true has no effect on a preference corpus" in said, said
    said = _check(_dpo(tmp_path, dpo_corpus, name="beta", dpo={"beta": 0.2}))
    assert "has no effect" not in said, said


def test_a_dpo_section_off_a_preference_corpus_is_said_at_any_value(tmp_path, corpus, chat_corpus, dpo_corpus):
    """The stage follows the corpus: [dpo] on a text or chat corpus trains that corpus's stage. On main a [dpo] at
    its defaults said nothing (every copy of deploy/example.toml wrote beta = 0.1 out), so a DPO config pointed at
    the SFT corpus trained SFT without a word; the example now leaves [dpo] commented out, and any [dpo] written
    (an empty table, or a --set) is said."""
    said = _check(write_config(tmp_path, chat_corpus, name="sft", dpo={"beta": 0.2}))
    assert (f"note: [dpo] beta = 0.2 has no effect: {chat_corpus[0]} is a chat corpus, so this run's stage is SFT, "
            f"not DPO (DPO reads a preference corpus, one of `minilmd prepare --format dpo`); leave [dpo] out of a "
            f"config that is not DPO's") in said, said
    assert "note: [dpo] beta = 0.1 has no effect" in _check(write_config(tmp_path, chat_corpus, name="default",
                                                                         dpo={"beta": 0.1}))
    assert f"note: [dpo] has no effect: {chat_corpus[0]} is a chat corpus" in _check(
        write_config(tmp_path, chat_corpus, name="bare", dpo={}))  # `[dpo]` alone, no key under it
    said = _check(write_config(tmp_path, corpus, name="text", dpo={"beta": 0.1}))
    assert f"note: [dpo] beta = 0.1 has no effect: {corpus[0]} is a text corpus, so this run's stage is " \
           f"pretraining, not DPO" in said, said
    plain = write_config(tmp_path, chat_corpus, name="plain-sft")
    assert "[dpo]" not in _check(plain)
    said = " ".join(CliRunner().invoke(app, ["run", "--check", str(plain), "--set", "dpo.beta=0.1"]).output.split())
    assert "note: [dpo] beta = 0.1 has no effect" in said, said
    assert "[dpo]" not in _check(_dpo(tmp_path, dpo_corpus, name="dpo-default", dpo={"beta": 0.1}))


def test_sft_with_the_pretraining_mode_written_out_is_said_as_a_note(tmp_path, corpus, chat_corpus):
    """A copy of deploy/example.toml (mode = "packed" written out) for an SFT stage: the written key beats SFT's
    default, length bucketing, and the run trains windows cut across conversations. Before, `--check` said nothing."""
    said = _check(_dpo(tmp_path, chat_corpus, name="sft-packed", data={"mode": "packed"}))
    assert ("note: data.mode = 'packed' on a chat corpus: this SFT run trains windows of train.seq_len tokens cut "
            "across conversations") in said, said
    assert "not SFT's default 'bucketed'" in said and "leave data.mode out of an SFT config" in said, said
    for name, data in (("sft-default", {}), ("sft-bucketed", {"mode": "bucketed"}),
                       ("sft-padfree", {"mode": "packed", "doc_mask": True})):
        assert "data.mode = 'packed' on a chat corpus" not in _check(_dpo(tmp_path, chat_corpus, name=name, data=data))
    pretraining = _check(_dpo(tmp_path, corpus, name="pt-packed", data={"mode": "packed"}))
    assert "data.mode = 'packed'" not in pretraining, pretraining


def test_a_third_users_chat_template_in_init_froms_checkpoint_is_not_read(tmp_path, dpo_corpus):
    """The checkpoint's tokenizer_config.json is read as init_place reads the source: a file of the source's owner
    or ours. On main a third user's file there (another template) was read and compared."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root: a file of a third user")
    config = _dpo(tmp_path, dpo_corpus, init={"from": str(tmp_path / "nfs-sft")})
    template = json.loads((dpo_corpus[0] / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    root = _source_root(tmp_path, config, dpo_corpus[0], step=100, total=100, template=template.replace("\n", " ", 1))
    os.chown(root / "step-00000100" / "tokenizer_config.json", 54321, 54321)
    assert "another chat template" not in _check(config)


def test_a_dpo_config_on_the_sft_corpus_from_a_pth_is_said_at_check_and_at_the_launch(tmp_path, chat_corpus):
    """A new user's DPO config (a copy of deploy/example.toml: [dpo] at its defaults) pointed at the chat corpus,
    init.from a MiniMind .pth: the run trains SFT, and a .pth records nothing of how it was trained, so no note of
    init.from's could tell. On main `--check` said nothing, nor did the supervisor once it staged the .pth
    (init_from_notes, the launch's notes). From a checkpoint of the SFT stage (a chat template) it is said once."""
    import torch

    from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY, expected_state_shapes
    from minilmd.stage_notes import init_from_notes

    model = load_config(write_config(tmp_path, chat_corpus, name="shape")).model_dict()
    state = {k: torch.randn(shape).half() for k, shape in expected_state_shapes(model).items()}
    state[TIED_HEAD_KEY] = state[EMBED_KEY]
    torch.save(state, tmp_path / "sft.pth")
    config = write_config(tmp_path, chat_corpus, name="dpo", dpo={"beta": 0.1},
                          init={"from": str(tmp_path / "sft.pth")})
    note = (f"[dpo] beta = 0.1 has no effect: {chat_corpus[0]} is a chat corpus, so this run's stage is SFT, not DPO "
            f"(DPO reads a preference corpus, one of `minilmd prepare --format dpo`)")
    said = _check(config)
    assert f"note: {note}" in said, said
    assert [n for n in init_from_notes(load_config(config)) if "[dpo]" in n] == [
        f"{note}; leave [dpo] out of a config that is not DPO's"]
    from_sft = write_config(tmp_path, chat_corpus, name="docs-dpo", dpo={"beta": 0.1},
                            init={"from": str(tmp_path / "nfs-sft")})
    _source_root(tmp_path, from_sft, chat_corpus[0], step=100, total=100)  # the SFT stage's, a chat template
    said = _check(from_sft)
    assert said.count("[dpo]") == 2 and f"note: {note}" in said, said  # one note, naming [dpo] twice


def test_sft_without_init_from_is_said_as_dpo_without_it_is(tmp_path, corpus, chat_corpus):
    """user6 #11: a pretraining config pointed at the SFT corpus, no init.from, trained SFT from random weights; only
    `lr 1e-05 (SFT default ...)` hinted at it. A text corpus without init.from is pretraining: nothing said."""
    said = _check(write_config(tmp_path, chat_corpus, name="sft-scratch"))
    assert " WARNING: no [init] from on a chat corpus: this run trains SFT from randomly initialised weights" \
        in said, said
    assert "no [init] from" not in _check(write_config(tmp_path, corpus, name="pretrain"))
