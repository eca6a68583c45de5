"""Why a file expected in a shared place (an NFS mount, a store another machine writes) is missing: the place gone or
an empty mount point (an outage to wait out), or a place that is there and simply lacks it (a config or data error).

One look for the four readers that ask it: the corpus's staging (daemon/jobs/staging.py), the probe corpus's
(daemon/jobs/initstage.py), the LoRA base's copy on the remote (daemon/jobs/basecopy.py) and the config check
(minilmd/probes.py). Each used to decide it alone, and they differed on the edges: a listing that fails was "an empty
directory" to two of them and an error to the others; a link that leads nowhere was a share gone to three and a
config error to the fourth; a file where the directory belongs was waited for without end. Now:
- the place is looked at as the config names it: a link there is followed, as every reader of it follows it (a
  path into the share may well be one: ~/corpus -> /nfs/corpora/wiki); one that leads nowhere is its share gone,
  said as "a link to nowhere (-> its target ...)";
- nothing there (or a path through a file): GONE; an empty directory (a mount point whose share is not mounted
  reads as its empty stub): EMPTY; a place that cannot be listed or looked into (EACCES, EIO, a stale handle):
  UNREADABLE, said with its reason. These three are an outage (`Look.outage`): waited for, never final;
- a file, FIFO, ... where the directory belongs: NOT_A_DIRECTORY (the config names something else: final);
- a directory holding other things: LACKS (not what the reader wants: final); the file is there: THERE (the reader's
  own error about it stands: a link or a FIFO by that name is its reader's to refuse).
Nothing in the place is opened or followed beyond its own name: an lstat of the expected name, a stat of the place,
the first entry of its listing. Standard library only; an fsspec filesystem is passed in, never imported.

A place not there at all is the share gone only when nothing says it is a typo; two things do (`gone_or_typo`,
for the config check's decision between waiting and refusing, exit 2): the nearest directory above it that is there
holds other entries (a share that is mounted, and lacks that name: an unmounted mount point reads as its empty stub),
and, for the corpus of a run that has staged before, a data.prepared other than the one its staged copy was made
from (`staged_from`, the record `<scratch>/corpus.source` staging writes beside the copy): a run restarted while
its share is gone trains from that copy, never from one of another corpus.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from enum import Enum

from minilmd.fsio import atomic_write_text
from minilmd.names import STAGED_CORPUS_SOURCE, STAGED_RECORD_MAX_BYTES
from minilmd.untrusted import Unreadable, file_kind, holds_any, printable, read_bytes
from minilmd.urls import is_local_fs, is_url


class Place(Enum):
    THERE = "there"
    LACKS = "lacks"
    GONE = "gone"
    EMPTY = "empty"
    UNREADABLE = "unreadable"
    NOT_A_DIRECTORY = "not a directory"


OUTAGES = (Place.GONE, Place.EMPTY, Place.UNREADABLE)


@dataclass(frozen=True)
class Look:
    place: Place
    what: str = ""
    """A few words: "not there", "an empty directory", "unreadable", "not a directory", "no meta.json"."""
    hint: str = ""
    """Why, or what it may mean: "its share gone?", "its share not mounted?", "permission denied", "a FIFO"."""

    @property
    def outage(self) -> bool:
        """The place is gone, an empty mount point or cannot be read now: waited for, never a final error."""
        return self.place in OUTAGES

    def __str__(self) -> str:
        return f"{self.what} ({self.hint})" if self.hint else self.what


def look(root: str | os.PathLike, expected: str, fs=None) -> Look:
    """Why `expected` is missing in the directory `root` (the module docstring): a local path, or a path of the
    fsspec filesystem `fs` when it is not a local one. Never raises an OSError: what fails is UNREADABLE."""
    if fs is not None and not is_local_fs(fs):
        return _look_in_store(fs, str(root).rstrip("/"), expected)
    path = os.fspath(root)
    try:
        os.lstat(os.path.join(path, expected))
        return Look(Place.THERE)
    except (FileNotFoundError, NotADirectoryError):
        pass  # what the place is says why
    except OSError as e:  # the place cannot be looked into (no search permission, EIO): said below if not
        if not os.path.isdir(path):
            return _gone_or_not_a_directory(path)
        return _unreadable(e)
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):  # followed: the place as the config names it
            return _gone_or_not_a_directory(path)
        holds = holds_any(path)
    except (FileNotFoundError, NotADirectoryError):
        return _gone_or_not_a_directory(path)
    except OSError as e:
        return _unreadable(e)
    if holds:
        return Look(Place.LACKS, f"no {expected}")
    return Look(Place.EMPTY, "an empty directory", "its share not mounted?")


def _gone_or_not_a_directory(path: str) -> Look:
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # a link that leads nowhere too: its target went with the share
        return _nowhere(path) or Look(Place.GONE, "not there", "its share gone?")
    except OSError as e:
        return _unreadable(e)
    if stat.S_ISDIR(mode):  # a directory now: the next attempt looks again
        return Look(Place.UNREADABLE, "unreadable", "changed while looked at")
    return Look(Place.NOT_A_DIRECTORY, "not a directory", file_kind(mode))


def _nowhere(path: str) -> Look | None:
    """A link at `path` whose target is not there, said as what it is (not "a file exists" nor "not there"): its
    share gone or not mounted; None when `path` is no link."""
    try:
        target = os.readlink(path)
    except OSError:  # no link (not there at all), or it cannot be read: "not there" says it
        return None
    return Look(Place.GONE, "a link to nowhere", f"-> {printable(target)}: its share gone or not mounted?")


def _unreadable(e: OSError) -> Look:
    why = "permission denied" if e.errno in (errno.EACCES, errno.EPERM) else (e.strerror or str(e))
    return Look(Place.UNREADABLE, "unreadable", why)


def _look_in_store(fs, root: str, expected: str) -> Look:
    """The same look in a store (s3, sftp, memory): there a prefix with nothing under it may not exist at all, so
    gone and empty both say "not reachable?"."""
    try:
        if fs.exists(f"{root}/{expected}"):
            return Look(Place.THERE)
        if not fs.isdir(root):
            if fs.exists(root):
                return Look(Place.NOT_A_DIRECTORY, "not a directory", "a file")
            return Look(Place.GONE, "not there", "not reachable?")
        holds = bool(fs.ls(root, detail=False))
    except FileNotFoundError:
        return Look(Place.GONE, "not there", "not reachable?")
    except OSError as e:
        return _unreadable(e)
    return Look(Place.LACKS, f"no {expected}") if holds else Look(Place.EMPTY, "empty", "not reachable?")


def gone_or_typo(path: str | os.PathLike) -> str:
    """Why a local `path` that is not there reads as a typo rather than its share gone: "" when it does not (it is
    there, or a link: one to nowhere is its share gone; or the nearest directory above it that is there is empty,
    an unmounted mount point's stub, or cannot be looked at: a share that fails), else what says so ("/nfs/corpora
    holds other entries, but no wiki2")."""
    child = os.path.abspath(os.fspath(path))
    try:
        os.lstat(child)
        return ""
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError:
        return ""  # cannot be looked at: an outage, not a typo
    parent = os.path.dirname(child)
    while parent != child:
        try:
            holds = holds_any(parent)
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(parent):  # a link on the way that leads nowhere now: its share gone
                return ""
            child, parent = parent, os.path.dirname(parent)
            continue
        except OSError:
            return ""
        return f"{printable(parent)} holds other entries, but no {printable(os.path.basename(child))}" if holds else ""
    return ""


def staged_from(scratch_dir: str | os.PathLike) -> str | None:
    """The data.prepared the staged corpus in `scratch_dir` was made from (its record), None when unknown (no
    record: nothing staged, or staged by a version before the record)."""
    try:
        raw = read_bytes(os.path.join(os.fspath(scratch_dir), STAGED_CORPUS_SOURCE), max_bytes=STAGED_RECORD_MAX_BYTES)
    except (Unreadable, OSError):
        return None
    return raw.decode("utf-8", errors="replace")


def same_source(recorded: str, source: str) -> bool:
    """Whether the staged copy's record names this data.prepared (spelt alike: a trailing "/" or a "." step is the
    same place)."""
    return recorded == source or (not is_url(source) and os.path.normpath(recorded) == os.path.normpath(source))


def record_staged_from(scratch_dir: str | os.PathLike, source: str | None) -> None:
    """Write the record `staged_from` reads: the staged copy in `scratch_dir` is of `source` (staging, once it has
    a verified copy of what the source holds now); None removes it (before another copy takes the staged name)."""
    path = os.path.join(os.fspath(scratch_dir), STAGED_CORPUS_SOURCE)
    if source is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    atomic_write_text(path, source)
