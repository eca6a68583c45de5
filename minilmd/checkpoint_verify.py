"""`minilmd verify`: the report on one checkpoint or on every checkpoint of a root, against what a config expects.

The validation itself is minilmd/checkpoint.py (`validate`, `Expectation`); here is what the command reads and
prints: the step directories a path names (a pointer, a step directory, a root) each validated, nothing moved, and
the Expectation a run config gives (its model section and, when its prepared corpus can be read, its fingerprints).
Torch-free.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minilmd.checkpoint import CheckpointError, CheckpointMismatch, Expectation, validate
from minilmd.checkpoint_dirs import PointerError, named_checkpoint, read_latest
from minilmd.config import load_config
from minilmd.corpus_meta import corpus_train_tokens, read_meta
from minilmd.names import MANIFEST, is_step_name, step_of


def verify_report(path: str | os.PathLike, expected: Expectation | None = None) -> dict:
    """`minilmd verify`: validate one checkpoint (a step directory, or the pointer file LATEST or BEST naming one),
    or every step directory under a root (those without a manifest included, as failures). Nothing is moved.
    {"ok": bool, "checkpoints": [{"path", "step", "ok", "problems", "mismatch"}]}; ok is False when there is no
    checkpoint at all."""
    try:
        path = named_checkpoint(path)  # ROOT/LATEST, ROOT/BEST: the step directory it names
    except PointerError as e:
        return {"ok": False, "latest": read_latest(Path(path).parent), "checkpoints": [
            {"path": str(path), "step": None, "ok": False, "mismatch": None, "problems": [str(e)]}]}
    if (path / MANIFEST).exists() or is_step_name(path.name):
        dirs = [path]
    elif path.is_dir():
        dirs = sorted((p for p in path.iterdir() if is_step_name(p.name) and p.is_dir()), key=step_of)
    else:
        dirs = []
    results = []
    for d in dirs:
        entry: dict[str, Any] = {"path": str(d), "step": step_of(d) if is_step_name(d.name) else None, "ok": True,
                 "problems": [], "mismatch": None}
        try:
            state = validate(d, expected)
            entry["step"] = state["step"]
        except CheckpointError as e:
            entry.update(ok=False, problems=e.problems,
                         mismatch=e.kind if isinstance(e, CheckpointMismatch) else None)
        results.append(entry)
    if not results:
        results.append({"path": str(path), "step": None, "ok": False, "mismatch": None,
                        "problems": [f"no checkpoint at {path} (neither a step-XXXXXXXX directory nor a root "
                                     f"holding any)"]})
    root = path.parent if dirs == [path] else path
    return {"ok": all(r["ok"] for r in results), "latest": read_latest(root), "checkpoints": results}


def expectation_from_config(config_path: str | os.PathLike, log: Callable[[str], None] = print) -> Expectation:
    """What a run config expects of its checkpoints: its model section and, when its prepared corpus can be
    read, the fingerprints of that corpus's data and tokenizer."""
    cfg = load_config(config_path, train_tokens_of=corpus_train_tokens)
    try:
        return Expectation.for_corpus(cfg, read_meta(cfg.data.prepared))
    except Exception as e:  # noqa: BLE001 - the corpus may be staged elsewhere or gone: check what can be checked
        log(f"note: fingerprints not checked, cannot read data.prepared = {cfg.data.prepared!r}: {e}")
    return Expectation.for_corpus(cfg)
