"""A DPO stage's checkpoints leave minilmd as an SFT stage's do (issue 42): `export --format minimind` writes
MiniMind's fp16 state (named as MiniMind names a DPO model, `dpo_<hidden>.pth`, where it has MiniMind's shape),
`--format hf` loads in transformers with minilmd's logits, and a LoRA DPO run's adapters export with `--format peft`
onto the HF export of its base, with the logits of minilmd's model with the adapter on. The reference kept in every
DPO checkpoint (dpo_reference.safetensors) is the run's, never part of an export."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import load_config
from minilmd.names import DPO_REFERENCE
from minilmd.protocol import EXIT_DONE
from minilmd.trainer.loop.train import Dist, Trainer
from minilmd.trainer.model.export import load_model
from trainer_corpus import write_config
from weights_helpers import save_checkpoint, tiny_model

pytestmark = pytest.mark.slow  # two short DPO trainers in this process, five exports, transformers and peft

DPO_TRAIN = {"seq_len": 128, "micro_batch_size": 4, "grad_accum": 1, "max_steps": 3, "checkpoint_every": 100,
             "log_every": 1}


def invoke(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def dpo_run(tmp_path, dpo_corpus, base, name: str, **sections):
    cfg = load_config(write_config(tmp_path, dpo_corpus, name=name, init={"from": str(base)},
                                   data={"val_windows": 16}, train={**DPO_TRAIN, "lr": 1e-2}, **sections))
    assert Trainer(cfg, Dist(0, 1, 0, torch.device("cpu"))).train() == EXIT_DONE
    ckpt = cfg.checkpoint_dir / "step-00000003"
    assert (ckpt / DPO_REFERENCE).is_file()
    return ckpt


def test_full_and_lora_dpo_checkpoints_export_as_minimind_hf_and_peft(tmp_path, small_dpo_corpus, capsys):
    from peft import PeftModel
    from transformers import Qwen3ForCausalLM

    prepared, vocab = small_dpo_corpus
    base = save_checkpoint(tmp_path / "sft" / "checkpoints", tiny_model(seed=5, vocab_size=vocab), step=2)
    full = dpo_run(tmp_path, small_dpo_corpus, base, "dpo")
    said = capsys.readouterr().out  # micro_batch_size counts pairs on a DPO run, as MiniMind's --batch_size does
    assert "preference pairs of up to 128 tokens a side, global batch 4 pairs, steps 0 -> 3" in said, said
    adapter = dpo_run(tmp_path, small_dpo_corpus, base, "lora-dpo", lora={"rank": 4, "alpha": 8.0})
    ids = torch.randint(3, vocab, (2, 24))

    invoke("export", full, "--format", "minimind", "--out", tmp_path / "m.pth")  # named dpo_<hidden>.pth in the
    # advice of a model of MiniMind's shape (test_dpo_train: minimind_weight); this tiny one gets --format hf's
    state = torch.load(tmp_path / "m.pth", weights_only=True)
    assert {v.dtype for v in state.values()} == {torch.float16} and not any("reward" in k for k in state)

    invoke("export", full, "--format", "hf", "--out", tmp_path / "hf-dpo", "--tokenizer", prepared / "tokenizer.json")
    exported = {p.name for p in (tmp_path / "hf-dpo").iterdir()}
    assert "model.safetensors" in exported and DPO_REFERENCE not in exported
    ours, _ = load_model(full)
    plain, _ = load_model(base)
    hf = Qwen3ForCausalLM.from_pretrained(tmp_path / "hf-dpo").eval()
    with torch.no_grad():
        want = ours(ids).logits
        assert not torch.allclose(want, plain(ids).logits, atol=1e-3)  # DPO moved the weights: not the SFT model
        torch.testing.assert_close(hf(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)

    invoke("export", adapter, "--format", "peft", "--out", tmp_path / "peft")
    invoke("export", base, "--format", "hf", "--out", tmp_path / "hf-base", "--tokenizer", prepared / "tokenizer.json")
    assert all("lora_" in k for k in load_file(tmp_path / "peft" / "adapter_model.safetensors"))
    assert DPO_REFERENCE not in {p.name for p in (tmp_path / "peft").iterdir()}
    with_adapter, _ = load_model(adapter)
    peft_model = PeftModel.from_pretrained(Qwen3ForCausalLM.from_pretrained(tmp_path / "hf-base"),
                                           tmp_path / "peft").eval()
    with torch.no_grad():
        want = with_adapter(ids).logits
        assert not torch.allclose(want, plain(ids).logits, atol=1e-3)  # the adapters trained
        torch.testing.assert_close(peft_model(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)
