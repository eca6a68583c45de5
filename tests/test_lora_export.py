"""A LoRA run's adapters outside minilmd: `export --format peft` loads with `PeftModel.from_pretrained` onto the HF
export of the base and gives the logits of minilmd's model with the adapter on; `--merge` gives full weights of
those logits; `sample --lora` / `--no-lora` switch the adapter; a base other than the adapter's is refused."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import load_config
from minilmd.names import INIT_DIR as STAGED_DIR
from minilmd.names import INIT_PTH as STAGED_PTH
from minilmd.names import INIT_RECORD as STAGED_RECORD
from minilmd.protocol import EXIT_DONE
from minilmd.trainer.loop.train import Dist, Trainer
from minilmd.trainer.model.export import ExportError, load_model
from supervisor_helpers import cli
from trainer_corpus import write_config
from weights_helpers import save_checkpoint, tiny_model

pytestmark = pytest.mark.slow  # a Trainer, four exports, transformers and peft: ~10 s

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_peft_round_trip_merge_and_switching_the_adapter(tmp_path, corpus):
    from peft import PeftModel
    from transformers import Qwen3ForCausalLM

    prepared, vocab = corpus
    tokenizer = prepared / "tokenizer.json"
    base = save_checkpoint(tmp_path / "base" / "checkpoints", tiny_model(seed=5, vocab_size=vocab), step=2)
    cfg = load_config(write_config(tmp_path, corpus, name="lora", init={"from": str(base)},
                                   lora={"rank": 4, "alpha": 8.0, "dropout": 0.05, "targets": ALL},
                                   train={"max_steps": 3, "lr": 2e-2, "checkpoint_every": 100}))
    assert Trainer(cfg, Dist(0, 1, 0, torch.device("cpu"))).train() == EXIT_DONE
    adapter = cfg.checkpoint_dir / "step-00000003"

    invoke("export", adapter, "--format", "peft", "--out", tmp_path / "peft")
    invoke("export", base, "--format", "hf", "--out", tmp_path / "hf", "--tokenizer", tokenizer)
    invoke("export", adapter, "--format", "hf", "--merge", "--out", tmp_path / "merged")
    refused = CliRunner().invoke(app, ["export", str(adapter), "--format", "hf", "--out", str(tmp_path / "x")])
    assert refused.exit_code == 1 and "--format peft" in refused.output and "--merge" in refused.output
    (tmp_path / "peft-link").symlink_to(tmp_path / "nowhere")  # a dangling link: refused, nothing written
    linked = CliRunner().invoke(app, ["export", str(adapter), "--format", "peft", "--out", str(tmp_path / "peft-link")])
    assert linked.exit_code == 2 and f"{tmp_path / 'peft-link'}: is a symbolic link" in linked.output, linked.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".peft-link.tmp")]  # no temporary copy left
    assert not (tmp_path / "nowhere").exists()

    keys = set(load_file(tmp_path / "peft" / "adapter_model.safetensors"))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert len(keys) == 2 * len(ALL) * cfg.model.num_hidden_layers
    peft_cfg = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert (peft_cfg["r"], peft_cfg["lora_alpha"], peft_cfg["target_modules"]) == (4, 8.0, ALL)
    assert peft_cfg["base_model_name_or_path"] == str(base)  # the minilmd checkpoint: transformers cannot load it
    said = invoke("export", adapter, "--format", "peft", "--out", tmp_path / "auto", "--base-name", tmp_path / "hf")
    assert "AutoPeftModelForCausalLM.from_pretrained(" in said  # issue 24: the base named for AutoPeft
    auto_cfg = json.loads((tmp_path / "auto" / "adapter_config.json").read_text())
    assert auto_cfg == {**peft_cfg, "base_model_name_or_path": str(tmp_path / "hf")}

    ids = torch.randint(3, vocab, (2, 24))
    ours, _ = load_model(adapter)
    plain, _ = load_model(base)
    switched_off, _ = load_model(adapter, no_lora=True)
    on_named_base, _ = load_model(base, lora=adapter)
    peft_model = PeftModel.from_pretrained(Qwen3ForCausalLM.from_pretrained(tmp_path / "hf"), tmp_path / "peft")
    peft_model.eval()
    merged = Qwen3ForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        want = ours(ids).logits
        assert not torch.allclose(want, plain(ids).logits, atol=1e-3)  # the adapter changes the model
        torch.testing.assert_close(peft_model(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(merged(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)
        assert torch.equal(on_named_base(ids).logits, want)
        assert torch.equal(switched_off(ids).logits, plain(ids).logits)
        with peft_model.disable_adapter():
            torch.testing.assert_close(peft_model(input_ids=ids).logits, plain(ids).logits, atol=1e-4, rtol=1e-4)
        from peft import AutoPeftModelForCausalLM

        auto = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "auto").eval()  # finds its base by itself
        torch.testing.assert_close(auto(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)

    other = save_checkpoint(tmp_path / "other", tiny_model(seed=9, vocab_size=vocab), step=1)
    with pytest.raises(ExportError, match="trained on the base"):
        load_model(other, lora=adapter)

    greedy = ("--prompt", "好", "--temperature", "0", "--max-new-tokens", "6", "--tokenizer", tokenizer,
              "--device", "cpu")
    assert invoke("sample", base, "--lora", adapter, *greedy) == invoke("sample", adapter, *greedy)
    assert invoke("sample", adapter, "--no-lora", *greedy) == invoke("sample", base, *greedy)


def test_a_peft_export_onto_a_full_disk_says_so_and_leaves_nothing_behind(tmp_path, corpus, small_tmpfs):
    """The adapter's export onto a disk that fills up (a real 16 KiB tmpfs): exit 74 with the reason, no
    `.NAME.tmp` left; before, a SafetensorError traceback and the half export."""
    base = save_checkpoint(tmp_path / "base" / "checkpoints", tiny_model(seed=5, vocab_size=corpus[1]), step=2)
    cfg = load_config(write_config(tmp_path, corpus, name="lora", init={"from": str(base)},
                                   lora={"rank": 4, "alpha": 8.0, "targets": ALL},
                                   train={"max_steps": 1, "checkpoint_every": 100}))
    assert Trainer(cfg, Dist(0, 1, 0, torch.device("cpu"))).train() == EXIT_DONE
    disk = small_tmpfs("16k")
    result = CliRunner().invoke(app, ["export", str(cfg.checkpoint_dir), "--format", "peft", "--out",
                                      str(disk / "peft")])
    assert result.exit_code == 74 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert "the export could not be written" in result.output and list(disk.iterdir()) == [], result.output


@pytest.fixture(scope="module")
def adapter_beside_its_base_copy(tmp_path_factory, corpus) -> Path:
    """A LoRA adapter trained on a MiniMind .pth, laid out as its run's remote holds it: `<remote>/step-00000001`
    beside `<remote>/init`, the base as staging copies it (daemon/jobs/initstage.py); the .pth itself gone."""
    from minilmd.daemon.jobs.initstage import stage_init
    from minilmd.trainer.model.export import export_minimind

    tmp = tmp_path_factory.mktemp("hostile-base")
    base = export_minimind(save_checkpoint(tmp / "ckpt", tiny_model(seed=5, vocab_size=corpus[1]), step=1),
                           tmp / "share" / "base.pth")
    cfg = load_config(write_config(tmp, corpus, name="lora", init={"from": str(base)},
                                   lora={"rank": 4, "alpha": 8.0, "targets": ALL},
                                   train={"max_steps": 1, "checkpoint_every": 100}))
    assert Trainer(cfg, Dist(0, 1, 0, torch.device("cpu"))).train() == EXIT_DONE
    remote = tmp / "remote"
    shutil.copytree(cfg.checkpoint_dir / "step-00000001", remote / "step-00000001")
    shutil.copytree(stage_init(str(base), tmp / "staging"), remote / STAGED_DIR)
    base.unlink()  # the share is gone: export and sample fall back to the copy
    return remote


@pytest.mark.parametrize("damage, command", [("none", "export"), ("fifo", "export"), ("fifo", "sample"),
                                             ("link to /dev/zero", "export"), ("sparse terabyte", "export"),
                                             ("sparse terabyte, a record from before sizes", "export")])
def test_a_hostile_base_copy_on_the_remote_is_refused_without_blocking(adapter_beside_its_base_copy, tmp_path,
                                                                       corpus, damage, command):
    """The remote is a place others write. Before, `export --merge` and `sample` of an adapter whose base is gone
    read `<remote>/init/weights.pth` unchecked: a FIFO there blocked them for ever, a link to /dev/zero or a
    sparse terabyte was read to its end. Now the copy is read as untrusted: exit 1 naming the file and what it is,
    at once (the timeout only guards the test)."""
    remote = shutil.copytree(adapter_beside_its_base_copy, tmp_path / "remote")
    weights = remote / STAGED_DIR / STAGED_PTH
    if damage != "none":
        weights.unlink()
    if damage == "fifo":
        os.mkfifo(weights)
    elif damage == "link to /dev/zero":
        weights.symlink_to("/dev/zero")
    elif damage.startswith("sparse terabyte"):
        with open(weights, "wb") as f:
            f.truncate(1 << 40)
    if damage.endswith("a record from before sizes"):  # then only the model's own size bounds the read
        record = json.loads((remote / STAGED_DIR / STAGED_RECORD).read_text())
        assert record.pop("size") > 0
        (remote / STAGED_DIR / STAGED_RECORD).write_text(json.dumps(record))
    adapter = remote / "step-00000001"
    if command == "export":
        done = cli("export", str(adapter), "--format", "minimind", "--merge", "--out", str(tmp_path / "m.pth"),
                   timeout=180)
    else:
        done = cli("sample", str(adapter), "--prompt", "好", "--max-new-tokens", "2", "--device", "cpu",
                   "--tokenizer", str(corpus[0] / "tokenizer.json"), timeout=180)
    if damage == "none":
        assert done.returncode == 0, done.stderr
        return
    said = {"fifo": "a FIFO", "link to /dev/zero": "a symbolic link", "sparse terabyte": f"{1 << 40} bytes, listed as ",
            "sparse terabyte, a record from before sizes": "over "}[damage]
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"its copy at {remote / STAGED_DIR} is not usable: {weights}: {said}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "m.pth").exists()
