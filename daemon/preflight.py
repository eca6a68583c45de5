"""What `minilmd run` checks before it creates anything, for `--check` and the launch alike; then, at launch, the
claim of scratch.

`check()` is `probes.load_checked` (every value in its range, then minilmd/probes.py's: the paths, the corpus's
meta.json against the model, the owner of scratch, init.from) plus what the supervisor's side measures: whether the
corpus and the checkpoints kept between two syncs fit in scratch (daemon/jobs/staging.py). Every problem comes at
once, in one ConfigError: exit 2, final, so a config that `--check` accepts is one that the launch will not refuse.
An init.from that cannot be reached now (a share gone, EIO, a stall), and a scratch big enough for the run whose
space others hold now, are no problem: the run waits for them in staging, as at a restart, and `--check` says so
(`check_with_waits`).
`launch()` (after `minilmd run` has re-executed itself once with the run's identity in its environment,
minilmd/procs.py) checks the same and makes scratch this run's (minilmd/scratch.py: 0700, the marker naming
run.dir), so that no other run can take it. A gpu.lock_dir another user could rearrange, or a card's lease file no
lease of this user's can be taken through (a link, a FIFO, another user's file she cannot open), is no refusal but a
wait (daemon/host/gpuwaits.py lock_dir_wait, lease_file_waits), and a default scratch root another user made first is
never used: the launch makes a private one (minilmd/scratch_root.py); one mkdir by anyone must not end a run for
good, nor a base whose room (its inodes) another user's files used up: the claim waits for room then, the run lock
held, state.json and systemd told, and hands the lock to the supervisor held (daemon/scratchclaim.py
`claim_scratch`). The checks the supervisor's side adds also include that train.device = "cuda" has an NVIDIA driver
to use, that a micro-batch can fit in the device's memory (memory_fit: minilmd/plan/footprint.py), that a local
run.remote lies where no other user can rearrange it, is no other user's directory, and holds no other user's
LATEST, BEST or init, that run.remote is this run's (not another run's claim, not inside or holding scratch:
daemon/jobs/remote_claim.py), that no other supervisor owns the run (its supervisor.lock), and that the checkpoint
the launch would resume from (scratch's, or the remote's newest, by its metadata) was trained with this config's
model, corpus and tokenizer (daemon/jobs/resumefrom.py). A local run.remote whose recorded root is gone or replaced
(daemon/jobs/remote_root.py) is a `waits:` line in the sync's words (`remote_root_wait`): the syncs wait for it, the
start is not refused.
Torch-free.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from minilmd import names, perms, place_rule, protocol, scratch, scratch_root
from minilmd.config import ConfigError, RunConfig
from minilmd.config_values import derived_checks_wait, no_budget, usable
from minilmd.daemon.base import knobs, stoprequest
from minilmd.daemon.host.gpu import device_offer, device_problems
from minilmd.daemon.host.gpuwaits import lease_file_waits, lock_dir_wait
from minilmd.daemon.host.lock import LockHeld, lock_holder
from minilmd.daemon.host.signals import Signals
from minilmd.daemon.jobs import remote_write
from minilmd.daemon.jobs.remote_room import remote_room_problems
from minilmd.daemon.jobs.rundone import Done
from minilmd.daemon.jobs.scratch_room import run_space_problem
from minilmd.daemon.phases.rundirwatch import full_at_start
from minilmd.daemon.scratchclaim import (  # noqa: F401 - run_lock, preempted_in_checks: the supervisor's, through here
    Held,
    LaunchEnds,
    RunDirFull,
    ScratchRootUnknown,
    claim_scratch,
    in_use_words,
    preempted_in_checks,
    run_lock,
)
from minilmd.names import INIT_DIR
from minilmd.probes import bounded_probe, load_checked
from minilmd.urls import is_url, local_remote_root


def check(config_path: str, overrides: list[str] | None = None, fresh: bool = False,
          claim_remote: bool = False) -> RunConfig:
    """The config, validated as the launch would (`fresh`: `run --fresh`; `claim_remote`: `run --claim-remote`);
    raises ConfigError with every problem. Creates nothing."""
    return check_with_waits(config_path, overrides, fresh=fresh, claim_remote=claim_remote)[0]


def check_with_waits(config_path: str, overrides: list[str] | None = None,
                     start: list[str] | None = None, fresh: bool = False,
                     claim_remote: bool = False) -> tuple[RunConfig, list[str]]:
    """check(), and what the run will wait for rather than refuse (an init.from that cannot be reached now, a
    scratch big enough whose space others hold now: the supervisor waits for them in staging), one line each, for
    `run --check` to say. `start` gets where the launch starts (daemon/jobs/resumefrom.py: "resumes from step N
    (scratch|remote: ...)", "starts from step 0: ...") and a note per checkpoint it would pass by."""
    waits: list[str] = []

    def more_checks(cfg: RunConfig) -> list[str]:
        problems: list[str] = []
        if usable(cfg, "run.remote", "run.dir", "run.scratch", "run.name"):  # the remote's place: its fields alone
            if root_wait := remote_root_wait(cfg, fresh, claim_remote):  # gone or replaced: the syncs wait, said now
                waits.append(root_wait)
            problems += (remote_place_problems(cfg) + remote_entry_problems(cfg)
                         + remote_owner_problems(cfg, claim_remote, waits))
        if derived_checks_wait(cfg):  # the rest weighs the run as a whole: it waits for every field it reads
            return problems + knobs.problems()
        problems += run_space_problem(cfg, waits)  # a scratch big enough that others fill now: a line in waits
        if lock_wait := lock_dir_wait(cfg):  # a gpu.lock_dir another user may rearrange: waited for, never refused
            waits.append(lock_wait)
        waits.extend(lease_file_waits(cfg))  # a card whose lease file no lease of ours is taken through: waited for
        return (problems + device_problems(cfg) + _epoch_without_budget(cfg) + owner_problems(cfg)
                + resume_problems(cfg, start, fresh) + memory_problems(cfg) + remote_room_problems(cfg)
                + knobs.problems())

    cfg = load_checked(config_path, overrides, waits=waits, more_checks=more_checks)
    return cfg, waits


def memory_problems(cfg: RunConfig) -> list[str]:
    """A micro-batch (or a validation set) that cannot fit in what the device offers: refused before anything is
    made or staged (memory_fit)."""
    return memory_fit(cfg)[0]


def memory_fit(cfg: RunConfig) -> tuple[list[str], str | None]:
    """(The refusal, the note) of minilmd/plan/footprint.py's rule: the run's estimate before its first step against
    what its device offers (daemon/host/gpu.py device_offer), the corpus's format and val split (and [eval] probe's)
    from its meta.json (a local one, read bounded; one behind a URL counts as text with no validation set)."""
    from minilmd.corpus_meta import read_corpus_meta
    from minilmd.plan.footprint import fit, host_available, host_offer

    offer, on_gpu = device_offer(cfg)
    if offer is None:
        return [], None
    def meta_of(prepared: str) -> dict | None:
        return bounded_probe(read_corpus_meta, prepared)[1] if prepared and not is_url(prepared) else None

    return fit(cfg, meta_of(cfg.data.prepared), offer, on_gpu, meta_of(cfg.eval.probe), host_offer(),
               host_available())


def remote_owner_problems(cfg: RunConfig, claim_remote: bool = False, waits: list[str] | None = None) -> list[str]:
    """A run.remote that is, holds or lies inside run.scratch (giving scratch back would delete it), or that is
    run.dir itself (minilmd/scratch.py remote_overlap_problem); else one claimed by another run, or holding
    checkpoints of an older minilmd this run never synced (daemon/jobs/remote_claim.py): this run would resume from
    them and prune them; with `claim_remote` (`run --claim-remote`), only one the consent may not take over. A claim
    moved here from another remote is a line in `waits` (remote_consent.check_problems)."""
    from pathlib import Path

    from minilmd.daemon.jobs import remote_consent

    root = local_remote_root(cfg.run.remote)
    if root is not None and cfg.run.dir:
        if overlap := scratch.remote_overlap_problem(Path(root), cfg.scratch_dir, cfg.run_dir):
            return [overlap]
    return remote_consent.check_problems(cfg, claim_remote, waits)


def resume_problems(cfg: RunConfig, start: list[str] | None = None, fresh: bool = False) -> list[str]:
    """The checkpoint the launch would resume from (in scratch, else on run.remote) trained with another model,
    corpus or tokenizer than the config's: refused now, exit 2, in the words the fetch would use
    (daemon/jobs/resumefrom.py), not found by the fetch or the trainer once the run has started. So is a start that
    would leave a newer step behind in the scratch or on the remote this run.dir's state.json records, when the
    config names others now (daemon/jobs/runidentity.py; `fresh`: `run --fresh` gives the old remote up)."""
    from minilmd.daemon.jobs import resumefrom  # reads a checkpoint (numpy) only where there is one

    return resumefrom.problems(cfg, local_remote_root(cfg.run.remote), start, fresh)


def owner_problems(cfg: RunConfig) -> list[str]:
    """Another live supervisor holds the run's supervisor.lock (daemon/host/lock.py lock_holder: a non-blocking
    probe that creates nothing), or, with none there, the run's scratch (minilmd/scratch_hold.py in_use: one whose
    run.dir was removed under it, still in its last sync; or one started at the same moment, named by its lock once
    it holds it: scratchclaim.in_use_words): the launch would exit 2 on it, so --check does. Runs
    before this process takes the lock (the launch takes it after these checks). Said with what an edit of the
    config does to a running run (daemon/runningedits.py: it applies at the next start) and what this config
    changes against its copy."""
    try:
        holder = lock_holder(cfg.run_dir) if cfg.run.dir else None
    except OSError:  # run.dir not readable: its own check says so
        return []
    if not holder:  # the run's scratch still held by a supervisor whose run.dir (and lock) was removed under it
        from minilmd import scratch_hold

        return [in_use_words(cfg, busy)] if cfg.run.dir and (busy := scratch_hold.in_use(cfg.scratch_dir)) else []
    from minilmd.daemon.runningedits import running_words

    held = LockHeld(holder.pid, holder.host, holder.since, cfg.run_dir / names.LOCK)
    return [f"{held}; {running_words(cfg, cfg.source)}"]  # and what its edits do (daemon/runningedits.py)


def _epoch_without_budget(cfg: RunConfig) -> list[str]:
    """plan's line of what one epoch is in steps, beside the missing-budget message. Imported only then: the plan
    loads numpy, which the supervisor does not before staging (tests/test_import_budget.py)."""
    if not no_budget(cfg):
        return []
    from minilmd.plan.budget import epoch_without_budget

    return epoch_without_budget(cfg)


REMOTE_OWN = {names.LATEST: True, names.BEST: True, INIT_DIR: False}
"""The names a sync writes in run.remote's root besides the step directories and the claim: its pointers and the
LoRA base. The claim (names.REMOTE_OWNER) is remote_owner_problems' to judge, in the words of a claim: said here too,
another user's owner.json was said twice."""


def remote_place_problems(cfg: RunConfig) -> list[str]:
    """A local run.remote under a directory another user owns or can rearrange, or itself a directory another
    user made first (dirfd's rule, remote_write.root_refused): final, at `--check` and at start, not a sync
    refused at every try. A remote that does not answer now: no problem (sync waits)."""
    root = local_remote_root(cfg.run.remote)
    if root is None:
        return []
    answered, refused, _ = bounded_probe(remote_write.root_refused, root)
    return [refused] if answered and refused else []


def remote_root_wait(cfg: RunConfig, fresh: bool = False, claim_remote: bool = False) -> str:
    """A local run.remote whose root the run recorded (daemon/jobs/remote_root.py: at its first sync's claim) and that
    is gone now (an unmounted share) or another directory: the run would start and train, and every sync would fail
    with these words, waited for, the last one too; said at `--check` in the sync's own words (remote_root's rule,
    `check_words`), with what to do, not found once the run has started. No refusal (exit 0): a share mounted again
    is the run's remote again. `fresh` (`run --fresh`): a new lineage, whose records say it never synced there;
    `claim_remote` (`run --claim-remote`): the directory there now is taken, nothing to say. A run.dir or remote
    that does not answer now: nothing said (the sync says it)."""
    from minilmd.daemon.jobs import remote_claim

    if claim_remote or not cfg.run.dir or local_remote_root(cfg.run.remote) is None:
        return ""
    answered, words = remote_claim.root_words_now(cfg, fresh)
    if not (answered and words):
        return ""
    return (f"run.remote: remote unavailable: {words}; until then every sync of the run fails so and is retried (no "
            f"try counted), and its last sync waits")


def remote_entry_problems(cfg: RunConfig) -> list[str]:
    """Another user's entry (or a link, a FIFO) at LATEST, BEST or init in a local run.remote: final, at `--check`
    and at start, not a sync failing for ever (another user's file in a sticky directory cannot be replaced: EPERM)
    or a LoRA run ending without its base's copy. A remote that does not answer now: no problem (sync waits)."""
    remote, root = cfg.run.remote, local_remote_root(cfg.run.remote)
    if root is None:
        return []
    answered, found, _ = bounded_probe(remote_write.foreign_entries, root, REMOTE_OWN)
    return [f"run.remote = {remote!r}: {what}, not this run's: a sync replaces LATEST and BEST and makes init there, "
            f"and another user's entry neither may be replaced nor may decide what a resume loads; have it "
            f"removed, or give run.remote a directory of this run's own" for what in (found if answered else [])]


def systemd_stop_note(cfg: RunConfig) -> str | None:
    """A `run --check` note when a stop of this run may take longer than the systemd unit lets it
    (deploy/minilmd@.service TimeoutStopSec: daemon/child/grace.py): under systemd, SIGKILL would end the trainer's
    save (or the last sync) before its end. Not a problem: a run under tmux or Slurm has no such bound here."""
    from math import ceil

    from minilmd.daemon.child.grace import SYSTEMD_STOP_TIMEOUT_S, save_grace, stop_takes_s

    takes = stop_takes_s(cfg)
    if takes <= SYSTEMD_STOP_TIMEOUT_S:
        return None
    return (f"restart.hang_timeout = {cfg.restart.hang_timeout}: a stop may take {ceil(takes / 60)} min (the "
            f"trainer's save, {save_grace(cfg):.0f}s, then a staging copy and the last sync), more than the systemd "
            f"unit allows (deploy/minilmd@.service TimeoutStopSec={SYSTEMD_STOP_TIMEOUT_S / 60:.0f}min): under "
            f"systemd set TimeoutStopSec={ceil(takes / 60)}min or more in the unit, or systemd SIGKILLs the run "
            f"before the save ends")


class Launched(NamedTuple):
    """What launch() hands the supervisor."""

    cfg: RunConfig
    resumes: bool
    """Whether it resumes from a checkpoint of its own (`resumes`)."""
    held: Held | None
    """The run lock and the stop signals, held since a wait for room for scratch (daemon/scratchclaim.py); None when
    it did not wait (the supervisor takes the lock)."""


def launch(config_path: str, overrides: list[str] | None = None, fresh: bool = False,
           claim_remote: bool = False, signals: Signals | None = None) -> Launched:
    """check(), then run.dir settled (made and judged in one walk: place_rule.settle_run_dir) and put in the config
    as its real path, then scratch claimed for this run; raises ConfigError (exit 2) if any refuses. Everything
    after (the claim's owner record, the supervisor, its trainer) uses that path, never the configured one again: a
    link planted on the way after check() cannot choose another run directory. The command (`minilmd run`) has
    given the process the run's identity before this (minilmd/procs.py `carry_supervisor_identity`). RunDirFull
    when run.dir's file system is full (said: the caller exits 73); NothingToDo when the run is done (said: exit 0,
    nothing made). Returns the config, whether it resumes from a checkpoint of its own (`resumes`) and what a wait for
    scratch holds for the supervisor (`Launched`). `signals`: `minilmd run`'s record (daemon/host/signals.py),
    installed before this: a stop during the checks raises LaunchStopped, after them it is recorded, for the scratch
    wait and the supervisor to act on."""
    said: list[str] = []  # where it starts: a run already done is no launch (daemon/jobs/rundone.py)
    try:
        cfg = check_with_waits(config_path, overrides, said, fresh, claim_remote)[0]
    except scratch_root.RecordUnreadable as e:
        raise ScratchRootUnknown(e) from None
    finally:
        if signals is not None:
            signals.record_only()  # before anything is written: a stop from now on is undone by the supervisor
    if done := next((line for line in said if isinstance(line, Done)), None):
        print(f"minilmd run: {done}", flush=True)  # nothing staged, no trainer started
        for moved in (line for line in said if line.startswith("note: init.from")):  # its base moved on, or edited
            print(f"minilmd run: {moved}", flush=True)
        if cleared := stoprequest.clear_at_a_done_start(cfg.run_dir, os.environ):
            print(f"minilmd run: {cleared}", flush=True)
        raise NothingToDo(done)
    for edited in (line for line in said if line.startswith("note: init.from now names ")):  # not applied: said
        print(f"minilmd run: {edited}", flush=True)
    perms.apply(cfg.run.share)  # before anything is created, and before any thread: the trainer inherits it
    settle_run_dir(cfg)
    held = claim_scratch(cfg, config_path, signals=signals)
    return Launched(cfg, resumes(said), held)


def resumes(start: list[str]) -> bool:
    """Whether the launch's `start` (check_with_waits's) is from a checkpoint of the run's own, in scratch or on
    run.remote: no first start (daemon/phases/initwait.py at_start), though a new machine lost state.json."""
    from minilmd.daemon.jobs.resumefrom import Resumes

    return any(isinstance(line, (Resumes, Done)) for line in start)


class NothingToDo(LaunchEnds):
    """The run is done: its newest checkpoint is at its budget's end (daemon/jobs/rundone.py)."""

    exit_status = protocol.SUPERVISOR_DONE


def settle_run_dir(cfg: RunConfig) -> None:
    """cfg.run.dir made, judged and replaced by its real path (place_rule.settle_run_dir), once; ConfigError when
    refused, or when it is not the run directory this process was started for (its identity, which `stop` proves,
    named another: a link on the way moved between the exec and now)."""
    try:
        real = place_rule.settle_run_dir(cfg.run_dir)
    except place_rule.PlaceRefused as e:
        raise ConfigError([str(e)], cfg.source) from None
    except OSError as e:
        if full_at_start(cfg.run_dir, e):  # said; the caller's exit 73, as a run.dir full once made
            raise RunDirFull(str(cfg.run_dir)) from e
        raise ConfigError([f"run.dir {cfg.run.dir} cannot be made: {e.strerror or e}"], cfg.source) from None
    carried = os.environ.get(names.SUPERVISOR_RUN_DIR_ENV)
    if carried and carried != str(real):
        raise ConfigError([f"run.dir {cfg.run.dir} leads to {real} now, not to {carried} as when this command "
                           f"started (a link on the way changed meanwhile); nothing was started: check the links on "
                           f"the way to run.dir, then start the run again"], cfg.source)
    cfg.run.dir = str(real)
