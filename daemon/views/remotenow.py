"""What `minilmd status` says of the remote checkpoint state.json records, once no supervisor keeps that record
(fault10 F5: a finished run showed `remote: step 4000 (verified)` after the remote had lost that step).

For a local run.remote (a path, file://, local://) status looks at the remote's LATEST as the sync reads it (from the
root's descriptor, no link followed below it: daemon/jobs/remote_write.py parent_dir; a small regular file read as
untrusted, minilmd/untrusted.py) and whether the recorded step's directory is there, in a bounded thread
(daemon/views/pathlooks.py: a share that stalls leaves the record as it was, and a note says it stalled). That is what a
launch judges a finished run by (daemon/jobs/rundone.py: LATEST naming its last step), so a LATEST that names an
older step, or none, is repaired by `minilmd run`. But only in the run's own directory: the root is judged first by
the rule the sync judges it by (daemon/jobs/remote_root.py `replaced_words`, against the root the run recorded in its
run.dir), or, with no record to go by, by its owner (the run's user, root or yours), and LATEST is read as a file of
the run's user (or of the owner of the very root recorded: a squashing share's); where either fails, status says
`run.remote is not this run's directory now (...)`, which `minilmd run` refuses too (hostile audit 11 F3: a
teammate's directory put at run.remote's path was vouched for, `LATEST names it now`, and before he wrote a LATEST,
`minilmd run` was said to repair it). A store behind a URL, a run of another host (its paths are that host's) or a
look that does not answer: the record is said as what it was when it was made ("verified when synced"). Torch-free,
light imports: the LocalRemote class itself would load numpy (minilmd/checkpoint.py).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from minilmd.bounded import SHARED_STORAGE_PROBE_S
from minilmd.daemon.base.runstate import fmt_time, names_remote
from minilmd.daemon.base.seen import supervisor_seen
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.pathlooks import Looks
from minilmd.fmt import fmt_duration
from minilmd.names import LATEST, POINTER_MAX_BYTES, is_step_name, step_name, step_of
from minilmd.perms import own_uid, owned_by_me_or_root, user_words
from minilmd.run_states import remote_unanswered
from minilmd.untrusted import Unreadable, printable, read_bytes
from minilmd.urls import local_remote_root


@dataclass(frozen=True)
class RemoteNow:
    """What a look at a local run.remote found now."""

    latest: str | None
    """The name its LATEST holds (stripped, at most POINTER_MAX_BYTES); None when there is none (or it is no
    regular file)."""
    recorded_there: bool
    """Whether the recorded step's directory is there (a real directory, no link)."""
    root_gone: bool = False
    """The root itself is not there (a share not mounted, removed)."""
    not_ours: str = ""
    """Why the directory at run.remote's path is not this run's (another directory than the one it recorded, another
    user's, a LATEST of another user's); "" when it is, as far as can be told."""


def look(root: str, recorded: str, url: str = "", run_dir: str = "") -> RemoteNow:
    """LATEST and the recorded step's directory at the local remote `root`, through its descriptor (remote_write's
    walk, the sync's reads), once the root is found the run's (`_not_ours`; `url`: the config's run.remote, `run_dir`:
    the run's directory, whose record of the root is read). Raises OSError when the root cannot be read (then
    nothing is said)."""
    from minilmd.daemon.jobs.remote_write import parent_dir

    try:
        with parent_dir(root, (LATEST,), lambda *names: "/".join([root, *names])) as at:
            not_ours, owners = _not_ours(url, run_dir, at)
            if not_ours:
                return RemoteNow(None, False, not_ours=not_ours)
            try:
                latest = read_bytes(LATEST, max_bytes=POINTER_MAX_BYTES, owner=owners, dir_fd=at.fd).decode(
                    "utf-8", "replace")
            except Unreadable as e:
                if e.os_error is not None:
                    raise e.os_error from None
                if e.kind == "owner" and (st := at.lstat(LATEST)) is not None:
                    return RemoteNow(None, False, not_ours=f"its {LATEST} belongs to {user_words(st.st_uid)}")
                latest = None
            try:
                there = stat.S_ISDIR(os.stat(recorded, dir_fd=at.fd, follow_symlinks=False).st_mode)
            except FileNotFoundError:
                there = False
    except FileNotFoundError:
        return RemoteNow(None, False, root_gone=True)
    return RemoteNow((latest or "").strip() or None, there)


def _not_ours(url: str, run_dir: str, at) -> tuple[str, tuple[int, ...]]:
    """(why the root opened as `at` is not this run's directory, or ""; whose its LATEST may be): by remote_root's rule
    against the root the run recorded (replaced_words: a share mounted again is the same root); with no record (an
    older run's, or another user's run, whose record only she reads), by its owner: the run's user, root or yours,
    as `minilmd run` takes no other user's root. The owner of the very root recorded is the run's too (a squashing
    share gives the run's files its anonymous user)."""
    from pathlib import Path

    from minilmd.daemon.base.runstate import state_owners
    from minilmd.daemon.jobs import remote_made, remote_root

    owners = state_owners(run_dir) if run_dir else (own_uid(),)
    st = os.fstat(at.fd)
    if run_dir and url:
        made = remote_made.Made(remote_made.run_record(Path(run_dir)))
        if was := remote_root.replaced_words(url, made, at.identity):
            return f"the directory there is not the one it synced to: it {was}", owners
        found = remote_root.recorded(url, made)
        if found is not None and not found.accept:
            return "", (*owners, st.st_uid)
    if not owned_by_me_or_root(st, also=owners):
        return f"{printable(str(at.path))} belongs to {user_words(st.st_uid)}", owners
    return "", owners


def look_now(state: StateJson, remote: str | None, alive: bool, looks: Looks | None = None) -> RemoteNow | None:
    """The look at run.remote (`remote`: the run's config's) for a run no supervisor runs for, whose record names a
    checkpoint on it; None where nothing is looked at (a supervisor alive keeps the record, a URL, another host's
    run, no record of this remote) or the look did not answer in time (said through `looks`: pathlooks.py)."""
    synced = state.remote_checkpoint
    root = local_remote_root(remote)
    if alive or synced is None or synced.step is None or root is None or not names_remote(synced.path, remote):
        return None
    if supervisor_seen(state).elsewhere:  # not checkable from here (daemon/base/seen.py)
        return None
    return (looks or Looks()).look("run.remote", root, look, root, step_name(synced.step), (remote or "").rstrip("/"),
                                   state.run_dir, default=None, timeout_s=SHARED_STORAGE_PROBE_S)


def remote_words(state: StateJson, t: float, alive: bool, now: RemoteNow | None) -> str:
    """The remote checkpoint as status's checkpoints line says it, after "remote: "."""
    synced = state.remote_checkpoint
    if not synced or not synced.time:
        return "none"
    checked = "verified" if synced.verified else "NOT verified"
    ago = f"{fmt_duration(t - synced.time)} ago"
    if alive:  # the supervisor's record; what it knows of the remote now, when it does not answer
        sync = state.sync
        if remote_unanswered(sync.state, sync.error):
            since = f" since {fmt_time(sync.since)}" if sync.since else ""
            return f"step {synced.step} ({checked} {ago}; run.remote does not answer now{since})"
        return f"step {synced.step} ({ago}, {checked})"
    if now is None:  # not looked at: the record, as of when it was made
        return f"step {synced.step} ({ago}, {checked} when synced)"
    said = f"step {synced.step} {checked} at {fmt_time(synced.time)}; "
    recorded = step_name(synced.step) if synced.step is not None else ""
    if now.root_gone:
        return said + "run.remote is not there now (a share not mounted? removed?)"
    if now.not_ours:  # `minilmd run` refuses it too: nothing there to repair, nor to vouch for
        return said + f"run.remote is not this run's directory now ({now.not_ours})"
    if now.latest is None:
        return said + "the remote holds no LATEST now: `minilmd run` repairs it"
    if not is_step_name(now.latest):
        return said + f"the remote's LATEST now names no checkpoint ({printable(now.latest)[:40]!r}): `minilmd run` " \
                      f"repairs it"
    if now.latest != recorded:
        newer = synced.step is not None and step_of(now.latest) > synced.step
        return said + f"the remote's LATEST now names step {step_of(now.latest)}" + (
            ", newer than this record" if newer else ": `minilmd run` repairs it")
    if not now.recorded_there:
        return said + (f"its directory {recorded} is gone from the remote now, though LATEST names it: "
                       f"`minilmd run` repairs it")
    return f"step {synced.step} ({ago}, {checked}; LATEST names it now)"
