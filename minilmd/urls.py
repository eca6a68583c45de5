"""What a string naming a place is, as fsspec reads it: a local path or a URL, and the one way to open it.

A URL is what fsspec opens as anything but a plain path: a protocol ("s3://bucket", "file:///nfs/x", "memory://"),
a chain ("simplecache::s3://bucket", "dir::/tmp", which has no "://"), or "data:". A local path is any other string;
"file://" and "local://" URLs open local paths too, which `open_fs` says (`local`): another user's files there may be
links or FIFOs, so they are looked at before they are opened (minilmd/untrusted.py, shared_place.py). A chain over a
local directory ("dir::/tmp", "simplecache::/nfs/x") is refused: fsspec would open its files by path, links followed
and no size bounded, where minilmd opens a local path only itself (`chain_over_local`).
Torch-free; fsspec is imported by `open_fs` alone.
"""
from __future__ import annotations

from typing import Any, NamedTuple

CHAIN = "::"
"""fsspec's chained-URL separator ("simplecache::s3://bucket")."""


def is_url(place: str) -> bool:
    """Whether fsspec reads `place` as a URL, not a local path (fsspec.core.split_protocol's rule, and its chains)."""
    if CHAIN in place or place.startswith("data:"):
        return True
    protocol, sep, _ = place.partition("://")
    return bool(sep) and len(protocol) > 1  # a one-letter "protocol" is a Windows drive, as fsspec reads it


def protocol_of(place: str) -> str:
    """The protocol of a URL ("s3" of "s3://b", "simplecache" of "simplecache::s3://b"); "" for a local path."""
    if not is_url(place):
        return ""
    first = place.split(CHAIN, 1)[0]
    return first.split("://", 1)[0] if "://" in first else first.split(":", 1)[0]


def local_remote_root(remote: str | None) -> str | None:
    """The path of a run.remote that the sync writes as a local path (LocalRemote: a plain path, file://,
    local://), None for any other store or none. Told from the protocol alone: building a remote store's
    filesystem may connect to it (sftp), and a check must not wait on a network that is down. The one answer of
    `run --check` (minilmd/probes.py path_problems) and of the daemon's checks (daemon/preflight.py)."""
    if not remote or not is_url(remote):
        return remote or None
    protocol, _, rest = remote.partition("://")
    return (rest.rstrip("/") or "/") if protocol_of(remote) in ("file", "local") and CHAIN not in remote else None


def chain_over_local(place: str) -> str | None:
    """The local path a chained URL ends on ("simplecache::/nfs/x", "dir::file:///nfs/x"), None for any other place.
    Such a chain is refused wherever a place is opened (`open_fs`) or checked (`run --check`): through it fsspec would
    write and read another user's directory by path, following his links into the run's user's files and reading
    his files unbounded, past every rule minilmd keeps for a local path. A cache adds nothing there: staging copies
    the corpus to scratch, the sync copies checkpoints."""
    if CHAIN not in place:
        return None
    inner = place.rsplit(CHAIN, 1)[1]
    return inner if not is_url(inner) else local_remote_root(inner)


def chain_refused(place: str, inner: str) -> str:
    """Why a chain over a local path is not opened: the one wording."""
    return (f"{place!r} is an fsspec chain over the local path {inner}, which minilmd does not open through fsspec "
            f"(links would be followed there): name {inner} itself")


def is_local_fs(fs: Any) -> bool:
    """Whether an fsspec filesystem is local paths (an NFS mount is one): another user's files there may be FIFOs
    or links, so they are looked at before they are opened. The one answer: `open_fs`'s `local` is this."""
    return "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))


class Opened(NamedTuple):
    fs: Any
    """The fsspec filesystem."""
    root: str
    """The path in it (no trailing "/", "/" for the root)."""
    local: bool
    """Whether it is a local path (is_local_fs)."""


def open_fs(place: str) -> Opened:
    """`place` (a local path or a URL) opened by fsspec: (fs, root, local). ValueError or ImportError for a URL fsspec
    cannot open (an unknown protocol, its package missing, a chain over a local path: `chain_over_local`); an OSError
    from a store that fails as it is opened."""
    if (inner := chain_over_local(place)) is not None:
        raise ValueError(chain_refused(place, inner))
    import fsspec  # light, but only the places that may be URLs need it

    fs, root = fsspec.core.url_to_fs(place)
    return Opened(fs, root.rstrip("/") or "/", is_local_fs(fs))
