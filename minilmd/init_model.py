"""init.from's model against the run's [model], said so that the fix can be pasted (user5 #5). [model] is never
inherited from init.from: a stage after a pretraining of a non-default model that leaves [model] out (as the docs'
sft.toml example does) runs the defaults, and was refused as "model.hidden_size: source 64, run 768", 768 being a
default the user never wrote. The refusal now says which of the run's values are defaults and gives the source's
values as the [model] lines to add. `run --check` and the launch (minilmd/probes.py) say it, for a run still
training (its config), for a checkpoint (init_source.model_problems) and for a MiniMind .pth (its tensors' shapes,
`shapes_mismatch`: read torch-free by minilmd/pth_shapes.py there, by torch in the trainer)."""
from __future__ import annotations

import dataclasses
import os
import shlex
import stat
from collections.abc import Callable

from minilmd.config import toml_value
from minilmd.config_sections import ModelSection, weights_config
from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY, as_model_section, expected_state_shapes

HEAD_NOT_TIED = f"{TIED_HEAD_KEY} differs from {EMBED_KEY}; minilmd's model ties them"
"""Why a .pth whose head is not its embedding cannot start this run (the trainer by value, `run --check` by shape)."""

MOE_KEYS = (".mlp.experts.", ".mlp.gate.weight")
"""What a MiniMind MoE model's state dict (use_moe=True: MOEFeedForward) has in place of a layer's dense MLP."""
MOE_MODEL = ("its tensors are of a Mixture-of-Experts MiniMind model (use_moe: mlp.experts.N, mlp.gate): minilmd "
             "trains the dense model only")

MINIMIND_LORA_KEYS = (".lora.A.weight", ".lora.B.weight")
"""Every key of what MiniMind's save_lora (model/model_lora.py) writes: `<layer>.lora.A.weight` (rank x in) and
`<layer>.lora.B.weight` (out x rank), on each square Linear of the model (apply_lora), fp16."""


OWN_DIR_CODE = ('o = os.path.abspath(sys.argv[-1]); p = os.path.dirname(o); dfd = os.open(p, os.O_RDONLY | '
                'os.O_DIRECTORY); s = os.fstat(dfd); s.st_uid in (0, os.geteuid()) or sys.exit("%s is owned by uid %d, '
                'not by you nor root: nothing written (its owner could replace the file there); give a directory of '
                'yours" % (p, s.st_uid)); s.st_mode & 0o022 and sys.exit("%s can be written by other users (mode %o): '
                'nothing written (they could replace the file there); give a directory only you can write" % (p, '
                's.st_mode & 0o7777)); ')
"""The start of a printed command that writes its last argument's file: that file's directory opened once, and
refused unless it is the user's own or root's and no one else can write it (the rule EVAL_COPY_CODE applies to
out/, hostile audit 10 F3); `OWN_DIR_FILE` then makes the file in that very directory. The directory printed is
`own_place`, which passes; this holds for one the user puts for DIR, or one changed before the paste."""
OWN_DIR_FILE = 'open(os.path.basename(o), "xb", opener=lambda n, f: os.open(n, f, 0o666, dir_fd=dfd))'
"""The output file, made by an exclusive create (a file or a link there refused, never replaced nor followed) in the
directory OWN_DIR_CODE checked (0666 less the umask, as open's own)."""


MERGE_CODE = ('import os, sys, torch; ' + OWN_DIR_CODE + 'b = torch.load(sys.argv[1], weights_only=True); a = '
              'torch.load(sys.argv[2], weights_only=True); d = {k[:-14] + ".weight": a[k[:-14] + ".lora.B.weight"]'
              '.float() @ a[k].float() for k in a if k.endswith(".lora.A.weight")}; assert d.keys() <= b.keys(), '
              '"not this base"; torch.save({k: v.half() + d[k].half() if k in d else v.half() for k, v in b.items()}, '
              + OWN_DIR_FILE + ')')
"""MiniMind's merge_lora (each weight plus B A, fp16, no scaling) on the two files' state dicts, with torch alone: both
loaded weights_only (merge_lora's own torch.load cannot be told to), the merged file made in a directory of the
user's own by an exclusive create that refuses a file or a link there (torch.save by a path writes through a link:
hostile audit 8 F1)."""
BASE_PLACEHOLDER, OUT_PLACEHOLDER = "BASE.pth", "DIR"


def minimind_lora(shapes: dict[str, tuple[int, ...]], path: str | os.PathLike = "") -> str:
    """What a MiniMind LoRA adapter file (lora_*.pth at `path`: only MINIMIND_LORA_KEYS) is and what to do with it,
    with the command that merges it into its base (MERGE_CODE) and the sizes read off its shapes, and whether
    MiniMind's eval_llm.py runs it as it is; "" for any other state dict. Not loaded as minilmd's adapters: those
    are a minilmd run's, scaled by alpha / rank, on the layers [lora] targets names. The command loads only files
    looked at here, by name: the adapter, and the base beside it only when it is the user's own regular file in a
    directory no one else can rearrange (`own_base`; a teammate's base, or his link, or hers in a team directory is
    named and left out: BASE.pth to fill in); it writes the merged file into a directory of the user's own
    (`own_place`), never beside the adapter."""
    if not shapes or not all(key.endswith(MINIMIND_LORA_KEYS) for key in shapes):
        return ""
    a_shapes = [shape for key, shape in sorted(shapes.items()) if key.endswith(".lora.A.weight") and len(shape) == 2]
    rank, hidden = a_shapes[0] if a_shapes else (16, 0)
    layers = len({key.split(".")[2] for key in shapes if key.startswith("model.layers.")})
    # train_lora.py saves the adapter as {save_dir}/{lora_name}_{hidden}.pth, beside the base it read,
    # {save_dir}/{from_weight}_{hidden}.pth (full_sft by default): that base, looked at beside the file
    folder, name = os.path.split(os.path.abspath(path)) if path else ("out", f"lora_NAME_{hidden}.pth")
    suffix = f"_{hidden}.pth"
    prefix = name.removesuffix(suffix) if name.endswith(suffix) else name.removesuffix(".pth")
    beside = os.path.join(folder, f"full_sft{suffix}")
    why_not = own_base(beside) if path else f"{beside} was not looked at"
    base = BASE_PLACEHOLDER if why_not else beside
    place = own_place()
    merged = os.path.join(place or OUT_PLACEHOLDER, f"{prefix}_merged{suffix}")
    said_base = (f"the command's base is that file, {beside}, yours; give it another if yours is elsewhere" if
                 not why_not else f"{why_not}: put your base's path for {BASE_PLACEHOLDER}")
    said_out = (f"it writes {merged}, in a directory of yours, and never replaces a file there" if place else
                f"put a directory of yours for {OUT_PLACEHOLDER} (neither the current directory nor your home is "
                f"one only you can change)")
    args = " ".join(shlex.quote(arg) for arg in (base, os.path.join(folder, name), merged))
    there_not_named = why_not if path and os.path.lexists(beside) else ""  # missing: hers to put there
    return (f"a MiniMind LoRA adapter (model_lora.py's save_lora: rank {rank} on {len(shapes) // 2} Linear "
            f"layers), not a model: merge it into the base it was trained on (train_lora.py's --from_weight, full_sft "
            f"by default, which it reads beside where it saves the adapter: {said_base}) as MiniMind's merge_lora "
            f"does, with torch ({said_out}), then give init.from the merged .pth (MiniMindConfig as the base was "
            f"built, hidden_size={hidden}, num_hidden_layers={layers}):\n"
            f"      python -c {shlex.quote(MERGE_CODE)} {args}\n"
            f"    or train the adapter here: [lora] rank = {rank} with init.from the base .pth "
            f"(docs/operations.md, \"MiniMind's files\");\n"
            f"    {_eval_llm_runs(rank, hidden, layers, name, prefix, there_not_named)}")


def own_base(path: str) -> str:
    """"" when the printed merge may name `path` as its base: `own_file`, in a directory that no one else can
    rearrange, nor one above it (place_rule's rule, perms' one rule). In a team directory (2775, not sticky) a group
    member could rename his file over hers between the print and her paste, and the merge would load his weights
    (weights_only stops code, not a poisoned base). Else why not. Judged by the place rule's walk (walk_problem), to
    the file itself: every directory on the way is judged as one above it, `..` after a link goes where the pasted
    command's open goes (by path, abspath read `~/link/../b.pth` as `~/b.pth`), and the file, a regular one of the
    user's (own_file), ends the walk as a file in the way, which walk_problem leaves to its caller."""
    from minilmd.place_rule import walk_problem
    from minilmd.untrusted import printable

    if why := own_file(path):
        return why
    try:
        problem = walk_problem(path, "the base", "the base", BASE_ADVICE)
    except OSError as e:  # a share failing on the way (EIO, ESTALE)
        problem = f"the directory of {path} cannot be looked at ({e.strerror or e}), so it is not named"
    return printable(problem or "")


BASE_ADVICE = "keep your base in a directory only you can change (so it is not named here)"
"""How own_base's refusal ends."""


def own_file(path: str) -> str:
    """"" when `path` is a regular file of the user's own (lstat: a link is not followed); else why a printed
    command does not name it: missing, a link, not a regular file, another user's (named: fsio.others_entry's
    owner rule)."""
    from minilmd import perms
    from minilmd.untrusted import printable

    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{printable(path)} cannot be looked at ({e.strerror or e}), so it is not named"
    if stat.S_ISLNK(st.st_mode):
        return f"{printable(path)} is a symbolic link, so it is not named"
    if not stat.S_ISREG(st.st_mode):
        return f"{printable(path)} is not a regular file, so it is not named"
    if not perms.owned_by_me(st):
        return f"{printable(path)} belongs to {perms.user_words(st.st_uid)}, not to you, so it is not named"
    return ""


def own_place() -> str:
    """Where a printed command writes its output: the current directory when it is the user's own and no one else
    can change it or a directory above it (place_rule's rule), else the home directory when it is; "" for neither.
    Never the directory of the file given, which may be a team directory whose members plant links. Not one its
    group may write either, even a user private group's (umask 002): the pasted command's own check (OWN_DIR_CODE)
    cannot tell such a group from a team's and refuses it. Judged by path (place_problem), not by the walk, for a
    reason: the pasted command opens the directory of os.path.abspath(its last argument) (OWN_DIR_CODE), so a
    `..` after a link in $HOME (`/x/link/../h`) is read as abspath reads it there; the place is judged, looked at
    and printed as that abspath (no `..` left in it), so the judgement, this look and the command's open agree."""
    from minilmd import perms
    from minilmd.place_rule import place_problem

    for given in (_cwd(), os.path.expanduser("~")):
        where = os.path.abspath(given) if given else ""  # OWN_DIR_CODE's reading of it
        try:
            st = os.lstat(where) if where else None
            mine = st is not None and perms.owned_by_me(st) and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022
        except OSError:
            continue
        if mine and not place_problem("the output", where, "the output", "", dir_itself=True):
            return where
    return ""


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # a removed working directory
        return ""


def _eval_llm_runs(rank: int, hidden: int, layers: int, name: str, prefix: str, base_not_named: str = "") -> str:
    """Whether MiniMind's eval_llm.py runs the adapter `name` as it is: it applies rank 16 only (apply_lora's
    default), and loads ./{save_dir}/{lora_weight}_{hidden_size}.pth with its base ./{save_dir}/{weight}_..., both
    paths relative to the checkout it runs in. Else the merged file runs, as --weight. `base_not_named`: own_base's
    why the base beside it is not named (another user's, a link, in a directory others can rearrange): eval_llm.py
    would load that very file, with torch.load and no weights_only (his pickle would run as her on torch < 2.6;
    hostile audit 9 F4), so the merged file is what runs then too."""
    flags = f"--hidden_size {hidden} --num_hidden_layers {layers}"
    where = ("DIR the file's directory, as a path relative to the checkout (eval_llm.py reads ./DIR/NAME_"
             f"{hidden}.pth)")
    merged = f"python eval_llm.py --save_dir DIR --weight {prefix}_merged {flags}, {where}"
    if rank == 16 and name.endswith(f"_{hidden}.pth") and base_not_named:
        return (f"MiniMind's eval_llm.py would run it with the base beside it, full_sft_{hidden}.pth, which is not "
                f"yours to trust ({base_not_named}): it loads that file with torch.load, pickles and all; run the "
                f"merged file (made from your own base) instead: {merged}")
    if rank == 16 and name.endswith(f"_{hidden}.pth"):
        return (f"MiniMind's eval_llm.py runs it as it is, with its base beside it: python eval_llm.py --save_dir DIR "
                f"--weight full_sft --lora_weight {prefix} {flags}, {where}")
    why = (f"it applies rank 16 only, apply_lora's default, and this adapter is rank {rank}" if rank != 16 else
           f"it reads --lora_weight NAME as NAME_{hidden}.pth, which this file's name is not")
    return f"MiniMind's eval_llm.py cannot run it as it is ({why}); it runs the merged file: {merged}"


def resume_file(name: str) -> str:
    """Why MiniMind's `*_resume.pth` cannot start a run, and which file can. Not taken for its 'model' entry: it
    holds the optimizer's moments too (about 5 times the weights, over what a .pth of the model may be read to),
    and lm_checkpoint writes the same weights beside it as the file init.from takes."""
    weights = name.removesuffix("_resume.pth") + ".pth" if name.endswith("_resume.pth") else \
        "<weight>_<hidden_size>.pth"
    return (f"this is MiniMind's resume file (its 'model' entry holds the weights, beside the optimizer's state): "
            f"use the weights file MiniMind saves with it, {weights} (in its checkpoints/, and out/)")


def model_mismatch(source: dict, run: dict, written: Callable[[str], bool]) -> str:
    """"" when the source's [model] (a config's, or one a checkpoint recorded) makes the run's weights; else "another
    model config: model.KEY: source X, run Y[ (default)], ...; [model] is not inherited ..." with the
    source's values as TOML lines. `written(key)`: whether the run's config sets "model.KEY" (RunConfig.is_set)."""
    source, run = weights_config(source), weights_config(run)
    keys = [k for k in sorted(set(source) | set(run)) if source.get(k) != run.get(k)]
    if not keys:
        return ""
    defaults = {k for k in keys if not written(f"model.{k}")}
    said = ", ".join(f"model.{k}: source {source.get(k)!r}, run {run.get(k)!r}"
                     + (" (default)" if k in defaults else "") for k in keys)
    said += " (default: this config does not set it)" if len(defaults) == 1 else \
        " (default: this config does not set them)" if defaults else ""
    known = [k for k in keys if source.get(k) is not None]
    if not known:
        return f"another model config: {said}"
    lines = "".join(f"\n      {k} = {toml_value(source[k])}" for k in known)
    return (f"another model config: {said}; [model] is not inherited from init.from: set the source's values in "
            f"this config's [model]:\n      [model]{lines}")


def shapes_mismatch(got: dict[str, tuple[int, ...]], model: dict | ModelSection,
                    written: Callable[[str], bool], path: str | os.PathLike = "") -> str:
    """"" when a MiniMind state dict of tensors of these shapes (lm_head.weight, the tied head, left out) loads into
    `model` (the run's [model]); else why not: the model fields their shapes imply where they differ from the
    run's, in `model_mismatch`'s words ("its tensors' shapes are of another model config: ..."), else the tensors
    that differ; a MiniMind LoRA file (at `path`) as one. The one rule of the trainer (trainer/checkpoint/
    init_weights.py) and `run --check`."""
    run_model = as_model_section(model)
    expected = expected_state_shapes(run_model)
    if got == expected:
        return ""
    if lora := minimind_lora(got, path):
        return lora
    if any(mark in key for key in got for mark in MOE_KEYS):  # no [model] lines to paste make it this model
        return MOE_MODEL
    implied = implied_model(got)
    run = weights_config(dataclasses.asdict(run_model)) | {"intermediate_size": run_model.ffn_size}
    mismatch = model_mismatch(implied, {k: run[k] for k in implied}, written)
    if mismatch:
        return f"its tensors' shapes are of {mismatch}"
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
    return (f"its tensors do not fit this run's model: missing {missing[:4]}, unexpected {extra[:4]}, other shapes "
            f"{wrong[:4]}")


def implied_model(shapes: dict[str, tuple[int, ...]]) -> dict:
    """The model fields a MiniMind state dict's shapes say (those that can be read off them)."""
    out = {}
    if EMBED_KEY in shapes and len(shapes[EMBED_KEY]) == 2:
        out["vocab_size"], out["hidden_size"] = shapes[EMBED_KEY]
    layers = {int(k.split(".")[2]) for k in shapes if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    out["num_hidden_layers"] = len(layers)
    gate = shapes.get("model.layers.0.mlp.gate_proj.weight")
    if gate:
        out["intermediate_size"] = gate[0]
    head_dim = (shapes.get("model.layers.0.self_attn.q_norm.weight") or (0,))[0]  # the heads, so that the [model]
    for key, proj in (("num_attention_heads", "q_proj"), ("num_key_value_heads", "k_proj")):  # lines pasted fit
        rows = (shapes.get(f"model.layers.0.self_attn.{proj}.weight") or (0,))[0]
        if head_dim and rows and rows % head_dim == 0:
            out[key] = rows // head_dim
    return out


WRAPPER_PREFIXES = {"module.": "DistributedDataParallel", "_orig_mod.": "torch.compile"}
"""The prefixes a wrapper puts before every key of a state dict saved from it rather than from the model it wraps
(`model.state_dict()` of a DDP model, of a compiled one, or of both). MiniMind's trainers save the model unwrapped
(trainer_utils.lm_checkpoint: `model.module`, then `_orig_mod`), but scripts of its users and older ones did not,
and its loader's `load_state_dict(strict=False)` then loads nothing of such a file, silently. torch's own
`consume_prefix_in_state_dict_if_present` strips them when every key carries one: so do minilmd's check and its
trainer (`unwrapped`)."""


def unwrapped(state: dict) -> tuple[dict, list[str]]:
    """`state` (a .pth's tensors or their shapes, by key) without the WRAPPER_PREFIXES every key carries, outermost
    first (`module._orig_mod.`: a compiled model wrapped in DDP), and the prefixes stripped ([] for a plain one)."""
    stripped: list[str] = []
    while state and (prefix := next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state)), None)):
        state = {key[len(prefix):]: value for key, value in state.items()}
        stripped.append(prefix)
    return state, stripped


def wrapper_words(stripped: list[str]) -> str:
    """What the stripped prefixes say of the file ("" for none), for `run --check`'s note and the trainer's line."""
    if not stripped:
        return ""
    keys = " and ".join(f"`{p}`" for p in stripped)
    saves = " and ".join(WRAPPER_PREFIXES[p] for p in stripped)
    return (f"its keys carry the prefix {keys} (saved from a {saves} wrapper, not from the model it wraps): read "
            f"without it, as the model's own names")
