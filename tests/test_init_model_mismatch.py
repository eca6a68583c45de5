"""A stage whose [model] is not init.from's (user5 #5): an SFT config without [model] (as the docs' sft.toml) after a
pretraining of a 64-wide model was refused with "model.hidden_size: source 64, run 768", 768 a default never written.
The refusal now says which run values are defaults, that [model] is not inherited from init.from, and gives the
source's values as [model] lines; pasted into the config, they are what `--check` accepts. For a predecessor still
to train (its config) and for a checkpoint (its trainer_state.json's config)."""
from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import load_config, toml_value
from minilmd.init_source import model_problems
from minilmd.protocol import SUPERVISOR_CONFIG
from trainer_corpus import TINY_MODEL, write_config


def _without_model(config, vocab: int):
    """The config with [model] holding vocab_size alone (the stage's sft.toml of the docs, with its corpus's
    vocabulary)."""
    text = config.read_text(encoding="utf-8")
    body = re.sub(r"\[model\]\n(?:[a-z_]+ = .*\n)*", f"[model]\nvocab_size = {vocab}\n", text)
    config.write_text(body, encoding="utf-8")
    return config


def _check(config):
    result = CliRunner().invoke(app, ["run", "--check", str(config)])
    return result.exit_code, result.output


def _pasted(config, said: str):
    """The [model] lines the refusal gives, added to the config's [model]."""
    block = said.split("values in this config's [model]:\n", 1)[1].split("\n")
    assert block[0].strip() == "[model]", said
    lines = []
    for line in block[1:]:
        if not re.match(r"^ {6}[a-z_]+ = ", line):
            break
        lines.append(line.strip())
    text = config.read_text(encoding="utf-8").replace("[model]\n", "[model]\n" + "".join(f"{x}\n" for x in lines))
    config.write_text(text, encoding="utf-8")
    return lines


def test_a_stage_without_model_after_a_small_pretraining_is_told_what_to_paste(tmp_path, corpus):
    first = write_config(tmp_path, corpus, name="pre")
    stage = _without_model(write_config(tmp_path, corpus, name="sft", init={"from": str(first)}), corpus[1])
    code, said = _check(stage)
    assert code == SUPERVISOR_CONFIG, said
    assert "run pre trains another model config: model.hidden_size: source 64, run 768 (default)," in said, said
    assert "(default: this config does not set them); [model] is not inherited" in said, said
    assert "[model] is not inherited from init.from" in said and "model.vocab_size" not in said, said
    lines = _pasted(stage, said)
    assert "hidden_size = 64" in lines and "num_hidden_layers = 2" in lines, lines
    code, said = _check(stage)
    assert code == 0 and "another model config" not in said, said


def test_a_written_value_is_not_called_a_default_and_a_checkpoint_says_the_same(tmp_path, corpus):
    first = write_config(tmp_path, corpus, name="pre")
    stage = write_config(tmp_path, corpus, name="sft", init={"from": str(first)}, model={"hidden_size": 128})
    code, said = _check(stage)
    assert code == SUPERVISOR_CONFIG and "model.hidden_size: source 64, run 128;" in said, said
    assert "run 128 (default)" not in said and "hidden_size = 64" in said, said

    ckpt = tmp_path / "nfs-pre" / "step-00000008"  # the predecessor's checkpoint: its recorded config
    ckpt.mkdir(parents=True)
    state = {"step": 8, "total_steps": 8, "config": load_config(first).to_dict()}
    (ckpt / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    (ckpt / "manifest.json").write_text(json.dumps({"step": 8, "files": {}}), encoding="utf-8")
    run = load_config(_without_model(write_config(tmp_path, corpus, name="sft2", init={"from": str(ckpt)}),
                                     corpus[1]))
    [problem] = model_problems(str(ckpt), run.model_dict(), "last", run.is_set)
    assert problem.startswith(f"{ckpt} holds another model config: model.hidden_size: source 64, run 768 "
                              f"(default),"), problem
    for key, value in TINY_MODEL.items():
        assert f"\n      {key} = {toml_value(value)}" in problem, problem


def test_a_pth_of_another_model_is_refused_by_the_trainer_in_the_same_words(tmp_path, corpus):
    """review 7 #4: the LoRA and hf refusals steer to a .pth (`export --format minimind`), whose model `--check`
    cannot read; the trainer then refused it as "model.hidden_size: source 64, run 768", no "(default)" mark and no
    [model] lines to paste (init_source.model_differences, gone). Now init_model.model_mismatch's words, pasted, fit."""
    import pytest
    import torch

    from minilmd.config import ConfigError
    from minilmd.model_shapes import expected_state_shapes
    from minilmd.trainer.checkpoint.init_weights import load_init

    source = load_config(write_config(tmp_path, corpus, name="pre")).model_dict()  # TINY_MODEL, the corpus's vocab
    pth = tmp_path / "pre.pth"
    torch.save({k: torch.zeros(shape) for k, shape in expected_state_shapes(source).items()}, pth)
    stage = _without_model(write_config(tmp_path, corpus, name="sft", init={"from": str(pth)}), corpus[1])
    with pytest.raises(ConfigError) as refused:
        load_init(load_config(stage))
    said = str(refused.value)
    assert ("its tensors' shapes are of another model config: model.hidden_size: source 64, run 768 (default), "
            in said), said
    assert "[model] is not inherited from init.from" in said and "\n      hidden_size = 64" in said, said
    _pasted(stage, said)
    weights, record = load_init(load_config(stage))  # the lines pasted: the .pth loads
    assert record["kind"] == "minimind" and weights.keys() == expected_state_shapes(source).keys()


def test_a_checkpoint_of_another_model_is_refused_by_the_trainer_in_the_same_words(tmp_path, corpus):
    """The trainer's own refusal of a checkpoint (`minilmd train` alone, or a source replaced after `--check`) said
    "saved by a different model config: model.hidden_size: source 64, run 768" (checkpoint_expect's words)."""
    import pytest

    from minilmd.config import ConfigError
    from minilmd.trainer.checkpoint.init_weights import load_init
    from weights_helpers import save_checkpoint, tiny_model

    ckpt = save_checkpoint(tmp_path / "pre" / "checkpoints", tiny_model(vocab_size=corpus[1]), step=1)
    stage = _without_model(write_config(tmp_path, corpus, name="sft", init={"from": str(ckpt)}), corpus[1])
    with pytest.raises(ConfigError) as refused:
        load_init(load_config(stage))
    said = str(refused.value)
    assert f"{ckpt} holds another model config: model.hidden_size: source 64, run 768 (default), " in said, said
    assert "[model] is not inherited from init.from" in said and "\n      hidden_size = 64" in said, said
