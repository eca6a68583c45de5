"""A run's remote belongs to that run alone: `<run.remote>/owner.json` (names.REMOTE_OWNER) names the run whose
syncs write there, in the shape of a scratch's owner.json (minilmd/run_owner.py). A remote is this run's when its
record names this run's run.dir (`run_owner.is_run`, the one rule a scratch's claim keeps too): a config copied with
another run.dir is another run, whatever its run.name (the same run.name kept by a copy once let the copy resume from
the first run's checkpoint and prune it: both pruned each other's when they ran at once).

A config copied for a second run whose run.remote was left as it was would otherwise resume from the first run's
checkpoint, sync its own steps there and prune the first run's with `sync.keep`. So:
- the first sync of a run writes the claim (RemoteStore.put_new: a local remote's made whole under a temporary name
  and renamed into place, never over a file there nor through a link; an object store's in one PUT), so a write that
  fails (a full share, EIO) leaves no half claim, and is a failed sync, retried (a full remote: the wait for room);
  the cut claim an older minilmd left is replaced (`_our_leftover`). It is made before the sync copies or removes
  anything, and every later
  sync reads it again first: a remote claimed by another run is refused (SyncError: nothing copied, nothing pruned),
  and the retention re-reads it right before it deletes anything. Such a refusal is final, as at the launch: two
  runs started together both passed the launch's check, and the loser, its syncs refused, trained on, then waited
  in `stopping` for ever; now it stops, `failed`, exit 2, its checkpoints kept (`Refusal.another_run`,
  daemon/jobs/sync_errors.py RemoteOfAnotherRun);
- `minilmd run --check` and the launch refuse such a remote (exit 2, daemon/preflight.py), naming both runs and the
  two ways on: another run.remote, or init.from naming that run's checkpoint to start from it;
- a remote without a claim that holds checkpoints (synced by an older minilmd) is adopted only by the run whose own
  records say it synced there (daemon/jobs/remotewait.py `records`: state.json's remote checkpoint, or a sync or
  fetch event naming this URL since the last `--fresh`); any other run is refused, told how to claim it by hand
  when those checkpoints are its own. An empty remote is claimed by the first run that syncs there.
The claim is per run, not per host: every node of a Slurm job, every restart on another machine and a move to a new
server where run.dir is the same path (a shared home) name the same run, and so does a run renamed in its run.dir. A
sync never rewrites it, so a run moved to another run.dir (another server, another path; renamed or not) is refused
by its own remote, as a copy is: `minilmd run --claim-remote`, the consent (remote_consent.py), rewrites it whole to
name this run (one rename: RemoteStore.replace_own), only where it is this user's own file and no live supervisor of
the run it names is seen, and says so in events.jsonl; the next sync then takes the root it finds as this run's
(daemon/jobs/remote_root.py accept: a share's directory replaced on purpose). A root moved away and replaced
since the run synced to it (a team directory's member: `mv remote remote.stolen; mkdir -m777 remote`) is said
to be replaced, its synced checkpoints gone from there, besides the refusal of his directory (`replaced`, by
remote_root.py's record of the root). Torch-free.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd import run_owner
from minilmd.daemon.jobs.remote_store import RemoteStore
from minilmd.names import REMOTE_OWNER
from minilmd.untrusted import Unreadable, loads, printable

if TYPE_CHECKING:
    from minilmd.daemon.jobs.remote_local import LocalRemote


class ClaimRefused(ValueError):
    """This run may not sync to (nor resume from) this remote: the message says why and what to do. `another_run`,
    when the remote is another run's (`Refusal.another_run`): the refusal in a line, final (the launch's exit 2)."""

    def __init__(self, message: str, another_run: str = ""):
        super().__init__(message)
        self.another_run = another_run


@dataclass(frozen=True)
class Refusal:
    """Why the run may not use the remote (`judge`): `words`, whole, with every way on; `another_run`, when the
    remote is another run's (its claim names another run.dir, or it holds checkpoints and no claim and this run's
    records say it never synced there), the same in a line. Such a refusal is final, as at the launch (exit 2): no
    wait ends it (removing that run's owner.json does not make its checkpoints this run's), only a run.remote of
    this run's own (`OWN_REMOTE`); a run that learns it while it trains stops (daemon/jobs/syncworker.py
    final_refusal). The others (another user's file, a record that cannot be read) are waited for: its owner may
    put them right."""

    words: str
    another_run: str = ""
    moved: bool = False
    """A claim moved here from another remote (_moved_here): no run's claim of this one, waited for at the launch
    too (`run --check` says it among its waits, remote_consent.check_problems), never the launch's exit 2."""


OWN_REMOTE = "set run.remote to a directory of this run's own"
"""The way on from a remote of another run, at the launch as at a run's end: the one that works whatever that run
does (its checkpoints stay its own; removing its owner.json makes none of them this run's)."""


def own_remote_advice(config: str, slurm: bool = False) -> str:
    """What to do once a run stopped on another run's remote (its checkpoints kept here): the way on, and that it
    goes on from them (staging resumes from scratch's newest, or run.dir's kept copy, and syncs it there); in a
    Slurm job, the job submitted again."""
    again = "submit the job again (sbatch)" if slurm else f"`minilmd run {config}` again"
    return f"{OWN_REMOTE}, then {again} (it resumes from that checkpoint and syncs it there)"


@dataclass(frozen=True)
class Claim:
    """The run that claims a remote, and how to learn whether an unclaimed remote's checkpoints are its own."""

    run_dir: Path
    run_name: str
    synced_before: Callable[[], str] = lambda: ""
    """Why this run's records say it synced to the remote before ("" when they do not): adopts an unclaimed one."""


class ForeignClaim(ValueError):
    """The remote's owner.json is another user's file: not this run's claim, never parsed (its text never shown)."""


class NotARecord(ValueError):
    """The remote's owner.json is this user's regular file but no owner record (not JSON, no run_dir)."""


def read(store: RemoteStore) -> dict | None:
    """The remote's owner record (None: none). ValueError when it is there but cannot be read (NotARecord: read,
    and no record); ForeignClaim, unread, when another user owns it (RemoteStore.cat_own: a group-shared remote's
    member could plant one to block this run's syncs for ever, or to put a terminal's escape codes in its
    messages)."""
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
        parsed = loads(raw, expect=None)
    except Unreadable as e:
        raise NotARecord(f"{where} is not valid JSON ({e.why})") from None
    try:
        return run_owner.checked(parsed, where)
    except ValueError as e:
        raise NotARecord(str(e)) from None


def problem(store: RemoteStore, claim: Claim) -> str | None:
    """Why the run may not use the remote (None: it holds this run's claim, or none and no checkpoint, or none and
    checkpoints this run's records say it synced), whole. Reads only."""
    refused = judge(store, claim)
    return refused.words if refused is not None else None


def judge(store: RemoteStore, claim: Claim) -> Refusal | None:
    """`problem`, with whether the remote is another run's (Refusal.another_run). Reads only."""
    try:
        owner = read(store)
    except ForeignClaim as e:
        return Refusal(f"run.remote {store.url}: {e}: the run neither syncs there nor resumes from there while it "
                       f"stands (a claim no sync of this user wrote); have its owner remove it, or give run.remote a "
                       f"directory of this run's own")
    except NotARecord as e:
        if not _our_leftover(store, claim):
            return Refusal(_no_record(store, e))
        owner = None  # the cut start of this run's own claim: no claim (ensure writes it whole)
    except ValueError as e:
        return Refusal(_no_record(store, e))
    if owner is not None:
        if run_owner.is_run(owner, claim.run_dir):
            return None
        if moved := _moved_here(store, owner):
            return Refusal(moved, moved=True)  # waited for: put back where it was written, it is no run's here
        return Refusal(_another_run(store, owner, claim),
                       f"run.remote {store.url} belongs to another run, {run_owner.describe(owner)}")
    steps = remote_steps(store)
    if not steps or claim.synced_before():
        return None
    return Refusal(_unclaimed(store, steps, claim),
                   f"run.remote {store.url} holds checkpoints this run never synced ({_shown(steps)}) and no "
                   f"{REMOTE_OWNER}: another run's, as far as this run's records tell")


def _no_record(store: RemoteStore, e: ValueError) -> str:
    consent = f"start it once with `minilmd run {CONSENT} CONFIG`, or " if isinstance(e, NotARecord) else ""
    return (f"run.remote {store.url}: {e}: whose checkpoints these are is unknown, so the run neither syncs "
            f"there nor resumes from there; if they are this run's, {consent}remove {store.show(REMOTE_OWNER)} "
            f"(the next sync claims the remote again)")


def _our_leftover(store: RemoteStore, claim: Claim) -> bool:
    """Whether the remote's owner.json, not a record, is what an interrupted write of this run's own claim left: this
    user's regular file (cat_own) holding less than the claim and nothing but its start (an empty file included),
    the claim an older minilmd wrote in place when the write failed (ENOSPC, EIO). It names no other run (another
    run's claim starts otherwise: its run_dir, its host), so ensure replaces it; anything else stays a refusal."""
    try:
        raw = store.cat_own(store.path(REMOTE_OWNER), run_owner.OWNER_MAX_BYTES)
    except (OSError, Unreadable):
        return False
    older = run_owner.encode(run_owner.record(claim.run_dir, claim.run_name))  # no RUN_REMOTE yet: what they wrote
    return any(len(raw) < len(whole) and whole.startswith(raw) for whole in (older, encoded(claim, store)))


def ensure(store: RemoteStore, claim: Claim) -> bool:
    """Make the remote this run's before a sync writes there (its root made): ClaimRefused when `problem` says
    why not; the claim written when there is none (or only the cut start of this run's own: `_our_leftover`,
    replaced whole). True when it was written now. A write that fails raises its OSError: a failed sync, retried
    (a full remote: the wait for room, remote_room.py), never a claim half made."""
    if refused := judge(store, claim):
        raise ClaimRefused(refused.words, refused.another_run)
    try:
        if read(store) is not None:
            return False
    except NotARecord:  # this run's cut claim (problem said so): replaced in one rename, only this user's file
        try:
            store.replace_own(REMOTE_OWNER, encoded(claim, store))
        except FileNotFoundError:
            write_new(store, claim)  # removed meanwhile: made new, never over another's
    else:
        write_new(store, claim)
    if refused := judge(store, claim):  # another run's sync made its claim first
        raise ClaimRefused(refused.words, refused.another_run)
    return True


def write_new(store: RemoteStore, claim: Claim) -> None:
    """The claim made where there is none, whole or not at all (RemoteStore.put_new: a temporary renamed into place,
    never over a file that stands there); one made meanwhile by another run's sync is left, for `problem` to judge.
    Any other failure (ENOSPC, EIO) raises as it is."""
    try:
        store.put_new(REMOTE_OWNER, encoded(claim, store))
    except FileExistsError:
        pass


def encoded(claim: Claim, store: RemoteStore) -> bytes:
    """The claim as owner.json holds it (and the temporary it is written under): the run, and the remote it was
    written for (`run_remote`: written_for), sorted after run_dir and run_name, so that the cut start of an older
    minilmd's claim, which lacks it, still reads as this run's (`_our_leftover`)."""
    return run_owner.encode({**run_owner.record(claim.run_dir, claim.run_name), RUN_REMOTE: written_for(store)})


RUN_REMOTE = "run_remote"
"""The claim's field naming the remote it was written for. In a team directory a member may rename the entries of
another's (group-writable, not sticky): one user's two runs' remotes side by side, `mv r1/owner.json r2/owner.json`
made run 2's claim run 1's, and run 2 stopped for good, as on a remote that another run syncs to (hostile audit,
stop 65, F1). A claim written for another remote is one moved here: waited for, said as what it is (`_moved_here`)."""


def written_for(store: RemoteStore) -> str:
    """The remote a claim is written for: a local one's absolute path, links resolved (as a run's run_dir: a link's
    name and its target are one remote); a URL as it is."""
    from minilmd.daemon.jobs.remote_local import LocalRemote

    return run_owner.run_identity(Path(store.root)) if isinstance(store, LocalRemote) else store.url


def _moved_here(store: RemoteStore, owner: dict) -> str:
    """Why the claim of another run that `store` holds is none of this remote's, where it was written for another
    remote (RUN_REMOTE): moved here. "" where it names this remote, or none (an older minilmd's claim: the claim of a
    run that syncs here, as before). A local remote's other name is judged by what stands there: only another
    directory is another remote; the same one by another name (a bind mount), or a path not there on this host
    (another host's mount point of the share), may be this very remote, and its claim stays another run's."""
    was = owner.get(RUN_REMOTE)
    if not isinstance(was, str) or was == written_for(store):
        return ""
    from minilmd.daemon.jobs.remote_local import LocalRemote

    if isinstance(store, LocalRemote) and _identity_at(was) in (None, store.root_identity()):
        return ""
    there = printable(was)
    return (f"{store.show(REMOTE_OWNER)} is the claim of {run_owner.describe(owner)} on another remote, {there}, "
            f"not on {store.url}: moved here (renamed by someone who may write both directories?), so no run's "
            f"claim of this remote. The run neither syncs here nor resumes from here while it stands: move it back "
            f"to {there}/{REMOTE_OWNER} (that run's own), or remove it; this run's next sync then claims "
            f"{store.url} again where its records say it synced there")


def _identity_at(path: str) -> tuple[int, int] | None:
    """(device, inode) of the directory at `path` (a claim's RUN_REMOTE, this user's own file's word), for words and
    this comparison only: None when nothing is there, or not a directory, or it cannot be looked at."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def still_ours(store: RemoteStore, claim: Claim) -> str | None:
    """Right before retention deletes anything: None when the remote still names this run; else why nothing is
    deleted (its claim gone, another's, or unreadable): a checkpoint this run did not write is never pruned."""
    try:
        owner = read(store)
    except ValueError as e:
        return str(e)
    if owner is None:
        return f"{store.show(REMOTE_OWNER)} is gone"
    return None if run_owner.is_run(owner, claim.run_dir) else f"it names {run_owner.describe(owner)}"


# --- the root this run claimed: a local remote replaced under it (hostile audit 10 F4) ------------------------------

def replaced(store: LocalRemote) -> str:
    """Why the root at run.remote's path is not the directory this run synced into: not the root remote_root.py
    recorded (in the run's run.dir: the claim on the remote went with the directory), by its rule (`replaced_words`);
    "" when it is the same, or nothing was recorded, or nothing is there. Said beside a place-rule refusal, which comes
    before remote_root's own judgement of an opened root: a group member of a team directory above the remote can
    `mv remote remote.stolen; mkdir -m777 remote`, and the refusal of his directory named him alone, not that the
    run's synced checkpoints were gone from run.remote (hostile audit 10 F4)."""
    from minilmd.daemon.jobs import remote_root

    if not (was := remote_root.replaced_words(store.url, store.made, store.root_identity_now())):
        return ""
    return (f"run.remote {store.root} was replaced since this run claimed it ({was}): the checkpoints synced before "
            f"are no longer there (moved away or removed by whoever can write the directory above it: look beside "
            f"it)")


def remote_steps(store: RemoteStore) -> list[str]:
    try:
        return store.steps().ours
    except FileNotFoundError:
        return []  # the remote is not made yet


def _another_run(store: RemoteStore, owner: dict, claim: Claim) -> str:
    same_name = "; the same run.name, but a run is its run.dir" if owner.get("run_name") == claim.run_name else ""
    # never "remove owner.json": the remote holds that run's checkpoints, which this run's next sync would then find
    # unclaimed and refuse all the same (its records never say it synced there); --claim-remote is the moved run's way
    return (f"run.remote {store.url} belongs to another run: {run_owner.describe(owner)}, not this one "
            f"({run_owner.run_identity(claim.run_dir)}, run.name {claim.run_name!r}{same_name}). Two runs never "
            f"share a remote (this one would resume from that run's checkpoint, and its syncs would prune that run's "
            f"checkpoints): {OWN_REMOTE}; to start from that run's checkpoint, name it in init.from (init.from = "
            f"{store.url!r} takes its newest, or one of its step-NNNNNNNN directories); if that run is this one in "
            f"another run.dir (moved to another server or path, renamed or not), start it once with `minilmd run "
            f"{CONSENT} CONFIG` ({TAKING_OVER})")


def _shown(steps: list[str]) -> str:
    """The remote's newest steps, for a refusal: three at most, and how many older."""
    return ", ".join(steps[-3:]) + (f" and {len(steps) - 3} older" if len(steps) > 3 else "")


def _unclaimed(store: RemoteStore, steps: list[str], claim: Claim) -> str:
    record = run_owner.record(claim.run_dir, claim.run_name)
    return (f"run.remote {store.url} holds checkpoints ({_shown(steps)}) and no {REMOTE_OWNER} (synced by an older "
            f"minilmd, or its claim removed), and this run's records (state.json, events.jsonl) do not say it synced "
            f"there: they may be another run's, which this one would resume from and prune. Set run.remote to a "
            f"directory of this run's own, or name one of them in init.from to start from it; if they are this "
            f"run's, start it once with `minilmd run {CONSENT} CONFIG` (this run then continues from them and "
            f"prunes them by sync.keep), or claim the remote by writing {store.show(REMOTE_OWNER)} holding "
            f"{{\"run_dir\": \"{record['run_dir']}\", \"run_name\": \"{claim.run_name}\"}}")


def root_words_now(cfg, fresh: bool = False, key: object = None) -> tuple[bool, str]:
    """(answered, words) of a bounded look at the root of the run's local run.remote: what its next sync would
    refuse it for now (remote_root.check_words: gone, replaced; "" when nothing). The one look `run --check`
    (daemon/preflight.py remote_root_wait) and staging's wait for the corpus share (daemon/jobs/stagingfetch.py
    look_at_remote) take; `fresh`: `run --fresh`, whose new lineage never synced there. (False, "") when the look
    did not answer within its bound (a stalled mount), or an earlier look under `key` has not (bounded_probe)."""
    from minilmd.bounded import bounded_probe
    from minilmd.daemon.jobs import remote_made, remote_root

    made = remote_made.Made(remote_made.run_record(Path(cfg.run_dir)))  # read only: no older record adopted here
    asked = (lambda: "") if fresh else synced_before(cfg)
    answered, words, _ = bounded_probe(remote_root.check_words, cfg.run.remote.rstrip("/"), made, asked, key=key)
    return answered, (words or "") if answered else ""


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


def probe_remote(cfg, look: Callable[[RemoteStore], object]):
    """look(run.remote's store) in a bounded probe; None when there is no remote or run.dir, when the remote cannot
    be opened (the sync says why) or does not answer now."""
    if not cfg.run.remote or not cfg.run.dir:
        return None
    from minilmd.daemon.jobs.remote_local import open_remote  # numpy, through the checkpoint: only with a remote
    from minilmd.probes import bounded_probe

    def opened():
        try:
            store = open_remote(cfg.run.remote)
        except (ValueError, ImportError):
            return None
        try:
            return look(store)
        finally:
            store.close()

    answered, found, _ = bounded_probe(opened)
    return found if answered else None


# --- `minilmd run --claim-remote`: the user's consent to make a remote this run's -----------------------------------

CONSENT = "--claim-remote"
TAKING_OVER = ("it rewrites the claim to name this run: this run then continues from the remote's newest "
               "checkpoint and prunes the others by sync.keep, and the run the claim named has its syncs there "
               "refused from then on (nothing copied, nothing pruned; a supervisor of it still running stops, exit "
               "2): only for that run in its new run.dir, running nowhere else")
"""What taking a remote over means, for the refusal, `run --check`, the event and the help alike."""
