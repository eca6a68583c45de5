"""`minilmd run --claim-remote` (remote_claim.CONSENT): the user's consent to make a remote this run's, where its claim
names this run in another run.dir, or it holds checkpoints and no claim (daemon/jobs/remote_claim.py says why a remote
is refused without it). The claim is rewritten whole to name this run (RemoteStore.replace_own), only where it is
this user's own file and no live supervisor of the run it names is seen, and said in events.jsonl. Torch-free.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minilmd import run_owner
from minilmd.daemon.jobs.remote_claim import (
    CONSENT,
    TAKING_OVER,
    Claim,
    ClaimRefused,
    ForeignClaim,
    NotARecord,
    Refusal,
    claim_of,
    encoded,
    judge,
    probe_remote,
    problem,
    read,
    remote_steps,
    write_new,
)
from minilmd.daemon.jobs.remote_store import RemoteStore
from minilmd.names import REMOTE_OWNER
from minilmd.untrusted import printable


@dataclass(frozen=True)
class TakeOver:
    """What `run --claim-remote` would do to the remote's claim (take_over_plan: reads only)."""

    refused: str = ""
    """Why the consent cannot make the remote this run's ("": it can)."""
    takes: str = ""
    """What the claim says now that it no longer will ("": nothing to take: this run's, or unclaimed and empty)."""
    replaces: bool = False
    """An owner.json of this user's stands there, replaced whole (else the claim is made new)."""


def take_over_plan(store: RemoteStore, claim: Claim) -> TakeOver:
    """Whether `run --claim-remote` may make the remote this run's. Never another user's file (it is neither
    replaced nor removed), nor one that cannot be read (a link, a FIFO: left for a hand to look at), nor the claim of
    a run whose supervisor holds its lock now (`_running`: its syncs would be refused while it trains); a run on a
    disk this machine does not see cannot be told alive: TAKING_OVER says what taking its remote means."""
    where = store.show(REMOTE_OWNER)
    try:
        owner = read(store)
    except ForeignClaim as e:
        return TakeOver(refused=f"run.remote {store.url}: {e}: {CONSENT} never replaces nor removes another user's "
                                f"file; have its owner remove it, or give run.remote a directory of this run's own")
    except NotARecord as e:
        return TakeOver(takes=str(e), replaces=True)
    except ValueError as e:
        return TakeOver(refused=f"run.remote {store.url}: {e}: {CONSENT} replaces only a regular file of this "
                                f"user's; remove it by hand if the remote is this run's")
    if owner is None:
        steps = remote_steps(store)
        return TakeOver(takes=f"it held checkpoints ({steps[-1]} the newest) and no {REMOTE_OWNER}" if steps else "")
    if run_owner.is_run(owner, claim.run_dir):
        return TakeOver()
    if running := _running(owner):
        return TakeOver(refused=f"run.remote {store.url} belongs to {run_owner.describe(owner)}, whose supervisor "
                                f"is running now ({running}): {CONSENT} does not take the remote of a live run (its "
                                f"syncs would be refused while it trains); stop it first (`minilmd stop "
                                f"{printable(owner['run_dir'])}`), or give run.remote a directory of this run's own")
    return TakeOver(takes=f"{where} named {run_owner.describe(owner)}", replaces=True)


def _running(owner: dict) -> str:
    """The supervisor holding the lock of the run directory a claim names, as a machine that sees that directory
    finds it (daemon/host/lock.py lock_holder: a probe that creates nothing); "" when none is seen."""
    from minilmd.daemon.host.lock import lock_holder

    try:
        holder = lock_holder(owner["run_dir"])
    except OSError:
        return ""
    return holder.describe() if holder else ""


def take_over(store: RemoteStore, claim: Claim) -> str:
    """`run --claim-remote`: the remote made this run's, its claim written whole (this user's owner.json replaced
    by RemoteStore.replace_own, in one rename; where there is none, made new as a first sync's): what the claim
    said before ("" when there was nothing to take). ClaimRefused when take_over_plan refuses, or the file changed
    meanwhile (another user's put there, another run's claim made first): nothing of another user's is changed."""
    plan = take_over_plan(store, claim)
    if plan.refused:
        raise ClaimRefused(plan.refused)
    if not plan.takes:
        return ""
    try:
        if plan.replaces:
            store.replace_own(REMOTE_OWNER, encoded(claim, store))
        else:
            write_new(store, claim)
    except FileNotFoundError:
        write_new(store, claim)  # removed meanwhile: made new, never over another's
    except OSError as e:
        raise ClaimRefused(f"run.remote {store.url}: {store.show(REMOTE_OWNER)} was not rewritten: {e}") from None
    if why := problem(store, claim):
        raise ClaimRefused(why)
    return plan.takes


def take_over_at_launch(cfg, emit: Callable[..., None]) -> str:
    """`minilmd run --claim-remote`, once the run's lock is held: take_over in a bounded probe, said in the event
    `remote_claim`; why not ("" when done, or nothing to take), for the launch to exit 2 on."""
    def take(store: RemoteStore) -> tuple[str, str]:
        try:
            return "", take_over(store, claim_of(cfg))
        except ClaimRefused as e:
            return str(e), ""

    if not cfg.run.remote:
        return ""
    found = probe_remote(cfg, take)
    if found is None:
        return (f"run.remote {cfg.run.remote} did not answer in time (or cannot be opened): its claim is not known "
                f"to be rewritten, and the run does not start; start it again with {CONSENT} once the remote answers")
    refused, took = found
    if not refused:  # the root there now is this run's remote, whatever the run recorded of it (remote_root.py)
        from minilmd.daemon.jobs import remote_root

        try:
            remote_root.accept(cfg.run.remote.rstrip("/"), Path(cfg.run_dir))
        except OSError as e:
            return f"{CONSENT}: the run's record of run.remote's root was not rewritten ({e.strerror or e})"
    if took:
        emit("remote_claim", f"run.remote {cfg.run.remote} is this run's now ({CONSENT}): {took}; {TAKING_OVER}",
             remote=cfg.run.remote)
    return refused


def check_note(cfg) -> str:
    """What `run --check --claim-remote` says the launch will take over ("": nothing to take)."""
    plan = probe_remote(cfg, lambda store: take_over_plan(store, claim_of(cfg)))
    if plan is None or plan.refused or not plan.takes:
        return ""
    return f"{CONSENT}: the launch makes run.remote {cfg.run.remote} this run's: {plan.takes}; {TAKING_OVER}"


def check_problems(cfg, consent: bool = False, waits: list[str] | None = None) -> list[str]:
    """For `run --check` and the launch: a remote this run may not use (another run's, or unclaimed with checkpoints
    this run never synced), looked at in a bounded probe; a remote that does not answer now is the sync's to find.
    `consent` (`run --claim-remote`): only what the consent cannot take over (take_over_plan's refusal). A claim moved
    here from another remote (Refusal.moved) goes to `waits`, as the syncs wait for it (a restart of the run must not
    end it for good, exit 2, on a teammate's rename); a problem where no `waits` is given."""
    def look(store: RemoteStore) -> Refusal | None:
        if consent:
            refused = take_over_plan(store, claim_of(cfg)).refused
            return Refusal(refused) if refused else None
        return judge(store, claim_of(cfg))

    found = probe_remote(cfg, look)
    if found is None:
        return []
    if found.moved and waits is not None:
        waits.append(found.words)
        return []
    return [found.words]
