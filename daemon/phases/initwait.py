"""The waiting_init phase: a run whose init.from names another run (its config file or run directory) waits until
that run has finished, then starts from its final, verified, synced checkpoint; a predecessor that failed (a
final exit) ends this run too, with a final status saying so. And the lineage `status` shows.

So a whole pipeline starts at once (`systemctl --user start minilmd@pretrain minilmd@sft minilmd@style`) and each
stage begins when the one before it is done. The predecessor's state.json says where it is
(minilmd.init_source.predecessor_outcome): polled every POLL_S, shown in state.json "init_wait". A run that already
has a checkpoint of its own resumes from it and does not wait. Torch-free.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from minilmd.config import RunConfig
from minilmd.daemon.jobs.syncworker import local_checkpoint_steps
from minilmd.daemon.runstate import RunState, now
from minilmd.daemon.statesections import InitWait
from minilmd.init_source import InitSourceError, predecessor, predecessor_outcome
from minilmd.names import BEST, LATEST, TRAINER_STATE, step_name

POLL_S = 2.0
"""Time between two reads of the predecessor's state.json."""


@dataclass
class InitOutcome:
    done: bool = False
    failed: str = ""
    """Why the predecessor's failure ends this run (empty: it has not failed)."""


def must_wait(cfg: RunConfig) -> bool:
    """Whether this run starts from another run's result that is not there yet (and has no checkpoint of its own)."""
    if not cfg.init.from_ or local_checkpoint_steps(cfg.checkpoint_dir):
        return False
    try:
        pred = predecessor(cfg.init.from_)
    except InitSourceError:
        return False  # the config check reports it
    return pred is not None and predecessor_outcome(pred)[0] != "done"


class InitWaiter:
    """Polls the predecessor; its view goes to state.json "init_wait" for `status`."""

    def __init__(self, cfg: RunConfig, state: RunState, emit):
        self.cfg, self.state, self.emit = cfg, state, emit
        self.last_poll = 0.0
        self.last_why = ""

    def tick(self) -> InitOutcome | None:
        """None while waiting; an InitOutcome once the predecessor is done or failed."""
        if now() - self.last_poll < POLL_S:
            return None
        self.last_poll = now()
        try:
            pred = predecessor(self.cfg.init.from_)
        except InitSourceError as e:
            return InitOutcome(failed=f"init.from = {self.cfg.init.from_!r}: {e}")
        if pred is None:
            return InitOutcome(done=True)
        outcome, why = predecessor_outcome(pred)
        wait = self.state.init_wait or InitWait(since=now(), checks=0)
        wait.run, wait.run_dir, wait.root, wait.why = pred.name, str(pred.run_dir), str(pred.root), why
        wait.checks += 1
        self.state.init_wait = wait
        if why != self.last_why:
            self.emit("init_wait", f"init.from: {why}")
            self.last_why = why
        if outcome == "done":
            return InitOutcome(done=True)
        if outcome == "failed":
            return InitOutcome(failed=f"the run this one starts from failed, so this one cannot start: {why}")
        return None


def lineage(checkpoint_dir: Path, limit: int = 8) -> list[str]:
    """The chain of init.from behind this run's newest checkpoint: each step's source, its step and fingerprint,
    read from the trainer_state.json of each checkpoint in turn (as far as they can be read)."""
    chain: list[str] = []
    found = local_checkpoint_steps(checkpoint_dir)  # names only: `minilmd status` shows the lineage, numpy-free
    path: Path | None = checkpoint_dir / step_name(found[-1]) if found else None
    while path is not None and len(chain) < limit:
        try:
            init = json.loads((path / TRAINER_STATE).read_text(encoding="utf-8")).get("init")
        except (OSError, ValueError, RecursionError, AttributeError):  # a malformed checkpoint ends the chain
            break
        if not isinstance(init, dict) or not init:
            break
        sha = init.get("manifest_sha256") or init.get("sha256") or ""
        via = f", its {init['pointer']}" if init.get("pointer") in (BEST, LATEST) else ""
        chain.append(f"{init.get('path')} (step {init.get('step', '-')}{via}, sha256 {sha[:12]})")
        path = Path(init["path"]) if init.get("kind") == "checkpoint" and init.get("path") else None
    return chain
