"""The trainer process as the supervisor watches it: the orphans at start, an attempt's command, a hang, a trainer
not reaped after SIGKILL, and what the restart policy needs to know about a death beyond its cause.

Functions the loop calls with what they need (the run's config, the child, `emit(kind, message, **details)`); the
process mechanics themselves (find, signal, dump a stack) are daemon/child/process.py, a death's classification
daemon/child/death.py. Torch-free.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from minilmd import compile_cache, names
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import RunConfig
from minilmd.daemon.base.runstate import Heartbeat, now, read_heartbeat
from minilmd.daemon.base.states import Cause
from minilmd.daemon.base.statesections import ChildInfo
from minilmd.daemon.child import compilecache, orphans, stackdump
from minilmd.daemon.child import process as childmod
from minilmd.daemon.child.death import Death
from minilmd.daemon.child.grace import save_grace
from minilmd.daemon.child.process import Child

STARTUP_GRACE_S = 60.0
"""Before its first heartbeat a trainer counts as hung only after max(hang_timeout, this)."""
UNREAPED_REPORT_S = 30.0
"""A trainer not reaped this long after SIGKILL is reported once (uninterruptible I/O); the loop goes on polling."""


def child_info(child: Child, command: list[str]) -> ChildInfo:
    """state.json's record of a launched trainer."""
    return ChildInfo(pid=child.pid, start_ticks=child.start_ticks, attempt=child.attempt, started=child.started,
                     log=str(child.log_path), command=command, newest_at_launch=child.newest_at_launch)


def kill_orphans(cfg: RunConfig, run_dir: Path, emit, watchdog: Callable[[], None]) -> None:
    """Never two trainers on one run: a trainer left by a killed supervisor is told to save and stop. The grace
    can outlast the unit's WatchdogSec, so the watchdog is fed while it waits. What its stop lost, when it saved
    nothing (its work since the newest checkpoint; a DPO reference pass it was computing), is said."""
    pids = orphans.find_orphans(run_dir)
    if not pids:
        return
    grace = save_grace(cfg)
    beat, launched = read_heartbeat(run_dir), orphans.launched_at(run_dir)  # what it is doing, before its SIGTERM
    newest, before, stopped = max(local_checkpoint_steps(cfg.checkpoint_dir), default=-1), newest_mark(cfg), now()
    emit("orphan", f"found trainer process(es) of this run left by an earlier supervisor: {pids}; "
                   f"SIGTERM, SIGKILL after {grace:.0f}s", pids=pids)
    orphans.terminate_orphans(run_dir, grace=grace, while_waiting=watchdog)
    left = orphans.find_orphans(run_dir)
    if left:
        raise RuntimeError(f"orphaned trainer processes {left} survived SIGKILL; not starting a second trainer")
    saved = newest_mark(cfg) != before  # a newer step, or step 0 saved again by a stop during a resumed DPO pass
    lost = "" if saved else orphan_loss(beat, launched, newest, stopped, _step0_pass(cfg) if newest == 0 else None)
    emit("orphan", f"orphaned trainer processes {pids} are gone" + (f"; {lost}" if lost else ""),
         **({"lost": lost} if lost else {}))


def newest_mark(cfg) -> tuple[int, int] | None:
    """The newest local checkpoint as (step, inode of its directory): a save publishes a new directory, so a step
    saved again (step 0 of a DPO reference pass stopped twice) reads as saved, which its number alone did not."""
    step = max(local_checkpoint_steps(cfg.checkpoint_dir), default=None)
    if step is None:
        return None
    try:
        return step, os.lstat(Path(cfg.checkpoint_dir) / names.step_name(step)).st_ino
    except OSError:
        return step, 0


def launched(child: Child, cfg: RunConfig, newest: int) -> None:
    """Record what a launched trainer's progress is judged against at its end (`made_progress`)."""
    child.newest_at_launch = newest
    child.step0_at_launch = newest_mark(cfg) if newest == 0 else None


def made_progress(cfg: RunConfig, child: Child) -> bool:
    """Whether an ended trainer saved a newer checkpoint than the newest at its launch, or saved step 0 again (a
    DPO reference pass saved further on, periodically or by a stop: a new directory): a run killed over and over
    during a long pass (OOM, a hang) makes only that progress, and must not run out of `restart.no_progress_limit`
    for it."""
    newest = max(local_checkpoint_steps(cfg.checkpoint_dir), default=-1)
    if newest > child.newest_at_launch:
        return True
    return newest == 0 and child.step0_at_launch is not None and newest_mark(cfg) != child.step0_at_launch


def _step0_pass(cfg) -> int | None:
    from minilmd.checkpoint import saved_pass  # numpy and safetensors: not before staging (tests/test_import_budget.py)

    return saved_pass(Path(cfg.checkpoint_dir) / names.step_name(0))


def orphan_loss(beat: Heartbeat | None, launched: float | None, newest: int, stopped: float,
                kept: int | None = None) -> str:
    """What an orphan stopped (at `stopped`) without a new checkpoint lost, from its last heartbeat (only one it
    beat since its launch, `launched`: trainer.json's time) and the newest checkpoint before its stop (a step 0 of
    a DPO reference pass saved so far: `kept` pairs); "" when nothing is known lost (no beat of its own, or its step
    is the newest checkpoint's and it was neither compiling nor computing its DPO reference past what is saved)."""
    if beat is None or launched is None or beat.mtime < launched:
        return ""
    ran = f"it had run {max(0.0, stopped - launched):.0f}s and saved no checkpoint"
    if (ref := beat.reference_pass()) is not None:
        if kept is None:
            return (f"{ran}: its DPO reference pass ({ref[0]:,}/{ref[1]:,} pairs) is lost, the next attempt "
                    f"computes it again")
        if ref[0] <= kept:
            return ""
        return (f"it had run {max(0.0, stopped - launched):.0f}s: its DPO reference pass since the {kept:,} pairs "
                f"saved at step 0 (to {ref[0]:,}/{ref[1]:,}) is lost, the next attempt goes on from {kept:,}")
    if beat.phase == names.HEARTBEAT_COMPILING:
        return f"{ran}: it was compiling its first step (at step {beat.step}), the next attempt compiles again"
    if beat.step is not None and beat.step > max(newest, 0):
        return f"{ran}: its steps after {max(newest, 0)} (to step {beat.step}) are lost, the next attempt " \
               f"trains them again"
    return ""


def compile_cache_root(cfg: RunConfig) -> Path:
    """The run's own torch.compile caches (inductor's and triton's), under scratch: kept across restarts."""
    return compile_cache.root_of(cfg.scratch_dir)


def attempt_command(run_dir: Path, staged: Path | None, scratch: Path, overrides: dict, cli_sets: dict[str, dict],
                    nproc: int) -> list[str]:
    """An attempt's command line: the staged corpus, the scratch the supervisor claimed (`run.scratch`: a default
    one's root was settled once at launch, so the trainer never works it out again from run.dir's record, whose
    failed read once led to the default root, another user's), the overrides the policy set, then the command
    line's (`cli_sets`, config.given_sets: their relative paths made absolute against this supervisor's working
    directory once, at its start, as its own config read them; the trainer runs in "/" (minilmd/pychild.py), and
    the supervisor's own directory may be deleted since)."""
    merged = {"data.prepared": str(staged), "run.scratch": str(scratch), **overrides}
    for section, values in cli_sets.items():
        for key, value in values.items():
            merged.setdefault(f"{section}.{key}", value)
    return childmod.build_command(run_dir / names.RUN_CONFIG_COPY, merged, nproc)


PHASE_ALLOWANCES = {names.HEARTBEAT_COMPILING: "compile_timeout", names.HEARTBEAT_EXITING: "exit_timeout"}
"""The heartbeat phases that allow more silence than restart.hang_timeout, and the restart key that says how much."""


def _allowance(child: Child, beat: Heartbeat | None) -> tuple[str, str] | None:
    """(phase, restart key) when this attempt's own heartbeat names a phase with an allowance of its own. The phase
    is the tick's one reading's (`beat`), never read again: the file may hold the next heartbeat by now."""
    phase = beat.phase if beat is not None and child.beats(beat) else ""
    return (phase, PHASE_ALLOWANCES[phase]) if phase in PHASE_ALLOWANCES else None


def hang_limit(cfg: RunConfig, child: Child, beat: Heartbeat | None) -> float:
    """Seconds of silence that make this trainer hung: restart.hang_timeout, or (if longer) restart.compile_timeout
    while its own heartbeat says it is compiling (a cold torch.compile of the first step takes minutes) and
    restart.exit_timeout once it says it is exiting (training is over; a torchrun group's teardown can be slow)."""
    limit = cfg.restart.hang_timeout_s
    if (allowed := _allowance(child, beat)) is not None:
        limit = max(limit, getattr(cfg.restart, f"{allowed[1]}_s"))  # RestartSection's seconds of that key
    return limit


def kill_if_hung(cfg: RunConfig, child: Child, beat: Heartbeat | None, emit) -> None:
    """A trainer silent too long: dump its stack into its log, then SIGKILL (the next ticks poll for its end).
    `beat` is the tick's one reading of the heartbeat: its mtime and its phase judged together; a reading that
    failed (None) is the newest own beat seen before, phase and all (a compile's allowance kept)."""
    beat = child.seen(beat)
    limit = hang_limit(cfg, child, beat)
    detail = child.silence(beat, limit, STARTUP_GRACE_S)
    if not detail:
        return
    if limit > cfg.restart.hang_timeout_s and (allowed := _allowance(child, beat)) is not None:
        detail += f" while {allowed[0]} (restart.{allowed[1]})"
    emit("hang", f"trainer pid {child.pid} looks hung: {detail}; dumping its stack")
    launch = child.launch_pids()  # one /proc scan for the dump and the kill
    dumped = stackdump.dump_stack(child.pid, child.log_path, torchrun=childmod.is_torchrun(child.command),
                                  others=tuple(launch), launch=child.launch())
    child.killed_for_hang = True
    child.hang_detail = f"{detail}; {dumped}"
    child.kill(launch)


def kill_on_second_stop(cfg: RunConfig, child: Child, emit) -> str:
    """A second SIGTERM/SIGINT while the trainer saves on the first: SIGKILL now, and say what scratch shows of
    that save: a checkpoint published since the first signal (`child.stop_mark`, the newest then) is kept, and the
    run resumes from it; otherwise its save, if it had not finished, is lost. Looked at once the SIGKILL is sent:
    a save said lost does not land after the words (short of a rename already in the kernel). Returns the words, for
    the run's last error (what `minilmd stop` and `status` show)."""
    child.kill(why="by the supervisor on a second stop signal")
    mark = newest_mark(cfg)
    newest = f"step {mark[0]}" if mark is not None else "none"
    if child.stop_sent is None:
        said = f"its save, if it had not finished, is lost (the newest checkpoint in scratch: {newest})"
    elif mark != child.stop_mark and mark is not None:
        said = f"a checkpoint was saved since the first signal ({newest}, the newest in scratch): a start resumes " \
               f"from it"
    else:
        said = (f"no checkpoint was saved since the first signal: its save, if it had not finished, is lost (the "
                f"newest checkpoint in scratch: {newest})")
    words = f"second stop signal: killed the trainer (pid {child.pid}) now; {said}"
    emit("signal", words)
    return words


def report_unreaped(child: Child, emit) -> None:
    """A trainer stuck in uninterruptible I/O (a stalled mount) ends only when the kernel lets it: say so once,
    and go on polling."""
    assert child.killed_at is not None  # the caller checked: this runs only after the kill
    waited = now() - child.killed_at
    if waited > UNREAPED_REPORT_S and not child.reap_reported:
        child.reap_reported = True
        emit("kill", f"trainer pid {child.pid} has not exited {waited:.0f}s after SIGKILL (probably "
                     f"uninterruptible I/O on a stalled mount); waiting for the kernel to release it", pid=child.pid)


def finished_before_end(cfg: RunConfig, child: Child, state, emit) -> bool:
    """Whether this attempt's trainer had finished before it ended: its own last heartbeat says `exiting` (it writes
    that once training is over and its final checkpoint is saved, before the teardown) and the checkpoint of that
    step is in scratch or on the remote (state.json's remote_checkpoint). Then a kill in a slow teardown, or any
    other end, is the run's finish: a restart would start at the final step and save nothing new."""
    beat = read_heartbeat(cfg.run_dir)  # once: its phase and its step from the same heartbeat
    if beat is None or not child.beats(beat) or beat.phase != names.HEARTBEAT_EXITING:
        return False
    step = beat.step
    remote = state.remote_checkpoint.step if state.remote_checkpoint is not None else None
    if step is None or (step not in local_checkpoint_steps(cfg.checkpoint_dir) and remote != step):
        return False
    emit("finish", f"attempt {child.attempt} had finished: its heartbeat said exiting at step "
                   f"{step}, whose checkpoint is saved; its end is the run's finish, not a restart", step=step)
    return True


def death_facts(death: Death, child: Child, cfg: RunConfig, state, staging, gpu, emit) -> dict:
    """What the restart policy needs to know about this death beyond its cause: whether the trainer had finished
    before it ended (`finished_before_end`), whether it died on a damaged kernel of the run's own compile cache (then
    removed: daemon/child/compilecache.py), whether the staged corpus is damaged (`staging` the StagingWorker),
    whether the GPU was taken from us (`gpu` the GpuWaiter: foreign processes, or memory our own processes do not
    account for)."""
    if death.cause != Cause.DONE and finished_before_end(cfg, child, state, emit):
        return {"finished": True}
    facts = {}
    if death.cause in (Cause.CRASH, Cause.SIGBUS) and compilecache.clear_damaged(
            child.log_path, compile_cache_root(cfg), os.environ, death.cause == Cause.SIGBUS, emit):
        facts["cache_cleared"] = True
    if death.cause in (Cause.SIGBUS, Cause.DATA_ERROR) and (problems := staging.problems()) is not None:
        facts["staged_damaged"] = bool(problems)
        if problems:
            emit("staging", f"the staged corpus fails verification: {'; '.join(problems[:3])}")
    if death.cause == Cause.CUDA_OOM and (taken := gpu.gpu_taken()) is not None:
        facts["gpu_busy"], why = taken
        emit("gpu", f"after the CUDA OOM the GPU {'was taken' if taken[0] else 'is ours alone'}: {why}")
    return facts
