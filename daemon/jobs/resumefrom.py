"""Where a launch resumes from, told before it starts (`run --check` and the launch alike, daemon/preflight.py): the
newest valid checkpoint in scratch, as the trainer's resume finds it (minilmd/checkpoint_select.py find_latest, with
nothing moved), or, when scratch holds none, the newest one on run.remote that staging's fetch would bring back
(daemon/jobs/fetch.py peek_latest: its manifest and trainer_state.json read as the fetch reads them, bounded and from
the root's descriptor; no weights fetched, those the fetch checks); or, when scratch is behind the remote (the
remote's newest valid checkpoint a newer step than scratch's, or a DPO run's step 0 further on in its reference
pass), that remote one, which staging fetches into scratch (the one rule of both: daemon/jobs/scratch_behind.py
judge; a remote that cannot be looked at now leaves scratch's, said in a note). Each is checked against what the
run expects of its checkpoints (minilmd/checkpoint.py Expectation: the model, the kernels, the corpus and its
tokenizer), the rule validation itself applies.

One trained with another model, corpus or tokenizer is refused here, exit 2, in the user's terms (`refusal`): which
setting differs, what the checkpoints were trained with and what the config says, and the two ways on; so is a LoRA
run's whose adapters were trained on the base another init.from gave (minilmd/init_moved.py lora_base_refused).
Before, `run --check` said OK, and the launch staged, fetched the checkpoint into a temporary directory and failed
there, naming the exception's class and that temporary path, and the finished run it was showed as failed. The
fetch's own refusal (a remote that did not answer the launch's look in time) says the same words
(daemon/jobs/stagingworker.py).
Torch-free; numpy and fsspec are imported only where there is a checkpoint to read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minilmd import names, scratch
from minilmd.batch_stream import change_note, dpo_seq_len_refused, recorded_config, stream_changes
from minilmd.corpus_meta import data_format_of, read_corpus_meta
from minilmd.daemon.jobs.remotewait import STEP_0
from minilmd.path_checks import launch_scratch, launch_staged_from
from minilmd.plan.trainer_state import Trained, recorded_trained
from minilmd.probes import bounded_probe, scratch_checkpoints
from minilmd.shared_place import same_source
from minilmd.untrusted import listed
from minilmd.urls import is_url

if TYPE_CHECKING:
    from minilmd.checkpoint import CheckpointMismatch, Expectation
    from minilmd.config import RunConfig

SCRATCH, REMOTE = "scratch", "remote"


class Resumes(str):
    """The line that says the launch resumes from a checkpoint of the run's own, in scratch or on run.remote: a
    `str` for `run --check` to print, a type for the launch to find (daemon/preflight.py launch): such a start is
    no first start, whatever this machine's state.json recorded or lost (daemon/phases/initwait.py at_start).
    `done`: what that checkpoint trained (None: not recorded), which `run --check`'s budget line counts after."""

    done: Trained | None = None


@dataclass
class Start:
    """Where the launch starts: `step` None is step 0."""

    step: int | None = None
    where: str = ""
    """SCRATCH or REMOTE ("" at step 0)."""
    path: str = ""
    """The checkpoint: its directory in scratch, or its path on the remote."""
    why: str = ""
    """At step 0: why (nothing there), or that the remote could not be looked at now."""
    passed_by: list[str] = field(default_factory=list)
    """Newer checkpoints passed by as invalid (the launch sets them aside, or the fetch does), one line each."""
    refused: str = ""
    """The refusal (`refusal`'s words) when the checkpoint it would resume from is of another model or corpus."""
    changes: list[str] = field(default_factory=list)
    """The batch stream settings the config changes against that checkpoint's (minilmd/batch_stream.py)."""
    reference: str = ""
    """A step 0 saved by a stopped DPO reference pass: how far (`reference pass 1,200/3,000 pairs`)."""
    over_scratch: str = ""
    """The remote's checkpoint taken over scratch's: why, and what staging does (scratch_behind.Taken.check_words)."""
    unlooked: str = ""
    """Why scratch's is resumed without the remote compared (scratch_behind.Verdict.unlooked)."""
    done: Trained | None = None
    """What that checkpoint trained (its steps, rows, token positions), as it records it; None: not read."""
    recorded: Any = None
    """What it records of its run (batch_stream.stream_record); None: not read."""

    def line(self) -> str:
        """What `run --check` says of it."""
        if self.step is None:
            return f"{STEP_0}{self.why}" if self.why else ""
        reference = f", {self.reference}" if self.reference else ""
        if self.where == SCRATCH:
            said = Resumes(f"resumes from step {self.step} (scratch: {self.path}{reference})")
        elif self.over_scratch:
            said = Resumes(f"resumes from step {self.step} (remote: {self.path}: {self.over_scratch} and verifies "
                           f"its weights there)")
        else:
            said = Resumes(f"resumes from step {self.step} (remote: {self.path}{reference}; staging fetches it into "
                           f"scratch and verifies its weights there)")
        said.done = self.done
        return said


def problems(cfg: RunConfig, remote_root: str | None, said: list[str] | None = None, fresh: bool = False) -> list[str]:
    """The launch's refusals: of the checkpoint it would resume from, and of a start that would leave behind a newer
    step in a scratch or on a remote this run.dir records and the config no longer names (daemon/jobs/runidentity.py;
    `fresh`: `run --fresh`); [] when there is none. `said` gets what `run --check` prints: the start line, then a
    note per checkpoint passed by, and one of an old scratch left behind. `remote_root`: run.remote's local path
    (minilmd/urls.py local_remote_root), None for a store (s3, sftp, memory) or none."""
    from minilmd.daemon.jobs import runidentity

    if not cfg.run.dir:
        return []
    # another user took the default's root: the launch makes a private root, empty, and fetches from the remote
    # (before: judged as a scratch of another run's, nothing said of where it starts, nor any checkpoint refused)
    fresh_root = launch_scratch(cfg) is None
    if not fresh_root and scratch.problems(cfg.scratch_dir, cfg.run_dir, cfg.scratch_is_default):
        return []  # the scratch is not this run's: its own problem says so, and its checkpoints are not read
    start = find(cfg, remote_root)
    unknown = start.step is None and not start.why and not start.refused  # the remote does not answer now
    from minilmd.daemon.jobs.rundone import done_line

    refused = ([start.refused] if start.refused else []) + runidentity.problems(cfg, start.step, fresh, unknown)
    # a run at its budget's end stages nothing: its LoRA base is not at stake, and it stays done (exit 0)
    done = None if refused else done_line(cfg, start.step, f"{start.where}: {start.path}", start.done)
    if not done:
        refused += _lora_base_refused(cfg, start)
    if said is not None:
        # a run at its budget's end: "run is done", in place of "resumes from step N"
        done = None if refused else done
        said += [done] if done else [line] if (line := start.line()) else []
        said += [f"note: {moved}"] if done and (moved := _moved_on(cfg, start)) else []
        said += [f"note: {other}"] if not refused and (other := _init_names_another(cfg, start)) else []
        said += [f"note: {p}" for p in start.passed_by]
        said += [f"note: {kept}"] if not refused and (kept := _kept_over(cfg, start)) else []
        said += [f"note: {start.unlooked}"] if start.unlooked else []
        said += [f"note: {change_note(start.step, start.changes)}"] if start.changes and start.step else []
        said += [f"note: {rate}"] if start.changes and start.step and (rate := _rate_change(cfg, start)) else []
        said += [f"note: {left}"] if not refused and (left := runidentity.left_behind(cfg)) else []
    return refused


def _kept_over(cfg: RunConfig, start: Start) -> str:
    """The note for a checkpoint an earlier Slurm job kept in run.dir (daemon/jobs/keptcopy.py) newer than the
    start found: staging fetches it and resumes from it when it verifies; "" when there is none such."""
    from minilmd.daemon.jobs import keptcopy

    kept = keptcopy.kept_step(cfg)
    if kept is None or (start.step is not None and start.step >= kept):
        return ""
    return (f"step {kept} is kept in {keptcopy.place(cfg)} (an earlier Slurm job's last sync could not put it on "
            f"run.remote): staging fetches it into scratch and resumes from it instead, once it verifies")


def find(cfg: RunConfig, remote_root: str | None) -> Start:
    """Where the launch would start (module docstring)."""
    if scratch_checkpoints(cfg):  # the trainer resumes from scratch, but for a newer checkpoint on the remote,
        return _over_scratch(cfg, _in_scratch(cfg))  # which staging fetches
    if not cfg.run.remote:
        return Start(why=f"scratch holds no checkpoint ({cfg.checkpoint_dir}), and there is no run.remote")
    holds_steps = _lists_steps(remote_root) if remote_root is not None else True
    if holds_steps is None:  # not there, or it does not answer now: daemon/jobs/remotewait.py says what the start does
        return Start()
    if not holds_steps:
        return Start(why=f"neither scratch nor run.remote ({cfg.run.remote}) holds a checkpoint")
    return _on_remote(cfg)


def _in_scratch(cfg: RunConfig) -> Start:
    from minilmd.checkpoint import CheckpointMismatch
    from minilmd.checkpoint_select import find_latest

    passed: list[str] = []
    try:
        path = find_latest([cfg.checkpoint_dir], expectation(cfg), log=passed.append, set_aside=False,
                           reuse=True)  # staging looks again: one hash (checkpoint_select.validate_once)
    except CheckpointMismatch as e:
        return Start(refused=refusal(e, f"in scratch {cfg.checkpoint_dir}"))
    if path is None:
        return Start(why=f"no checkpoint in scratch ({cfg.checkpoint_dir}) is valid", passed_by=passed)
    start = Start(names.step_of(path), SCRATCH, str(path), passed_by=passed, reference=_reference(path))
    return _judged(cfg, start, recorded_config(path))


def _reference(path: Path) -> str:
    """How far the stopped DPO reference pass a step 0 in scratch was saved by got; "" for any other."""
    from minilmd.checkpoint import read_manifest
    from minilmd.checkpoint_contents import pass_words
    from minilmd.daemon.jobs.pass_resume import stopped_pass

    held = stopped_pass(names.step_of(path), lambda: read_manifest(path))
    return pass_words(held) if held is not None else ""


def _over_scratch(cfg: RunConfig, start: Start) -> Start:
    """Scratch's `start`, or the remote's checkpoint staging takes over it: the one rule of both
    (daemon/jobs/scratch_behind.py judge)."""
    if not cfg.run.remote or start.refused:
        return start
    from minilmd.daemon.jobs import scratch_behind

    syncer = _syncer(cfg)
    verdict = scratch_behind.judge(syncer, cfg.checkpoint_dir, start.step)
    if verdict.refused is not None:
        return Start(refused=refusal(verdict.refused, f"on the remote {cfg.run.remote}"))
    if verdict.taken is None:
        start.unlooked = verdict.unlooked
        return start
    taken = verdict.taken
    return _remote_start(cfg, syncer, taken.name, start.passed_by + taken.passed, taken.check_words())


def _syncer(cfg: RunConfig):
    """A Syncer to look at the remote as the fetch does (no claim: `run --check` takes nothing from it)."""
    from minilmd.daemon.jobs.sync import Syncer

    return Syncer(cfg.checkpoint_dir, cfg.run.remote, expectation(cfg), run_dir=cfg.run_dir if cfg.run.dir else None)


def _judged(cfg: RunConfig, start: Start, recorded) -> Start:
    """`start`, the checkpoint it resumes recording the config `recorded` (None: unread), with the batch stream
    settings the config changes against it (minilmd/batch_stream.py: said, not refused), or refused for the one
    change a resume refuses (a DPO run's seq_len)."""
    meta = _corpus_meta(cfg)
    if refused := dpo_seq_len_refused(cfg, recorded, data_format_of(meta) if meta else "", Path(start.path).name):
        return Start(refused=refused)
    start.changes = stream_changes(cfg, recorded)
    start.done, start.recorded = recorded_trained(recorded), recorded
    return start


def _moved_on(cfg: RunConfig, start: Start) -> str:
    """A done stage whose init.from run has trained on since the step it started from (minilmd/init_moved.py)."""
    from minilmd.batch_stream import INIT_USED
    from minilmd.init_moved import moved_on

    return moved_on(cfg, start.recorded.get(INIT_USED)) if isinstance(start.recorded, dict) else ""


def _init_names_another(cfg: RunConfig, start: Start) -> str:
    """A run with a checkpoint of its own whose config's init.from names another source than it started from: the
    edit is not applied (minilmd/init_moved.py names_another; a LoRA run's is refused: `_lora_base_refused`)."""
    from minilmd.batch_stream import INIT_USED
    from minilmd.init_moved import names_another

    if not start.step or not isinstance(start.recorded, dict):
        return ""
    return names_another(cfg, start.recorded.get(INIT_USED), start.step)


def _lora_base_refused(cfg: RunConfig, start: Start) -> list[str]:
    """A LoRA run whose config's init.from is not the one the checkpoint it would resume was trained on: refused
    before anything is staged (minilmd/init_moved.py lora_base_refused, the rule staging asks too)."""
    from minilmd.batch_stream import INIT_USED
    from minilmd.init_moved import lora_base_refused

    if start.step is None or not isinstance(start.recorded, dict):
        return []
    place = f"in scratch {cfg.checkpoint_dir}" if start.where == SCRATCH else f"on the remote {cfg.run.remote}"
    refused = lora_base_refused(cfg, start.recorded.get(INIT_USED), f"step {start.step}, {place}")
    return [refused] if refused else []


def _rate_change(cfg: RunConfig, start: Start) -> str:
    """The rate of the resumed step before and after the change (plan/resume_rate.py); "" when it is the same."""
    from minilmd.plan.resume_rate import rate_change

    return rate_change(cfg, start.recorded, start.done, _corpus_meta(cfg))


def _on_remote(cfg: RunConfig) -> Start:
    """The fetch's choice, looked at in a thread for SHARED_STORAGE_PROBE_S at most: a remote that stalls or fails
    now is staging's to wait for (daemon/jobs/remotewait.py says so), no refusal."""
    from minilmd.daemon.jobs.scratch_behind import peek

    syncer = _syncer(cfg)
    answered, found, _ = bounded_probe(peek, syncer)
    if not answered:
        return Start()
    outcome, value, passed = found
    if outcome == "refused":
        return Start(refused=refusal(value, f"on the remote {cfg.run.remote}"))
    if outcome == "failed" or value is None:
        why = f"run.remote ({cfg.run.remote}) holds no valid checkpoint" if passed else \
            f"neither scratch nor run.remote ({cfg.run.remote}) holds a checkpoint"
        return Start(why="" if outcome == "failed" else why, passed_by=passed)
    return _remote_start(cfg, syncer, value, passed)


def _remote_start(cfg: RunConfig, syncer, name: str, passed: list[str], over_scratch: str = "") -> Start:
    """The start from remote checkpoint `name` (staging fetches it), judged against the config it records (read as
    the fetch reads it; None when it does not answer now)."""
    from minilmd.checkpoint_contents import pass_words
    from minilmd.daemon.jobs.pass_resume import stopped_pass

    recorded = bounded_probe(syncer.recorded_config, name)[1]
    held = bounded_probe(stopped_pass, names.step_of(name), lambda: syncer.remote.read_manifest(name).manifest)[1]
    start = Start(names.step_of(name), REMOTE, syncer.remote.show(name), passed_by=passed,
                  reference=pass_words(held) if held is not None else "", over_scratch=over_scratch)
    return _judged(cfg, start, recorded)


def _lists_steps(root: str) -> bool | None:
    """Whether a local remote's root names a step directory: a look before anything that reads checkpoints is
    imported. None when it cannot be listed now (not there, EIO, stalled, more entries than untrusted.listed
    reads: someone filled it)."""
    answered, found, _ = bounded_probe(listed, root)
    return any(names.is_step_name(n) for n in found) if answered else None


def expectation(cfg: RunConfig) -> Expectation:
    """What the run's checkpoints must match, as staging builds it (daemon/infra.py expectation): the model, the
    kernels and, from the corpus's meta.json (data.prepared's, or its verified copy in scratch when that one cannot
    be read now), its data and tokenizer fingerprints; without a meta.json to read (a corpus behind a URL not staged
    yet) the fingerprints are left to the trainer."""
    from minilmd.checkpoint import Expectation

    meta = _corpus_meta(cfg)
    try:
        return Expectation.for_corpus(cfg, meta)
    except (KeyError, TypeError, AttributeError):  # a meta.json without the tokenizer's hash: the corpus's check
        return Expectation.for_corpus(cfg)


def _corpus_meta(cfg: RunConfig) -> dict | None:
    prepared = cfg.data.prepared
    if prepared and not is_url(prepared):
        answered, meta, _ = bounded_probe(read_corpus_meta, prepared)
        if answered and meta is not None:
            return meta
    copied = launch_staged_from(cfg)  # none in a default root another user took: not the launch's scratch
    if prepared and copied is not None and same_source(copied, prepared):
        return read_corpus_meta(cfg.scratch_dir / names.STAGED_CORPUS)
    return None


def refusal(e: CheckpointMismatch, where: str) -> str:
    """A checkpoint of another model, corpus or tokenizer refused in the user's terms: which setting differs, what
    the run's checkpoints were trained with (at which step, `where`: "in scratch PATH", "on the remote URL") and
    what the config says now, and the two ways on. The words of `run --check`, the launch and the fetch."""
    step = names.step_or_none(Path(e.path).name)
    head = f"this run's checkpoints ({f'step {step}, ' if step is not None else ''}{where}) were trained with"
    if e.kind == "model" and e.differences:
        was = " and ".join(f"{what} {theirs}" for what, theirs, _ in e.differences)
        now = " and ".join(ours for _, _, ours in e.differences)
        return (f"{head} {was}; the config says {now}: a resume goes on with what its checkpoints were trained with. "
                f"Put the old value back to resume them, or give the config a new run.dir (and run.remote) to train "
                f"this one from step 0")
    if e.kind in ("data", "tokenizer") and e.differences:
        _, theirs, ours = e.differences[0]
        what = "corpus" if e.kind == "data" else "tokenizer"
        return (f"{head} another {what} than the corpus data.prepared names now ({e.kind} fingerprint {theirs[:12]}, "
                f"the config's {ours[:12]}): a resume goes on with what its checkpoints were trained with. Point "
                f"data.prepared back at that corpus (one grown by `prepare --append` resumes), or give the config a "
                f"new run.dir (and run.remote) to train on this one from step 0")
    return f"{head} something else than the config says ({'; '.join(e.problems)}): give the config a new run.dir " \
           f"(and run.remote), or put back what they were trained with"
