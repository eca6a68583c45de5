"""init.from's MiniMind .pth read once, as another user's file on a share: in the directory resolve opened and
pinned (init_place.reopen: that very (device, inode) or none), through its descriptor, a regular file of that
directory's owner or ours (no link followed, never blocked on a FIFO), bounded by a state dict of the run's model
(`pth_bound`), and hashed as read. The trainer unpickles those bytes, staging writes them to its copy: what was
hashed is what is used, and a .pth swapped after the resolution, or its directory swapped by whoever can write
above it, is not read. `run --check` reads its tensors' shapes through the same descriptor, without torch
(pth_problems, pth_note: minilmd/pth_shapes.py), and compares them with the run's [model] by the trainer's rule.
Torch-free.
"""
from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

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
    from minilmd.init_place import owners_of, reopen
    from minilmd.untrusted import Unreadable, copy_regular

    bound = _bound(model)
    with reopen(source.path.parent, source.identity) as parent:  # a staged copy (no identity): this run's scratch
        owners = source.owners or owners_of(parent)
        try:
            copy_regular(source.path.name, sink, max_bytes=bound, dir_fd=parent.fd, owner=owners)
        except Unreadable as e:
            raise _refused(source, parent, e, owners, model, bound) from None
    return {"kind": "minimind", "path": str(source.path.resolve()), "sha256": sink.sha256.hexdigest()}


def pth_shapes_of(source: InitSource, model: dict) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of the .pth, read without torch (minilmd/pth_shapes.py: its zip's directory and data.pkl,
    not its tensors) through the descriptor `read_pth` reads it by, refused as read_pth refuses one (no link, its
    directory's owner's or ours, no larger than a .pth of the run's `model`); pth_shapes.NotReadHere for one that
    reader does not read (the trainer does, with torch). Raises as `read_pth` does. The same file is read once
    (_last_read), however many checks ask."""
    from minilmd.init_place import owners_of, reopen
    from minilmd.pth_shapes import NotReadHere, ResumeFile, pth_shapes
    from minilmd.untrusted import Unreadable, open_regular

    bound = _bound(model)
    with reopen(source.path.parent, source.identity) as parent:
        owners = source.owners or owners_of(parent)
        try:
            fd = open_regular(source.path.name, owner=owners, dir_fd=parent.fd)
        except Unreadable as e:
            raise _refused(source, parent, e, owners, model, bound) from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if st.st_size > bound:
                raise _too_big(source, model, bound)
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            last = _last_read
            found: dict[str, tuple[int, ...]] | tuple[type[NotReadHere | ResumeFile], str]
            if last is not None and last[0] == key:
                found = last[1]
            else:
                try:
                    found = pth_shapes(f)
                except (NotReadHere, ResumeFile) as e:  # what it is, said again as found
                    found = (type(e), str(e))
                _remember(key, found)
    if isinstance(found, tuple):  # a fresh one each time: one raised again grows its traceback, keeps its frames
        raise found[0](found[1])
    return dict(found)  # the caller's own: pth_problems pops the head from it


_last_read: tuple[tuple, Any] | None = None
"""The last .pth whose shapes pth_shapes_of read: (its file's identity: device, inode, size, mtime, ctime, as fstat
said on the descriptor opened; its shapes, or the type and words of the NotReadHere or ResumeFile it raised, never
the exception itself: raised again, one instance grew its traceback and kept its frames alive). `run --check` asks
twice (pth_problems, then pth_note for its note): a .pth of gigabytes on NFS was read and unpickled twice. The file
is opened and looked at each time (a .pth replaced since, or changed in place, has another identity and is read
again); only its reading is not repeated. One entry: a long-lived supervisor keeps no more."""


def _remember(key: tuple, found: Any) -> None:
    global _last_read
    _last_read = (key, found)  # one assignment: a check in another thread sees the old entry or this one


def pth_problems(source: InitSource, model: dict, written: Callable[[str], bool]) -> list[str]:
    """What keeps the .pth from initialising a model of `model` (the run's [model]), in the trainer's words and by
    its rule (init_model.shapes_mismatch; `written`: which model keys the run's config sets), found without torch:
    its tensors of another model, a head other than its embedding. [] where its shapes fit, or are not read here
    (`pth_note` says so). Raises as `read_pth` does."""
    from minilmd.init_model import HEAD_NOT_TIED, resume_file, shapes_mismatch, unwrapped
    from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY
    from minilmd.pth_shapes import NotReadHere, ResumeFile

    try:
        shapes, _ = unwrapped(pth_shapes_of(source, model))  # a DDP or torch.compile save: its keys prefixed
    except ResumeFile:
        return [resume_file(source.path.name)]
    except NotReadHere:
        return []
    head = shapes.pop(TIED_HEAD_KEY, None)
    if head is not None and EMBED_KEY in shapes and head != shapes[EMBED_KEY]:  # by shape: the trainer by value
        return [HEAD_NOT_TIED]
    mismatch = shapes_mismatch(shapes, model, written, source.path)
    return [mismatch] if mismatch else []


def pth_note(source: InitSource, model: dict) -> str:
    """Why the .pth's shapes are not compared with the run's model here (pth_shapes.NotReadHere: the legacy
    torch.save format, a pickle of more than a state dict, a damaged zip), or that its keys carry a wrapper's
    prefix, stripped (init_model.unwrapped), for `run --check`'s note; "" when neither (or it cannot be read: the
    check says that)."""
    from minilmd.init_model import unwrapped, wrapper_words
    from minilmd.pth_shapes import NotReadHere

    try:
        return wrapper_words(unwrapped(pth_shapes_of(source, model))[1])
    except NotReadHere as e:
        return f"its tensors' shapes are not checked here: {e}; the trainer checks them at start"
    except (ValueError, OSError):
        pass
    return ""


def minimind_lora_file(path: str | os.PathLike) -> str:
    """init_model.minimind_lora's words of the file at `path` (one a command was given where it takes a checkpoint
    directory: `sample --lora`) when it is a MiniMind LoRA adapter, read as `pth_shapes_of` reads one (no link
    followed, never blocked, only its directory and data.pkl, bounded); "" for any other file or one not read."""
    from minilmd.init_model import minimind_lora
    from minilmd.pth_shapes import pth_shapes
    from minilmd.untrusted import Unreadable, open_regular

    try:
        with os.fdopen(open_regular(path), "rb") as f:
            return minimind_lora(pth_shapes(f), path)
    except (Unreadable, ValueError, OSError):
        return ""


def _bound(model: dict | None) -> int:
    from minilmd.model_shapes import pth_bound

    return pth_bound(model) if model is not None else MAX_PTH_BYTES


def _refused(source: InitSource, parent, e, owners, model: dict | None, bound: int) -> Exception:
    """An untrusted.Unreadable of the .pth in `parent` (an init_place Dir) as read_pth raises it."""
    from minilmd.init_place import Refused, refusal

    if e.kind == "too_big":  # its size, looked at before a byte is read
        return _too_big(source, model, bound)
    found = refusal(parent, source.path.name, e, owners)  # a link, a FIFO, a third user's file: named
    return InitSourceError(str(found)) if isinstance(found, Refused) else untrusted_failure(e)


def _too_big(source: InitSource, model: dict | None, bound: int) -> InitSourceTooBig:
    from minilmd.init_model import resume_file
    from minilmd.untrusted import size_text

    limit = "a state dict of this run's model can be" if model is not None else "init.from's .pth may be"
    resume = f"; {resume_file(source.path.name)}" if source.path.name.endswith("_resume.pth") else ""
    return InitSourceTooBig(f"{source.path}: over {size_text(bound)}, more than {limit}{resume}")
