"""The size of a LoRA checkpoint of MiniMind-3 (768 x 8, 63.9M), rank 8 on all seven targets, measured with the real
code: the model, the adapters, one AdamW step, a real checkpoint save.
`.venv/bin/python scripts/lora_size.py [TOKENIZER.json]`: with a tokenizer, the checkpoint carries its copy (and the
tokenizer_config.json beside it, a chat corpus's template), as every checkpoint of a run does."""
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from minilmd.config import LoraSection, ModelSection, RunConfig
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.loop.train import build_optimizer
from minilmd.trainer.model.lora import adapter_state_dict, apply_lora
from minilmd.trainer.model.minimind import MiniMindForCausalLM

cfg = RunConfig()
cfg.model, cfg.lora = ModelSection(), LoraSection(rank=8)
torch.manual_seed(0)
model = MiniMindForCausalLM(cfg.model)
full = model.num_parameters()
n = apply_lora(model, cfg.lora)
opt = build_optimizer(model, cfg, torch.device("cpu"))
ids = torch.randint(0, cfg.model.vocab_size, (1, 8))
model(ids, labels=ids).loss.backward()
opt.step()
root = Path(tempfile.mkdtemp(prefix="lora-size-"))
ck = ckpt_io.save(root, 1, adapter_state_dict(model), opt.state_dict(), {"step": 1, "config": cfg.to_dict()},
                  tokenizer=sys.argv[1] if len(sys.argv) > 1 else None,
                  param_names=ckpt_io.optimizer_param_names(model, opt))
sizes = {p.name: p.stat().st_size for p in ck.iterdir()}
shutil.rmtree(root)
print(f"full model parameters {full:,}; adapter parameters {n:,} ({100 * n / full:.2f} %)")
print(f"adapter fp32 {n * 4 / 1e6:.2f} MB vs full fp32 {full * 4 / 1e6:.1f} MB")
print("checkpoint files:", {k: f"{v / 1e6:.2f} MB" for k, v in sorted(sizes.items())},
      f"total {sum(sizes.values()) / 1e6:.2f} MB")
