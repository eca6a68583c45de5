"""Which checkpoint an export, a loader or `sample` reads, for export.py, adapter.py and tokenizer_files.py alike:
the checkpoint a path names (a step directory, a root's LATEST or newest, a pointer file, a run directory, a run
config), said on stderr once. Apart from export_paths.py, which validates the one taken (validated_checkpoint) and
holds where an export writes: finding a checkpoint is a concern of its own, with its own rules (a root's entries
passed by, BEST said).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from minilmd import leftovers, scratch
from minilmd.names import BEST, CHECKPOINTS, LATEST, MODEL_FILE, RUN_CONFIG_COPY, STATE, step_of
from minilmd.trainer.model.export_paths import ExportError


def _not_a_directory(path: Path) -> str:
    """Why `path`, not a directory, is no checkpoint: nothing there, or a file (a MiniMind LoRA adapter said as
    one: user7 #2, `sample --lora lora_identity_512.pth` said "no such checkpoint directory" of a file there)."""
    from minilmd.init_pth import minimind_lora_file

    if not os.path.lexists(path):
        return "no such checkpoint directory"
    lora = minimind_lora_file(path) if path.suffix == ".pth" else ""
    return "a file, not a checkpoint directory" + (f"; it is {lora}" if lora else "")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint directory, from a pointer file (ROOT/LATEST, ROOT/BEST: the one it
    names), or from a root: the one `LATEST` names, else the newest `step-*` directory with a manifest. Of a root,
    only its own step directories (checkpoint_dirs.list_checkpoints): a symbolic link or another user's directory
    by a step name, planted in a root others can write, is passed by and said, never taken for the newest (nor
    for the one LATEST names)."""
    from minilmd.checkpoint_dirs import PointerError, list_checkpoints, named_checkpoint, read_latest
    from minilmd.checkpoint_select import is_run_dir

    try:
        path = named_checkpoint(path)  # ROOT/BEST: the lowest val loss (early_stop)
    except PointerError as e:
        raise ExportError(str(e)) from None
    if path.suffix == ".toml" and path.is_file():  # a run config: its run's checkpoints, a hand run's scratch too
        return _config_checkpoint(path)
    if not path.is_dir():
        raise ExportError(f"{path}: {_not_a_directory(path)}")
    if is_run_dir(path):
        return _run_checkpoint(path)
    if not (path / MODEL_FILE).is_file():
        passed_by: dict[str, str] = {}
        steps = list_checkpoints(path, passed_by)
        for name, why in sorted(passed_by.items()):
            _say_once(f"{path / name}: passed by: {why}, not one of this root's checkpoints")
        latest = {p.name: p for p in steps}.get(read_latest(path) or "")
        if latest is not None or steps:
            path = latest if latest is not None else steps[-1]
            _say_best_elsewhere([path.parent], path)
        elif (path / STATE).is_file():
            raise ExportError(f"{path}: a run directory without its {RUN_CONFIG_COPY}, which says where its "
                              f"checkpoints are: give its run.remote, or its scratch's checkpoints directory "
                              f"({scratch.default_path('RUN_NAME') / CHECKPOINTS} by default)")
        else:
            raise ExportError(f"{path}: not a checkpoint (no {MODEL_FILE}) and no {LATEST} or step-* "
                              f"checkpoint under it")
    return path


def _config_checkpoint(config: Path) -> Path:
    """A run config stands for its run (run.dir, when a supervisor ran it) or, trained by hand, its scratch's."""
    from minilmd.checkpoint_select import is_run_dir
    from minilmd.config import load_config
    try:
        cfg = load_config(config)
    except (OSError, ValueError) as e:  # ConfigError is a ValueError
        raise ExportError(f"{config}: a file, not a checkpoint directory, nor a run config that loads: {e}") from None
    return _run_checkpoint(cfg.run_dir) if is_run_dir(cfg.run_dir) else resolve_checkpoint(cfg.checkpoint_dir)


def _run_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a run directory stands for: the one a resume of the run would take (checkpoint_select's
    run_roots and find_latest: the newest that validates, of its scratch's and its run.remote's), said on stderr.
    Its run.toml is read as another run's copy (run_roots), and nothing is moved: a damaged checkpoint is passed
    by. The one taken is validated again where it is
    read (validated_checkpoint): it may have changed since."""
    from minilmd.checkpoint import CheckpointError
    from minilmd.checkpoint_select import RunDirUnusable, find_latest, run_roots

    try:
        run = run_roots(run_dir)
    except RunDirUnusable as e:
        raise ExportError(f"{e}; give one of its checkpoints") from None
    try:
        found = find_latest(run.roots, log=_say_once, set_aside=False)
    except CheckpointError as e:
        raise ExportError(f"{run_dir}: a run directory; its checkpoints in {run.where}{run.gone}: "
                          f"{'; '.join(e.problems)}") from None
    if found is None:
        raise ExportError(f"{run_dir}: a run directory; no valid checkpoint where its checkpoints are, {run.where}"
                          f"{run.unread}{run.gone}")
    _say_once(f"{run_dir}: a run directory: {found}, the newest valid checkpoint of {run.where} (the one a resume "
              f"would take){run.gone}")
    _say_best_elsewhere(run.roots, found)
    return found


def _say_best_elsewhere(roots: list[Path], taken: Path) -> None:
    """A root (or a run) taken for its newest checkpoint, when its BEST names another step (an early stop's: the one
    a next stage's `init.checkpoint = "best"` takes): one line on stderr says so, and how to take that one."""
    from minilmd.checkpoint_dirs import read_best
    from minilmd.names import is_step_name

    for root in [taken.parent, *(r for r in roots if r != taken.parent)]:
        name = read_best(root)
        if name is None or not is_step_name(name):
            continue
        if step_of(name) != step_of(taken):
            _say_once(f"{BEST} names step {step_of(name)} ({_best_words(root / name)}): export {root / BEST} for it")
        return


def _best_words(best: Path) -> str:
    """`best val loss 2.1234`, from the early-stop state in the trainer_state.json of the checkpoint BEST names
    (read bounded, this user's own); the metric alone when that cannot be read."""
    from minilmd.names import TRAINER_STATE, TRAINER_STATE_MAX_BYTES
    from minilmd.perms import own_uid
    from minilmd.untrusted import Unreadable, read_json

    try:
        stop = read_json(best / TRAINER_STATE, max_bytes=TRAINER_STATE_MAX_BYTES, owner=own_uid()).get("early_stop")
    except Unreadable:
        stop = None
    metric = stop.get("metric") if isinstance(stop, dict) else None
    value = stop.get("best_value") if isinstance(stop, dict) else None
    if not isinstance(metric, str) or not isinstance(value, (int, float)):
        return "the best validation of its early_stop.metric"
    return f"best {metric.replace('_', ' ')} {value:.4f}"


@functools.cache
def _say_once(message: str) -> None:
    """On stderr, once: one command resolves its checkpoint several times (weights, tokenizer, chat template)."""
    leftovers.stderr_say("checkpoints")(message)
