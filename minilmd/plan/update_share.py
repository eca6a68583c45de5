"""`minilmd run --check`: the share of sample updates a fine-tune takes relative to the run it starts from.

The seed's style SFT (section 3): 87,940 conversations x 5 epochs = 439,700 sample updates on top of a base SFT of
904,979 x 2 = 1,809,958, i.e. 24 % of the updates, on a very different distribution at an unchanged learning rate:
the textbook setting of catastrophic forgetting. A sample update is what those notes count: a document (a
conversation) trained once, whatever the mode packs into a row. This run's: the rows its budget trains, as the
trainer counts them (minilmd/plan/budget.py, the same functions, after what a resumed checkpoint trained), times
the documents a row holds (minilmd/plan/epoch.py). Its base's: the rows its checkpoint records it trained
(`rows_seen` in its trainer_state.json: what it did train, not what it planned), counted the same way from its own
config and corpus when that corpus's meta.json is readable here, else as rows. A warning above
eval.update_share_warn. A DPO run's sample update is a pair trained once (its rows are pairs: minilmd/plan/pairs.py),
against its base's conversations; its warning names dpo.beta among the remedies. Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from minilmd.config import ConfigError, RunConfig, config_from_dict
from minilmd.corpus_meta import CORPUS_SUMMARY, data_fingerprint, read_corpus_meta
from minilmd.init_source import InitSourceError, resolve, source_state
from minilmd.names import TRAINER_STATE
from minilmd.plan.budget import as_trained, planned
from minilmd.plan.epoch import corpus_epoch
from minilmd.plan.trainer_state import Trained, rows_seen


def base_rows(cfg: RunConfig) -> tuple[Path, int, dict] | None:
    """(the base checkpoint, the rows its run trained on, its trainer_state), for an init.from that is a minilmd
    checkpoint: its `rows_seen` (the rows up to that checkpoint), or for a checkpoint older than that field its
    step times its global batch (minilmd/plan/trainer_state.py, as a resume reads it)."""
    try:
        source = resolve(cfg.init.from_, cfg.init.checkpoint)
        if source.kind != "checkpoint":
            return None
        state = source_state(source)  # in the directory resolve opened, its owner's file or ours
    except (InitSourceError, ValueError):  # Unreadable too: another user's checkpoint, read as hostile
        return None
    rows = rows_seen(state)
    return (source.path, rows, state) if rows else None


def base_samples(state: dict, rows: int) -> int | None:
    """The sample updates of the base's `rows`, counted from the config its checkpoint records (as trained) and
    the corpus that config names, when its meta.json is readable here; None otherwise."""
    raw = state.get("config")
    if not isinstance(raw, dict):
        return None
    try:
        base = config_from_dict(raw, source=TRAINER_STATE)
    except (ConfigError, TypeError, ValueError):
        return None
    meta = read_corpus_meta(base.data.prepared) if base.data.prepared else None
    if meta is None and isinstance(state.get(CORPUS_SUMMARY), dict):  # its staged copy, named there, is gone
        meta = state[CORPUS_SUMMARY]
    epoch = corpus_epoch(as_trained(base, meta), meta) if meta else None
    return epoch.samples(rows) if epoch else None


def share_lines(cfg: RunConfig, done: Trained | None = None) -> list[str]:
    """What `run --check` prints about the update share (nothing without init.from or without the numbers).
    `done`: what the checkpoint the launch resumes from trained (planned's), so the rows are the trainer's after a
    batch change (review11b F4: a fresh start's count at today's batch, before)."""
    if not cfg.init.from_:
        return []
    base, plan = base_rows(cfg), planned(cfg, None, None, done)
    if base is None or plan is None or plan.epoch is None or plan.samples is None:
        return []
    path, rows, state = base
    of_base = base_samples(state, rows)
    share = plan.samples / (of_base or rows)
    line = (f"update share: this run trains {plan.samples:,} sample updates ({plan.epoch.unit}: {plan.rows:,} rows, "
            f"each {plan.epoch.row_holds()}), {100 * share:.1f} % of the "
            + (f"{of_base:,} of its base {path}" if of_base else f"{rows:,} rows its base {path} trained"))
    if share <= cfg.eval.update_share_warn:
        return [line]
    head = f"WARNING: {line}, above eval.update_share_warn = {cfg.eval.update_share_warn:g}: "
    if plan.lr == 0:  # a sanity run: nothing moves, however many updates
        return [line + " (train.lr = 0: no weight moves)"]
    if plan.epoch.kind == "pairs":  # DPO: the reference (the base) anchors the policy; beta prices the distance
        return [head + f"this many preference updates at lr {plan.lr:g} pull the model away from its base, its "
                "reference (the seed's style SFT took 24 % and erased what its base learnt); lower train.lr or the "
                "epochs, raise dpo.beta (a dearer distance from the reference), "
                + ("lower lora.rank" if cfg.lora.enabled else "use [lora]") + ", or watch [eval] probe"]
    if not _fine_tuned(state):
        return [line + " (its base was trained from scratch: a first fine-tune of a pretrained model takes this "
                "much by design; the warning is for a fine-tune of a fine-tune, whose abilities this many updates "
                "erase)"]
    data = "on its base's own corpus" if _same_corpus(cfg, state) else "on other data"
    if cfg.lora.enabled:  # already the remedy: the base stays as it is, but the model with the adapter on drifts
        return [head + f"the base's weights stay frozen, but with the adapter on, this many updates {data} "
                f"at lr {plan.lr:g} override what the base learnt (the seed's style SFT took 24 %); lower "
                "train.lr, the epochs or lora.rank, or watch [eval] probe"]
    return [head + f"a fine-tune this large {data} at lr {plan.lr:g} erases what the base learnt (the "
            "seed's style SFT took 24 %); lower train.lr or the epochs, use [lora], or watch [eval] probe"]


def _fine_tuned(state: dict) -> bool:
    """Whether the base was itself a fine-tune (its config names an init.from): a first SFT of a model trained from
    scratch is the recipe (the seed's MiniMind SFT took about 48 % of its pretraining's documents), the seed's
    forgetting came from a style SFT on top of an SFT. A base whose config cannot be read counts as a fine-tune."""
    raw = state.get("config")
    init = raw.get("init") if isinstance(raw, dict) else None
    return not isinstance(init, dict) or bool(init.get("from"))


def _same_corpus(cfg: RunConfig, state: dict) -> bool:
    """Whether this run trains on the very data its base did (the data fingerprints its checkpoint records)."""
    fingerprints = state.get("fingerprints")
    meta = read_corpus_meta(cfg.data.prepared) if cfg.data.prepared else None
    recorded = fingerprints.get("data") if isinstance(fingerprints, dict) else None
    return meta is not None and isinstance(recorded, str) and recorded == data_fingerprint(meta)
