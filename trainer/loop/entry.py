"""`minilmd train CONFIG`'s entry: from the command line to the Trainer's loop (trainer/loop/train.py) and back.

main() settles run.dir (its real path, before anything records it), on its own claims scratch and its compile caches,
takes scratch's trainer.lock; run() enables the stack dumps, installs the stop flag, sets up CUDA's environment, the
ranks and the threads, refuses a micro-batch that cannot fit the device, then trains and turns any failure into its
exit status (trainer/loop/exits.py). Kept apart from train.py so that the Trainer there is its components and its loop
alone, and the process's start and end read here.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
from pathlib import Path

import torch

from minilmd import compile_cache, perms, trainer_lock
from minilmd.config import ConfigError, RunConfig
from minilmd.fsio import is_disk_full
from minilmd.names import FAULT
from minilmd.place_rule import PlaceRefused, settle_run_dir
from minilmd.plan.budget import epoch_without_budget
from minilmd.probes import load_checked
from minilmd.protocol import EXIT_CONFIG, EXIT_RUN_DIR_FULL, EXIT_SCRATCH_FULL, EXIT_TRAINER_BUSY
from minilmd.roomwords import no_room, top_of
from minilmd.scratch import ScratchRefused
from minilmd.scratch import claim as claim_scratch
from minilmd.supervision import SupervisionRefused, supervision
from minilmd.trainer.loop import cpu_threads, determinism, exits, warmup
from minilmd.trainer.loop.distributed import Dist, init_distributed, release
from minilmd.trainer.loop.guards import StopFlag, tolerating_full_run_dir
from minilmd.trainer.loop.train import Trainer


def run(cfg: RunConfig) -> int:
    """Train with an already validated config whose run.dir main() settled (its real path); returns the exit
    status."""
    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop = StopFlag()
    stop.install()
    with contextlib.suppress(OSError):
        (cfg.run_dir / FAULT).unlink(missing_ok=True)  # a fault note describes the attempt that wrote it
    dist = None
    step = 0
    warmup.set_cuda_alloc_conf(cfg.train.device)  # before CUDA is initialised
    prepared = determinism.prepare_environment(cfg)  # before CUDA is initialised too
    with tolerating_full_run_dir(stop.writes):  # its log is in run.dir: a print there must not cost the save
        try:
            dist = init_distributed(cfg)
            if dist.device.type == "cuda":  # where cuBLAS runs: a CPU run's last words (its last error) are its own
                print(f"minilmd: {prepared}", flush=True)
            determinism.apply(cfg, dist.device.type)
            if supervision() is None:  # on its own: no supervisor set its threads (minilmd/threads.py)
                count, why = cpu_threads.choose(dist.device.type, "minilmd train")
                torch.set_num_threads(count)
                print(f"minilmd: torch threads {count} ({why})", flush=True)
            refuse_what_cannot_fit(cfg, dist)
            trainer = Trainer(cfg, dist, stop)
            try:
                return trainer.train()
            finally:
                step = trainer.step
                del trainer  # its DDP model holds the process group that release() below leaves
        except Exception as e:  # noqa: BLE001 - every failure has its exit status (trainer/loop/exits.py)
            return exits.status_of(cfg, e, dist, step)
        finally:
            release(dist)


def refuse_what_cannot_fit(cfg: RunConfig, dist: Dist) -> None:
    """minilmd/plan/footprint.py's rule on this rank's device, before anything is built: a micro-batch (or a
    validation set) clearly too big for it is refused with the figures and the way out (too_big: a ConfigError on
    the CPU, a CUDA out-of-memory on a card); one close to it a note, and one over what the host has available now a
    note too (at a restart, another user may hold it for a while).
    The corpus's format and val split (and [eval] probe's) from their meta.json (staged copies under a supervisor)."""
    from minilmd.corpus_meta import read_corpus_meta
    from minilmd.plan.footprint import Offer, fit, host_available, host_offer

    on_gpu = dist.device.type == "cuda"
    if on_gpu:
        card = torch.cuda.get_device_properties(dist.device)
        offer: Offer | None = Offer(card.total_memory, f"GPU memory of {card.name}")
    else:
        offer = host_offer()
    if offer is None:
        return
    probe = cfg.eval.probe_staged or cfg.eval.probe
    refused, near = fit(cfg, read_corpus_meta(cfg.data.prepared), offer, on_gpu,
                        read_corpus_meta(probe) if probe else None, host_offer(), host_available())
    if refused:
        raise too_big(refused, cfg, on_gpu)
    if near and dist.is_main:
        print(f"minilmd: note: {near}", flush=True)


def too_big(refused: list[str], cfg: RunConfig, on_gpu: bool) -> Exception:
    """What a micro-batch too big for this rank's device raises. On a card, a CUDA out-of-memory (exit 76, fault.json):
    `run --check` and the launch judged the largest card here, and the supervisor leases whichever is free, so a
    smaller one at a restart is no fault of the config's, and the OOM retry halves the micro-batch (a final config
    error there ended a run for good because the big card was busy). On the CPU the host's total memory does not
    change between starts: a ConfigError (exit 2)."""
    if on_gpu:
        return torch.OutOfMemoryError("; ".join(refused))
    return ConfigError(refused, cfg.source)


def main(config_path: str, overrides: list[str] | None = None, checked: RunConfig | None = None) -> int:
    """Entry point of `minilmd train CONFIG [--set SECTION.KEY=VALUE ...]`; returns the exit status. `checked`:
    the config the command line already loaded and judged (load_checked, before it imported torch), not read again."""
    try:
        supervision()  # a run directory without its supervisor's identity (or the reverse): refused before anything
        cfg = checked or load_checked(config_path, overrides, more_checks=epoch_without_budget, count_replies=False)
        perms.apply(cfg.run.share)  # under a supervisor, its umask already; on its own, before creating anything
        if (refused := settle_run_dir_of(cfg)) is not None:  # before scratch's claim records it: its real path
            return refused
        if supervision() is None:  # on its own, the trainer makes scratch its run's as the supervisor does
            if (full := claim_on_its_own(cfg)) is not None:
                return full
        trainer_lock.hold_for(cfg)  # one trainer per scratch, before any checkpoint is read: a second one refused
    except trainer_lock.TrainerLockNoRoom as e:  # another user's files fill scratch: waited for, never final
        return exits.scratch_without_room(e)
    except trainer_lock.TrainerLockHeld as e:  # this run's own trainer still holds it: the supervisor retries it
        print(f"minilmd train: {e}", file=sys.stderr)
        return EXIT_TRAINER_BUSY if e.retried else EXIT_CONFIG
    except (ConfigError, SupervisionRefused, ScratchRefused, trainer_lock.TrainerLockRefused) as e:
        print(f"minilmd train: {e}", file=sys.stderr)
        return EXIT_CONFIG
    return run(cfg)


def settle_run_dir_of(cfg: RunConfig) -> int | None:
    """cfg.run.dir made and judged in one walk (place_rule.settle_run_dir) and replaced by its real path, once,
    before anything records it (scratch's owner.json): a link planted on the way after the config was read chooses
    nothing. None when settled, else the exit status, said: 2 refused or not makeable, 74 its file system full, 73
    under a supervisor when it is gone (removed since the supervisor made it: made again here, it would lack the run's
    state.json and config copy; the supervisor says so and stops, daemon/phases/rundirwatch.py)."""
    if supervision() is not None and not os.path.isdir(cfg.run_dir):
        print(f"minilmd train: run.dir {cfg.run.dir} is not there (removed since the supervisor made it?): the "
              f"trainer does not make it again", file=sys.stderr, flush=True)
        return EXIT_RUN_DIR_FULL
    try:
        cfg.run.dir = str(settle_run_dir(cfg.run_dir))
    except PlaceRefused as e:
        print(f"minilmd train: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except OSError as e:
        full = is_disk_full(e)
        print(f"minilmd train: run.dir {cfg.run.dir} cannot be made: {e.strerror or e} ({e.filename})"
              + ("; make room on its file system, then start the run again" if full else ""), file=sys.stderr,
              flush=True)
        return EXIT_SCRATCH_FULL if full else EXIT_CONFIG
    return None


def claim_on_its_own(cfg: RunConfig) -> int | None:
    """`minilmd train` on its own: scratch claimed and its compile caches made there, as the supervisor does. None
    when done; on a scratch with no room (bytes or inodes: fsio.is_disk_full) exit 74 (protocol.EXIT_SCRATCH_FULL),
    said in one line with what is used up there (minilmd/roomwords.py), and the directories this call made removed
    again (only those, and only empty: a claim half made is no claim; before, a traceback, and an empty scratch
    left behind)."""
    scratch = cfg.scratch_dir
    new = [p for p in (scratch.parent, scratch, compile_cache.root_of(scratch)) if not os.path.lexists(p)]
    try:
        claim_scratch(scratch, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)
        own_compile_caches(cfg)
    except OSError as e:
        if not is_disk_full(e):
            raise
        for made in reversed(new):  # the deepest first
            remove_empty_tree(made)
        print(f"minilmd train: scratch full: run.scratch {scratch} cannot be made ready: "
              f"{no_room(e, scratch.parent, top_of(scratch.parent))}; make room there, then start again",
              file=sys.stderr, flush=True)
        return EXIT_SCRATCH_FULL
    return None


def remove_empty_tree(top: Path) -> None:
    """The empty directories under `top` and `top` itself removed, bottom up (rmdir: never a file, nor a directory
    that holds one); links not followed."""
    for here, dirs, _ in os.walk(top, topdown=False):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(here, name))
    with contextlib.suppress(OSError):
        os.rmdir(top)


def own_compile_caches(cfg: RunConfig) -> None:
    """On its own, the trainer's torch.compile caches are its run's, under scratch, as the supervisor sets them
    (minilmd/compile_cache.py): never inductor's default in /tmp, whose fixed name another user can take first.
    Before torch imports its compiler (nothing has yet: torch.compile and DDP import it later)."""
    chosen = compile_cache.settle(compile_cache.root_of(cfg.scratch_dir), os.environ, "minilmd train",
                                  "the run's own, under scratch")
    compile_cache.apply(chosen)
    for line in compile_cache.refusals(chosen):
        print(f"minilmd: {line}", flush=True)
