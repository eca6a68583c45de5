"""init.from's MiniMind .pth read once, as another user's file on a share: in the directory resolve opened and
pinned (init_place.reopen: that very (device, inode) or none), through its descriptor, a regular file of that
directory's owner or ours (no link followed, never blocked on a FIFO), bounded by a state dict of the run's model
(`pth_bound`), and hashed as read. The trainer unpickles those bytes, staging writes them to its copy: what was
hashed is what is used, and a .pth swapped after the resolution, or its directory swapped by whoever can write
above it, is not read. Torch-free.
"""
from __future__ import annotations

import io

from minilmd.init_kinds import InitSource, InitSourceError, untrusted_failure

MAX_PTH_BYTES = 16 << 30
"""The largest .pth read when the run's model is not given (a caller without the run's config): 2G weights at 8
bytes, beyond any small LM; given the model (the trainer, staging), `pth_bound` of it bounds the read."""


class InitSourceTooBig(InitSourceError):
    """A .pth larger than a state dict of the run's model can be: refused before it is read (final)."""


def read_pth(source: InitSource, model: dict | None = None) -> tuple[io.BytesIO, dict]:
    """A MiniMind .pth source read as untrusted (the module's docstring), into memory and hashed as read; (those
    bytes, the fingerprint record of exactly them). The caller unpickles the bytes, never the path again: what was
    hashed is what is loaded. Raises InitSourceError for a source that is not what it must be (InitSourceTooBig:
    larger than a .pth of `model` can be); the OSError of one that cannot be read now (init_place.Moved: its
    directory replaced since the resolution)."""
    from minilmd.untrusted import Hashing

    sink = Hashing(io.BytesIO())
    record = read_pth_into(source, model, sink)
    sink.keep.seek(0)
    return sink.keep, record


def copy_pth(source: InitSource, model: dict | None, out) -> dict:
    """read_pth's one read, its bytes written to `out` (a binary file object of this process: staging's copy in
    scratch) instead of kept in memory; the fingerprint record of exactly the bytes written. Raises as `read_pth`
    does; an OSError of `out` as it is."""
    from minilmd.untrusted import Hashing

    return read_pth_into(source, model, Hashing(out))


def read_pth_into(source: InitSource, model: dict | None, sink) -> dict:
    """The .pth read once into `sink` (an untrusted.Hashing), bounded by `model`; its fingerprint record."""
    from minilmd.init_place import Refused, owners_of, refusal, reopen
    from minilmd.model_shapes import pth_bound
    from minilmd.untrusted import Unreadable, copy_regular, size_text

    bound = pth_bound(model) if model is not None else MAX_PTH_BYTES
    with reopen(source.path.parent, source.identity) as parent:  # a staged copy (no identity): this run's scratch
        owners = source.owners or owners_of(parent)
        try:
            copy_regular(source.path.name, sink, max_bytes=bound, dir_fd=parent.fd, owner=owners)
        except Unreadable as e:
            if e.kind == "too_big":  # its size, looked at before a byte is read
                limit = "a state dict of this run's model can be" if model is not None else "init.from's .pth may be"
                raise InitSourceTooBig(f"{source.path}: over {size_text(bound)}, more than {limit}") from None
            found = refusal(parent, source.path.name, e, owners)  # a link, a FIFO, a third user's file: named
            raise (InitSourceError(str(found)) if isinstance(found, Refused) else untrusted_failure(e)) from None
    return {"kind": "minimind", "path": str(source.path.resolve()), "sha256": sink.sha256.hexdigest()}
