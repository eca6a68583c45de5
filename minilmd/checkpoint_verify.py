"""`minilmd verify`: the report on one checkpoint, on every checkpoint of a root or of a run directory, against what a
config expects.

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
from minilmd.checkpoint_select import RunDirUnusable, is_run_dir, resume_order, run_roots
from minilmd.config import load_config
from minilmd.corpus_meta import corpus_train_tokens, read_meta
from minilmd.names import MANIFEST, is_step_name, step_of
from minilmd.untrusted import listed


def verify_report(path: str | os.PathLike, expected: Expectation | None = None) -> dict:
    """`minilmd verify`: validate one checkpoint (a step directory, or the pointer file LATEST or BEST naming one),
    every step directory under a root (those without a manifest included, as failures), or every checkpoint of a
    run directory (`verify_run`). Nothing is moved.
    {"ok": bool, "checkpoints": [{"path", "step", "ok", "problems", "mismatch"}]}; ok is False when there is no
    checkpoint at all."""
    if is_run_dir(Path(path)):
        return verify_run(Path(path), expected)
    try:
        path = named_checkpoint(path)  # ROOT/LATEST, ROOT/BEST: the step directory it names
    except PointerError as e:
        return {"ok": False, "latest": read_latest(Path(path).parent),
                "checkpoints": [_failure(Path(path), str(e))]}
    if (path / MANIFEST).exists() or is_step_name(path.name):
        dirs = [path]
    else:
        dirs = _step_dirs(path)
    results = [_checked(d, expected) for d in dirs]
    if not results:
        results.append(_failure(path, f"no checkpoint at {path} (neither a step-XXXXXXXX directory nor a root "
                                      f"holding any)"))
    root = path.parent if dirs == [path] else path
    return {"ok": all(r["ok"] for r in results), "latest": read_latest(root), "checkpoints": results}


def verify_run(run_dir: Path, expected: Expectation | None = None) -> dict:
    """`minilmd verify RUN_DIR`: every step directory of the run's checkpoint roots (checkpoint_select.run_roots:
    its scratch's, then its run.remote's when local), each entry saying its root ("root": "scratch" or
    "run.remote"), and "run": {"dir", "roots": [{"path", "kind", "latest"}], "resume": the checkpoint a resume
    would take (the first valid one in resume_order; None when none is, or when a checkpoint of another run comes
    first: a resume refuses it), "unread": the words for a run.remote not read here, "gone": those for a scratch
    gone (RunRoots.gone; its root is then left out of "roots")}. ok is False when any
    checkpoint is invalid, or when there is none in any root."""
    try:
        run = run_roots(run_dir)
    except RunDirUnusable as e:
        return {"ok": False, "latest": None, "checkpoints": [_failure(run_dir, str(e))]}
    results, roots = [], []
    for kind, root in run.found():  # a run.remote not read here: one root; a scratch gone: said by run.gone
        results += [{**_checked(d, expected), "root": kind} for d in _step_dirs(root)]
        roots.append({"path": str(root), "kind": kind, "latest": read_latest(root)})
    if not results:
        results.append(_failure(run_dir, f"no checkpoint in {run.where}, where the checkpoints of the run "
                                         f"directory {run_dir} are{run.unread}{run.gone}"))
    checked = {r["path"]: r for r in results}
    resume = None
    for _, candidate in resume_order(run.roots):
        entry = checked.get(str(candidate))
        if entry is not None and (entry["ok"] or entry["mismatch"]):  # a resume takes it, or refuses (find_latest)
            resume = str(candidate) if entry["ok"] else None
            break
    return {"ok": all(r["ok"] for r in results), "latest": read_latest(run.roots[0]), "checkpoints": results,
            "run": {"dir": str(run_dir), "roots": roots, "resume": resume, "unread": run.unread,
                    "gone": run.gone}}


def report_lines(report: dict) -> list[str]:
    """verify_report's report as `minilmd verify` prints it: each checkpoint `PATH: ok` or `PATH: INVALID` (with
    its root, of a run directory) and its problems; of a run directory, where its roots are and which checkpoint a
    resume would take."""
    run = report.get("run")
    lines = []
    if run:
        roots = " and ".join(f"{root['path']} ({root['kind']})" for root in run["roots"])
        lines.append(f"{run['dir']}: a run directory; its checkpoints in {roots}{run['unread']}{run.get('gone', '')}")
    for entry in report["checkpoints"]:
        root = f" ({entry['root']})" if "root" in entry else ""
        lines.append(f"{entry['path']}: {'ok' if entry['ok'] else 'INVALID'}{root}")
        lines += [f"  - {problem}" for problem in entry["problems"]]
    if run:
        lines.append(f"a resume of the run would take {run['resume']}" if run["resume"] else
                     "no checkpoint a resume of the run would take")
    return lines


def _step_dirs(root: Path) -> list[Path]:
    """The step directories of a root, oldest first (a link or one without a manifest too: verified, they fail).
    A root of more entries than untrusted.listed reads is refused (TooManyEntries, an OSError), not listed whole."""
    if not root.is_dir():
        return []
    return sorted((root / n for n in listed(root) if is_step_name(n) and (root / n).is_dir()), key=step_of)


def _checked(step_dir: Path, expected: Expectation | None) -> dict[str, Any]:
    """One checkpoint validated: its report entry."""
    entry: dict[str, Any] = {"path": str(step_dir), "step": step_of(step_dir) if is_step_name(step_dir.name) else None,
                             "ok": True, "problems": [], "mismatch": None}
    try:
        state = validate(step_dir, expected)
        entry["step"] = state["step"]
    except CheckpointError as e:
        entry.update(ok=False, problems=e.problems, mismatch=e.kind if isinstance(e, CheckpointMismatch) else None)
    return entry


def _failure(path: Path, problem: str) -> dict[str, Any]:
    return {"path": str(path), "step": None, "ok": False, "mismatch": None, "problems": [problem]}


def expectation_from_config(config_path: str | os.PathLike, log: Callable[[str], None] = print) -> Expectation:
    """What a run config expects of its checkpoints: its model section and, when its prepared corpus can be
    read, the fingerprints of that corpus's data and tokenizer."""
    cfg = load_config(config_path, train_tokens_of=corpus_train_tokens)
    try:
        return Expectation.for_corpus(cfg, read_meta(cfg.data.prepared))
    except Exception as e:  # noqa: BLE001 - the corpus may be staged elsewhere or gone: check what can be checked
        log(f"note: fingerprints not checked, cannot read data.prepared = {cfg.data.prepared!r}: {e}")
    return Expectation.for_corpus(cfg)
