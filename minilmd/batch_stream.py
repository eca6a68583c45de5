"""The settings that make a run's batch stream, its lr schedule and its update (weight decay, clip, DPO's beta, a
LoRA run's scale), and what a resume that changes them says (the one rule: stream_changes over RESUME_KEYS).

A resume rebuilds the sampler from the config it runs with (minilmd/plan/growth.py resume_sampler) and positions it
at the rows the checkpoint had seen: a train.seq_len, data.mode or train.seed other than the checkpoint's run used
gives other rows in another order from the resumed step on, and a micro_batch_size or grad_accum other than its
sums them in other batches. Lengthening seq_len mid-run is a legitimate practice, so none is refused (a DPO run's
seq_len is: trainer/loop/dpo_reference.py; data.doc_mask and the model's shape are, as another model:
minilmd/checkpoint_expect.py), but the run is from then on the same as an undisturbed run of neither config: `run
--check` and the trainer say so at the resume, staging records it (event "data_shape", state.json's
shape_changes, daemon/jobs/stagingworker.py) and `minilmd status` says the run is not bit-reproducible
(daemon/views/reproducible.py). What a checkpoint records of its run's config is its trainer_state.json "config"
(trainer/loop/train.py trainer_state: RunConfig.to_dict()), and beside it the world size it trained on (its ranks:
a resume on another number of GPUs cuts every global batch into other rank slices, plan/sampler_base.py, and sums
the ranks' gradients in another order). A change the supervisor made itself, the smaller micro-batch of its retry
after a CUDA OOM (daemon/child/policy.py: the global batch kept), is said as that retry's, with the micro-batch it
had and the one it has now, so that `status` does not leave the operator looking for a config edit nobody made."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minilmd.config import KEPT_ON_RESUME, RunConfig, stage_defaults
from minilmd.corpus_meta import CORPUS_SUMMARY
from minilmd.names import TRAINER_STATE, TRAINER_STATE_MAX_BYTES, is_step_name, step_of
from minilmd.perms import own_uid
from minilmd.untrusted import Unreadable, listed, printable, read_json

STREAM_KEYS = ("train.seq_len", "train.micro_batch_size", "train.grad_accum", "train.seed", "data.mode",
               "train.lr", "train.min_lr_ratio", "train.warmup_steps", "train.max_steps", "train.max_tokens",
               "train.max_epochs")
"""The settings whose change at a resume changes the batches, or the learning rate of every step (the schedule's
rates, its warmup, the budget its cosine decays over), from the resumed step on."""

UPDATE_KEYS = ("train.weight_decay", "train.grad_clip", "dpo.beta", "lora.alpha", "lora.dropout")
"""The settings whose change at a resume changes the loss or the update of every step from the resumed step on,
the batches and the rate kept: the decay, the gradient clip, DPO's beta (the loss and its rewards' scale), a LoRA
run's scale and dropout. A dpo key is compared only where the checkpoint trained on a DPO corpus, a lora key only
where it trained adapters (RELEVANT_WHEN): elsewhere the run never used it."""

RESUME_KEYS = (*STREAM_KEYS, *UPDATE_KEYS)
"""Every key a resume compares against its checkpoint's recorded config (stream_changes, the one rule). Beside
them train.dtype, compared as what it resolves to (matmul_of): "auto" is fp32 on the CPU as "fp32" is."""

MATMUL = "matmul"
"""The key trainer_state.json records (trainer/loop/train.py) and stream_record copies: what the checkpoint's
matrices ran in, "bf16" (autocast) or "fp32", train.dtype resolved on its device."""


def matmul_of(setting: Any, on_cuda: bool | None) -> str | None:
    """What train.dtype `setting` runs the matrices in (the one rule; the trainer's autocast follows it,
    trainer/loop/step.py): "bf16" for "bf16", "fp32" for "fp32", and "auto" bf16 on CUDA, fp32 on the CPU; None
    where that cannot be told ("auto" on a device not known yet, a value that is none of these)."""
    if setting in ("bf16", "fp32"):
        return setting
    if setting == "auto" and on_cuda is not None:
        return "bf16" if on_cuda else "fp32"
    return None


def _is_cuda(device: Any) -> bool | None:
    """Whether a device type ("cuda", "cpu": train.device, a checkpoint's kernels record) is CUDA; None where it does
    not tell (train.device "auto": not known here)."""
    return {"cpu": False, "cuda": True}.get(device) if isinstance(device, str) else None


def _dtype_change(cfg: RunConfig, recorded: Any, on_cuda: bool | None) -> list[str]:
    """`train.dtype = ...` where the matmul dtype the resume runs differs from the one the checkpoint ran
    (stream_record's MATMUL): every step's rounding changes from the resumed step on."""
    then = recorded.get(MATMUL) if isinstance(recorded, dict) else None
    now = matmul_of(cfg.train.dtype, _is_cuda(cfg.train.device) if on_cuda is None else on_cuda)
    if then is None or now is None or then == now:
        return []
    return [f"train.dtype = {cfg.train.dtype!r} ({now} matmuls, was {then})"]

def bit_reproducible(on_cpu: bool, deterministic: bool, shape_changes: Sequence[str] = ()) -> bool:
    """Whether a run killed and resumed ends with the weights an undisturbed run would have, bit for bit (the one
    rule, `minilmd status` says it: daemon/views/reproducible.py): always on the CPU, on the GPU only with
    train.deterministic (deterministic kernels: trainer/loop/determinism.py); never once a resume changed the batch
    stream (`shape_changes`, state.json's): the run is then the same as an undisturbed run of neither config."""
    return not shape_changes and (on_cpu or deterministic)


LEFT_TO_THE_STAGE = frozenset({*KEPT_ON_RESUME, *(key for data_format in ("text", "chat", "dpo") for lora in
                                                  (False, True) for key in stage_defaults(data_format, lora)[1])})
"""Keys whose value, where the config leaves them out, is the stage's (an SFT run's data.mode is "bucketed", a DPO
run's lr 1e-5: config.stage_defaults, applied by the trainer once it knows the corpus) or kept from the checkpoint
(config.keep_recorded_schedule): compared only where the config (or the supervisor's override) sets them; the
schema's default is not what such a run used."""


WORLD_SIZE = "world_size"
"""The key stream_record adds to a checkpoint's recorded config: the ranks its run trained on (trainer_state.json's
"world_size", beside "config"); no section of the config has that name."""

OOM_RETRY = "by the supervisor's retry after a CUDA OOM (the global batch kept)"
"""How a change the supervisor's own overrides made is said: its only ones are the OOM retry's smaller micro-batch
and the grad_accum that keeps the global batch (daemon/child/policy.py)."""


TRAINED = "trained"
"""The key stream_record adds for what the checkpoint trained: trainer_state.json's TRAINED_KEYS, copied as they are
(plan/trainer_state.py recorded_trained reads them, as a resume does: a budget in tokens or epochs is counted after
them, plan/budget.py), and the total steps its schedule ran over (plan/resume_rate.py)."""
TRAINED_KEYS = ("step", "rows_seen", "positions_seen", "global_batch", "total_steps")
DATA_FORMAT = "data_format"
"""The key stream_record adds for the data format the checkpoint trained on (its trainer_state.json corpus summary,
minilmd/corpus_meta.py corpus_summary): a DPO key is compared only for a DPO run."""
INIT_USED = "init_used"
"""The key stream_record adds for what [init] from was (trainer_state.json's "init": its path and step), which a
finished stage's base having moved on is told by (minilmd/init_moved.py); not "init", the config's section."""


def _trained_dpo(recorded: Any) -> bool:
    summary = recorded.get(DATA_FORMAT) if isinstance(recorded, dict) else None
    return summary == "dpo"


def _trained_adapters(recorded: Any) -> bool:
    lora = recorded.get("lora") if isinstance(recorded, dict) else None
    rank = lora.get("rank") if isinstance(lora, dict) else None
    return isinstance(rank, int) and not isinstance(rank, bool) and rank > 0


RELEVANT_WHEN = {"dpo": _trained_dpo, "lora": _trained_adapters}
"""A section whose keys a run uses only on some corpora or models: compared only where the checkpoint's did."""


def stream_record(state: Any) -> Any:
    """What a checkpoint records of its batch stream, from its trainer_state.json: its "config", the world size
    it trained on under WORLD_SIZE and what it trained under TRAINED; None when `state` is not a mapping."""
    if not isinstance(state, dict):
        return None
    config = state.get("config")
    corpus = state.get(CORPUS_SUMMARY)
    return {**(config if isinstance(config, dict) else {}), WORLD_SIZE: state.get(WORLD_SIZE),
            DATA_FORMAT: corpus.get("data_format") if isinstance(corpus, dict) else None,
            TRAINED: {key: state[key] for key in TRAINED_KEYS if key in state}, INIT_USED: state.get("init"),
            MATMUL: _recorded_matmul(state, config)}


def _recorded_matmul(state: dict, config: Any) -> str | None:
    """What the checkpoint's matrices ran in: its MATMUL record, or (saved before that existed) its train.dtype
    resolved on the device its "kernels" record names; None where neither tells."""
    if state.get(MATMUL) in ("bf16", "fp32"):
        return state[MATMUL]
    train = config.get("train") if isinstance(config, dict) else None
    kernels = state.get("kernels")
    device = kernels.get("device_type") if isinstance(kernels, dict) else None
    return matmul_of(train.get("dtype") if isinstance(train, dict) else None, _is_cuda(device))


def stream_changes(cfg: RunConfig, recorded: Any, overrides: dict | None = None,
                   world_size: int | None = None, on_cuda: bool | None = None) -> list[str]:
    """`KEY = now (was then)` for each of RESUME_KEYS whose value in `cfg` (with the supervisor's `overrides`, as
    its trainer runs) differs from `recorded`, a checkpoint's config (stream_record: its trainer_state.json
    "config"); a key `recorded` lacks (saved before it was recorded) is not compared. The keys the `overrides` set
    (the OOM retry's smaller micro-batch) are said in one line, as that retry's (OOM_RETRY). Then the world size:
    `world_size` (the ranks the resume trains on; None: the config's, cfg.world_size, as the supervisor launches)
    against the one `recorded` holds, when it holds one. And the matmul dtype (_dtype_change): `on_cuda` whether the
    resume trains on CUDA (None: as train.device tells; "auto" then compares an explicit dtype only)."""
    said: list[str] = []
    retried: list[str] = []
    overrides = overrides or {}
    for key in RESUME_KEYS:
        if key in LEFT_TO_THE_STAGE and not cfg.is_set(key) and key not in overrides:
            continue
        section, name = key.split(".")
        if section in RELEVANT_WHEN and not RELEVANT_WHEN[section](recorded):
            continue
        then = (recorded.get(section) or {}).get(name) if isinstance(recorded, dict) else None
        if then is None or isinstance(then, (dict, list)):
            continue
        now = overrides.get(key, getattr(getattr(cfg, section), name))
        if str(then) != str(now):  # an override may be held as its text
            (retried if key in overrides else said).append(f"{key} = {now!r} (was {printable(repr(then))})")
    if retried:
        said.append(f"{' and '.join(retried)} {OOM_RETRY}")
    said += _dtype_change(cfg, recorded, on_cuda)
    then_world = recorded.get(WORLD_SIZE) if isinstance(recorded, dict) else None
    now_world = cfg.world_size if world_size is None else world_size
    if isinstance(then_world, int) and not isinstance(then_world, bool) and then_world != now_world:
        said.append(f"world size = {now_world} rank(s) (was {then_world}: each global batch is cut into other rank "
                    f"slices and their gradients summed in another order)")
    return said


def dpo_seq_len_refused(cfg: RunConfig, recorded: Any, data_format: str, ckpt_name: str) -> str | None:
    """The one batch stream change a resume refuses: a DPO run's train.seq_len (its reference log-probs, kept in
    its checkpoints, are sums over the rows that seq_len cut, and the reference model may be gone:
    trainer/loop/dpo_reference.py). `run --check` and the launch compare the checkpoint's recorded config; the
    trainer its reference file's record (dpo_seq_len_refusal, the same words). None when it goes on."""
    then = (recorded.get("train") or {}).get("seq_len") if isinstance(recorded, dict) else None
    if data_format != "dpo" or not isinstance(then, int) or then == cfg.train.seq_len:
        return None
    return dpo_seq_len_refusal(cfg.train.seq_len, then, ckpt_name)


def dpo_seq_len_refusal(now: int, then: int, ckpt_name: str) -> str:
    return (f"train.seq_len is {now}; this DPO run's reference log-probs were computed at {then} ({ckpt_name}): put "
            f"it back, or start the DPO stage as a new run")


def change_note(step: int, changes: list[str]) -> str:
    """What `run --check`, the trainer, staging's event and status say of a resume at `step` that `changes`
    (stream_changes' lines) the batch stream, the schedule or the update."""
    return (f"the resume from step {step:,} changes the batch stream, the lr schedule or the update: "
            f"{', '.join(changes)}: the data rows, their order, how they are batched, their learning rate or the "
            f"loss and update of each step change from step {step:,} on, "
            f"and the run is no longer the same as an undisturbed run of either config (not bit-reproducible "
            f"against one)")


def newest_recorded(checkpoint_dir: Path) -> tuple[int, Any] | None:
    """(step, the config it records) of the newest checkpoint in scratch whose trainer_state.json reads, the one a
    resume would take but for damage the trainer's validation finds; None when scratch holds none."""
    try:
        steps = sorted((n for n in listed(checkpoint_dir) if is_step_name(n)), reverse=True)
    except OSError:
        return None
    for name in steps:
        if (recorded := recorded_config(checkpoint_dir / name)) is not None:
            return step_of(name), recorded
    return None


def recorded_config(ckpt: Path) -> Any | None:
    """The config checkpoint `ckpt` in the run's own scratch records (stream_record of its trainer_state.json, read
    bounded, no link followed, a file of this user's: its trainer wrote it); None when it cannot be read."""
    try:
        state = read_json(ckpt / TRAINER_STATE, max_bytes=TRAINER_STATE_MAX_BYTES, owner=own_uid())
    except (OSError, Unreadable):
        return None
    return stream_record(state)
