"""Where an export reads and writes, for export.py (MiniMind's .pth, HF Qwen3) and adapter.py (PEFT) alike: the
checkpoint a path names (a step directory, a root's LATEST or newest, a pointer file), strictly validated; the
fresh --out directory and the temporary one beside it, written or removed whole (`writing`); ExportError. Torch-free.
"""
from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from minilmd.names import LATEST, MODEL_FILE, export_tmp_name


class ExportError(ValueError):
    """A checkpoint that cannot be read or a destination that cannot be written; the message says which file."""

    exit_status = 1


class OutRefused(ExportError):
    """An --out an export must not write: a usage error (exit 2), refused before anything is written."""

    exit_status = 2


class ExportNotWritten(ExportError):
    """Writing the export failed (the disk full, a quota, EIO): its temporary copy removed, nothing at --out; 74,
    EX_IOERR, as the trainer's own write failures."""

    exit_status = 74


def _is_write_error(e: Exception) -> bool:
    """An error of writing a file: an OSError, and what torch.save (a RuntimeError: "unexpected pos") and
    safetensors (SafetensorError: "I/O error") make of one."""
    if isinstance(e, (OSError, RuntimeError)):
        return True
    from safetensors import SafetensorError

    return isinstance(e, SafetensorError)


@contextlib.contextmanager
def writing(out: Path, tmp: Path) -> Iterator[None]:
    """Around the writing of an export into `tmp` and its publishing as `out`: a write that fails removes `tmp` and
    becomes ExportNotWritten, which says why and how much room is left, instead of a traceback with a half export
    beside --out."""
    try:
        yield
    except Exception as e:  # narrowed by _is_write_error: anything else is re-raised as it was
        if not _is_write_error(e):
            raise
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        try:
            free = f"; {shutil.disk_usage(out.parent).free / 1e6:,.1f} MB free there"
        except OSError:
            free = ""
        raise ExportNotWritten(f"{out}: the export could not be written ({e}){free}; nothing was left behind, so "
                               f"free some space (or choose another --out) and export again") from None


def out_and_tmp(out: str | Path) -> tuple[Path, Path]:
    """(--out, the temporary name beside it that is renamed onto it); OutRefused when either is a symbolic link,
    dangling or not: an export never writes through a link, nor renames onto one."""
    out = Path(out)
    tmp = out.with_name(export_tmp_name(out.name))
    for path in (out, tmp):
        if path.is_symlink():
            raise OutRefused(f"{path}: is a symbolic link; an export never writes through one: choose another --out")
    return out, tmp


def fresh_export_dir(out_dir: str | Path) -> tuple[Path, Path]:
    """(the export's directory, an empty temporary directory beside it to fill and publish_dir onto it); an
    existing --out that is not an empty directory is refused."""
    out_dir, tmp = out_and_tmp(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"{out_dir}: exists and is not an empty directory; choose a new --out")
    shutil.rmtree(tmp, ignore_errors=True)
    with writing(out_dir, tmp):
        tmp.mkdir(parents=True)
    return out_dir, tmp


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint directory, from a pointer file (ROOT/LATEST, ROOT/BEST: the one it
    names), or from a root: the one `LATEST` names, else the newest `step-*` directory with a manifest."""
    from minilmd.checkpoint_dirs import PointerError, list_checkpoints, named_checkpoint, read_latest

    try:
        path = named_checkpoint(path)  # ROOT/BEST: the lowest val loss (early_stop)
    except PointerError as e:
        raise ExportError(str(e)) from None
    if not path.is_dir():
        raise ExportError(f"{path}: no such checkpoint directory")
    if not (path / MODEL_FILE).is_file():
        name = read_latest(path)
        steps = list_checkpoints(path)
        if name and (path / name / MODEL_FILE).is_file():
            path = path / name
        elif steps:
            path = steps[-1]
        else:
            raise ExportError(f"{path}: not a checkpoint (no {MODEL_FILE}) and no {LATEST} or step-* "
                              f"checkpoint under it")
    return path


def _validate(ckpt: Path) -> None:
    from minilmd.checkpoint import CheckpointError, validate

    try:
        validate(ckpt)
    except CheckpointError as e:
        raise ExportError(f"checkpoint is invalid: {e}") from None
