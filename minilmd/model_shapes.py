"""The exact tensors a checkpoint holds for a model config, computed without torch.

The supervisor validates checkpoints before it syncs them and must stay small, so the keys and shapes of the model
weights are derived here from the config alone, in plain Python; a test checks them against the real model.

The tied head. The language-model head shares its matrix with the token embeddings (MiniMind and Qwen3 small
models do the same). A checkpoint stores that matrix ONCE, under `model.embed_tokens.weight`, and has no
`lm_head.weight` key:
- safetensors refuses two names for one storage, and storing a copy would double 5 MB for nothing and leave room
  for the two copies to disagree;
- `MiniMindForCausalLM.state_dict()` already leaves `lm_head.weight` out and `load_state_dict()` re-ties it, so
  `model.state_dict()` IS the checkpoint's weight set and loads back with `strict=True`;
- the exports (`trainer/model/export.py`) add `lm_head.weight` back, because MiniMind's loader and HF Qwen3 expect it.
Weights are saved in float32 whatever the training precision (bf16 autocast keeps fp32 master weights).

A LoRA run ([lora] rank > 0) checkpoints its adapters only: `expected_adapter_shapes` gives, for each target of
each block, `<module>.lora_A.weight` (rank, in) and `<module>.lora_B.weight` (out, rank), PEFT's names without its
`base_model.model.` prefix; the base stays where init.from names it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from minilmd.config_sections import LoraSection, ModelSection

TIED_HEAD_KEY = "lm_head.weight"
"""Left out of checkpoints (see the module docstring); exports write it, equal to EMBED_KEY."""
EMBED_KEY = "model.embed_tokens.weight"


def _section(cls, value, what: str):
    """`value` if it is a `cls` already, else a `cls` from its dict form; unknown keys are refused by name."""
    if isinstance(value, cls):
        return value
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{what} config has unknown keys {unknown} (known: {sorted(known)})")
    return cls(**value)


def as_model_section(model: dict[str, Any] | ModelSection) -> ModelSection:
    """A ModelSection from a ModelSection or from its dict form (trainer_state["config"]["model"]).

    Keys this version does not know are refused with their names, so that a checkpoint written by a newer
    minilmd is not silently read with a different architecture."""
    return _section(ModelSection, model, "model")


def expected_state_shapes(model: dict[str, Any] | ModelSection) -> dict[str, tuple[int, ...]]:
    """Every key of the checkpoint's model weights and its shape, in the model's own order (no lm_head.weight)."""
    m = as_model_section(model)
    hidden, head_dim, ffn = m.hidden_size, m.head_dim, m.ffn_size
    q_out, kv_out = m.num_attention_heads * head_dim, m.num_key_value_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {EMBED_KEY: (m.vocab_size, hidden)}
    for i in range(m.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (q_out, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, q_out)
        shapes[p + "self_attn.q_norm.weight"] = (head_dim,)
        shapes[p + "self_attn.k_norm.weight"] = (head_dim,)
        shapes[p + "mlp.gate_proj.weight"] = (ffn, hidden)
        shapes[p + "mlp.up_proj.weight"] = (ffn, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, ffn)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    return shapes


TARGET_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                  "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
"""Where each LoRA target lives in a block."""


def as_lora_section(lora: dict[str, Any] | LoraSection) -> LoraSection:
    """A LoraSection from itself or its dict form (trainer_state["config"]["lora"]); unknown keys are refused."""
    return _section(LoraSection, lora, "lora")


def expected_adapter_shapes(model: dict[str, Any] | ModelSection,
                            lora: dict[str, Any] | LoraSection) -> dict[str, tuple[int, ...]]:
    """Every tensor of a LoRA checkpoint's model weights (the adapters) and its shape, block by block."""
    base = expected_state_shapes(model)
    cfg = as_lora_section(lora)
    if cfg.rank < 1 or any(t not in TARGET_MODULES for t in cfg.targets):
        raise ValueError(f"lora config needs rank >= 1 and targets among {sorted(TARGET_MODULES)}: {cfg}")
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(as_model_section(model).num_hidden_layers):
        for target in [t for t in TARGET_MODULES if t in cfg.targets]:
            module = f"model.layers.{i}.{TARGET_MODULES[target]}.{target}"
            out_features, in_features = base[module + ".weight"]
            shapes[module + ".lora_A.weight"] = (cfg.rank, in_features)
            shapes[module + ".lora_B.weight"] = (out_features, cfg.rank)
    return shapes


PTH_SLACK_BYTES, PTH_TENSOR_BYTES = 1 << 20, 4096
"""A MiniMind .pth's framing beyond its tensors' bytes: the zip and pickle of the whole, and of each tensor."""


def pth_bound(model: dict[str, Any] | ModelSection) -> int:
    """The most bytes a MiniMind .pth of this model can hold: every weight (and the tied head again) at 8 bytes
    (float64, the widest dtype a state dict of it may have), plus the framing. A .pth from elsewhere (init.from, a
    LoRA base's kept copy) is read no further: a bigger one cannot be of this model."""
    shapes = expected_state_shapes(model)
    return 8 * (parameter_count(shapes) + math.prod(shapes[EMBED_KEY])) + PTH_SLACK_BYTES + \
        PTH_TENSOR_BYTES * (len(shapes) + 1)


def parameter_count(shapes: dict[str, tuple[int, ...]]) -> int:
    """How many numbers tensors of these shapes hold (expected_state_shapes: the model's parameters; the adapters'):
    the one count of a model's size."""
    return sum(math.prod(shape) for shape in shapes.values())
