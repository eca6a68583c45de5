"""What a run would do that its config may not mean, for `run --check`'s `note:` lines (stage_notes): settings its
corpus's stage ignores, SFT on packed windows across conversations (packed_sft), DPO or SFT without init.from (a
`WARNING:` line), an init.from checkpoint root of a run not finished yet, a model trained on text before DPO, a
tokenizer or chat template other than the corpus's, a .pth whose shapes are not read here (init_pth.pth_note); the
supervisor says init.from's (init_from_notes) once it has staged its checkpoint. Notes, never problems: what the
config check refuses is minilmd/probes.py's. Torch-free.
"""
from __future__ import annotations

import dataclasses
import os

from minilmd import init_tokenizer
from minilmd.bounded import bounded_probe
from minilmd.checkpoint_dirs import read_latest
from minilmd.config import RunConfig, stage_defaults
from minilmd.config_sections import DpoSection
from minilmd.corpus_meta import data_format_of, meta_value, owner_note, read_corpus_meta
from minilmd.init_pth import pth_note
from minilmd.init_source import InitSource, predecessor, resolve, source_state
from minilmd.names import TOKENIZER_CONFIG, is_step_name
from minilmd.probes import has_checkpoint
from minilmd.source_owner import checkpoint_note
from minilmd.untrusted import printable
from minilmd.urls import is_url

DPO_WITHOUT_INIT = ("no [init] from on a preference corpus: DPO trains from randomly initialised weights, against a "
                    "reference that is the same random model; set init.from to the SFT run's config or run directory")
"""`run --check`'s note and the trainer's warning (trainer/loop/dpo_reference.py) of DPO without init.from: never a
real stage, but how tiny tests exercise the objective, so not refused."""
WITHOUT_INIT = {"dpo": DPO_WITHOUT_INIT, "chat": "no [init] from on a chat corpus: this run trains SFT from randomly "
                "initialised weights, a model that has learnt no language first; set init.from to the pretraining "
                "run's config or run directory (a pretraining corpus is one of `minilmd prepare --format text`)"}
"""The warning of a fine-tuning stage's corpus without init.from (user6 #11: a pretraining config pointed at the SFT
corpus trained SFT from random weights in silence), by the corpus's data_format."""

WARNING = "WARNING: "
"""The start of a note `run --check` prints as a warning, not as `note:` (a stage from random weights, as the
update share's WARNING: plan/update_share.py)."""


def stage_notes(cfg: RunConfig) -> list[str]:
    """What the run will do that its config may not mean, for `run --check`'s `note:` lines: settings its corpus's
    stage ignores (ignored_settings), DPO or SFT without init.from (from random weights: a WARNING), a corpus of
    another user's (corpus_meta.owner_note), and what init.from's checkpoint records (init_notes). A corpus or a
    source that cannot be read now gives no note: the checks say it."""
    meta = _corpus_meta(cfg)
    data_format = data_format_of(meta) if meta is not None else ""
    notes = ignored_settings(cfg, data_format) + packed_sft(cfg, data_format)
    if not cfg.init.from_ and (without := WITHOUT_INIT.get(data_format)):
        notes.append(f"{WARNING}{without}")  # a fine-tuning stage from random weights: rarely meant (user10 #9)
    if owner := bounded_probe(owner_note, cfg.data.prepared, meta)[1]:  # another user's corpus: said, not refused
        notes.append(owner)
    return notes + _bounded_init_notes(cfg, meta)


def init_from_notes(cfg: RunConfig) -> list[str]:
    """stage_notes' notes of init.from's checkpoint (init_notes: another tokenizer or chat template than the
    corpus's, a model trained on text before DPO...) and of a [dpo] its corpus ignores (dpo_ignored), for the supervisor
    once it has staged that checkpoint (daemon/jobs/stagingworker.py): a predecessor still training at `run --check`
    had none to compare, and a launch without `--check` says none."""
    meta = _corpus_meta(cfg)
    return dpo_ignored(cfg, data_format_of(meta) if meta is not None else "") + _bounded_init_notes(cfg, meta)


def _corpus_meta(cfg: RunConfig) -> dict | None:
    """The local corpus's meta.json, read on shared storage in a bounded thread; None for a URL, or unread."""
    if not cfg.data.prepared or is_url(cfg.data.prepared):
        return None
    return bounded_probe(read_corpus_meta, cfg.data.prepared)[1]


def _bounded_init_notes(cfg: RunConfig, meta: dict | None) -> list[str]:
    """init_notes on shared storage, in a bounded thread (a source that does not answer gives no note)."""
    if not cfg.init.from_ or cfg.init.staged or is_url(cfg.init.from_):
        return []
    answered, found, _ = bounded_probe(init_notes, cfg, meta)
    return found if answered else []


def ignored_settings(cfg: RunConfig, data_format: str) -> list[str]:
    """The settings written in the config that the corpus's stage does not use: [dpo] off a preference corpus
    (a DPO config pointed at another corpus trains that corpus's stage: dpo_ignored), data.mode and data.doc_mask on
    one (its rows are pairs, length-bucketed, one side of one pair each: plan/pairs.py)."""
    if not data_format:
        return []
    notes = dpo_ignored(cfg, data_format)
    if data_format == "dpo" and cfg.is_set("data.mode") and cfg.data.mode != "bucketed":
        notes.append(f"data.mode = {cfg.data.mode!r} has no effect on a preference corpus: its pairs are "
                     f"length-bucketed, both sides in one micro-batch padded to its longest row")
    if data_format == "dpo" and cfg.data.doc_mask:
        notes.append("data.doc_mask = true has no effect on a preference corpus: each row holds one side of one pair, "
                     "a single document")
    return notes


def packed_sft(cfg: RunConfig, data_format: str) -> list[str]:
    """data.mode = "packed" written in the config of a chat corpus, without data.doc_mask: a written key beats the SFT
    default ("bucketed": SFT_DEFAULTS), so the run trains windows cut across conversations. A copy of
    deploy/example.toml (a pretraining config, mode written out) for an SFT stage did so without a word. A note, not
    a refusal: packed SFT runs, and may be meant."""
    if data_format != "chat" or not cfg.is_set("data.mode") or cfg.data.mode != "packed" or cfg.data.doc_mask:
        return []
    stage = stage_defaults(data_format, cfg.lora.enabled)[0]
    return [f"data.mode = 'packed' on a chat corpus: this {stage} run trains windows of train.seq_len tokens cut "
            f"across conversations (a row may start inside one and run into the next), not {stage}'s default "
            f"'bucketed' (one conversation a row, micro-batches of similar lengths); leave data.mode out of an SFT "
            f"config for that (a copy of deploy/example.toml writes it), or add data.doc_mask = true for whole "
            f"conversations packed (padding-free)"]


def dpo_ignored(cfg: RunConfig, data_format: str) -> list[str]:
    """A [dpo] written in the config (a table, empty or not, or a --set dpo key) on a text or chat corpus: the stage
    follows the corpus (stage_defaults), so a DPO config pointed at another corpus trains that corpus's stage, and
    nothing of init.from can tell (a .pth records nothing of how it was trained). Said at its defaults too:
    deploy/example.toml leaves [dpo] commented out, so a config that writes it means DPO."""
    if data_format in ("", "dpo") or not cfg.section_written("dpo"):
        return []
    written = ", ".join(f"{f.name} = {getattr(cfg.dpo, f.name)!r}" for f in dataclasses.fields(DpoSection)
                        if cfg.is_set(f"dpo.{f.name}"))
    stage = stage_defaults(data_format, cfg.lora.enabled)[0]
    return [f"[dpo]{' ' + written if written else ''} has no effect: {cfg.data.prepared} is a {data_format} corpus, "
            f"so this run's stage is {stage}, not DPO (DPO reads a preference corpus, one of `minilmd prepare "
            f"--format dpo`); leave [dpo] out of a config that is not DPO's"]


def init_notes(cfg: RunConfig, meta: dict | None) -> list[str]:
    """What init.from's checkpoint says the run may not mean (none once the run has a checkpoint of its own: it
    never reads init.from again): a checkpoint of another user's or below a directory another user owns or can
    rearrange (source_owner.checkpoint_note), a checkpoint root of a run that has not finished (unfinished_source),
    a model trained on text before DPO, a tokenizer or chat template other than the corpus's
    (minilmd/init_tokenizer.py notes: where another tokenizer cannot be proven; where it can, _check_init refuses
    it)."""
    spec = cfg.init.from_
    if has_checkpoint(cfg):
        return []
    try:
        names_a_run = predecessor(spec) is not None  # the run waits for its final checkpoint
        source = resolve(spec, cfg.init.checkpoint)
        state = source_state(source) if source.kind == "checkpoint" else None
    except (ValueError, OSError):  # InitSourceError, Unreadable: said by the checks, as a problem or a wait
        return []
    owner = checkpoint_note(f"init.from = {spec!r}", source.path)  # another user's place: said, not refused
    notes = [owner] if owner else []
    if state is None:  # a .pth records nothing of how it was trained; its shapes, where not read here, are noted
        note = pth_note(source, cfg.model_dict()) if source.kind == "minimind" else ""
        return notes + ([f"init.from = {spec!r}: {note}"] if note else [])
    notes += [] if names_a_run or source.pointer is None else unfinished_source(spec, source)
    if meta is not None and data_format_of(meta) == "dpo" and not os.path.lexists(source.path / TOKENIZER_CONFIG):
        notes.append(f"init.from = {spec!r}: {source.path} holds no chat template ({TOKENIZER_CONFIG}): it was "
                     f"trained on a text corpus (pretraining), not SFT, and DPO's reference is this model; DPO "
                     f"starts from the SFT stage's model")
    return notes + (init_tokenizer.notes(spec, cfg.data.prepared, source, state, meta) if meta is not None else [])


def unfinished_source(spec: str, source: InitSource) -> list[str]:
    """A checkpoint root (or its pointer file) whose newest checkpoint is of a run that has not finished: below
    the total steps it records, not stopped early. Only init.from naming the run (its config or run directory)
    waits for its final checkpoint; a root takes whatever is newest now."""
    latest = read_latest(source.path.parent)
    if latest is None or latest == source.path.name or not is_step_name(latest):  # no other step directory named
        newest = source
    else:
        newest = InitSource("checkpoint", source.path.parent / latest)
    try:
        state = source_state(newest)
    except ValueError:
        return []
    step, total = state.get("step"), _total_steps(state)
    if not isinstance(step, int) or total is None or step >= total or _stopped_early(state):
        return []
    run_dir = meta_value(state, "config", "run", "dir")
    where = f" ({printable(run_dir)})" if isinstance(run_dir, str) and run_dir else ""
    taken = "" if newest == source else f"; it takes {source.path.name}, its {source.pointer}"
    return [f"init.from = {spec!r}: its newest checkpoint, step {step:,} of {total:,}, is of a run that has not "
            f"finished{taken}: a launch now starts from that half-trained model. Name the run's config or run "
            f"directory{where} in init.from to wait for it to finish"]


def _total_steps(state: dict) -> int | None:
    """The steps the checkpoint's run trains in all: its trainer_state's total_steps, else its train.max_steps."""
    for total in (state.get("total_steps"), meta_value(state, "config", "train", "max_steps")):
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            return total
    return None


def _stopped_early(state: dict) -> bool:
    """The checkpoint's run ended by early_stop: its patience of validations without a new best spent."""
    patience = meta_value(state, "config", "early_stop", "patience")
    since = meta_value(state, "early_stop", "since_best")
    return isinstance(patience, int) and isinstance(since, int) and 0 < patience <= since
