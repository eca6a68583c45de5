"""The remote of a run's checkpoints (RemoteStore, daemon/jobs/remote_store.py: what sync, fetch and basecopy may ask
of it; they never ask which kind it is): remote_local.py's `open_remote` chooses by URL between a local path (NFS:
daemon/jobs/remote_local.py's LocalRemote, a place others may write, read as untrusted and written at its root's
checked descriptor) and any other fsspec store (Remote, here: objects, no links, no rename, so a copy is written in
place, its manifest last). What both do alike is written once, here. A hash reads no further than one byte past the
size its caller expects, a download no more than one byte past the size listed. Torch-free.
"""
from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from minilmd import checkpoint as ck
from minilmd.daemon.jobs.remote_publish import LeftAside
from minilmd.daemon.jobs.remote_store import ListedManifest, RemoteStore, Steps
from minilmd.fsio import table_problems
from minilmd.names import COPY_CHUNK_BYTES as CHUNK
from minilmd.names import LATEST, MANIFEST, MANIFEST_MAX_BYTES, POINTER_MAX_BYTES, is_step_name, step_of
from minilmd.shared_place import Look, look
from minilmd.untrusted import Unreadable, loads, read_stream

__all__ = ["LeftAside", "ListedManifest", "Remote", "RemoteStore", "Steps"]


def _sha256_stream(f, size: int, moved: Callable[[int], None] = lambda n: None) -> str:
    """The sha256 of at most size + 1 bytes of f: a file longer than expected hashes as a mismatch, never read to
    its end (others may write to it as it is read, or make it a sparse terabyte). `moved(n)` after each chunk."""
    h, left = hashlib.sha256(), size + 1
    while left > 0 and (chunk := f.read(min(CHUNK, left))):
        h.update(chunk)
        left -= len(chunk)
        moved(len(chunk))
    return h.hexdigest()


class Remote:
    """A store over fsspec that is not a local path (objects: no links, no rename): the few file operations sync
    needs, and what a local one does alike (LocalRemote overrides the rest)."""

    def __init__(self, url: str, tmp_tag: str = "", opened=None):
        if opened is None:
            from minilmd.urls import open_fs

            opened = open_fs(url)[:2]
        self.url = url.rstrip("/")
        self.fs, root = opened
        self.root = root.rstrip("/") or "/"
        self.tmp_tag = tmp_tag
        """Goes into the name of a pointer's temp file: whose it is, on a remote other hosts write too."""
        self.moved: Callable[[int], None] = lambda n: None
        """Told the bytes of each chunk a `put` writes and a hash reads back: a sync's progress, by which a slow
        remote is told from a stalled one (the Syncer's ReadWatch, daemon/base/worker.py)."""

    @property
    def renames_into_place(self) -> bool:
        """No rename on an object store: a copy is written in place, its manifest last."""
        return False

    def close(self) -> None:
        """Nothing held (LocalRemote holds its root's descriptor)."""

    # --- reading ---------------------------------------------------------------------------------------------------
    def path(self, *names: str) -> str:
        return "/".join([self.root, *names])

    def show(self, *names: str) -> str:
        return "/".join([self.url, *names])

    def names(self) -> list[str]:
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))
        except FileNotFoundError:
            return []

    def steps(self) -> Steps:
        """Step directory names on the remote, oldest first (with or without a manifest)."""
        return Steps(sorted((n for n in self.names() if is_step_name(n)), key=step_of), {})

    def look(self, expected: str) -> Look:
        """Why `expected` is missing at the root, as minilmd/shared_place.py says (not there, an empty directory, one
        that cannot be listed): told from a root that answers without it."""
        return look(self.root, expected, self.fs)

    def size(self, *names: str) -> int | None:
        try:
            return int(self.fs.size(self.path(*names)))
        except FileNotFoundError:
            return None

    def sha256(self, *names: str, size: int) -> str:
        """The sha256 of a file expected to hold `size` bytes, read no further than one byte past them."""
        with self.open(*names) as f:
            return _sha256_stream(f, size, self.moved)

    def open(self, *names: str):
        """A file of the remote opened for reading."""
        return self.fs.open(self.path(*names), "rb")

    def cat(self, path: str, max_bytes: int) -> bytes:
        """A small file of the remote (an object: it is what was written), at most max_bytes (more: Unreadable)."""
        with self.fs.open(path, "rb") as f:
            return read_stream(f, path, max_bytes=max_bytes)

    def cat_own(self, path: str, max_bytes: int) -> bytes:
        """`cat`: an object store has no other users' entries (LocalRemote: another user's file refused unread)."""
        return self.cat(path, max_bytes)

    def read_text(self, *names: str) -> str | None:
        try:  # a pointer: a name; none when it is not a small regular file (as checkpoint_dirs.read_latest)
            return self.cat(self.path(*names), POINTER_MAX_BYTES).decode("utf-8", errors="replace")
        except (FileNotFoundError, Unreadable):
            return None

    def manifest(self, name: str) -> dict | None:
        return self.manifest_or_problems(name)[0]

    def manifest_or_problems(self, name: str) -> tuple[dict | None, list[str]]:
        """(the manifest of a remote checkpoint, []) or (None, what is wrong with it: [] when there is none, which
        on a store without rename is a copy in progress). Parsed as untrusted: depth bounded, its shape checked."""
        return self.read_manifest(name)[:2]

    def read_manifest(self, name: str) -> ListedManifest:
        """manifest_or_problems's answer and the bytes read, in one read of the file."""
        try:
            raw = self.cat(self.path(name, MANIFEST), MANIFEST_MAX_BYTES)
        except FileNotFoundError:
            return ListedManifest(None, [], None)
        except Unreadable as e:
            return ListedManifest(None, [f"cannot read {MANIFEST}: {e.why}"], None)
        try:
            manifest = loads(raw, expect=None)
        except Unreadable as e:
            return ListedManifest(None, [f"{MANIFEST} is not valid JSON: {e.why}"], raw)
        problems = ck.manifest_problems(manifest)
        return ListedManifest(None, problems, raw) if problems else ListedManifest(manifest, [], raw)

    def not_regular(self, name: str, files) -> list[str]:
        """Nothing to look at on an object store, which holds only objects (LocalRemote: FIFOs, links)."""
        return []

    def why_foreign(self, name: str) -> str | None:
        """None: an object store has no other users' entries nor links (LocalRemote: what `name` is when it is no
        real directory of this user's)."""
        return None

    def made_here(self, name: str) -> bool:
        """True: every step of an object store is taken as this run's (LocalRemote: made by a sync of this user)."""
        return True

    def age(self, name: str) -> float:
        """0: unknown on an object store (LocalRemote: seconds since `name` was last modified)."""
        return 0.0

    def free(self) -> int | None:
        """None: not measurable on an object store."""
        return None

    def inodes_if_none_left(self) -> int | None:
        """None: an object store has no inodes to run out of."""
        return None

    def hasher(self, name: str, manifest: dict):
        """sha256_of for verify_manifest: each file of checkpoint `name` hashed as far as its manifest's size."""
        return lambda f: self.sha256(name, f, size=manifest["files"][f]["size"])

    def intact(self, name: str, full_hash: bool = False) -> tuple[dict | None, list[str]]:
        """(manifest, problems) of a remote checkpoint; sizes always, sha256 when full_hash."""
        manifest = self.manifest(name)
        if manifest is None:
            return None, [f"{self.show(name)}: no valid {MANIFEST}"]
        odd = self.not_regular(name, manifest["files"])
        if odd:
            return manifest, odd
        if full_hash:
            return manifest, ck.verify_manifest(manifest, lambda f: self.size(name, f), self.hasher(name, manifest))
        return manifest, table_problems(manifest["files"], lambda f: self.size(name, f), listed_in=MANIFEST)

    def get(self, names: tuple[str, ...], local: Path, size: int, answered=lambda: None) -> str:
        """Download to `local` the `size` bytes a manifest or record lists, and at most one more (a file longer
        than listed shows as `local` of size + 1: a file others write to as it is read is never copied without
        end); the sha256 of the bytes written. `answered()` after each chunk read."""
        h, left = hashlib.sha256(), size + 1
        with self.open(*names) as src, open(local, "wb") as out:
            while left > 0 and (chunk := src.read(min(CHUNK, left))):
                answered()
                left -= len(chunk)
                out.write(chunk)
                h.update(chunk)
            out.flush()
            os.fsync(out.fileno())
        return h.hexdigest()

    # --- writing ---------------------------------------------------------------------------------------------------
    def put(self, local: Path, *names: str) -> int:
        """Copy a local file to a file of the remote; the bytes written (each chunk told to `moved`)."""
        with self.fs.open(self.path(*names), "wb") as out, open(local, "rb") as src:
            n = 0
            while chunk := src.read(CHUNK):
                out.write(chunk)
                n += len(chunk)
                self.moved(len(chunk))
        return n

    def replace_own(self, name: str, data: bytes) -> None:
        """The file `name` replaced whole by `data`: one PUT, atomic on an object store, which has no other users'
        files (LocalRemote: only this user's regular file is replaced)."""
        if not self.fs.exists(self.path(name)):
            raise FileNotFoundError(errno.ENOENT, f"{self.show(name)} is not there")
        self.fs.pipe_file(self.path(name), data)

    def put_new(self, name: str, data: bytes) -> None:
        """The file `name` made with `data` where there is none (FileExistsError otherwise): one PUT, which an
        object store makes whole or not at all (LocalRemote: a temporary renamed into place without replacing)."""
        if self.fs.exists(self.path(name)):
            raise FileExistsError(errno.EEXIST, f"{self.show(name)} is there already")
        self.fs.pipe_file(self.path(name), data)

    def makedirs(self, *names: str) -> None:
        """The root and names below it, made as needed (an object store has no links)."""
        self.fs.makedirs(self.path(*names), exist_ok=True)

    def make_tmp(self, target: str, *below: str, taken=lambda found, fresh: None,
                 kept: Callable[[str], str | None] = lambda name: None) -> str:
        """Make the directory `target` (and `below` in it) for a copy, an earlier try's removed first; the name used
        (LocalRemote: a fresh name where `target` holds what is not this sync's, or what `kept` says)."""
        self.rm(target)
        self.makedirs(target, *below)
        return target

    def rm(self, name: str, file: bool = False, was: str | None = None, claim: bytes | None = None) -> str | None:
        """Remove what a sync made, a name of the root: None (removed, or not there). An object store has no other
        users, nor their renames (LocalRemote: only what is proven this run's)."""
        try:
            self.fs.rm(self.path(name), recursive=True)
        except FileNotFoundError:
            pass
        return None

    def set_aside(self, name: str, reason: str) -> str | None:
        """None: a store without rename has nowhere to move a damaged checkpoint to; it is left, and skipped."""
        return None

    def write_latest(self, name: str, pointer: str = LATEST) -> None:
        self.fs.pipe_file(self.path(pointer), (name + "\n").encode())  # one PUT: atomic on object stores

    def rename_dir(self, src: str, dst: str) -> None:
        """No rename on an object store (callers ask renames_into_place first)."""
        raise OSError(errno.EOPNOTSUPP, f"{self.url} has no rename: {self.show(src)} is not renamed to {dst}")

    def publish_unless_taken(self, src: str, dst: str, replaceable: Callable[[str], bool],
                             ours: Callable[[str], bool]) -> bool:
        """No rename on an object store (callers ask renames_into_place first)."""
        raise OSError(errno.EOPNOTSUPP, f"{self.url} has no rename: {self.show(src)} is not published at {dst}")
