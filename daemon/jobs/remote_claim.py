"""A run's remote belongs to that run alone: `<run.remote>/owner.json` (names.REMOTE_OWNER) names the run whose
syncs write there, in the shape of a scratch's owner.json (minilmd/run_owner.py). A remote is this run's when its
record names this run's run.dir or its run.name (`is_this_run`: a run moved to a new server keeps its run.name and
run.remote, its run.dir may differ), so a config copied with a new run.name and run.dir is another run.

A config copied for a second run whose run.remote was left as it was would otherwise resume from the first run's
checkpoint, sync its own steps there and prune the first run's with `sync.keep`. So:
- the first sync of a run writes the claim (through the RemoteStore Protocol: a local remote's file made new, never
  through a link, O_EXCL; an object store's written once), before it copies or removes anything, and every later
  sync reads it again first: a remote claimed by another run is refused (SyncError: nothing copied, nothing pruned),
  and the retention re-reads it right before it deletes anything;
- `minilmd run --check` and the launch refuse such a remote (exit 2, daemon/preflight.py), naming both runs and the
  two ways on: another run.remote, or init.from naming that run's checkpoint to start from it;
- a remote without a claim that holds checkpoints (synced by an older minilmd) is adopted only by the run whose own
  records say it synced there (daemon/jobs/remotewait.py `records`: state.json's remote checkpoint, or a sync or
  fetch event naming this URL since the last `--fresh`); any other run is refused, told how to claim it by hand
  when those checkpoints are its own. An empty remote is claimed by the first run that syncs there.
The claim is per run, not per host: every node of a Slurm job, every restart on another machine and a move to a new
server name the same run. Torch-free.
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minilmd import run_owner
from minilmd.daemon.jobs.remote_store import RemoteStore
from minilmd.names import REMOTE_OWNER
from minilmd.untrusted import Unreadable, loads


class ClaimRefused(ValueError):
    """This run may not sync to (nor resume from) this remote: the message says why and what to do."""


@dataclass(frozen=True)
class Claim:
    """The run that claims a remote, and how to learn whether an unclaimed remote's checkpoints are its own."""

    run_dir: Path
    run_name: str
    synced_before: Callable[[], str] = lambda: ""
    """Why this run's records say it synced to the remote before ("" when they do not): adopts an unclaimed one."""


class ForeignClaim(ValueError):
    """The remote's owner.json is another user's file: not this run's claim, never parsed (its text never shown)."""


def read(store: RemoteStore) -> dict | None:
    """The remote's owner record (None: none). ValueError when it is there but cannot be read or is no record;
    ForeignClaim, unread, when another user owns it (RemoteStore.cat_own: a group-shared remote's member could plant
    one to block this run's syncs for ever, or to put a terminal's escape codes in its messages)."""
    where = store.show(REMOTE_OWNER)
    try:
        raw = store.cat_own(store.path(REMOTE_OWNER), run_owner.OWNER_MAX_BYTES)
    except FileNotFoundError:
        return None
    except Unreadable as e:
        if e.kind == "owner":
            raise ForeignClaim(f"{where} is another user's file ({e.why}), not this run's claim; it was not "
                               f"read") from None
        raise ValueError(f"{where} cannot be read ({e.why})") from None
    try:
        return run_owner.checked(loads(raw, expect=None), where)
    except Unreadable as e:
        raise ValueError(f"{where} is not valid JSON ({e.why})") from None


def problem(store: RemoteStore, claim: Claim) -> str | None:
    """Why the run may not use the remote (None: it holds this run's claim, or none and no checkpoint, or none and
    checkpoints this run's records say it synced). Reads only."""
    try:
        owner = read(store)
    except ForeignClaim as e:
        return (f"run.remote {store.url}: {e}: the run neither syncs there nor resumes from there while it stands "
                f"(a claim no sync of this user wrote); have its owner remove it, or give run.remote a directory "
                f"of this run's own")
    except ValueError as e:
        return (f"run.remote {store.url}: {e}: whose checkpoints these are is unknown, so the run neither syncs "
                f"there nor resumes from there; if they are this run's, remove {store.show(REMOTE_OWNER)} (the next "
                f"sync claims the remote again)")
    if owner is not None:
        return None if is_this_run(owner, claim) else _another_run(store, owner, claim)
    steps = _steps(store)
    if not steps or claim.synced_before():
        return None
    return _unclaimed(store, steps, claim)


def ensure(store: RemoteStore, claim: Claim) -> bool:
    """Make the remote this run's before a sync writes there (its root made): ClaimRefused when `problem` says
    why not; the claim written when there is none. True when it was written now."""
    if why := problem(store, claim):
        raise ClaimRefused(why)
    if read(store) is not None:
        return False
    with tempfile.TemporaryDirectory(prefix="minilmd-claim-") as tmp:
        local = Path(tmp) / REMOTE_OWNER
        local.write_bytes(run_owner.encode(run_owner.record(claim.run_dir, claim.run_name)))
        try:
            store.put(local, REMOTE_OWNER)  # a local remote's: made new (O_EXCL), never a file already there
        except OSError:
            if read(store) is None:
                raise
    if why := problem(store, claim):  # another run's sync made its claim first
        raise ClaimRefused(why)
    return True


def still_ours(store: RemoteStore, claim: Claim) -> str | None:
    """Right before retention deletes anything: None when the remote still names this run; else why nothing is
    deleted (its claim gone, another's, or unreadable): a checkpoint this run did not write is never pruned."""
    try:
        owner = read(store)
    except ValueError as e:
        return str(e)
    if owner is None:
        return f"{store.show(REMOTE_OWNER)} is gone"
    return None if is_this_run(owner, claim) else f"it names {run_owner.describe(owner)}"


def is_this_run(owner: dict, claim: Claim) -> bool:
    """Whether a remote's owner record names the claiming run: its run.dir (a run renamed keeps its run.dir), or its
    run.name (a run moved to a new server keeps its run.name and run.remote, while its run.dir, a local path, may
    differ: docs/operations.md). A copy of a config with another run.name and another run.dir is another run.
    Looser than scratch's rule (run.dir alone), since a remote outlives the server a run started on."""
    return run_owner.is_run(owner, claim.run_dir) or owner.get("run_name") == claim.run_name


def _steps(store: RemoteStore) -> list[str]:
    try:
        return store.steps().ours
    except FileNotFoundError:
        return []  # the remote is not made yet


def _another_run(store: RemoteStore, owner: dict, claim: Claim) -> str:
    return (f"run.remote {store.url} belongs to another run: {run_owner.describe(owner)}, not this one "
            f"({run_owner.run_identity(claim.run_dir)}, run.name {claim.run_name!r}). Two runs never share a remote "
            f"(this one would resume from that run's checkpoint, and its syncs would prune that run's checkpoints): "
            f"set run.remote to a directory of this run's own; to start from that run's checkpoint, name it in "
            f"init.from (init.from = {store.url!r} takes its newest, or one of its step-NNNNNNNN directories); if "
            f"that run is this one under a new run.name and run.dir (renamed and moved, in either order), "
            f"remove {store.show(REMOTE_OWNER)} (this run's next sync claims the remote)")


def _unclaimed(store: RemoteStore, steps: list[str], claim: Claim) -> str:
    shown = ", ".join(steps[-3:]) + (f" and {len(steps) - 3} older" if len(steps) > 3 else "")
    record = run_owner.record(claim.run_dir, claim.run_name)
    return (f"run.remote {store.url} holds checkpoints ({shown}) and no {REMOTE_OWNER} (synced by an older minilmd), "
            f"and this run's records (state.json, events.jsonl) do not say it synced there: they may be another "
            f"run's, which this one would resume from and prune. Set run.remote to a directory of this run's own, or "
            f"name one of them in init.from to start from it; if they are this run's, claim the remote by writing "
            f"{store.show(REMOTE_OWNER)} holding {{\"run_dir\": \"{record['run_dir']}\", \"run_name\": "
            f"\"{claim.run_name}\"}}")


def synced_before(cfg) -> Callable[[], str]:
    """Claim.synced_before for the run of `cfg`: why its records (remotewait.records) say it synced to run.remote,
    read when asked (the supervisor's state.json as it is then)."""
    def ask() -> str:
        from minilmd.daemon.base.runstate import load_state
        from minilmd.daemon.base.statesections import StateJson
        from minilmd.daemon.jobs.remotewait import SYNCED, records

        try:
            old = load_state(cfg.run_dir)
        except Unreadable:
            old = {}
        found = records(cfg.run.remote, cfg.run_dir, StateJson.from_dict(old).remote_checkpoint)
        return found.why if found.verdict == SYNCED else ""
    return ask


def claim_of(cfg) -> Claim:
    return Claim(Path(cfg.run_dir), cfg.run.name, synced_before(cfg))


def check_problems(cfg) -> list[str]:
    """For `run --check` and the launch: a remote this run may not use (another run's, or unclaimed with checkpoints
    this run never synced), looked at in a bounded probe; a remote that does not answer now is the sync's to find."""
    if not cfg.run.remote or not cfg.run.dir:
        return []
    from minilmd.daemon.jobs.remote_local import open_remote  # numpy, through the checkpoint: only with a remote
    from minilmd.probes import bounded_probe

    def look() -> str | None:
        try:
            store = open_remote(cfg.run.remote)
        except (ValueError, ImportError):
            return None  # the sync says why it cannot open it
        try:
            return problem(store, claim_of(cfg))
        finally:
            store.close()

    answered, found, _ = bounded_probe(look)
    return [found] if answered and found else []


