"""The base a LoRA run's checkpoints were trained on, as its scratch tells it: what the newest checkpoint records
(its trainer_state's "init": the base's fingerprint record, its "from" the config's init.from then) against the
config and against the copy staged in scratch (`<scratch>/init`, daemon/jobs/initstage.py). A LoRA checkpoint holds
adapters alone, which resume only on that base; without a run.remote (whose `<remote>/init` keeps a copy:
daemon/jobs/basecopy.py) the staged copy is the only one. So staging refuses a changed init.from before it stages
anything (`refuse_another_base`, by the rule `run --check` and the launch refuse it with: minilmd/init_moved.py
lora_base_refused), and the end of a failed run keeps the staged copy only when it is that base, and says so only
then (`kept_why`). Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from minilmd.names import INIT_DIR


def newest_base(cfg) -> tuple[Path | None, dict | None]:
    """(The newest checkpoint in scratch whose trainer_state reads, the base it records: its init record, None when
    it records none); (None, None) when scratch holds none such."""
    from minilmd.checkpoint_dirs import list_checkpoints
    from minilmd.names import TRAINER_STATE, TRAINER_STATE_MAX_BYTES
    from minilmd.untrusted import read_json

    try:
        ckpts = list_checkpoints(cfg.checkpoint_dir)
    except OSError:  # scratch not readable: nothing to resume here (staging says what is wrong with it)
        return None, None
    for ckpt in reversed(ckpts):
        try:
            state = read_json(ckpt / TRAINER_STATE, max_bytes=TRAINER_STATE_MAX_BYTES)
        except (OSError, ValueError):  # Unreadable: an older one may still say
            continue
        init = state.get("init") if isinstance(state, dict) else None
        return ckpt, init if isinstance(init, dict) else None
    return None, None


def trained_on(cfg) -> dict | None:
    """The base the newest checkpoint in scratch of a LoRA run was trained on (its trainer_state's init record)."""
    return newest_base(cfg)[1]


def refuse_another_base(cfg) -> None:
    """InitSourceError (final, exit 2) for a LoRA run whose newest checkpoint in scratch was trained on the base
    another init.from gave (init_moved.lora_base_refused, the rule of `run --check` and the launch): asked before
    anything is staged, so that `<scratch>/init` is never replaced by another base. The launch refuses it already;
    this is for a checkpoint it could not read then (a remote that did not answer its look, fetched since)."""
    from minilmd.init_moved import lora_base_refused
    from minilmd.init_source import InitSourceError
    from minilmd.names import step_of

    if not cfg.lora.enabled:
        return
    ckpt, base = newest_base(cfg)
    if ckpt is not None and (refused := lora_base_refused(cfg, base, f"step {step_of(ckpt)}, in scratch "
                                                                      f"{cfg.checkpoint_dir}")):
        raise InitSourceError(refused)


def kept_why(cfg) -> str:
    """Why a LoRA run with checkpoints that failed for good keeps its staged base in scratch (scratch_end.
    release_inputs' `keep`), in words that are true: the base its adapters were trained on (the copy's record the
    newest checkpoint's); "" for a copy of another base (init.from's weights staged since: no use to these adapters,
    given back with the other inputs); the copy kept, said so, when either record cannot be read."""
    from minilmd.init_source import same_source, staged_record

    trained = trained_on(cfg)
    try:
        staged = staged_record(cfg.scratch_dir / INIT_DIR)
    except (OSError, ValueError):  # Unreadable: a damaged copy, or none
        staged = None
    if trained is not None and isinstance(staged, dict):
        if not same_source(trained, staged):
            return ""
        only = "there is no run.remote: the only copy" if not cfg.run.remote else \
            "without its copy on run.remote, the only one"
        return f"the LoRA base its adapters were trained on ({only})"
    return ("the LoRA base its adapters may have been trained on (what the newest checkpoint records of its base, or "
            "the copy's record, cannot be read)")
