"""A LoRA run's checkpoints outside training: the base + adapter as one model, PEFT's adapter format, merged weights.

A LoRA checkpoint holds the adapters only (trainer/model/lora.py); its trainer_state records the base
(`init`: the path and fingerprint of the checkpoint or .pth the run was trained on) and its [lora] config.
- `load_lora_model(adapter, base=None)`: the base (the recorded one, or `base` given by `sample BASE --lora
  ADAPTER`; the recorded one gone or changed, the copy its run kept beside its checkpoints), validated and
  checked against the recorded fingerprint, wrapped and loaded with the adapters. The adapter's checkpoint is
  validated once, its trainer_state and adapters taken from that read (export_paths.validated_checkpoint).
- `export_peft(adapter, out_dir)`: `adapter_model.safetensors` under PEFT's key names
  (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`) and an `adapter_config.json` of PEFT's
  LoraConfig fields, which `PeftModel.from_pretrained(Qwen3ForCausalLM.from_pretrained(<hf export of the base>),
  out_dir)` loads: the same logits as `load_lora_model` (tests/test_lora_export.py).
- `merged_weights(ckpt, checked)`: the base with every adapter folded in, for `export --merge --format hf|minimind`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from minilmd import perms
from minilmd.checkpoint import Validated, saved_lora
from minilmd.names import PEFT_CONFIG, PEFT_WEIGHTS
from minilmd.trainer.model.export_paths import (
    ExportError,
    fresh_export_dir,
    validated_checkpoint,
    validated_tensors,
    writing,
)
from minilmd.trainer.model.export_source import resolve_checkpoint

PEFT_PREFIX = "base_model.model."
"""What PeftModel puts before the wrapped model's own parameter names in a saved adapter."""


def _base_weights(ckpt: Path, state: dict, base: str | Path | None) -> dict:
    """The base weights of a LoRA checkpoint: `base`, else its recorded init path, else (that path gone, or other
    weights now) the durable copy its run kept beside its checkpoints (`<remote>/init`, `<scratch>/init`:
    daemon/jobs/basecopy.py), read as untrusted into a private directory first (basecopy_read.py); validated
    strictly, and with the fingerprint the adapter was trained on."""
    from minilmd.names import CHECKPOINTS
    from minilmd.names import INIT_DIR as STAGED_DIR

    recorded = state.get("init") or {}
    if base:
        return _load_base(state, str(base), recorded)
    try:
        return _load_base(state, str(recorded.get("path", "")), recorded)
    except ExportError as first:
        copies = [ckpt.parent / STAGED_DIR]  # <remote>/step-X: <remote>/init
        if ckpt.parent.name == CHECKPOINTS:  # <scratch>/checkpoints/step-X: <scratch>/init
            copies.append(ckpt.parent.parent / STAGED_DIR)
        unusable = []
        for copy in copies:
            try:
                weights = _from_copy(state, recorded, copy)
            except ExportError as e:  # said with the first error: why the base's own copy did not serve either
                unusable.append(f"its copy at {copy} is not usable: {e}")
                continue
            if weights is not None:
                return weights
        if unusable:
            raise ExportError(f"{first}; {'; '.join(unusable)}") from None
        raise first


def _from_copy(state: dict, recorded: dict, copy: Path) -> dict | None:
    """The base from its kept copy at `copy`, None when there is none there: copied into a private temporary
    directory as untrusted, then loaded from there (nothing of the shared copy is opened twice)."""
    import tempfile

    from minilmd.trainer.model.basecopy_read import private_copy

    with tempfile.TemporaryDirectory(prefix="minilmd-lora-base-") as tmp:
        private = Path(tmp)
        try:
            if not private_copy(copy, recorded, state["config"]["model"], private):
                return None
        except OSError as e:  # writing the private copy (TMPDIR full?); reading the shared one is Unreadable
            raise ExportError(f"it could not be copied into {tmp} ({e}); set TMPDIR to a place with room") from None
        try:
            return _load_base(state, str(recorded.get("from", "")), recorded, staged=private)
        except ExportError as e:  # named by the copy, not by the private directory about to go
            raise ExportError(str(e).replace(str(private), str(copy))) from None


def _load_base(state: dict, source: str, recorded: dict, staged: Path | None = None) -> dict:
    from minilmd.checkpoint import CheckpointError
    from minilmd.config import ConfigError, RunConfig
    from minilmd.init_source import same_source
    from minilmd.init_words import describe
    from minilmd.model_shapes import as_model_section
    from minilmd.trainer.checkpoint.init_weights import load_init

    cfg = RunConfig(source="the adapter's base")
    cfg.model = as_model_section(state["config"]["model"])
    cfg.init.from_ = source
    cfg.init.staged = str(staged) if staged else ""
    try:
        weights, found = load_init(cfg)
    except ConfigError as e:
        raise ExportError(f"the base of this adapter: {'; '.join(e.problems)}") from None
    except CheckpointError as e:  # a durable copy that does not verify
        raise ExportError(f"the base of this adapter at {staged}: {'; '.join(e.problems)}") from None
    if not same_source(recorded, found):
        raise ExportError(f"the adapter was trained on the base {describe(recorded)}, but {source} is "
                          f"{describe(found)}")
    return weights


def load_lora_model(adapter: str | Path, device: str = "cpu", base: str | Path | None = None,
                    active: bool = True):
    """(MiniMindForCausalLM in eval mode with the adapters on it, the adapter checkpoint's one validation without
    its weights' bytes: its trainer_state in .state); active=False: the base alone (`--no-lora`)."""
    ckpt = resolve_checkpoint(adapter)
    return lora_model(ckpt, validated_checkpoint(ckpt), device, base, active)


def lora_model(ckpt: Path, checked: Validated, device: str = "cpu", base: str | Path | None = None,
               active: bool = True):
    """load_lora_model's answer for the checkpoint `ckpt` validated once as `checked`: its trainer_state and its
    adapters are those that validation read."""
    from minilmd.trainer.model.lora import apply_lora, load_adapter, set_active
    from minilmd.trainer.model.minimind import MiniMindForCausalLM

    state = checked.state
    model = MiniMindForCausalLM(state["config"]["model"])
    model.load_state_dict(_base_weights(ckpt, state, base), strict=True)
    apply_lora(model, saved_lora(state) or {})
    load_adapter(model, validated_tensors(checked))
    set_active(model, active)
    return model.to(device).eval(), checked.without_weights()


def merged_weights(ckpt: Path, checked: Validated) -> tuple[dict, dict[str, Any], dict[str, Any]]:
    """(full fp32 weights with the adapters merged in, model config, trainer_state) of the LoRA checkpoint `ckpt`
    validated as `checked`: read_checkpoint's answer for `export --merge`."""
    from minilmd.trainer.model.lora import merged_state_dict

    model, kept = lora_model(ckpt, checked)
    return merged_state_dict(model), kept.state["config"]["model"], kept.state


def peft_config(state: dict, base_name: str) -> dict[str, Any]:
    """adapter_config.json: PEFT's LoraConfig fields for this adapter (plain LoRA: no DoRA, no rsLoRA)."""
    lora = saved_lora(state) or {}
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": lora["rank"],
        "lora_alpha": lora["alpha"],
        "lora_dropout": lora["dropout"],
        "target_modules": list(lora["targets"]),
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": None,
    }


def export_peft(adapter: str | Path, out_dir: str | Path, base_name: str = "", group_share: bool = False) -> Path:
    """Write a PEFT adapter directory (see the module docstring); `base_name` goes into base_model_name_or_path
    (default: the base checkpoint's path). Published by a rename; an existing non-empty directory is refused."""

    from safetensors.torch import save_file

    ckpt = resolve_checkpoint(adapter)
    checked = validated_checkpoint(ckpt)
    state = checked.state
    if saved_lora(state) is None:
        raise ExportError(f"{ckpt}: not a LoRA checkpoint (its run has no [lora] rank); export it with --format hf "
                          f"or minimind")
    tensors = {PEFT_PREFIX + k: v.contiguous() for k, v in validated_tensors(checked).items()}
    out_dir = fresh_export_dir(out_dir, group_share)
    with writing(out_dir, group_share) as copy:
        tmp = copy.inside  # through its descriptor, never its name (export_paths.ExportCopy)
        save_file(tensors, str(tmp / PEFT_WEIGHTS), metadata={"format": "pt"})
        perms.settle_new_file(tmp / PEFT_WEIGHTS)  # safetensors makes it 0600 whatever --share says
        config = peft_config(state, base_name or str((state.get("init") or {}).get("path", "")))
        (tmp / PEFT_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        published = copy.publish_dir()
    return published
