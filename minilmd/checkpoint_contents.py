"""What the parts of a checkpoint must hold, once their bytes are hashed and parsed (minilmd/checkpoint.py reads
them): the types of trainer_state.json and optimizer.json, one step named by all, the tensors' keys, shapes and
dtypes against what the config needs, the optimizer's state against the model's, every value finite. Each function
returns the problems it finds, one line each, and raises nothing: validation turns them into CheckpointInvalid."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd.names import (
    DPO_REFERENCE,
    DPO_REFERENCE_PASS,
    MANIFEST,
    MODEL_FILE,
    OPTIMIZER_FILE,
    OPTIMIZER_META,
    REFERENCE_PASS,
    TRAINER_STATE,
    is_step_name,
    step_of,
)
from minilmd.untrusted import is_count, kind_of, printable

if TYPE_CHECKING:  # numpy behind it: `minilmd status` reads a manifest's reference pass (reference_pass) without
    from minilmd.safetensors_scan import Scan


def structure_problems(state: dict, opt_meta: dict) -> list[str]:
    """The parts of trainer_state.json and optimizer.json that validation and loading use, of the types they need."""
    problems = []
    config = state.get("config")
    if config is not None and not isinstance(config, dict):
        problems.append(f"{TRAINER_STATE}: config is {kind_of(config)}, not an object")
    elif config:
        problems += [f"{TRAINER_STATE}: config.{key} is {kind_of(config[key])}, not an object"
                     for key in ("model", "lora", "data") if config.get(key) is not None
                     and not isinstance(config[key], dict)]
    problems += [f"{TRAINER_STATE}: {key} is {kind_of(state[key])}, not an object"
                 for key in ("fingerprints", "init") if state.get(key) is not None
                 and not isinstance(state[key], dict)]
    groups, names, scalars = opt_meta.get("param_groups"), opt_meta.get("param_names"), opt_meta.get("scalars")
    if groups is not None and not (isinstance(groups, list) and all(
            isinstance(g, dict) and isinstance(g.get("params", []), list)
            and all(is_count(i) for i in g.get("params", [])) for g in groups)):
        problems.append(f"{OPTIMIZER_META}: param_groups is not a list of groups with integer params")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        problems.append(f"{OPTIMIZER_META}: param_names is not a list of names")
    if scalars is not None and not (isinstance(scalars, dict) and all(isinstance(v, dict)
                                                                      for v in scalars.values())):
        problems.append(f"{OPTIMIZER_META}: scalars is not a table of tables")
    tuple_keys = opt_meta.get("tuple_keys")
    if tuple_keys is not None and not (isinstance(tuple_keys, list) and all(isinstance(k, list)
                                                                            for k in tuple_keys)):
        problems.append(f"{OPTIMIZER_META}: tuple_keys is not a list of lists")
    return problems


def step_problems(ckpt_dir: Path, step: int, state: dict) -> list[str]:
    """The directory name, the manifest and trainer_state.json must name the same step."""
    problems = []
    if is_step_name(ckpt_dir.name) and step_of(ckpt_dir) != step:
        problems.append(f"directory name says step {step_of(ckpt_dir)}, {MANIFEST} says {step}")
    if state.get("step") != step:
        problems.append(f"{TRAINER_STATE} says step {state.get('step')!r}, {MANIFEST} says {step}")
    return problems


def saved_lora(state: dict) -> dict | None:
    """The [lora] section a checkpoint's trainer_state records when its run trained LoRA adapters, else None."""
    config = state.get("config") if isinstance(state, dict) else None
    lora = config.get("lora") if isinstance(config, dict) else None  # also asked of unvalidated checkpoints
    return lora if isinstance(lora, dict) and lora.get("rank", 0) else None


def tensor_problems(scans: dict[str, Scan], opt_meta: dict, expected_shapes: dict[str, tuple[int, ...]],
                    step: int) -> list[str]:
    """Keys, shapes and dtypes of the weights (the full model's, or a LoRA run's adapters) and the optimizer state
    against the shapes the config needs; the optimizer's step against the checkpoint's; every tensor finite."""
    problems = shape_problems(MODEL_FILE, scans[MODEL_FILE].tensors, expected_shapes)
    problems += optimizer_problems(scans[OPTIMIZER_FILE].tensors, scans[OPTIMIZER_FILE].scalars, opt_meta,
                                   expected_shapes, step)
    for name in (MODEL_FILE, OPTIMIZER_FILE):
        for key, n in scans[name].nonfinite.items():
            problems.append(f"{name}: tensor {key} has {n} non-finite value(s) (NaN or inf)")
    return problems


def lora_text(lora: dict | None) -> str:
    if lora is None:
        return "off (it trains full weights)"
    return ", ".join(f"{k} = {v!r}" for k, v in sorted(lora.items()))


def shape_problems(file: str, found: dict, expected: dict[str, tuple[int, ...]]) -> list[str]:
    problems = [f"{file}: missing tensor {k} {list(s)}" for k, s in expected.items() if k not in found]
    problems += [f"{file}: unexpected tensor {k} {list(found[k]['shape'])}" for k in found if k not in expected]
    for k, s in expected.items():
        if k in found and found[k]["shape"] != s:
            problems.append(f"{file}: tensor {k} has shape {list(found[k]['shape'])}, the config needs {list(s)}")
        elif k in found and found[k]["dtype"] != "F32":
            problems.append(f"{file}: tensor {k} is {found[k]['dtype']}, checkpoints hold F32")
    return problems


def header_problems(name: str, found: dict, opt_meta: dict, expected: dict[str, tuple[int, ...]],
                    step: int) -> list[str]:
    """tensor_problems' look at one tensors' file from its header alone (keys, shapes, dtypes; no value read): what
    validation asks before it reads a model or optimizer file whole, so that a wrong one is refused unread."""
    if name == MODEL_FILE:
        return shape_problems(name, found, expected)
    return optimizer_problems(found, {}, opt_meta, expected, step)


OPTIMIZER_MOMENTS = 3
"""The most tensors of each parameter's size an optimizer file holds (AdamW: exp_avg, exp_avg_sq, and its step)."""


def most_data_bytes(name: str, expected: dict[str, tuple[int, ...]]) -> int:
    """The most bytes of tensors a model or optimizer file of a checkpoint whose tensors have these shapes holds
    (F32, every checkpoint's): beyond it (and its header's bound), a listed size is refused before a byte is read."""
    data = 4 * sum(math.prod(shape) for shape in expected.values())
    return data if name == MODEL_FILE else OPTIMIZER_MOMENTS * data


def optimizer_problems(found: dict, scalars: dict[str, float], meta: dict, expected: dict[str, tuple[int, ...]],
                       step: int) -> list[str]:
    per_param: dict[int, dict[str, tuple]] = {}
    for key, e in found.items():
        parts = key.split(".", 2)
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            return [f"{OPTIMIZER_FILE}: unexpected tensor name {key!r} (expected state.<index>.<name>)"]
        per_param.setdefault(int(parts[1]), {})[parts[2]] = e["shape"]
    groups = meta.get("param_groups") or []
    indices = [i for g in groups for i in g.get("params", [])]
    problems = []
    if per_param and sorted(per_param) != sorted(indices):
        problems.append(f"{OPTIMIZER_FILE}: state for parameters {sorted(per_param)[:8]}..., param_groups "
                        f"list {len(indices)} parameters")
    names = meta.get("param_names")
    for idx, tensors in sorted(per_param.items()):
        if names and idx < len(names) and names[idx] in expected:
            want = expected[names[idx]]
            label = names[idx]
        else:
            want, label = None, f"parameter {idx}"
        for tname, shape in tensors.items():
            if tname == "step":
                continue
            if want is not None and shape != want:
                problems.append(f"{OPTIMIZER_FILE}: {tname} of {label} has shape {list(shape)}, needs {list(want)}")
            elif want is None and shape not in expected.values():
                problems.append(f"{OPTIMIZER_FILE}: {tname} of {label} has shape {list(shape)}, no model tensor has")
    steps = {key: v for key, v in scalars.items() if key.endswith(".step")}
    steps.update({f"state.{i}.step": v for i, d in (meta.get("scalars") or {}).items() for k, v in d.items()
                  if k == "step"})
    wrong = {k: v for k, v in steps.items() if v != step}
    if wrong:
        k, v = next(iter(wrong.items()))
        shown = f"{v:g}" if isinstance(v, (int, float)) else printable(repr(v))[:40]
        problems.append(f"{OPTIMIZER_FILE}: optimizer step {shown} ({k}, {len(wrong)} tensor(s)) disagrees with "
                        f"checkpoint step {step}")
    return problems


def reference_pass(manifest: dict) -> tuple[int, int] | None:
    """(pairs done, pairs in all) of the stopped DPO reference pass a step 0 was saved by (its manifest's
    REFERENCE_PASS); None when its manifest says none (the sums complete, or no DPO run), or says it malformed
    (reference_pass_problems refuses that manifest)."""
    value = manifest.get(REFERENCE_PASS)
    if not (isinstance(value, list) and len(value) == 2 and all(is_count(v) for v in value)
            and value[0] <= value[1]):  # all of them: a stop during the pass's last batch
        return None
    return value[0], value[1]


def reference_pass_problems(manifest: dict) -> list[str]:
    """A manifest's REFERENCE_PASS, when it has one: [done, of], two counts, done at most of, at step 0."""
    if REFERENCE_PASS not in manifest:
        return []
    if reference_pass(manifest) is None or manifest.get("step") != 0:
        return [f"{MANIFEST}: {REFERENCE_PASS} {printable(str(manifest[REFERENCE_PASS]))[:60]} is not [pairs done, "
                f"pairs in all] of a step 0"]
    return []


def pass_file_problems(manifest: dict, scans: dict[str, Scan]) -> list[str]:
    """A manifest that says a reference pass stopped (REFERENCE_PASS) lists a reference file that holds one (its
    DPO_REFERENCE_PASS tensor): the sync judges which step 0 is further by the manifest alone. A file that holds
    one under a manifest that does not say so is a stopped pass saved by minilmd before the manifest said it: valid
    (its resume goes on from the pairs the file holds), and never judged further than another by the sync."""
    says = REFERENCE_PASS in manifest
    holds = DPO_REFERENCE in scans and DPO_REFERENCE_PASS in scans[DPO_REFERENCE].tensors
    if says and not holds:
        return [f"{MANIFEST} says a DPO reference pass stopped at {manifest[REFERENCE_PASS]}, and no {DPO_REFERENCE} "
                f"it lists holds one"]
    return []


def further_pass(newer: dict, held: dict) -> bool:
    """Whether the step 0 whose manifest is `newer` carries a DPO reference pass further on than `held`'s: held's
    pass stopped at some pairs, newer's went further over the same pairs, or ended (its sums complete)."""
    was, now = reference_pass(held), reference_pass(newer)
    if was is None or newer.get("step") != 0 or held.get("step") != 0:
        return False
    if now is None:
        return REFERENCE_PASS not in newer  # complete, not malformed
    return now[1] == was[1] and now[0] > was[0]


def pass_words(manifest: dict) -> str:
    """`reference pass 1,200/2,446 pairs` of a step 0 saved by a stopped pass, or `reference complete`."""
    done = reference_pass(manifest)
    return "reference complete" if done is None else f"reference pass {done[0]:,}/{done[1]:,} pairs"
