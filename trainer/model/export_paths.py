"""Where an export reads and writes, for export.py (MiniMind's .pth, HF Qwen3) and adapter.py (PEFT) alike: the
checkpoint taken (which one a path names: export_source.py) strictly validated once (`validated_checkpoint`); the
fresh --out and the temporary copy beside it, named by this process, made by it and removed again on every way out
but its publishing (`writing`), and what killed exports left there (`_clear_leftovers`); ExportError and its exit
statuses. The directory of --out must be one no other user can rearrange (minilmd/dirfd.py's rule, prepare's): it is
opened once, and the copy made, written, published and removed through descriptors (ExportCopy), never by a name
someone could replace by a link to the victim's files or by a FIFO. Torch-free but for the tensors read from
validated bytes (validated_tensors).
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from minilmd import leftovers, perms
from minilmd.dirfd import OPEN_NEW, Dir, Identity, NameHeld, PlaceRefused, Replaced, temp_name
from minilmd.dirpublish import publish
from minilmd.fsio import DISK_FULL_ERRNOS, open_out_parent, others_entry, out_parent_problem
from minilmd.protocol import COMMAND_FAILED, EXIT_CONFIG, EXIT_IO
from minilmd.tmpnames import aside_name, export_tmp_maker, export_tmp_name, old_export_tmp_name
from minilmd.untrusted import Unreadable, holds_any

if TYPE_CHECKING:
    from minilmd.checkpoint import Validated


class ExportError(ValueError):
    """A checkpoint that cannot be read or a destination that cannot be written; the message says which file."""

    exit_status = COMMAND_FAILED


class OutRefused(ExportError):
    """An --out an export must not write: a usage error (exit 2), refused before anything is written."""

    exit_status = EXIT_CONFIG


class ExportNotWritten(ExportError):
    """Writing the export failed (the disk full, a quota, no permission, a read-only or failing file system): its
    temporary copy removed, nothing at --out; 74, EX_IOERR, as the trainer's own write failures. The message says
    which: only a full disk or a quota is told to free space."""

    exit_status = EXIT_IO


_WHAT_TO_DO = {
    errno.EACCES: "choose an --out you may write",
    errno.EPERM: "choose an --out you may write",
    errno.EROFS: "choose an --out on a writable file system",
}


def _write_errno(e: BaseException) -> int | None:
    """The errno of a write error: an OSError's; the OSError torch.save's RuntimeError was raised while handling
    (it writes through the file object it is given); the `(os error N)` a SafetensorError's message ends with."""
    seen: BaseException | None = e
    for _ in range(8):  # a chain of causes, never a loop
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    found = re.search(r"\(os error (\d+)\)", str(e))
    return int(found.group(1)) if found else None


def _is_write_error(e: Exception) -> bool:
    """An error of writing a file: an OSError, or what torch.save and safetensors make of one. Anything else (a
    bug) is not reported as the disk's fault."""
    if isinstance(e, OSError) or _write_errno(e) is not None:
        return True
    from safetensors import SafetensorError

    return isinstance(e, SafetensorError) and "I/O error" in str(e)


def not_written(out: Path, e: BaseException) -> ExportNotWritten:
    """What a write error means for the export: a full disk or quota with the room left there; anything else (no
    permission, a read-only file system, EIO) said as what it is."""
    code = _write_errno(e)
    if code in DISK_FULL_ERRNOS:
        try:
            free = f"; {shutil.disk_usage(out.parent).free / 1e6:,.1f} MB free there"
        except OSError:
            free = ""
        return ExportNotWritten(f"{out}: the export could not be written ({e}){free}; nothing was left behind, so "
                                f"free some space (or choose another --out) and export again")
    # an OSError's own text names the file it met: the temporary copy's random name, not the --out the user typed
    what = os.strerror(code) if isinstance(e, OSError) and code else f"{os.strerror(code)}: {e}" if code else str(e)
    todo = _WHAT_TO_DO.get(code or 0, "export again, or choose another --out")
    if isinstance(e, NameHeld):  # another user's name in a sticky directory: whose it is, not "not permitted"
        what, todo = e.strerror or what, e.what_to_do
    return ExportNotWritten(f"{out}: the export could not be written: {what}; nothing was left behind; {todo}")


class CheckpointNotRead(ExportError):
    """A checkpoint place that could not be read (no permission, EIO on a share): 74, EX_IOERR, nothing written."""

    exit_status = EXIT_IO


def not_read(checkpoint: str | Path, e: OSError) -> CheckpointNotRead:
    """What a read error of the checkpoint (or of the run's scratch or run.remote it stands for) means, in one line:
    the place, what the system said and, when the permission is missing, whose that place is (a run.remote another
    user owns is his to chmod 700: `_owner_words`)."""
    where = f" ({e.filename})" if e.filename else ""
    owner = _owner_words(e.filename) if e.errno in (errno.EACCES, errno.EPERM) and e.filename else ""
    todo = ("have its owner give you read permission back, or export another copy of the checkpoint" if owner
            else "fix the disk, the share or its permissions, then export again")
    return CheckpointNotRead(f"{checkpoint}: the checkpoint could not be read: {e.strerror or e}{where}{owner}; "
                             f"nothing was written; {todo}")


def _owner_words(path: str | os.PathLike) -> str:
    """"; X belongs to user mal (uid 1002)": the nearest place on the way to `path` that can be looked at (the
    file itself, or the directory that lets no one through), when it is not this user's; "" when it is."""
    here = Path(os.path.abspath(path))
    for place in [here, *here.parents]:
        try:
            st = os.lstat(place)
        except OSError:
            continue
        return "" if perms.owned_by_me(st) else f": {place} belongs to {perms.user_words(st.st_uid)}"
    return ""


def foreign_out_dir(out: Path, st: os.stat_result) -> str:
    """Why an existing --out directory (as lstat saw it) is not this export's to replace ("" when it is this
    user's): another user's, made first. An export replaces only an empty directory of the user's own: publishing
    would delete another's (in a sticky directory the rename fails anyway: EPERM, "not permitted", said before
    without whose it is)."""
    if perms.owned_by_me(st):
        return ""
    return (f"{out}: a directory of {perms.user_words(st.st_uid)}, made before this export: an export replaces only "
            f"an empty directory of yours, never another user's; choose a new --out, or have its owner remove it")


OUT_ADVICE = ("choose an --out in a directory only you (and root) can change, or pass --group-share to export into a "
              "team directory anyway (docs/operations.md)")
class ExportCopy:
    """This export's temporary copy beside --out (`writing`): a 0700 directory with a random name (Dir.make_temp),
    made in the directory of --out opened once and checked (`parent`). Everything is written through `inside`
    (/proc/self/fd/N: the directory the descriptor holds, whatever its name leads to now), and published by a
    rename at the parent's descriptor: never through a name someone could have replaced by a link or a FIFO."""

    def __init__(self, out: Path, parent: Dir, tmp: Dir, name: str):
        self.out, self.parent, self.tmp, self.name = out, parent, tmp, name

    @property
    def inside(self) -> Path:
        return self.tmp.inside

    def new_file(self, name: str) -> BinaryIO:
        """A new file `name` inside the copy, made exclusively (O_EXCL, no link followed), open for writing."""
        return os.fdopen(os.open(name, OPEN_NEW, 0o666, dir_fd=self.tmp.fd), "wb")

    def publish_dir(self) -> Path:
        """The complete copy itself renamed onto --out, durably (dirpublish.publish: identities checked on both sides).
        An empty directory at --out is replaced, and removed only while it is still empty; anything else there is
        refused (fresh_export_dir said so before the export began)."""
        replaces = self._empty_out()
        self.tmp.mode_self(0o777 & ~perms.current_umask())  # what mkdir gave the copy before: --share's policy
        kept = publish(self.parent, self.tmp, self.name, self.out.name, replaces, aside=aside_name(self.name),
                       foreign=_not_empty)
        if kept is not None:
            _SAY(f"{self.out}: the empty directory it replaced was not deleted ({kept.why}): it is at {kept.where}")
        return self.out

    def publish_file(self, name: str) -> Path:
        """The complete file `name` of the copy renamed onto --out (replacing a file there, as an export always
        did), at the descriptors, durably; Replaced when the copy's name no longer leads to this copy. Another user's
        entry at --out is never replaced, --force or not (fsio.others_entry: looked at first by `others_out`)."""
        if held := others_entry(self.parent, self.out):
            raise OutRefused(f"{held}; nothing was written")
        if self.parent.identity_of(self.name) != self.tmp.identity:
            raise Replaced(f"{self.out.parent / self.name}: the temporary directory was replaced by another one")
        self.tmp.rename(name, self.parent, self.out.name)
        os.fsync(self.parent.fd)
        return self.out

    def _empty_out(self) -> Identity | None:
        """The identity of the empty directory at --out (None: nothing there), looked at through the parent."""
        st = self.parent.lstat(self.out.name)
        if st is None:
            return None
        if stat.S_ISDIR(st.st_mode):
            if theirs := foreign_out_dir(self.out, st):
                raise OutRefused(f"{theirs}; nothing was published")
            with Dir.at(self.parent, self.out.name) as there:
                if not _not_empty(there):
                    return there.identity
        raise ExportError(f"{self.out}: exists and is not an empty directory; choose a new --out")


def _not_empty(there: Dir) -> str:
    """dirpublish.publish's `foreign` for the empty --out an export replaces: why it may not be deleted ("" when
    empty)."""
    return "it is no longer empty" if holds_any(there.fd) else ""


@contextlib.contextmanager
def writing(out: Path, group_share: bool = False) -> Iterator[ExportCopy]:
    """This export's temporary copy beside `out`, made for the export (ExportCopy) and removed again on every way
    out but its publishing: a write error (then ExportNotWritten, `not_written`), any other exception, Ctrl-C or
    SIGTERM (the CLI raises KeyboardInterrupt for it). Only its own descriptor is emptied, and its name removed only
    while it leads to it. Then the temporary copies of other exports to `out` are looked at (`_clear_leftovers`):
    made first, so that of two exports started at once at least one sees the other. `out` itself is never touched
    here. A copy replaced by someone (Replaced) is an ExportError: nothing was published. `group_share`: the
    directory of --out is a team directory (`_open_parent`); there a name proves nothing, so no leftover is
    removed (prepare --group-share's rule): a killed export's copy is the user's to remove by hand."""
    with _open_parent(out, group_share) as parent:
        try:
            tmp, name = parent.make_temp(export_tmp_name(out.name, *leftovers.me()))
        except Replaced as e:
            raise ExportError(f"{e}; nothing was written. Check who moves things in {out.parent}") from None
        except OSError as e:
            raise not_written(out, e) from None
        try:
            if not group_share:
                _clear_leftovers(parent, out, name)
            yield ExportCopy(out, parent, tmp, name)
        except Replaced as e:
            raise ExportError(f"{e}; nothing was published. Check who moves things in {out.parent}") from None
        except Exception as e:
            if _is_write_error(e):
                raise not_written(out, e) from None
            raise
        finally:
            parent.discard(tmp, name)


def _open_parent(out: Path, group_share: bool = False) -> Dir:
    """The directory of --out, made when missing and opened once (Dir.open); OutRefused (exit 2, nothing written)
    when another user could rearrange it or a directory above it (minilmd/dirfd.py's rule, prepare's): he could
    put a link to the victim's directory where the export writes, or a FIFO where it publishes. `group_share`
    (--group-share) waives the rule for the directory of --out alone, a team directory: the copy is made in it
    0700 with a random name and published by its descriptor, identities checked (Dir.make_temp, dirpublish.publish)."""
    try:
        return open_out_parent(out, "--out", "the export", OUT_ADVICE, group_share=group_share)
    except PlaceRefused as e:
        raise OutRefused(f"{e}; nothing was written") from None
    except OSError as e:
        raise not_written(out, e) from None


_SAY = leftovers.stderr_say("export")
_WORDS = leftovers.Words(one="an export", tool="export", thing="temporary copy")


def _clear_leftovers(parent: Dir, out: Path, ours: str) -> None:
    """The other exports' temporary copies beside `out`, each named by its maker (tmpnames.export_tmp_name), looked at
    and removed in `parent`, the directory of --out opened once (through its descriptor, each only while its name leads
    to what was looked at: leftovers.sweep's Dir). One whose export still runs (its pid alive with the start time the
    name records) is left, and this export refused: two exports to one --out at once would publish over each other. One
    whose export is gone (a SIGKILL, an OOM kill, a power loss leave it; a recycled pid has another start time, a
    process of a later boot another boot) is removed when it is this user's own file or directory, and said. Left as
    they are, and said, while this export goes on under its own name: a symbolic link (never followed), another user's
    copy (never deleted for them), anything but a file or a directory, another host's copy (its pid says nothing here),
    and an older minilmd's `.NAME.tmp`. The loop is leftovers.sweep, shared with the clean-ups of prepare, append and a
    checkpoint root."""
    def refuse(path: Path, pid: int) -> None:
        raise OutRefused(f"{path}: another export to {out} is writing it now (pid {pid}); two exports to one --out "
                         f"at once are refused: let it finish, or choose another --out")

    leftovers.sweep(parent, lambda name: export_tmp_maker(out.name, name), _WORDS, _SAY, out=out,
                    skip=ours, on_running=refuse)
    old = old_export_tmp_name(out.name)  # an older minilmd's `.NAME.tmp`: it names no process
    st = parent.lstat(old)
    if st is None:
        return
    if stat.S_ISLNK(st.st_mode):
        leftovers.own(out.parent / old, st, _WORDS, _SAY)  # says it is a link, left
    else:
        _SAY(f"{out.parent / old}: an older minilmd's temporary copy, which does not say whose it is; left as it is: "
             f"remove it once no export to {out} is running")


def others_out(out: Path, group_share: bool = False) -> str | None:
    """fsio.others_entry of --out up front, before the checkpoint is read and converted (publish_file looks again)."""
    if not os.path.lexists(out):
        return None
    with _open_parent(out, group_share) as parent:
        return others_entry(parent, out)


def pth_out_problem(out: str | Path) -> str | None:
    """Why --out cannot name --format minimind's one .pth file: it is a directory, or ends with "/" (said before
    the checkpoint is read; before, `OUT already exists; pass --force`, then with --force `Is a directory`). hf and
    peft write the directory --out names, the .pth is the file --out names: never a file put inside it."""
    text = str(out)
    if not (text.endswith(("/", os.sep)) or os.path.isdir(text)):
        return None
    return (f"--out {text} is a directory: --format minimind writes one file, the .pth, and --out names that file "
            f"(e.g. --out {Path(text) / 'model.pth'}); nothing was written")


def checked_out(out: str | Path, group_share: bool = False) -> Path:
    """--out, checked before anything is read or written: OutRefused when it is a symbolic link, dangling or not
    (an export never writes through a link, nor renames onto one), when its name leaves no room for the temporary
    copy's beside it (tmpnames.export_tmp_name and Dir.make_temp's random suffix), or when others could rearrange the
    directory it goes in, unless `group_share` (fsio.out_parent_problem: the walk `_open_parent` opens it by)."""
    out = Path(out)
    tmp = out.with_name(temp_name(export_tmp_name(out.name, *leftovers.me()), "0" * 8))
    for path in (out, tmp):
        try:
            linked = stat.S_ISLNK(os.lstat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:  # the temporary name is some 40 characters longer than --out's
                raise OutRefused(f"{out}: its name is too long for the temporary copy an export writes beside it "
                                 f"({tmp.name}); choose a shorter --out") from None
            raise not_written(out, e) from None
        if linked and path == out:
            raise OutRefused(f"{path}: is a symbolic link; an export never writes through one: choose another --out")
    if problem := out_parent_problem(out, "--out", "the export", OUT_ADVICE, group_share=group_share):
        raise OutRefused(f"{problem}; nothing was written")
    return out


def fresh_export_dir(out_dir: str | Path, group_share: bool = False) -> Path:
    """checked_out's --out for an export directory: an existing one that is not an empty directory, or another
    user's (foreign_out_dir), is refused (ExportCopy.publish_dir looks again, through the directory of --out, when
    it publishes)."""
    out_dir = checked_out(out_dir, group_share)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        if stat.S_ISDIR((st := os.lstat(out_dir)).st_mode) and (theirs := foreign_out_dir(out_dir, st)):
            raise OutRefused(f"{theirs}; nothing was written")
    if out_dir.exists() and (not out_dir.is_dir() or holds_any(out_dir)):
        raise OutRefused(f"{out_dir}: exists and is not an empty directory; choose a new --out")
    return out_dir


def validated_checkpoint(ckpt: Path) -> Validated:
    """The one strict validation of a checkpoint an export or a loader makes (checkpoint.validated_weights: each
    file read once, no link followed, no mmap), and what that read found: the trainer_state parsed from the very
    bytes hashed, the weights file's bytes as hashed and scanned. Everything is then taken from this answer, never
    from the checkpoint's path read again: a checkpoint of another user's or of a shared remote may have a
    consistent manifest and other files put in place the moment a validation is done, and on NFS a second read is
    the seconds of the first again. First, before anything of the checkpoint is parsed (its JSON may be hostile)."""
    from minilmd.checkpoint import CheckpointError, validated_weights

    try:
        return validated_weights(ckpt)
    except CheckpointError as e:
        raise ExportError(f"checkpoint is invalid: {e}") from None


def validated_tensors(checked: Validated) -> dict:
    """The weights `validated_checkpoint` read, deserialized from its bytes."""
    from safetensors.torch import load

    return load(checked.weights)


def read_explicit(path: Path, max_bytes: int) -> bytes:
    """The --tokenizer file (tokenizer_files.find_tokenizer): its links followed by the one link rule of the sources
    (minilmd/corpus/sources/local.py read_source: a teammate's link to the user's private file is refused), then
    read as untrusted (a regular file, of at most max_bytes: a FIFO or a device named by mistake is refused, never
    opened)."""
    from minilmd.corpus.sources.local import LinkRefused, read_source

    try:
        return read_source(path, max_bytes=max_bytes)[0]
    except LinkRefused as e:
        raise ExportError(f"--tokenizer {path}: {e}") from None
    except Unreadable as e:
        raise ExportError(f"--tokenizer {path}: {'no such file' if e.missing else e.why}") from None
