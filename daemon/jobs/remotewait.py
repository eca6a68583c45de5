"""A start with no checkpoint in scratch and a remote that does not answer: wait for the remote, or start from
step 0. daemon/jobs/stagingworker.py decides with it after its fetch found nothing; `minilmd run --check` says which
it will be.

A remote that is not there now (its share gone, a link to nowhere), an empty directory (a mount point whose share is
not mounted reads as its empty stub) or one that cannot be listed lists no checkpoint, like a remote never written.
Taken at its word after a reboot that emptied scratch, the run would train again from step 0 (a fine-tune from its
init.from) and its new lineage would later be synced over the old one. So the run's own records are asked first:
state.json's remote checkpoint, and the steps events.jsonl says were synced to the remote or fetched from it. A run
that has synced before waits (staging `waiting_remote`, retried with backoff, for as long as it takes) and resumes
from the remote's newest checkpoint once the remote answers; a run that never synced has nothing there to lose and
starts from step 0; `minilmd run --fresh` starts from step 0 whatever the records say. Torch-free.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from minilmd import names
from minilmd.shared_place import Place, look

EVENTS_MAX_LINE = 1 << 16
"""A line of events.jsonl longer than this is no sync record (one is a few hundred bytes): not parsed."""


def remote_absent(url: str) -> str:
    """How the remote cannot be reached now, in a few words ("not there (its share gone?)", "a link to nowhere (->
    /nfs/x: ...)", "an empty directory (...)", "unreadable (...)", "not a directory (...)"); "" when it answers
    (holding checkpoints or not). minilmd/shared_place.py decides, as for every other shared place."""
    import fsspec  # light; the remote may be any fsspec URL

    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ValueError, ImportError, OSError) as e:
        return f"cannot be opened ({e})"
    found = look(root.rstrip("/") or "/", names.LATEST, fs)
    return "" if found.place in (Place.THERE, Place.LACKS) else str(found)


def synced_before(run_dir: Path, remote_step: int | None) -> str:
    """Why this run's remote must hold a checkpoint, in words ("" when nothing says so): the remote step state.json
    records (`remote_step`, adopted from the previous supervisor's), else the newest step events.jsonl says was
    synced to the remote or fetched from it."""
    if remote_step is not None:
        return f"{names.STATE} records step {remote_step} on the remote"
    step = _newest_synced_step(run_dir / names.EVENTS)
    return f"{names.EVENTS} records step {step} synced to or fetched from the remote" if step is not None else ""


def _newest_synced_step(events: Path) -> int | None:
    """The newest step of a "sync" (synced step N) or "fetch" (fetched step N) event; None when there is none or
    the file cannot be read. The run's own file, read once per decision, line by line."""
    newest = None
    try:
        fd = os.open(events, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        for line in f:
            if len(line) > EVENTS_MAX_LINE or b'"step"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            step = record.get("step")
            if record.get("event") in ("sync", "fetch") and isinstance(step, int) and not isinstance(step, bool):
                newest = step if newest is None else max(newest, step)
    return newest


def decision(url: str, run_dir: Path, remote_step: int | None, absent: str, fresh: bool) -> tuple[bool, str]:
    """(wait, why) for a start whose scratch holds no checkpoint and whose remote `url` lists none: wait when the
    remote is `absent` (remote_absent's words) and the run synced before, unless `fresh`; else start from step 0."""
    if not absent:
        return False, f"neither scratch nor {url} holds a checkpoint"
    sign = synced_before(run_dir, remote_step)
    if fresh:
        return False, f"{url} is {absent}, and `--fresh` was given" + (f" ({sign})" if sign else "")
    if sign:
        return True, f"{url} is {absent}, and this run has synced to it before ({sign})"
    return False, f"{url} is {absent}, and this run has never synced to it"


def check_line(cfg, fresh: bool) -> str:
    """What `run --check` says of a start with no checkpoint in scratch whose remote cannot be reached now: that it
    waits for the remote, or that it starts from step 0 (`decision`); "" when scratch holds a checkpoint, there is
    no remote, or the remote answers (the run resumes from its newest checkpoint, or it has none). A remote that
    cannot be listed (EACCES, EIO) or does not answer fails the fetch itself: waited for, unless `fresh`."""
    from minilmd.daemon.jobs.syncworker import local_checkpoint_steps
    from minilmd.daemon.runstate import read_state
    from minilmd.daemon.statesections import StateJson
    from minilmd.probes import bounded_probe

    url = cfg.run.remote
    if not url or local_checkpoint_steps(cfg.checkpoint_dir):
        return ""
    answered, absent, failed = bounded_probe(remote_absent, url)
    absent = absent if answered else failed
    if not absent:
        return ""
    remote = StateJson.from_dict(read_state(cfg.run_dir) or {}).remote_checkpoint
    if not answered or absent.startswith("unreadable"):
        wait, why = not fresh, f"{url} is {absent}" + (", and `--fresh` was given" if fresh else "")
    else:
        wait, why = decision(url, cfg.run_dir, remote.step if remote is not None else None, absent, fresh)
    if wait:
        return (f"waits: run.remote: {why}; scratch holds no checkpoint, so the run waits for the remote (`minilmd "
                f"status`: staging waiting_remote, retried with backoff) and resumes from its newest checkpoint; "
                f"`minilmd run --fresh` starts from step 0 instead")
    return f"starts from step 0: run.remote: {why}; scratch holds no checkpoint"
