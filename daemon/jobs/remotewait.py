"""A start with no checkpoint in scratch and a remote that does not answer: wait for the remote, or start from
step 0. daemon/jobs/stagingworker.py decides with it after its fetch found nothing; `minilmd run --check` says which
it will be.

A remote that is not there now (its share gone, a link to nowhere), an empty directory (a mount point whose share is
not mounted reads as its empty stub) or one that cannot be listed lists no checkpoint, like a remote never written.
Taken at its word after a reboot that emptied scratch, the run would train again from step 0 (a fine-tune from its
init.from) and its new lineage would later be synced over the old one. So the run's own records are asked first:
the newer of state.json's remote checkpoint and the steps events.jsonl says were synced to the remote or fetched
from it, each counted only when it names the current run.remote (a run pointed at a new place has not synced there),
and in events.jsonl only after the last `--fresh` start (what came before is a lineage given up). A run that has synced
before waits (staging `waiting_remote`, retried with backoff, for as long as it takes) and resumes from the remote's
newest checkpoint once the remote answers; so does one whose records cannot be read (it may have synced); a run that
never synced has nothing there to lose and starts from step 0, and is told, of a remote not there whose place above
answers or is an empty directory no mount table names (the first start of a new run), that it does not exist yet
and the first sync creates it, not that its share may be gone (`made_by_first_sync`); `minilmd run --fresh` starts
from step 0 whatever the records say. A remote that answers but lists no checkpoint that verifies (the fetch read
each one three times, then set it aside into quarantine/: daemon/jobs/fetch.py; or one set aside at an earlier start)
is waited for the same way by a run that synced there: its steps are lost to it until one there verifies again, and
step 0 would train them all again (`decision`). Torch-free.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from minilmd import mount_places, names
from minilmd.daemon.base import timeline
from minilmd.daemon.base.runstate import names_remote, state_owners
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.path_checks import made_in_empty_directory, remote_parents_refused
from minilmd.shared_place import Place, gone_or_typo, look
from minilmd.untrusted import MAX_LINE_DEPTH, Unreadable, loads, open_regular
from minilmd.urls import open_fs

EVENTS_MAX_LINE = 1 << 16
"""A line of events.jsonl longer than this is no sync record (one is a few hundred bytes): not parsed."""


def remote_absent(url: str) -> str:
    """How the remote cannot be reached now, in a few words ("not there (its share gone?)", "a link to nowhere (->
    /nfs/x: ...)", "an empty directory (...)", "unreadable (...)", "not a directory (...)"); "" when it answers
    (holding checkpoints or not). minilmd/shared_place.py decides, as for every other shared place; a URL fsspec
    cannot open: "out of reach: it cannot be opened (...)", read after "URL is"."""
    try:
        opened = open_fs(url)  # the remote may be any fsspec URL
    except (ValueError, ImportError, OSError) as e:
        return f"out of reach: it cannot be opened ({e})"
    found = look(opened.root, names.LATEST, opened.fs)
    return "" if found.place in (Place.THERE, Place.LACKS) else str(found)


def made_by_first_sync(url: str) -> str:
    """What the first sync makes of a local run.remote that is not there, or is an empty directory, when that is
    what it is rather than its share gone or not mounted, in words read after the URL ("does not exist yet (the first
    sync creates it)"); "" when it is not that. It is no link (one to nowhere is a share gone), the first sync makes
    it (minilmd/path_checks.py remote_parents_refused: no chain from the top level), and the nearest directory above
    it that is there holds other entries (shared_place.gone_or_typo's evidence of a place that answers), or is an
    empty one that no fstab, autofs map or systemd unit names as a mount point (path_checks.made_in_empty_directory:
    one the user made; an unmounted share's mount point reads as its empty stub). "" for a store (s3, sftp): nothing
    tells there."""
    try:
        _, root, local = open_fs(url)
    except (ValueError, ImportError, OSError):
        return ""
    config = mount_places.snapshot()
    if not local or remote_parents_refused(root, config):
        return ""
    if gone_or_typo(root):
        return "does not exist yet (the first sync creates it)"
    if not (empty := made_in_empty_directory(root, config)):
        return ""
    unnamed = "an empty directory that no fstab, autofs map or systemd unit names as a mount point"
    path = os.path.normpath(os.path.abspath(root))
    if empty == path:
        return f"is {unnamed} (the first sync writes in it)"
    if empty == os.path.dirname(path):
        return f"does not exist yet (the first sync creates it in {empty}, {unnamed})"
    return f"does not exist yet (the first sync creates it and the directories missing above it in {empty}, {unnamed})"


SYNCED, NEVER, UNKNOWN = "synced", "never", "unknown"
"""What the run's records say of its remote: it synced to it before, it never did, or they cannot be read."""


@dataclass(frozen=True)
class Records:
    verdict: str
    """SYNCED, NEVER or UNKNOWN."""
    why: str
    """In words: the record that says it synced ("state.json records step 194 on it"), or what cannot be read."""
    step: int | None = None
    """The step that record names (SYNCED), else None."""


def records(url: str, run_dir: Path, remote: RemoteCheckpoint | None, state_unreadable: str = "") -> Records:
    """Whether this run synced to `url` before, and the newest step it did: the larger of state.json's remote
    checkpoint (`remote`, adopted from the previous supervisor's) when it is on `url` and the newest step
    events.jsonl says was synced to `url` or fetched from it since the last `run --fresh` (a state.json rewritten
    to an older step, as an older minilmd's last sync could after a stop during staging's re-list, does not hide
    the newer step events.jsonl still holds: review12a F1). UNKNOWN when neither says so and one of them cannot be
    read (`state_unreadable`: why the previous state.json could not be, "" when it could or there was none)."""
    state_step = remote.step if remote is not None and names_remote(remote.path, url) else None
    said = f"{names.STATE} records step {state_step} on it"
    try:
        step, earlier_unreadable = read_events(run_dir, url)
    except Unreadable as e:
        return Records(SYNCED, said, state_step) if state_step is not None else \
            Records(UNKNOWN, f"{names.EVENTS} {e.why}")
    if state_step is not None and (step is None or step <= state_step):
        return Records(SYNCED, said, state_step)
    if step is not None:
        older = f" ({said})" if state_step is not None else ""
        return Records(SYNCED, f"{names.EVENTS} records step {step} synced to or fetched from it{older}", step)
    if state_unreadable:
        return Records(UNKNOWN, f"{names.STATE} {state_unreadable}")
    if earlier_unreadable:
        return Records(UNKNOWN, f"{names.STATE} {earlier_unreadable}, at an earlier start")
    return Records(NEVER, "")


def read_events(run_dir: Path, url: str) -> tuple[int | None, str]:
    """(the newest step of a "sync" (synced step N) or "fetch" (fetched step N) event naming `url` as its remote,
    why an earlier start could not read its state.json ("adopt" event: what that one held is unknown, and a
    state.json written since does not hold it)), both counted after the last `run --fresh` start only (a "fetch"
    event with lineage "fresh": what came before is another lineage); (None, "") when there is no events.jsonl.
    The run's own file (its owner checked), read line by line, a line longer than EVENTS_MAX_LINE skipped unread.
    Raises Unreadable when it is there but cannot be read."""
    newest, unreadable = None, ""
    path = run_dir / names.EVENTS
    try:
        fd = open_regular(path, owner=state_owners(run_dir))
    except Unreadable as e:
        if e.missing:
            return None, ""
        raise
    with os.fdopen(fd, "rb") as f:
        try:
            for record in _event_records(f):
                event, step = record.get("event"), record.get("step")
                if timeline.is_fresh_event(record):
                    newest, unreadable = None, ""
                elif event == "adopt" and isinstance(record.get("unreadable"), str):
                    unreadable = record["unreadable"]
                elif event in ("sync", "fetch") and names_remote(record.get("remote"), url) and \
                        isinstance(step, int) and not isinstance(step, bool):
                    newest = step if newest is None else max(newest, step)
        except OSError as e:
            raise Unreadable(f"cannot be read: {e.strerror or e}", path, os_error=e) from None
    return newest, unreadable


def _event_records(f) -> Iterator[dict]:
    """The JSON objects among the lines of `f` that may be records `read_events` counts; a line longer than
    EVENTS_MAX_LINE is skipped to its end without being held whole, a torn one skipped."""
    while line := f.readline(EVENTS_MAX_LINE + 1):
        if len(line) > EVENTS_MAX_LINE:
            while not line.endswith(b"\n") and (line := f.readline(EVENTS_MAX_LINE)):
                pass
            continue
        if b'"step"' not in line and b'"lineage"' not in line and b'"unreadable"' not in line:
            continue
        try:
            yield loads(line, max_depth=MAX_LINE_DEPTH, expect=dict)
        except Unreadable:
            continue


def decision(url: str, absent: str, found: Records, fresh: bool, new: str = "",
             set_aside: tuple[str, ...] = ()) -> tuple[bool, str]:
    """(wait, why) for a start whose scratch holds no checkpoint and whose remote `url` lists none that verifies:
    wait when the remote is `absent` (remote_absent's words), or answers but lists none (`set_aside`: what this
    staging's fetches set aside there as invalid, in words), and the run's records (`found`) say it synced there
    before, unless `fresh`; so too when they cannot be read, for a remote absent or one whose checkpoints were just
    set aside; else start from step 0. `new` (made_by_first_sync's words): the remote is not made yet, the first
    sync makes it; a run that never synced is told so, not that its share may be gone."""
    if not absent:
        return _none_valid(url, found, fresh, set_aside)
    if new and found.verdict == NEVER:
        return False, f"{url} {new}, and this run has never synced to it"
    if fresh:
        return False, f"{url} is {absent}, and `--fresh` was given" + (f" ({found.why})" if found.why else "")
    if found.verdict == SYNCED:
        return True, f"{url} is {absent}, and this run has synced to it before ({found.why})"
    if found.verdict == UNKNOWN:
        return True, f"{url} is {absent}, and this run's records cannot be read ({found.why}): it may have " \
                     f"synced to it before"
    return False, f"{url} is {absent}, and this run has never synced to it"


def _none_valid(url: str, found: Records, fresh: bool, set_aside: tuple[str, ...]) -> tuple[bool, str]:
    """`decision` for a remote that answers and lists no checkpoint that verifies: every one this run synced there
    is lost (set aside as invalid now or at an earlier start, or removed by hand), so a run that synced there waits
    for a valid one rather than train its steps again from step 0 (a checkpoint set back from quarantine/, or `run
    --fresh`)."""
    held = f"{url} holds no checkpoint that verifies: {len(set_aside)} set aside as invalid " \
           f"({'; '.join(set_aside[:4])}{'; ...' if len(set_aside) > 4 else ''})" if set_aside else \
        f"neither scratch nor {url} holds a checkpoint"
    if fresh:
        return False, f"{held}, and `--fresh` was given" + (f" ({found.why})" if found.why else "")
    if found.verdict == SYNCED:
        kept = "" if set_aside else f" (any this run set aside as invalid is under {url}/{names.QUARANTINE})"
        return True, f"{held}{kept}, and this run has synced to it before ({found.why}): waiting for a valid " \
                     f"checkpoint there (one set back from {names.QUARANTINE}/ once it reads whole)"
    if found.verdict == UNKNOWN and set_aside:
        return True, f"{held}, and this run's records cannot be read ({found.why}): it may have synced to it " \
                     f"before; waiting for a valid checkpoint there"
    return False, held + (", and this run has never synced to it" if set_aside and found.verdict == NEVER else "")


STEP_0 = "starts from step 0: "
"""How `run --check`'s line of a start from step 0 begins (check_line's, and resumefrom's `Start.line`)."""


def check_line(cfg, fresh: bool, none_valid: bool = False) -> str:
    """What `run --check` says of a start with no checkpoint in scratch whose remote cannot be reached now, or
    answers and holds none that verifies (`none_valid`: daemon/jobs/resumefrom.py found none there): that it waits
    for the remote, or that it starts from step 0 (`decision`); "" when scratch holds a checkpoint, there is no
    remote, or the remote answers with a checkpoint (the run resumes from it) or with none for a run that never
    synced there. A remote that cannot be listed (EACCES, EIO) or does not answer fails the fetch itself: waited
    for, unless `fresh`."""
    from minilmd.daemon.base.runstate import load_state
    from minilmd.daemon.base.statesections import StateJson
    from minilmd.probes import bounded_probe, scratch_checkpoints

    url = cfg.run.remote
    if not url or scratch_checkpoints(cfg):
        return ""
    answered, absent, failed = bounded_probe(remote_absent, url, says_why=True)
    absent = absent if answered else failed
    if not absent and not none_valid:
        return ""
    if absent and (not answered or absent.startswith("unreadable")):
        wait, why = not fresh, f"{url} is {absent}" + (", and `--fresh` was given" if fresh else "")
    else:
        try:
            old, unreadable = load_state(cfg.run_dir), ""
        except Unreadable as e:
            old, unreadable = {}, "" if e.missing else e.why
        found = records(url, cfg.run_dir, StateJson.from_dict(old).remote_checkpoint, unreadable)
        new = (bounded_probe(made_by_first_sync, url)[1] or "") if absent else ""
        wait, why = decision(url, absent, found, fresh, new)
        if not absent and not wait:
            return ""  # the start's own line says step 0
    if wait:
        return (f"waits: run.remote: {why}; scratch holds no checkpoint, so the run waits for the remote (`minilmd "
                f"status`: staging waiting_remote, retried with backoff) and resumes from its newest checkpoint; "
                f"`minilmd run --fresh` starts from step 0 instead")
    return f"{STEP_0}run.remote: {why}; scratch holds no checkpoint"
