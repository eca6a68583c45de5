"""What a directory init.from names holds when it is no checkpoint and no checkpoint root (no manifest.json, no
LATEST), said so that the user can act (user7 #3): a model MiniMind saved in transformers format (config.json of
model_type "minimind": its safetensors hold MiniMind's .pth tensor names, which init.from takes once converted:
the one-line conversion is printed), an export of minilmd's (`export --format hf`: the checkpoint it came from is
the source), a directory of MiniMind .pth files (MiniMind's out/: they are named), or a prepared corpus. Read as
init_source reads the directory: relative to its descriptor, its owner's files or ours, bounded. Torch-free."""
from __future__ import annotations

import os
import shlex
import stat

from minilmd import perms
from minilmd.dirfd import Dir
from minilmd.init_model import MOE_MODEL, OUT_PLACEHOLDER, OWN_DIR_CODE, OWN_DIR_FILE, own_place
from minilmd.init_place import Owners, read_in
from minilmd.names import CORPUS_META, HF_CONFIG, LATEST, MANIFEST, MODEL_FILE
from minilmd.untrusted import Unreadable, dir_names, loads, printable

HF_CONFIG_MAX_BYTES = 64 << 10
"""A transformers config.json is a few KB."""
MAX_LISTED = 4096
"""The entries of a directory read to find its .pth files (a bigger one is not named file by file)."""
SHOWN = 8
"""The .pth files named at most."""

CONVERT_CODE = ("import os, sys, torch; from safetensors.torch import load_file; " + OWN_DIR_CODE +
                "torch.save(load_file(sys.argv[1]), " + OWN_DIR_FILE + ")")
"""safetensors to torch.save's .pth: no pickle read; the .pth made in a directory of the user's own that no one else
can write (OWN_DIR_CODE) by an exclusive create that refuses a file or a link there (torch.save by a path writes
through a link: hostile audit 8 F1)."""

NOT_A_CHECKPOINT = f"a directory without {MANIFEST} (not a checkpoint) and without {LATEST} (not a checkpoint root)"


def not_a_checkpoint(root: Dir, owners: Owners) -> str:
    """Why the directory `root` (no manifest.json, no LATEST) is no source, and what it holds that may be."""
    if root.lstat(MODEL_FILE) is not None and root.lstat(HF_CONFIG) is not None:  # the hf layout, looked at
        if _model_type(root, owners) == "minimind":
            return _minimind_hf(root, owners)
        return (f"a directory with {MODEL_FILE} but without {MANIFEST}: an export (`minilmd export --format hf`, "
                f"for transformers), not a checkpoint; init.from takes a checkpoint, its root or run, or a MiniMind "
                f".pth (`minilmd export CHECKPOINT --format minimind [--merge] --out model.pth`)")
    if root.lstat(CORPUS_META) is not None:  # a new user's init.from at the corpus: a checkpoint was meant
        return (f"{NOT_A_CHECKPOINT}; it holds {CORPUS_META}: a prepared corpus, which data.prepared takes (init.from "
                f"takes the weights a stage starts from: a checkpoint, its root or run, or a MiniMind .pth)")
    pths = _pth_files(root)
    if not pths:
        return NOT_A_CHECKPOINT
    models = [name for name in pths if _not_a_model(name) is None]
    others = [f"{name} ({_not_a_model(name)})" for name in pths if name not in models]
    said = f"{NOT_A_CHECKPOINT}; it holds MiniMind .pth files"
    if models:
        said += f": name one as init.from, {_names(root, models)}"
    return said + (f"; not a model: {_names(root, others)}" if others else "")


def _not_a_model(name: str) -> str | None:
    """What a .pth is by MiniMind's names for the files that are no model (init.from says the same of their
    contents: init_model.resume_file, minimind_lora); None for a model's."""
    if name.endswith("_resume.pth"):
        return "a resume file"
    return "a LoRA adapter" if name.startswith("lora") else None


def _names(root: Dir, names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(printable(str(root.path / name)) for name in names[:SHOWN]) + more


def _hf_config(root: Dir, owners: Owners) -> dict:
    try:
        return loads(read_in(root, HF_CONFIG, HF_CONFIG_MAX_BYTES, owners), path=root.path / HF_CONFIG)
    except (Unreadable, ValueError, OSError):  # said as the export it then looks like
        return {}


def _model_type(root: Dir, owners: Owners) -> str:
    return str(_hf_config(root, owners).get("model_type", ""))


def _minimind_hf(root: Dir, owners: Owners) -> str:
    """A MiniMind model's save_pretrained directory: the conversion to the .pth init.from takes."""
    said = f"a MiniMind model saved in transformers format ({HF_CONFIG}: model_type \"minimind\"), not a checkpoint"
    if _hf_config(root, owners).get("use_moe"):
        return f"{said}; {MOE_MODEL}"
    weights = root.lstat(MODEL_FILE)
    if weights is None or not stat.S_ISREG(weights.st_mode) or not perms.owner_in(weights, owners):
        return (f"{said}: its {MODEL_FILE} holds MiniMind's .pth tensor names, but it is not a regular file of the "
                f"directory's owner or yours, so no command to convert it is given")
    place = own_place()  # never beside the directory: a team directory's member could put a link there (audit 8)
    out = os.path.join(place or OUT_PLACEHOLDER, f"{root.path.name}.pth")
    where = (f"written to {out}, in a directory of yours; a file there is never replaced" if place else
             f"put a directory of yours for {OUT_PLACEHOLDER}")
    return (f"{said}: its {MODEL_FILE} holds MiniMind's .pth tensor names; convert it once ({where}) and give "
            f"init.from the .pth:\n      python -c {shlex.quote(CONVERT_CODE)} "
            f"{shlex.quote(str(root.path / MODEL_FILE))} {shlex.quote(out)}")


def _pth_files(root: Dir) -> list[str]:
    """The .pth names in `root`, sorted; [] when it cannot be listed or holds over MAX_LISTED entries."""
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root.fd)
    except OSError:
        return []
    try:
        return sorted(name for name in dir_names(fd, max_entries=MAX_LISTED) if name.endswith(".pth"))
    except Unreadable:
        return []
    finally:
        os.close(fd)
