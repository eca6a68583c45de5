"""The waiting_init phase: a run whose init.from names another run (its config file or run directory) waits until that
run has finished, then starts from its final, verified, synced checkpoint; a predecessor that failed (a final exit)
ends this run too, with a final status saying so. And the lineage `status` shows.

So a whole pipeline starts at once (`systemctl --user start minilmd@pretrain minilmd@sft minilmd@style`) and each
stage begins when the one before it is done. The predecessor's state.json says where it is
(minilmd.init_source.predecessor_report, read as another user's file): polled every POLL_S, shown in state.json
"init_wait". Whether it is alive too: its recorded supervisor pid still runs (with its start time: never a recycled
pid), and its state.json was written within STALE_S; one that is not is "not running since" its state.json's last
write (systemd may restart it: still a wait, never a failure). The wait is logged when the predecessor's phase or
liveness changes (or its last sync begins to wait: `final sync waiting`), not at every step it makes. A run that
already has a checkpoint of its own resumes from it and does not wait. Torch-free.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from minilmd import init_stall
from minilmd.bounded import Stalled
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import RunConfig
from minilmd.daemon.base.runstate import RunState, fmt_time, now
from minilmd.daemon.base.seen import supervisor_seen
from minilmd.daemon.base.statesections import InitWait, StateJson
from minilmd.daemon.base.worker import Worker
from minilmd.init_source import (
    InitSource,
    InitSourceError,
    InitSourceUnreachable,
    Predecessor,
    PredecessorReport,
    predecessor,
    predecessor_outcome,
    predecessor_report,
    source_state,
)
from minilmd.init_words import describe
from minilmd.names import step_name
from minilmd.perms import run_dir_owner
from minilmd.probes import bounded_probe
from minilmd.source_owner import owner_words

POLL_S = 2.0
"""Time between two reads of the predecessor's state.json."""
STALE_S = 60.0
"""A live supervisor rewrites its state.json every second or so (daemon/phases/rundirwatch.py): one not written for
this long is not running, whatever its lock says (a stopped or hung process)."""


@dataclass
class InitOutcome:
    done: bool = False
    failed: str = ""
    """Why the predecessor's failure ends this run (empty: it has not failed)."""


@dataclass(frozen=True)
class AtStart:
    """What the supervisor's start asks of init.from: whether to wait for it, and the update share lines
    (plan/update_share.py) to log at a first start from a base already finished (the ones `run --check` prints:
    systemd and sbatch never run it)."""

    waits: bool = False
    share: tuple[str, ...] = ()

    def say_share(self, emit) -> None:
        for line in self.share:  # as InitWaiter says it once a predecessor started together has finished
            emit("update_share", line)


def at_start(cfg: RunConfig, resumes: bool = False, emit=None) -> AtStart:
    """Whether this run starts from another run's result that is not there yet, and, when it is there, what the
    update share is: only at a first start (no checkpoint of its own in scratch; `resumes`: one the launch found on
    run.remote, or one state.json records synced there; a new machine that lost state.json still finds the remote's,
    so a resume there neither says the share again nor waits).
    Asked on shared storage in a bounded thread: an init.from that fails or does not answer is no predecessor to
    wait for here, and no share to say; staging waits for it in its own thread and `status` says so. A look that
    is slow is said at once to `emit` (supervisor.log, before the start's first event: minilmd/init_stall.py)."""
    if not cfg.init.from_ or resumes or local_checkpoint_steps(cfg.checkpoint_dir):
        return AtStart()
    said = init_stall.slow_look(cfg.init.from_, "the start", lambda line: emit("staging", line)) if emit else None
    answered, found, why = bounded_probe(_start_facts, cfg, on_slow=said)
    if not isinstance(why, Stalled):
        init_stall.answered(cfg.init.from_)  # as the launch's look: a stall said once is forgotten once it answers
    return found if answered and isinstance(found, AtStart) else AtStart()


def must_wait(cfg: RunConfig, resumes: bool = False) -> bool:
    """at_start's wait alone."""
    return at_start(cfg, resumes).waits


def _start_facts(cfg: RunConfig) -> AtStart:
    try:
        pred = predecessor(cfg.init.from_)
    except InitSourceError:
        return AtStart()  # the config check reports it
    if pred is not None and predecessor_outcome(pred)[0] != "done":
        return AtStart(waits=True)  # InitWaiter says the share once it is done
    return AtStart(share=_update_share(cfg))


@dataclass(frozen=True)
class Liveness:
    """Whether the predecessor's supervisor runs, and since when it does not (its state.json's last write)."""

    running: bool
    since: float | None = None
    detail: str = ""


def predecessor_liveness(pred: Predecessor, state: dict | None, t: float | None = None) -> Liveness | None:
    """Whether the supervisor of the predecessor runs, by status's rule (daemon/base/seen.py: its recorded pid alive
    with its start time, checked against who holds its run lock by the kernel's lock table; another host's, or a
    record gone while another pid holds that lock, not judged here: waited on as running), and its state.json
    written within STALE_S. Its lock is never opened nor probed: a probe every POLL_S, even a shared one of
    microseconds, could meet that supervisor restarting and make its own non-blocking acquire fail, a final exit 2.
    None when there is no state.json to judge by (not started, or unreadable: the why says so already)."""
    if state is None:
        return None
    t = now() if t is None else t
    read = StateJson.from_dict(state)
    seen = supervisor_seen(read, pred.run_dir, owner=run_dir_owner(pred.run_dir))  # its run lock must be theirs
    alive = seen.alive is not False
    updated = read.updated
    if read.outcome is not None:  # it ended, and not finished (stopped, or a status systemd restarts)
        return Liveness(False, read.outcome.time or updated, f"its supervisor ended with exit {read.outcome.exit}")
    if not alive:
        return Liveness(False, updated, "its supervisor is gone")
    if updated is not None and t - updated > STALE_S:
        return Liveness(False, updated, "its supervisor has not written state.json since")
    return Liveness(True)


def liveness_text(run: str, live: Liveness | None, last_said: str = "") -> str:
    """"predecessor X is not running since T" (or "" while it runs, or cannot be judged); `last_said`: what its
    state.json said then (a killed supervisor's stays "training" until someone looks), as what it was, not is."""
    if live is None or live.running:
        return ""
    said = f"; its state.json last said: {last_said}" if last_said else ""
    return (f"predecessor {run} is not running since {fmt_time(live.since)} ({live.detail}{said}; it may be "
            f"restarted: this run waits)")


def waiting_why(report: PredecessorReport, live: Liveness | None, run: str) -> str:
    """The one line of a wait, from one reading of the predecessor: its state.json's words while its supervisor runs
    (or where that cannot be judged), else that it is not running, with those words as what it last said. Never
    both as now: "run X is training at step N" beside "predecessor X is not running" (user6 #8)."""
    return liveness_text(run, live, report.why) or report.why


@dataclass(frozen=True)
class PredecessorPoll:
    """One read of the predecessor (init_source.predecessor, its report and liveness), made in a worker thread."""

    pred: Predecessor | None
    report: PredecessorReport | None = None
    live: Liveness | None = None
    share: tuple[str, ...] = ()
    """Once it is done: the update share lines (plan/update_share.py) `run --check` could not say before."""


def poll_predecessor(cfg: RunConfig) -> PredecessorPoll:
    """Everything InitWaiter reads of shared storage (the predecessor's config, its state.json, its base's
    trainer_state), in one call for a worker thread: a stalled NFS holds that thread, never the loop. Raises
    InitSourceError as `predecessor` does."""
    pred = predecessor(cfg.init.from_)
    if pred is None:
        return PredecessorPoll(None)
    report = predecessor_report(pred)
    live = predecessor_liveness(pred, report.state) if report.outcome == "waiting" else None
    return PredecessorPoll(pred, report, live, _update_share(cfg) if report.outcome == "done" else ())


def _update_share(cfg: RunConfig) -> tuple[str, ...]:
    from minilmd.plan.update_share import share_lines

    try:
        return tuple(share_lines(cfg))
    except (OSError, ValueError, TypeError, KeyError):  # its base unreadable now: advice unsaid, as by --check
        return ()


class InitWaiter:
    """Polls the predecessor; its view goes to state.json "init_wait" for `status`. Each poll runs in a Worker
    (daemon/base/worker.py): `tick` starts one every POLL_S and takes its answer once it has come."""

    def __init__(self, cfg: RunConfig, state: RunState, emit):
        self.cfg, self.state, self.emit = cfg, state, emit
        self.last_poll = 0.0
        self.poll: Worker | None = None
        """The poll under way (None between two)."""
        self.last_said: tuple | None = None
        """(outcome, phase, running, unreadable why) at the last line logged: a new line only when one changes."""

    def tick(self) -> InitOutcome | None:
        """None while waiting (and while a poll has not answered); an InitOutcome once the predecessor is done or
        failed."""
        if self.poll is None:
            if now() - self.last_poll < POLL_S:
                return None
            self.last_poll = now()
            self.poll = Worker("init-wait", functools.partial(poll_predecessor, self.cfg))
        if not self.poll.done:
            return None  # its share does not answer (yet): the loop goes on, the thread waits
        poll, self.poll = self.poll, None
        if isinstance(poll.error, InitSourceUnreachable):
            return None  # its share cannot be reached now: still a wait, never a failure
        if isinstance(poll.error, InitSourceError):
            return InitOutcome(failed=f"init.from = {self.cfg.init.from_!r}: {poll.error}")
        if poll.error is not None:
            raise poll.error
        return self._take(poll.result)

    def _take(self, found: PredecessorPoll) -> InitOutcome | None:
        pred, report, live = found.pred, found.report, found.live
        if pred is None or report is None:
            return InitOutcome(done=True)
        wait = self.state.init_wait or InitWait(since=now(), checks=0)
        wait.run, wait.run_dir, wait.root = pred.name, str(pred.run_dir), str(pred.root)
        wait.why = waiting_why(report, live, pred.name)
        wait.running = None if live is None else live.running
        wait.not_running_since = live.since if live is not None and not live.running else None
        wait.not_running = liveness_text(pred.name, live)
        wait.checks += 1
        self.state.init_wait = wait
        said = _change_key(report, live)
        if said != self.last_said:
            self.emit("init_wait", f"init.from: {wait.why}")
            self.last_said = said
        if report.outcome == "done":
            for line in found.share:  # said now, once, into the run's log (a WARNING above eval.update_share_warn)
                self.emit("update_share", line)
            return InitOutcome(done=True)
        if report.outcome == "failed":
            return InitOutcome(failed=f"the run this one starts from failed, so this one cannot start: {report.why}")
        return None


def _change_key(report: PredecessorReport, live: Liveness | None) -> tuple:
    """What a new [init_wait] line is for: the predecessor's outcome, phase and liveness, its last sync beginning to
    wait (still `stopping`: the why says for what), or a new why when there is no phase (not started, unreadable);
    never its step alone."""
    return (report.outcome, report.phase, None if live is None else live.running, report.last_sync_waits,
            report.why if not report.phase else "")


LINEAGE_PATH_SHOWN = 1024
"""The longest path of the lineage shown whole: a longer one (a trainer_state.json's "init" may say anything: a
planted megabyte printed a megabyte) is shown cut, saying how much was left out (untrusted.clipped)."""


def lineage(checkpoint_dir: Path | None, limit: int = 8, synced: Path | None = None) -> list[str]:
    """The chain of init.from behind this run's newest checkpoint (in scratch; else `synced`, its newest on
    run.remote, once scratch is gone, or not looked in: None): each step's source, its step and fingerprint,
    read from the trainer_state.json of each checkpoint in turn (as far as they can be read). Each is another
    run's, often another user's: read as init.from's checkpoint is (init_source.source_state: in its directory
    opened once, no link followed, no FIFO opened, bounded, a file of that directory's owner or ours), and said
    with its owner where that is neither yours nor root's (source_owner.owner_words: a teammate's checkpoint)."""
    chain: list[str] = []
    found = local_checkpoint_steps(checkpoint_dir) if checkpoint_dir is not None else []  # names only: numpy-free
    path: Path | None = checkpoint_dir / step_name(found[-1]) if checkpoint_dir is not None and found else synced
    while path is not None and len(chain) < limit:
        try:
            init = source_state(InitSource("checkpoint", path)).get("init")
        except ValueError:  # InitSourceError, Unreadable: a malformed checkpoint, a FIFO, a third user's file: the end
            break
        if not isinstance(init, dict) or not init:
            break
        said_path = init.get("path")  # a checkpoint's word: a path only when it is a string
        whose = owner_words(said_path) if isinstance(said_path, str) and said_path else ""  # a teammate's: said
        chain.append(describe(init, LINEAGE_PATH_SHOWN, whose))  # another user's word: clipped
        path = None
        if init.get("kind") == "checkpoint" and isinstance(said_path, str) and said_path:
            path = Path(said_path)
    return chain
