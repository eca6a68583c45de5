"""`[init] from`: what a fresh run starts from, found and checked without torch (for `run --check` and the trainer).

A source is one of:
- another run, by its config file or run directory (`predecessor`): its final checkpoint once it has finished;
- a checkpoint directory `step-XXXXXXXX/` (its manifest.json is there);
- a checkpoint root, a run's scratch checkpoints or its remote: the checkpoint its `BEST` names when it has one
  (the lowest val loss of a run with [early_stop]) unless `[init] checkpoint = "last"`, else the one its `LATEST`
  names (a run named by its config or run directory: the same, of its remote or scratch root);
- a pointer file `ROOT/BEST` or `ROOT/LATEST`: the checkpoint it names, as if that directory were given;
- a MiniMind `.pth` state dict (MiniMind's key names are ours; `lm_head.weight` is the tied embedding).
A checkpoint carries its model config (trainer_state.json): a mismatch is named field by field before anything
starts; a .pth carries only tensors, compared by shape when the trainer loads them.

The fingerprint recorded in the new run's checkpoints: for a checkpoint, the sha256 of its manifest.json (which holds
the sha256 of every file of it, so it names the whole checkpoint) and its step; for a .pth, the file's sha256.
A source is another user's or another run's file, often on NFS: its manifest and its .pth are read through
minilmd/untrusted.py (no link followed, never blocked on a FIFO, size bounded: a .pth no bigger than a state dict of
the run's model can be), and a .pth is hashed and unpickled from the one read (minilmd/init_pth.py `read_pth`, in
the directory resolve pinned, a file of its owner or ours). What the named directory
holds (run.toml, state.json, LATEST, BEST, their step directory, manifest.json, trainer_state.json) is walked by its
descriptor (minilmd/init_place.py): no link followed, no FIFO opened, each file the source owner's or ours.
"""
from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from minilmd.config import ConfigError, RunConfig, load_config
from minilmd.dirfd import Dir
from minilmd.init_foreign import not_a_checkpoint
from minilmd.init_kinds import (
    UNREACHABLE_ERRNOS,
    InitSource,
    InitSourceError,
    InitSourceUnreachable,
    untrusted_failure,
)
from minilmd.init_model import model_mismatch
from minilmd.init_place import Refused, judge, open_dir_in, open_named, owners_of, read_in, reopen
from minilmd.names import BEST, LATEST, MANIFEST, RUN_CONFIG_COPY, TRAINER_STATE, is_step_name
from minilmd.names import INIT_CHECKPOINT as STAGED_CHECKPOINT
from minilmd.names import INIT_PTH as STAGED_PTH
from minilmd.names import INIT_RECORD as STAGED_RECORD
from minilmd.names import MANIFEST_MAX_BYTES as MAX_MANIFEST_BYTES
from minilmd.names import POINTER_MAX_BYTES as _MAX_POINTER
from minilmd.names import STAGED_RECORD_MAX_BYTES as MAX_RECORD_BYTES
from minilmd.names import STATE_MAX_BYTES as PREDECESSOR_STATE_MAX_BYTES
from minilmd.names import TRAINER_STATE_MAX_BYTES as _MAX_STATE
from minilmd.perms import user_words
from minilmd.run_owner import remote_not_the_runs, run_user
from minilmd.run_states import Phase
from minilmd.scratch_lost import elsewhere_words, lost_for_good, other_host
from minilmd.shared_place import Place, look
from minilmd.source_owner import claim_checked
from minilmd.untrusted import file_kind, loads, printable, read_json
from minilmd.urls import is_url, local_remote_root


@dataclass(frozen=True)
class Predecessor:
    """Another run that init.from names by its config file or its run directory: this run starts from its final,
    verified, synced checkpoint once it has finished (the supervisor waits for that: daemon/phases/initwait.py)."""

    name: str
    run_dir: Path
    root: Path
    """Where its final checkpoint is: its run.remote (a local path), else its scratch checkpoints."""
    model: dict = field(default_factory=dict)
    """Its [model] section: what its final checkpoint will hold (a stage of another model is refused at once)."""
    lora: dict | None = None
    """Its [lora] section when it trains LoRA adapters (RunConfig.lora_dict()): its checkpoints hold adapters, not
    a model to start from (adapter_source, refused at once too)."""
    identity: tuple[int, int] | None = field(default=None, compare=False)
    """(device, inode) of the run directory its run.toml was read in (init.from naming that directory): its
    state.json is read in that very directory or not at all (init_place.reopen); None for a run named by its
    config file (its run.dir opened once, as named, when its state.json is read)."""
    scratch_only: bool = False
    """It has no run.remote: `root` is its scratch's checkpoints, its only copy (minilmd/scratch_lost.py)."""
    init_from: str = ""
    """Its own init.from (what it waits for in turn: a stage that names this run back would wait for ever)."""


def _unreadable(e: OSError) -> InitSourceError:
    """An OSError met on init.from's path, as the one decision has it: unreachable now, or there and wrong."""
    cls = InitSourceUnreachable if e.errno in UNREACHABLE_ERRNOS else InitSourceError
    return cls(f"cannot be read ({e})")


def predecessor(spec: str) -> Predecessor | None:
    """The run init.from names, when it names a run's config file (.toml) or run directory (holding run.toml);
    None for a checkpoint, a checkpoint root or a .pth. InitSourceError for a run config that cannot be read
    (InitSourceUnreachable when its storage cannot be reached now)."""
    from minilmd.corpus_meta import corpus_train_tokens

    path = Path(spec)
    try:
        with open_named(path) as run_dir:  # a directory: a run's when it holds its supervisor's copy, run.toml
            if run_dir.lstat(RUN_CONFIG_COPY) is None:
                return None
            # that copy, in a run directory that may be another user's: that user's or ours, as its state.json
            # (predecessor_state), read through this descriptor, and that directory, not its name, recorded
            return _predecessor_in(run_dir, spec)
    except NotADirectoryError:
        if path.suffix != ".toml":
            return None
    except FileNotFoundError:
        return None  # resolve says it (not there: unreachable now)
    except Refused as e:
        raise InitSourceError(str(e)) from None
    except OSError as e:
        raise _unreadable(e) from None
    try:  # a config file the config names: read as named, as load_config reads every config
        cfg = load_config(path, train_tokens_of=corpus_train_tokens)
    except ConfigError as e:
        raise InitSourceError(f"the run config {path} does not load: {'; '.join(e.problems[:3])}") from None
    except OSError as e:
        raise _unreadable(e) from None
    return _predecessor_of(cfg, run_user(cfg.run_dir, path))


def _predecessor_in(run_dir: Dir, spec: str) -> Predecessor:
    """The run whose run directory init.from names, opened as `run_dir`: its run.toml read there."""
    from minilmd.corpus_meta import corpus_train_tokens
    from minilmd.run_config_copy import run_config_of

    path = run_dir.path / RUN_CONFIG_COPY
    try:
        cfg = run_config_of(run_dir.path, run_dir.fd, corpus_train_tokens)
    except ConfigError as e:
        raise InitSourceError(f"the run config {path} does not load: {'; '.join(e.problems[:3])}") from None
    if os.path.realpath(cfg.run_dir) != os.path.realpath(spec):
        # a copy whose recorded places are not where it sits (written with relative paths by a minilmd before they
        # were recorded absolute, or a run directory moved): its state and checkpoints would be looked for elsewhere
        raise InitSourceError(f"{path} names run.dir {cfg.run_dir}, not {os.path.abspath(spec)} where it is (relative "
                              f"paths recorded by an older minilmd, or the run directory moved): name the run's "
                              f"checkpoint directory in init.from (its run.remote, or its scratch's checkpoints)")
    return _predecessor_of(cfg, os.fstat(run_dir.fd).st_uid, run_dir.identity)


def _predecessor_of(cfg: RunConfig, run_uid: int, identity: tuple[int, int] | None = None) -> Predecessor:
    """The run of `cfg`, of user `run_uid`: its remote (run_owner.remote_not_the_runs), else its scratch's."""
    remote = local_remote_root(cfg.run.remote)  # a path, file://, local:// (the one answer); None for a store
    if cfg.run.remote and remote is None:
        raise InitSourceError(f"the run {cfg.run.name} syncs to {cfg.run.remote}, a URL: init.from reads local paths")
    if remote and (foreign := remote_not_the_runs(Path(remote), cfg.run_dir, run_uid)):
        raise InitSourceError(f"the run {cfg.run.name} ({cfg.run_dir}, of {user_words(run_uid)}): {foreign}")
    return Predecessor(cfg.run.name, cfg.run_dir, Path(remote) if remote else cfg.checkpoint_dir, cfg.model_dict(),
                       cfg.lora_dict(), identity, scratch_only=not remote, init_from=cfg.init.from_)


WAIT_WHY_SHOWN = 1000
"""The most of a predecessor's own reason a waiting run shows (its state.json: another user's words, bounded)."""


@dataclass(frozen=True)
class PredecessorReport:
    """What the predecessor's state.json says: its outcome for this run, in words, its phase and the state itself."""

    outcome: str
    """"done", "waiting" or "failed"."""
    why: str
    phase: str = ""
    """Its phase ("" when it has not started or its state.json cannot be read)."""
    state: dict | None = None
    """Its state.json, when it could be read."""
    last_sync_waits: bool = False
    """It finished training and its last sync waits (`final sync waiting: ...`: room on its remote, its remote's owner
    record): the why says for what; a change the waiting run logs, though the phase stays `stopping`."""


def predecessor_state(pred: Predecessor) -> dict:
    """The predecessor's state.json, read as a file of another user (minilmd/untrusted.py: a regular file of its run
    directory's owner, size and depth bounded, an object), in its run directory opened once (init_place: by that
    descriptor): Unreadable otherwise, with `missing` when there is none."""
    from minilmd.names import STATE
    from minilmd.untrusted import Unreadable, read_bytes

    path = pred.run_dir / STATE
    try:
        run_dir = reopen(pred.run_dir, pred.identity)  # the one `predecessor` read run.toml in, or none (Moved)
    except FileNotFoundError:
        raise Unreadable("missing", path, missing=True) from None
    except OSError as e:
        raise Unreadable(f"its run directory cannot be read: {e.strerror or e}", path, os_error=e) from None
    with run_dir:
        try:
            raw = read_bytes(STATE, max_bytes=PREDECESSOR_STATE_MAX_BYTES, owner=owners_of(run_dir),
                             dir_fd=run_dir.fd)
        except Unreadable as e:  # said with its whole path
            raise Unreadable(e.why, path, kind=e.kind, os_error=e.os_error) from None
    return loads(raw, path=path)


def predecessor_report(pred: Predecessor) -> PredecessorReport:
    """The predecessor's outcome from its state.json: done once its supervisor ended with the run finished (its last
    checkpoint synced: protocol.how_ended); failed once it ended with a final exit status; waiting otherwise (not
    started, running, stopped on request, its Slurm job requeued or cancelled, killed: a restart, a requeue or a
    new submission goes on; or a state.json that is not one, said as "unreadable (why)")."""
    from minilmd.names import STATE
    from minilmd.protocol import (
        ENDED_CANCELLED,
        ENDED_REQUEUED,
        ENDED_UNSYNCED,
        FINAL_EXIT_STATUSES,
        FINAL_SYNC_WAITING,
        FINISHED_ENDINGS,
        how_ended,
    )
    from minilmd.untrusted import Unreadable, printable

    try:
        state = predecessor_state(pred)
    except Unreadable as e:
        if e.missing:
            return PredecessorReport("waiting", f"run {pred.name} has not started ({pred.run_dir / STATE} not there "
                                                f"yet)")
        return PredecessorReport("waiting", f"run {pred.name}'s {STATE} is unreadable ({e.why})")
    phase = state["phase"] if isinstance(state.get("phase"), str) else ""
    outcome: dict = state["outcome"] if isinstance(state.get("outcome"), dict) else {}
    progress: dict = state["progress"] if isinstance(state.get("progress"), dict) else {}
    step = progress.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    exit_status = outcome.get("exit")
    reason = printable(str(state.get("reason", "")))
    ended = how_ended(state)
    if phase == Phase.DONE and exit_status == 0 and ended in FINISHED_ENDINGS:
        return PredecessorReport("done", f"run {pred.name} finished at step {step}", phase, state)
    if phase == Phase.FAILED and exit_status in FINAL_EXIT_STATUSES:
        return PredecessorReport("failed", f"run {pred.name} failed with exit {exit_status}: "
                                           f"{printable(str(state.get('last_error') or reason))}", phase, state)
    at = f" at step {step}" if step is not None else ""
    if phase == Phase.DONE and ended == ENDED_REQUEUED:
        return PredecessorReport("waiting", f"run {pred.name} was requeued by Slurm{at}: it resumes when Slurm "
                                            f"starts its job again", phase, state)
    if phase == Phase.DONE and ended == ENDED_CANCELLED:
        return PredecessorReport("waiting", f"run {pred.name}'s Slurm job was cancelled{at}: it resumes when its "
                                            f"job is submitted again", phase, state)
    if phase == Phase.DONE and ended == ENDED_UNSYNCED:  # an older minilmd's ending (now its last sync waits)
        return PredecessorReport("waiting", f"run {pred.name} finished{at}, but its last checkpoint is not on its "
                                            f"run.remote (its owner.json is not that run's): it is synced when that "
                                            f"run is started again", phase, state)
    if phase == Phase.DONE:  # done but not finished: stopped on request; it waits for a restart
        return PredecessorReport("waiting", f"run {pred.name} was stopped{at}", phase, state)
    if phase == Phase.STOPPING and reason.startswith(FINAL_SYNC_WAITING):  # its checkpoint not on its remote yet
        return PredecessorReport("waiting", f"run {pred.name} finished training{at}, but its last checkpoint is not "
                                            f"on its run.remote yet; that run says: {reason[:WAIT_WHY_SHOWN]}", phase,
                                 state, last_sync_waits=True)
    return PredecessorReport("waiting", f"run {pred.name} is {printable(phase)[:40]}{at}", phase, state)


def predecessor_outcome(pred: Predecessor) -> tuple[str, str]:
    """("done" | "waiting" | "failed", why): `predecessor_report` in short."""
    report = predecessor_report(pred)
    return report.outcome, report.why


def resolve(spec: str, checkpoint: str = "best") -> InitSource:
    """The source init.from names; raises InitSourceError saying what is wrong, InitSourceUnreachable (one) when
    it cannot be reached now (UNREACHABLE_ERRNOS; the one decision of the config check and of staging).
    `checkpoint` is init.checkpoint: of a run or a checkpoint root, "best" takes the checkpoint its BEST names
    when it has one (early_stop's lowest val loss), else its LATEST; "last" takes its LATEST. A pointer file
    (ROOT/BEST, ROOT/LATEST) is taken as the step directory it names."""
    try:
        return claim_checked(_resolve(spec, checkpoint))  # a copy in another user's place claiming your run: refused
    except OSError as e:
        raise _unreadable(e) from None


def _resolve(spec: str, checkpoint: str) -> InitSource:
    if is_url(spec):
        raise InitSourceError("must be a local path (an NFS mount is one); URLs are not read")
    pred = predecessor(spec)
    if pred is not None:
        report = predecessor_report(pred)
        if report.outcome != "done":
            raise InitSourceError(f"names the run {pred.name}, which has not finished ({report.why})")
        if (found := look(pred.root, LATEST)).outage:  # its remote gone or not mounted: not init.from's own path
            supervisor = (report.state or {}).get("supervisor")
            host = other_host(supervisor.get("host") if isinstance(supervisor, dict) else None)
            if pred.scratch_only and host is not None:  # its scratch is that host's: waited for, never judged here
                raise InitSourceUnreachable(elsewhere_words(pred.name, pred.root, host))
            if pred.scratch_only and found.place != Place.UNREADABLE and lost_for_good(pred.root):
                raise InitSourceError(scratch_lost(pred))  # final: nothing brings a removed scratch back
            raise InitSourceUnreachable(f"the run {pred.name} has finished, but {pred.root}, which holds its "
                                        f"checkpoints, is {found}")
        spec = str(pred.root)
    try:
        return _in_place(Path(spec), checkpoint)
    except Refused as e:
        raise InitSourceError(str(e)) from None


def scratch_lost(pred: Predecessor) -> str:
    """What init.from is told of a finished run with no run.remote whose scratch checkpoints are gone for good."""
    return (f"the run {pred.name} has finished, but it had no run.remote: its checkpoints were only in its scratch "
            f"({pred.root}), and they are gone (a reboot, a scratch cleaner or an rm; nothing brings them back). Train "
            f"{pred.name} again (give it a run.remote to keep a copy), or point init.from at another checkpoint")


def _in_place(path: Path, checkpoint: str) -> InitSource:
    """The source at `path`, walked by descriptor (minilmd/init_place.py): a checkpoint directory, a root, or a
    file (a .pth, a pointer) in the directory the config names."""
    try:
        named = open_named(path)
    except NotADirectoryError:
        return _named_file(path)
    except FileNotFoundError:
        raise InitSourceUnreachable("no such file or directory") from None  # not there (yet, or a share gone)
    with named:
        owners = owners_of(named)
        if named.lstat(MANIFEST) is not None:
            judge(named, MANIFEST, owners)
            return InitSource("checkpoint", path, None, owners, named.identity)
        return _from_root(named, checkpoint, owners)


def _named_file(path: Path) -> InitSource:
    """A file init.from names: a pointer (ROOT/LATEST, ROOT/BEST: the checkpoint it names) or a MiniMind .pth;
    looked at in its directory without following a link."""
    with open_named(path.parent) as parent:
        if path.name in (LATEST, BEST):
            return _pointed(parent, path.name, owners_of(parent))
        st = parent.lstat(path.name)
        if st is None:
            raise InitSourceUnreachable("no such file or directory")
        if stat.S_ISLNK(st.st_mode):
            raise InitSourceError(f"{printable(path)} is a symbolic link: not followed")
        if not stat.S_ISREG(st.st_mode):  # a FIFO, a socket, a device: there, and no source
            raise InitSourceError(f"neither a file nor a directory ({file_kind(st.st_mode)})")
        if path.suffix != ".pth":
            raise InitSourceError("a file, but not a MiniMind .pth (give a checkpoint directory, a checkpoint root "
                                  "with LATEST, its LATEST or BEST, or a .pth)")
        owners = owners_of(parent)  # a teammate's .pth reads as hers, a third user's planted beside it does not
        judge(parent, path.name, owners)
        return InitSource("minimind", path, None, owners, parent.identity)


def _pointed(root, pointer: str, owners: tuple[int, ...]) -> InitSource:
    """The checkpoint the pointer file `pointer` in `root` (an init_place Dir) names: a step directory of the
    root's (no link, its owner's or ours) holding a manifest.json of the same."""
    name = read_in(root, pointer, _MAX_POINTER, owners).decode("utf-8", errors="replace").strip()
    if not is_step_name(name):
        raise InitSourceError(f"{printable(root.path / pointer)} names no checkpoint ({printable(repr(name))[:80]}, "
                              f"not a step-XXXXXXXX name)")
    none = InitSourceError(f"its {pointer} names {name}, which holds no {MANIFEST}")
    try:
        step = open_dir_in(root, name, owners)
    except FileNotFoundError:
        raise none from None
    with step:
        if step.lstat(MANIFEST) is None:
            raise none
        judge(step, MANIFEST, owners)
        return InitSource("checkpoint", root.path / name, pointer, owners, step.identity)


def _from_root(root, checkpoint: str, owners: tuple[int, ...]) -> InitSource:
    """The checkpoint of a root init.checkpoint chooses: BEST (when there is one, with "best"), else LATEST."""
    if checkpoint == "best" and root.lstat(BEST) is not None:
        try:
            return _pointed(root, BEST, owners)
        except InitSourceError as e:
            raise InitSourceError(f"{e} (init.checkpoint = \"last\" takes its LATEST instead)") from None
    if root.lstat(LATEST) is None:  # a MiniMind model in transformers format, MiniMind's out/, an export: said
        raise InitSourceError(not_a_checkpoint(root, owners))
    return _pointed(root, LATEST, owners)


def source_state(source: InitSource) -> dict:
    """A checkpoint source's trainer_state.json, read in the directory resolve opened (the same one, or refused), as
    a file of the source's owner or ours: bounded, no link followed, an object. InitSourceError (a ValueError) when
    it cannot be read there; untrusted.Unreadable (a ValueError) when it is no JSON object."""
    try:
        with reopen(source.path, source.identity) as ckpt:  # a Moved one: unreachable now (ESTALE), resolved again
            raw = read_in(ckpt, TRAINER_STATE, _MAX_STATE, source.owners or owners_of(ckpt))
    except Refused as e:
        raise InitSourceError(str(e)) from None
    except OSError as e:
        raise _unreadable(e) from None
    return loads(raw, path=source.path / TRAINER_STATE)


def source_model(source: InitSource) -> dict | None:
    """The model config a checkpoint source records; None for a .pth (it records none). Its trainer_state.json is
    read as source_state reads it."""
    if source.kind != "checkpoint":
        return None
    try:
        model = source_state(source)["config"]["model"]
    except InitSourceError:
        raise
    except (ValueError, KeyError, TypeError) as e:  # Unreadable (a ValueError): too deep, not an object
        raise InitSourceError(f"{source.path / TRAINER_STATE}: no readable config.model ({e})") from None
    if not isinstance(model, dict):
        raise InitSourceError(f"{source.path / TRAINER_STATE}: config.model is not a table")
    return model


def model_problems(spec: str, run_model: dict, checkpoint: str = "best",
                   written: Callable[[str], bool] = lambda key: True) -> list[str]:
    """What keeps init.from from initialising a model of `run_model` (empty: nothing found without torch): a
    checkpoint of a LoRA run (adapter_source), another model config (init_model.model_mismatch; `written`: which
    model keys the run's config sets), a .pth of another model (its tensors' shapes: init_pth.pth_problems)."""
    source = resolve(spec, checkpoint)
    if source.kind == "minimind":
        from minilmd.init_pth import pth_problems

        try:
            return pth_problems(source, run_model, written)
        except OSError as e:  # its directory moved since, the storage failing: as resolve decides
            raise _unreadable(e) from None
    saved = source_model(source)
    if saved is None:
        return []
    from minilmd.checkpoint_contents import lora_text, saved_lora  # here: it pulls in numpy (safetensors_scan), which
    # status and the supervisor's start never load

    if (lora := saved_lora(source_state(source))) is not None:
        return [f"{source.path} is a checkpoint of {adapter_source(lora_text(lora))}"]
    mismatch = model_mismatch(saved, run_model, written)
    return [f"{source.path} holds {mismatch}"] if mismatch else []


def adapter_source(lora: str) -> str:
    """Why init.from cannot be a LoRA run's checkpoint (its [lora] `lora`, as lora_text writes it): the one rule the
    trainer (trainer/checkpoint/init_weights.py, which loads init.from as full weights, a LoRA run's as its base),
    `run --check` and the launch (probes.py, before anything is staged) refuse it by."""
    return (f"a LoRA run ([lora] {lora}): its checkpoints hold adapters on its base, not a model "
            f"to start from, with or without [lora] here; `minilmd export CHECKPOINT --format minimind --merge --out "
            f"merged.pth` merges it into a MiniMind .pth, and init.from = that .pth starts from it (init.from takes "
            f"no --format hf export)")


def fingerprint(source: InitSource, model: dict | None = None) -> dict:
    """What the new run records of its source, in every checkpoint's trainer_state.json ("init"). A .pth is read
    as `read_pth` reads one (`model`: the run's [model], which bounds its size), hashed and not kept. Raises
    InitSourceError for a source that is not what it must be; the OSError of one that cannot be read now (staging
    waits for it, the trainer alone refuses it)."""
    if source.kind == "checkpoint":
        from minilmd.untrusted import Unreadable, read_bytes

        try:  # another user's manifest, read once (a FIFO, /dev/zero or 60 KB of `[` is refused) and hashed as read
            raw = read_bytes(source.path / MANIFEST, max_bytes=MAX_MANIFEST_BYTES, owner=source.owners or None)
            return checkpoint_record(source, raw)
        except Unreadable as e:
            raise untrusted_failure(e) from None
    from minilmd.init_pth import read_pth_into
    from minilmd.untrusted import Hashing

    return read_pth_into(source, model, Hashing())


def checkpoint_record(source: InitSource, raw: bytes) -> dict:
    """`fingerprint` of a checkpoint whose manifest.json is `raw` (as staging read it, in the directory resolve
    opened); Unreadable for bytes that are no JSON object."""
    manifest = loads(raw, path=source.path / MANIFEST)
    pointer = {"pointer": source.pointer} if source.pointer else {}
    return {"kind": "checkpoint", "path": str(source.path.resolve()), "step": manifest.get("step"),
            "manifest_sha256": hashlib.sha256(raw).hexdigest(), **pointer}


def same_source(recorded: dict | None, current: dict | None) -> bool:
    """Whether two fingerprint records name the same weights (the hashes, wherever the files now lie)."""
    if not recorded or not current or recorded.get("kind") != current.get("kind"):
        return False
    keys = ("manifest_sha256", "step") if current.get("kind") == "checkpoint" else ("sha256",)
    return all(recorded.get(k) == current.get(k) for k in keys)


def staged_copy(staged: Path) -> Path:
    """The weights inside a staged init.from: its checkpoint directory or its .pth."""
    return staged / STAGED_CHECKPOINT if (staged / STAGED_CHECKPOINT).is_dir() else staged / STAGED_PTH


def staged_record(staged: Path) -> dict:
    """The source's fingerprint record staging wrote beside the copy (this run's own file in its scratch)."""
    return read_json(staged / STAGED_RECORD, max_bytes=MAX_RECORD_BYTES)
