"""Use the weights outside minilmd: read a checkpoint, write MiniMind's .pth or an HF Qwen3 directory.

- `read_checkpoint(path)`: a checkpoint directory `step-XXXXXXXX/`, or a root holding `LATEST`, -> its fp32
  weights, its model config and its trainer state. The checkpoint is strictly validated first, and once
  (minilmd.checkpoint.validated_weights: hashes, shapes, finiteness), everything taken from what that read found:
  exporting a corrupt checkpoint must fail loudly.
- `export_minimind(path, out)`: the state dict MiniMind's `eval_llm.py` loads with `strict=True`: its key names
  (the same as ours), fp16, and the tied head under both `model.embed_tokens.weight` and `lm_head.weight`.
- `export_hf(path, out_dir)`: `config.json` (Qwen3ForCausalLM, tie_word_embeddings), `model.safetensors`,
  `generation_config.json` and the tokenizer files, loadable by `Qwen3ForCausalLM.from_pretrained(out_dir)`; for a
  model trained on a chat corpus `tokenizer_config.json` carries its `chat_template`, so that transformers'
  `apply_chat_template` renders prompts as the model saw them (`find_chat_config`).
- The tokenizer files an HF export carries are found and vetted by trainer/model/tokenizer_files.py
  (`find_tokenizer`, `find_chat_config`), which `minilmd sample` and `minilmd chat` use too.
"""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from minilmd import perms
from minilmd.checkpoint import Validated, saved_lora
from minilmd.fsio import out_taken
from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY, as_model_section, expected_state_shapes
from minilmd.names import (
    HF_CONFIG,
    MODEL_FILE,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    TRAINER_STATE,
)
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS
from minilmd.trainer.model.export_paths import (
    ExportError,
    OutRefused,
    checked_out,
    fresh_export_dir,
    others_out,
    pth_out_problem,
    validated_checkpoint,
    validated_tensors,
    writing,
)
from minilmd.trainer.model.export_source import resolve_checkpoint
from minilmd.trainer.model.tokenizer_files import FoundTokenizer, find_chat_config, find_tokenizer

DTYPES = ("float32", "bfloat16", "float16")
PTH_NAME = "model.pth"
"""The .pth's name inside the export's temporary copy, before it is renamed onto --out."""


def read_checkpoint(path: str | Path, merge: bool = False) -> tuple[dict, dict[str, Any], dict[str, Any]]:
    """(weights as fp32 tensors, model config dict, trainer_state) of a checkpoint (or of LATEST under a root),
    all from its one validation. A LoRA checkpoint (adapters only) gives its base with the adapters merged in with
    `merge`, else is refused."""
    _, checked, weights, model_cfg = _read_checked(path, merge)
    return weights, model_cfg, checked.state


def _read_checked(path: str | Path, merge: bool) -> tuple[Path, Validated, dict, dict[str, Any]]:
    """(the checkpoint directory, its one validation, read_checkpoint's weights and model config)."""
    from minilmd.trainer.model.adapter import merged_weights

    ckpt = resolve_checkpoint(path)
    checked = validated_checkpoint(ckpt)
    if saved_lora(checked.state) is not None:
        if not merge:
            raise ExportError(f"{ckpt}: a LoRA checkpoint holds adapters only: export them with --format peft, "
                              f"or the full weights with --merge")
        weights, model_cfg, _ = merged_weights(ckpt, checked)
    else:
        weights, model_cfg, _ = _full_weights(ckpt, checked)
    return ckpt, checked, weights, model_cfg


def _full_weights(ckpt: Path, checked: Validated) -> tuple[dict, dict[str, Any], dict[str, Any]]:
    """read_checkpoint's answer for a full-weights checkpoint validated as `checked`."""
    state = checked.state
    try:
        model_cfg = state["config"]["model"]
        as_model_section(model_cfg)
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{ckpt / TRAINER_STATE}: no usable config.model ({e})") from None
    weights = validated_tensors(checked)
    expected = expected_state_shapes(model_cfg)
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if got != expected:
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
        raise ExportError(f"{ckpt / MODEL_FILE}: weights do not match config.model: missing {missing[:5]}, "
                          f"unexpected {extra[:5]}, wrong shapes {[(k, got[k], expected[k]) for k in wrong[:5]]}")
    return weights, model_cfg, state


def load_model(path: str | Path, device: str = "cpu", lora: str | Path | None = None,
               no_lora: bool = False) -> tuple[Any, Validated]:
    """(A MiniMindForCausalLM in eval mode with a checkpoint's weights, that checkpoint's one validation without
    its weights' bytes: its trainer_state and tokenizer files, for find_tokenizer and find_chat_config). With
    `lora` (a LoRA checkpoint), `path` is its base and the adapters go on it (the validation is the adapter's); a
    LoRA checkpoint as `path` brings its recorded base; `no_lora` switches the adapters off (the base alone)."""
    from minilmd.trainer.model.adapter import load_lora_model, lora_model
    from minilmd.trainer.model.minimind import MiniMindForCausalLM

    if lora:
        return load_lora_model(lora, device, base=path, active=not no_lora)
    ckpt = resolve_checkpoint(path)
    checked = validated_checkpoint(ckpt)
    if saved_lora(checked.state) is not None:
        return lora_model(ckpt, checked, device, active=not no_lora)
    weights, model_cfg, _ = _full_weights(ckpt, checked)
    kept = checked.without_weights()
    del checked  # its bytes of the weights file: the tensors hold them now; kept, the model would be held thrice
    model = MiniMindForCausalLM(model_cfg)
    model.load_state_dict(weights, strict=True)
    return model.to(device).eval(), kept


def with_tied_head(weights: dict) -> dict:
    """The weights with `lm_head.weight` added back, as its own tensor (MiniMind and HF expect the key)."""
    out = dict(weights)
    out[TIED_HEAD_KEY] = weights[EMBED_KEY].clone()
    return out


def export_minimind(path: str | Path, out: str | Path, merge: bool = False, group_share: bool = False) -> Path:
    """Write MiniMind's .pth: fp16 state dict, both names for the tied head. Returns the file written.
    `group_share`: --group-share, the directory of `out` may be a team directory (export_paths.writing)."""
    return write_minimind(path, out, merge, group_share)[0]


def write_minimind(path: str | Path, out: str | Path, merge: bool = False, group_share: bool = False,
                   force: bool = False) -> tuple[Path, Validated]:
    """(export_minimind's file, the one validation of its checkpoint, without the weights' bytes): what `minilmd
    export` tells of it (minimind_eval_command, find_chat_config) unread again. An --out there is replaced only with
    `force` (OutRefused: fsio.out_taken)."""
    import torch

    if not_a_file := pth_out_problem(out):  # --force replaces a file, never puts one inside a directory
        raise OutRefused(not_a_file)
    out = checked_out(out, group_share)
    if taken := out_taken(out, force) or others_out(out, group_share):  # before GBs are read, converted, written
        raise OutRefused(f"{taken}; nothing was written")
    _, checked, weights, _ = _read_checked(path, merge)
    kept = checked.without_weights()
    del checked  # its bytes of the weights file: the tensors hold them now
    state = {k: v.to(torch.float16).contiguous() for k, v in with_tied_head(weights).items()}
    with writing(out, group_share) as copy:
        with copy.new_file(PTH_NAME) as f:
            torch.save(state, f)  # through our file object: a write error reaches us with its errno
            f.flush()
            os.fsync(f.fileno())
        copy.publish_file(PTH_NAME)
    return out, kept


def minimind_weight(listed: frozenset[str], chat: bool) -> str:
    """The name MiniMind gives this stage's weights (its `--weight`, the .pth's prefix), from the file names a
    validated checkpoint's manifest lists (Validated.listed): "dpo" for a DPO run's (it carries the reference sums:
    MiniMind's train_dpo.py saves dpo_<hidden>.pth), "full_sft" for one fine-tuned on a chat corpus, else
    "pretrain"."""
    from minilmd.names import DPO_REFERENCE

    if DPO_REFERENCE in listed:
        return "dpo"
    return "full_sft" if chat else "pretrain"


EVAL_NEW_TOKENS = 100  # the answer length the printed eval_llm.py command asks for (its default: 8192)
EVAL_COPY_CODE = ('import os, shutil, stat, sys; os.path.lexists("out") or os.mkdir("out", 0o755); l = '
                  'os.open("out", os.O_PATH | os.O_NOFOLLOW); s = os.fstat(l); link = stat.S_ISLNK(s.st_mode); '
                  'link and s.st_uid not in (0, os.geteuid()) and sys.exit("out is a link owned by uid %d, not by '
                  'you nor root: not followed, nothing copied" % s.st_uid); d = os.open(os.readlink("", dir_fd=l), '
                  'os.O_RDONLY | os.O_DIRECTORY) if link else os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=l); '
                  's = os.fstat(d); s.st_uid in (0, os.geteuid()) or sys.exit("out is a directory owned by uid %d, '
                  'not by you nor root: nothing copied (its owner could swap the copy before eval_llm.py loads it)" '
                  '% s.st_uid); s.st_mode & 0o022 and sys.exit("out is a directory other users can write (mode %o): '
                  'nothing copied (they could swap the copy before eval_llm.py loads it; chmod go-w out if it is '
                  'yours alone)" % stat.S_IMODE(s.st_mode)); r = open(sys.argv[1], "rb"); t = ".%s.%d.partial" % '
                  '(sys.argv[2], os.getpid()); w = open(t, "xb", opener=lambda p, f: os.open(p, f, 0o644, dir_fd=d)); '
                  'shutil.copyfileobj(r, w); w.close(); os.rename(t, sys.argv[2], src_dir_fd=d, dst_dir_fd=d)')
"""The copy of the export into the checkout's out/, with Python alone. out/ is made when missing; a link at out/ is
followed only when it is the user's own or root's (perms.own_link's rule: `out -> /data/big/out` is common), read
from the link itself (O_PATH, no second lookup by name), and one of another user's is refused. The bytes go to a
fresh name inside out/ (an exclusive create: nothing there is written through) and a rename puts them at the name:
a rename replaces a file or a link there as a directory entry and never follows it, so a second export's copy
lands (review11b F1: the exclusive create at the name itself refused it, and the eval then ran the old weights) and
a link a teammate planted at out/NAME is replaced, not written through (hostile audit 9 F4: `mkdir -p out && cp X
out/NAME` replaced her 0600 notes). The directory reached, out/ or where the link leads, must be the user's own or
root's and writable by no one else (hostile audit 10 F3: another user's out/, mode 777 in a team checkout, took the
copy, replacing his file there, and he could swap it before eval_llm.py's torch.load ran his pickle as her); a
group-writable one counts as others' even for a user private group (umask 002): the pasted code cannot tell, and
`chmod go-w out` is the way out it names. out/ is made 0755 (less the umask) so that a fresh one passes. A copy
that fails midway (a full disk) leaves its .NAME.PID.partial there."""


def minimind_eval_command(pth: str | Path, model_cfg: dict[str, Any], chat: bool = False,
                          weight: str | None = None) -> str:
    """How to run an exported .pth with MiniMind's eval_llm.py, as commands that run unattended when pasted in the
    checkout: it loads `./out/<weight>_<hidden_size>.pth` (relative to where it runs; out/ made first when missing) into
    MiniMindConfig(hidden_size, num_hidden_layers), MiniMind's defaults for the rest (a model that differs there
    does not load: the answer says which, and points to --format hf), decoding with its model/ tokenizer. It asks
    "[0] auto test [1] manual input" on stdin (`echo 0` answers) and answers up to 8192 tokens a prompt by default
    (minutes on CPU: bounded). `--weight pretrain`: BOS + text, as trained; chat: `full_sft`; `weight` overrides."""
    from minilmd.config import ModelSection

    m = as_model_section(model_cfg)
    defaults = ModelSection(hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers)
    differ = [f"{name} {getattr(m, name)} (MiniMind: {getattr(defaults, name)})"
              for name in ("vocab_size", "num_attention_heads", "num_key_value_heads", "ffn_size",
                           "max_position_embeddings", "rope_theta", "rms_norm_eps")
              if getattr(m, name) != getattr(defaults, name)]
    if differ:
        return (f"MiniMind's eval_llm.py builds its model from --hidden_size and --num_hidden_layers alone, with its "
                f"defaults for the rest; this model differs in {', '.join(differ)}, so eval_llm.py cannot load it. "
                f"Use `minilmd export --format hf` (Qwen3ForCausalLM) instead.")
    weight = weight or ("full_sft" if chat else "pretrain")
    name = f"{weight}_{m.hidden_size}.pth"
    # eval_llm.py reads ./out/NAME from where it runs, the checkout's root; a checkout has no out/ until a trainer
    # of its own saved there, and the .pth's path must hold from there too: absolute, whatever export's cwd was
    return (f"In a MiniMind checkout of your own (eval_llm.py loads out/{name} with torch.load, pickles and all: "
            f"in a shared checkout whoever can write its out/ chooses what it runs), in the directory of its "
            f"eval_llm.py (its model/ must hold the tokenizer this run used, MiniMind's own for a run prepared with "
            f"it); the copy replaces out/{name} by a rename (a link there is replaced, never written through), "
            f"follows out/ only when it is a link of yours or root's, and copies only into an out/ of yours or root's "
            f"that no one else can write; eval_llm.py runs only after the copy succeeded (&&); `echo 0` answers its "
            f"stdin question (0: its own test prompts; 1: type yours), --max_new_tokens "
            f"{EVAL_NEW_TOKENS} bounds each answer:\n"
            f"  python -c {shlex.quote(EVAL_COPY_CODE)} {shlex.quote(os.path.abspath(pth))} {name} &&\n"
            f"  echo 0 | python eval_llm.py --load_from model --save_dir out --weight {weight} --hidden_size "
            f"{m.hidden_size} --num_hidden_layers {m.num_hidden_layers} --max_new_tokens {EVAL_NEW_TOKENS}")


def hf_config(model_cfg: dict[str, Any], dtype: str = "float32") -> dict[str, Any]:
    """HF Qwen3Config fields for our model config (rope written both the 4.x and the 5.x way)."""
    m = as_model_section(model_cfg)
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_size,
        "num_hidden_layers": m.num_hidden_layers,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_key_value_heads,
        "head_dim": m.head_dim,
        "max_position_embeddings": m.max_position_embeddings,
        "rope_theta": m.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": m.rope_theta},
        "rope_scaling": None,
        "rms_norm_eps": m.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": dtype,
    }


def _tokenizer_config(max_length: int) -> dict[str, Any]:
    names = {v: k for k, v in SPECIAL_TOKENS.items()}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": names[BOS_ID],
        "eos_token": names[EOS_ID],
        "pad_token": names[PAD_ID],
        "unk_token": names[PAD_ID],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }


def export_hf(path: str | Path, out_dir: str | Path, tokenizer: str | Path | None = None,
              dtype: str = "float32", merge: bool = False, group_share: bool = False) -> Path:
    """Write an HF Qwen3 directory. Written under a temporary name and renamed, so a half export never looks
    finished. Refuses to overwrite a non-empty directory."""
    import torch

    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    ckpt, checked, weights, model_cfg = _read_checked(path, merge)
    # The tokenizer files of that very checkpoint as its validation hashed them against its manifest (or the
    # corpus's, read once as untrusted): what is written below is those bytes (module docstring).
    found = find_tokenizer(ckpt, tokenizer, checked=checked)
    chat = find_chat_config(ckpt, tokenizer, checked=checked)
    del checked  # its bytes of the weights file: the tensors hold them now
    out_dir = fresh_export_dir(out_dir, group_share)
    torch_dtype = getattr(torch, dtype)
    tensors = {k: v.to(torch_dtype).contiguous() for k, v in with_tied_head(weights).items()}
    with writing(out_dir, group_share) as copy:
        _write_hf(copy.inside, tensors, model_cfg, dtype, chat, found)  # through its descriptor, never its name
        published = copy.publish_dir()  # an existing out_dir is empty (checked above, and again there)
    return published


def _write_hf(tmp: Path, tensors: dict, model_cfg: dict, dtype: str, chat: dict | None,
              tokenizer: FoundTokenizer) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt"})  # HF's name happens to be ours
    perms.settle_new_file(tmp / MODEL_FILE)  # safetensors makes it 0600 whatever --share says
    max_len = as_model_section(model_cfg).max_position_embeddings
    files = {
        HF_CONFIG: hf_config(model_cfg, dtype),
        "generation_config.json": {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID},
        TOKENIZER_CONFIG: {**_tokenizer_config(max_len), **({"chat_template": chat["chat_template"]} if chat else {})},
        "special_tokens_map.json": {k: v for k, v in _tokenizer_config(max_len).items() if k.endswith("_token")},
    }
    for name, body in files.items():
        (tmp / name).write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    (tmp / TOKENIZER_FILE).write_bytes(tokenizer.data)  # the bytes read and checked, not the path again
