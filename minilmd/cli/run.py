"""`minilmd run`: the supervisor in the foreground, or `run --check`, what a launch would check."""
from __future__ import annotations

import functools

import typer

commands = typer.Typer()
"""The top-level command of this group; minilmd/cli/__init__.py registers it on the `minilmd` app."""


@commands.command("run")
def run_command(
    config: str = typer.Argument(..., help="The run config (TOML)."),
    check: bool = typer.Option(False, "--check", help="Check what a launch would: the config, the corpus against the "
                                                      "model, scratch's owner and space, the checkpoint it would "
                                                      "resume from; exit 0 saying where it starts, or 2 listing "
                                                      "every problem. Creates nothing."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
    fresh: bool = typer.Option(False, "--fresh", help="With no checkpoint in scratch and a run.remote that cannot "
                                                      "be read (not there, an empty mount point, a link to "
                                                      "nowhere, unreadable), start from step 0 instead of waiting "
                                                      "for the remote (a run that has synced to it before "
                                                      "waits). Also starts a new lineage in a run.dir whose "
                                                      "state.json records a newer step on another run.remote "
                                                      "(refused without it). A remote that answers is still "
                                                      "resumed from; an old scratch of this run holding newer "
                                                      "checkpoints is still refused: remove it to give them up."),
    claim_remote: bool = typer.Option(False, "--claim-remote", help="Make run.remote this run's although its "
                                                                    "owner.json names another run (or it holds "
                                                                    "checkpoints and no owner.json): for this run "
                                                                    "moved to another run.dir (another server or "
                                                                    "path), whose claim names its old run.dir. "
                                                                    "The claim is rewritten "
                                                                    "(an event says so): this run resumes from the "
                                                                    "remote and prunes it, the run it named has its "
                                                                    "syncs there refused. Never another user's "
                                                                    "owner.json, nor the remote of a run whose "
                                                                    "supervisor is seen running."),
) -> None:
    """Supervise one run in the foreground: wait for a GPU, stage, train, sync, restart on failures.

    Exit status: 0 finished (or stopped on request), 1 the supervisor crashed, could not set up the run directory or
    read its scratch-root.json, or the run finished but its last sync failed (not final: systemd restarts it, and a
    restart retries the sync), 2 bad config (a checkpoint to resume from of another model or corpus too; a run.name,
    run.scratch or run.remote edited away from a newer step this run.dir's state.json records there) or run owned by
    another supervisor, 65 bad data, 73 run.dir's disk full or run.dir removed (stopped after the last sync), 79 gave up
    after too many
    restarts (2, 65, 73 and 79 are final: list them in systemd's RestartPreventExitStatus=)."""
    if check:
        from minilmd import scratch_root
        from minilmd.config import ConfigError
        from minilmd.daemon import preflight
        from minilmd.protocol import SUPERVISOR_CONFIG, SUPERVISOR_RETRY

        start: list[str] = []  # where the launch starts: resumes from step N (scratch|remote), or step 0
        try:
            cfg, waits = preflight.check_with_waits(config, set_, start, fresh, claim_remote)
        except ConfigError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(SUPERVISOR_CONFIG) from None
        except scratch_root.RecordUnreadable as e:  # not the config's fault, and no default root guessed instead
            typer.echo(f"{config}: where the run's scratch is cannot be known now: {e}", err=True)
            raise typer.Exit(SUPERVISOR_RETRY) from None
        typer.echo(f"{config}: OK (run {cfg.run.name}, run dir {cfg.run.dir}, scratch {cfg.scratch_dir})")
        from minilmd.corpus_meta import read_corpus_meta
        from minilmd.plan.budget import budget_line, lr_line, planned

        meta = read_corpus_meta(cfg.data.prepared) if cfg.data.prepared else None  # once, for every line below
        typer.echo(lr_line(cfg, meta))  # the rate the trainer will run at, and where it comes from
        # what the checkpoint it resumes from trained: a budget in tokens or epochs is counted after it
        trained = next((d for line in start if (d := getattr(line, "done", None)) is not None), None)
        plan = functools.cache(lambda: planned(cfg, meta, None, trained))  # meta.json as --check read it (None: here)
        from minilmd.daemon.jobs.remotewait import STEP_0, check_line

        # no checkpoint in scratch, the remote out of reach: wait, or step 0; else where it resumes (or step 0)
        remote_line = check_line(cfg, fresh, any(line.startswith(STEP_0) and "run.remote" in line for line in start))
        rate = measured_rate(cfg, _start_step(remote_line, trained, preflight.resumes(start)))
        typer.echo(budget_line(cfg, plan(), rate))  # steps, tokens, epochs, which budget binds
        for line in waits:
            typer.echo(f"waits: {line}")
        from minilmd.plan.epoch_notes import epoch_notes

        for line in _notes(cfg, plan, claim_remote, rate) + epoch_notes(cfg, plan(), meta):
            typer.echo(line if line.startswith("WARNING: ") else f"note: {line}")  # stage_notes.WARNING
        for line in [remote_line] if remote_line else start:
            typer.echo(line)
        init_unreachable = any(line.startswith("init.from") for line in waits)  # the others: scratch's room
        from minilmd.daemon.jobs.rundone import Done
        from minilmd.plan.update_share import share_lines

        done = any(isinstance(line, Done) for line in start)  # it trains nothing: no share to weigh
        # reachable: it may not have finished yet; a run with a checkpoint of its own waits for no init.from
        if not init_unreachable and (wait := _init_wait(cfg, preflight.resumes(start))):
            typer.echo(f"waits: init.from = {cfg.init.from_!r}: {wait}; the run waits for it to finish, then "
                       f"checks its final checkpoint")
        for line in share_lines(cfg, trained) if not init_unreachable and not done else []:  # reads init.from
            typer.echo(line)
        raise typer.Exit(0)
    from minilmd import procs
    from minilmd.config import ConfigError, load_config
    from minilmd.daemon.supervisor import run_supervisor

    try:  # executes this command once more, its environment carrying the run: how `stop` proves its supervisor
        procs.carry_supervisor_identity(load_config(config, set_).run_dir)
    except ConfigError:
        pass  # run_supervisor's check says what is wrong
    raise typer.Exit(run_supervisor(config, set_, fresh, claim_remote))


def _init_wait(cfg, resumes: bool = False) -> str:
    """Why a launch would first wait in waiting_init (the run init.from names has not finished: the check passes
    without its final checkpoint), as the supervisor decides it (daemon/phases/initwait.py; `resumes`: from a
    checkpoint of its own, which no wait precedes); "" when it would not."""
    from minilmd.daemon.phases.initwait import must_wait
    from minilmd.init_source import predecessor, predecessor_outcome

    if not must_wait(cfg, resumes):
        return ""
    pred = predecessor(cfg.init.from_)
    return predecessor_outcome(pred)[1] if pred is not None else ""


def _notes(cfg, plan, claim_remote: bool = False, rate=None) -> list[str]:
    """What the launch does that the user may not expect, for `--check` to say: train on the CPU (train.device =
    "auto" and no NVIDIA driver: daemon/host/gpu.py), need close to its device's memory (daemon/preflight.py
    memory_fit), train on some conversations or preference pairs nothing (train.seq_len
    cuts their replies away: minilmd/replycut.py), what the config may not mean (stage_notes.stage_notes), take longer
    to stop
    than the systemd unit allows (a long restart.hang_timeout: daemon/preflight.py), fill run.dir's file system
    (under 4 MiB free: daemon/phases/rundirwatch.py room_note), fill run.remote (room for fewer than sync.keep + 1
    checkpoints: daemon/jobs/remote_room.py), keep its checkpoints only in
    scratch (no run.remote), make a private scratch root (another user took the default's: minilmd/scratch_root.py),
    take a remote over (`claim_remote`: what it takes, daemon/jobs/remote_claim.py).
    `plan()`: the budget's plan (budget.planned), for the checkpoint and time notes; `rate`: the speed this run
    directory measured (measured_rate, from the step the launch starts at), for the time notes."""
    from minilmd.daemon.host.gpu import cpu_fallback
    from minilmd.daemon.jobs.remote_room import remote_room_note
    from minilmd.daemon.phases.rundirwatch import room_note
    from minilmd.daemon.preflight import memory_fit, systemd_stop_note
    from minilmd.reply_check import replies_cut_warning
    from minilmd.scratch_root import check_note as root_taken
    from minilmd.stage_notes import stage_notes

    notes = [taken] if (taken := root_taken(cfg.scratch_dir, cfg.scratch_root_settled)) else []
    notes += [why] if (why := cpu_fallback(cfg)) else []
    notes += [near] if (near := memory_fit(cfg)[1]) else []  # a micro-batch close to the device's memory
    notes += [cut] if (cut := replies_cut_warning(cfg)) else []  # replies train.seq_len cuts away: fewer than half
    notes += stage_notes(cfg)  # settings the stage ignores, DPO from random weights, what init.from's run was
    notes += [slow] if (slow := systemd_stop_note(cfg)) else []  # hang_timeout past the unit's TimeoutStopSec
    notes += [full] if (full := room_note(cfg.run_dir)) else []  # run.dir's file system nearly full: exit 73 soon
    notes += [tight] if (tight := remote_room_note(cfg)) else []  # the remote: room for sync.keep + 1 checkpoints
    if claim_remote:
        from minilmd.daemon.jobs.remote_consent import check_note

        notes += [taken] if (taken := check_note(cfg)) else []
    if not cfg.run.remote:
        notes.append(f"no run.remote: the checkpoints stay only in scratch ({cfg.checkpoint_dir}), which a reboot "
                     f"(/dev/shm), a scratch cleaner or a lost node takes with them; set run.remote to a directory "
                     f"on persistent storage to keep a copy")
    return notes + _checkpoint_note(cfg, plan) + _time_notes(plan, rate, cfg)


def _checkpoint_note(cfg, plan) -> list[str]:
    """A note when train.checkpoint_every, in steps, is more than the whole run's (`plan()`: budget.planned): its
    only checkpoint is then the last, and a crash before it loses every step (a duration is bounded: a week)."""
    every = cfg.train.checkpoint_every_steps
    if every is None or (planned := plan()) is None or every <= planned.steps:
        return []
    return [f"train.checkpoint_every = {every:,} steps, more than the run's {planned.steps:,}: its only checkpoint "
            f"is its last, so a crash before the end loses all of its training; set it to a few minutes "
            f"(train.checkpoint_every = \"5m\", the default) or a step count well under the budget"]


YEAR_S = 365 * 86400.0


def measured_rate(cfg, at: int | None = None):
    """The speed this run directory's earlier launch measured (state.json's progress: tok/s, at its step shown, its
    tokens with the step of the train line that counted them), as budget.Rate; None when none was (a fresh run), or
    not as numbers (another hand's state.json). Tokens without that line's step (a file of an older version, whose
    step may be the heartbeat's) are not taken: a step's tokens are then its positions."""
    import math

    from minilmd.daemon.base.runstate import read_state
    from minilmd.plan.budget import Rate

    progress = (read_state(cfg.run_dir) or {}).get("progress")
    progress = progress if isinstance(progress, dict) else {}
    tok_s, step = progress.get("tok_s"), progress.get("step")
    seen, seen_at = progress.get("tokens_seen"), progress.get("tokens_seen_step")
    if not isinstance(tok_s, (int, float)) or isinstance(tok_s, bool) or not 0 < tok_s < math.inf:
        return None
    paired = type(seen) is int and seen > 0 and type(seen_at) is int and seen_at > 0
    return Rate(float(tok_s), step if type(step) is int else 0, seen if paired else None, at,
                seen_at if paired else None)


def _time_notes(plan, rate, cfg) -> list[str]:
    """What the budget's steps left (`plan()`: budget.planned) take at the rate this run directory last measured
    (measured_rate; budget.time_left): a note when that is years (a budget mistyped), and one when sync.every is
    longer than that (no sync comes before the last, at the end). [] without a measured rate: a fresh run has no
    estimate."""
    from minilmd.fmt import fmt_duration
    from minilmd.plan.budget import time_left

    if rate is None:
        return []  # none measured, or not a number: another hand's state.json
    if (planned := plan()) is None or (left_eta := time_left(planned, rate)) is None:
        return []  # an epoch budget of a corpus that does not say its size; or finished: nothing left to time
    left, eta = left_eta
    rate_said = f"at the {rate.tok_s:,.0f} tok/s this run last measured"
    notes = []
    if eta >= YEAR_S:
        notes.append(f"the budget's {left:,} steps left take {eta / YEAR_S:,.0f} years {rate_said}: is "
                     f"train.max_steps, max_tokens or max_epochs what you meant?")
    if cfg.run.remote and cfg.sync.every_s > eta:
        notes.append(f"sync.every = {cfg.sync.every!r} is longer than the run takes ({fmt_duration(eta)} "
                     f"{rate_said}): no sync comes before the last one, at its end; until then its checkpoints are "
                     f"only in scratch")
    return notes


def _start_step(remote_line: str, trained, resumes: bool) -> int | None:
    """The step the launch starts from, where --check knows it: the steps left are counted from it, not from the last
    recorded step. A remote line that waits knows nothing yet; one of step 0 knows (before: "the 225 steps left after
    step 175 (the last known: ...)" above its own "starts from step 0")."""
    from minilmd.daemon.jobs.remotewait import STEP_0

    if remote_line:
        return 0 if remote_line.startswith(STEP_0) else None
    if trained:
        return trained.step
    return None if resumes else 0
