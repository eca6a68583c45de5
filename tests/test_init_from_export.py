"""init.from and exports (user5 #3): the message refusing a LoRA run as init.from said `--format hf --merge` (as
well as `--format minimind --merge`) makes a model to start from, but init.from refused that directory as "a
directory without manifest.json (not a checkpoint) and without LATEST (not a checkpoint root)". The advice names
the .pth alone now, and an export directory is refused as what it is. Nothing of it is read: its names are only
looked at (lstat, relative to the directory's descriptor)."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.init_source import InitSourceError, adapter_source, resolve
from minilmd.protocol import SUPERVISOR_CONFIG
from trainer_corpus import write_config


def _hf_export(where):
    where.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        (where / name).write_bytes(b"{}")
    return where


def test_the_lora_advice_names_only_what_init_from_takes():
    said = adapter_source("rank = 4")
    assert "--format minimind --merge --out merged.pth" in said and "init.from = that .pth" in said, said
    assert "--format hf --merge" not in said and "(or --format hf" not in said, said


def test_an_hf_export_as_init_from_is_refused_as_an_export_at_check(tmp_path, corpus):
    export = _hf_export(tmp_path / "exp" / "merged-hf")
    with pytest.raises(InitSourceError, match="an export .*not a checkpoint; init.from takes a checkpoint"):
        resolve(str(export), "best")
    config = write_config(tmp_path, corpus, name="from-hf", init={"from": str(export)})
    result = CliRunner().invoke(app, ["run", "--check", str(config)])
    said = " ".join(result.output.split())
    assert result.exit_code == SUPERVISOR_CONFIG, said
    assert "with model.safetensors but without manifest.json: an export (`minilmd export --format hf`" in said, said
    assert "--format minimind [--merge] --out model.pth" in said, said
    (export / "model.safetensors").unlink()  # any other directory: as before
    with pytest.raises(InitSourceError, match="without LATEST"):
        resolve(str(export), "best")


def test_a_directory_with_model_safetensors_alone_is_no_export_but_a_directory_without_a_manifest(tmp_path):
    """review 7 #5: "an export" was decided from model.safetensors alone, so a damaged checkpoint (its manifest.json
    lost, or copied by hand without it) was called an `export --format hf`. The hf layout has config.json too."""
    damaged = tmp_path / "step-00000100"
    damaged.mkdir()
    for name in ("model.safetensors", "optimizer.safetensors", "trainer_state.json"):
        (damaged / name).write_bytes(b"{}")
    with pytest.raises(InitSourceError, match="without LATEST") as refused:
        resolve(str(damaged), "best")
    assert "export" not in str(refused.value), refused.value
    (damaged / "config.json").write_bytes(b"{}")  # now the hf layout
    with pytest.raises(InitSourceError, match="an export"):
        resolve(str(damaged), "best")


def test_a_prepared_corpus_as_init_from_is_said_to_be_data_prepareds(tmp_path, corpus):
    """A new user (stop 65) pointed init.from at the prepared corpus: refused as a directory without manifest.json
    and without LATEST, with no word of what it is. Now the refusal names data.prepared."""
    with pytest.raises(InitSourceError, match="it holds meta.json: a prepared corpus, which data.prepared takes"):
        resolve(str(corpus[0]), "best")
