"""A finished temporary directory (dirfd's `Dir.make_temp`) put in place of an output, replacing only what was checked.

`publish` renames such a directory into place (RENAME_NOREPLACE, or RENAME_EXCHANGE with what stood there),
checking identities (device, inode) on both sides: it replaces only the directory the caller checked earlier, and a
directory that is not the one expected is swapped back and left, never deleted; the old version, looked at again by
the caller's rule after the swap (`foreign`), is left whole when it holds more than it did (`Kept` says where and
why). Apart from minilmd/dirfd.py, whose `Dir` it uses only through its public methods: the swap, its undoing and
the old version's fate are one procedure of their own, used by prepare and export. Torch-free.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from minilmd.dirfd import Dir, Identity, Replaced
from minilmd.dirtree import fsync_tree


class Kept(NamedTuple):
    """An old version publish did not delete: where it is now, and why (what the caller's `foreign` said)."""
    where: Path
    why: str


def publish(parent: Dir, tmp: Dir, tmp_name: str, final: str, replaces: Identity | None, aside: str, *,
            foreign: Callable[[Dir], str] | None = None, keep_as: str | None = None) -> Kept | None:
    """The complete directory `tmp` (in `parent` at `tmp_name`) put at `final`, durably. `replaces`: the identity of
    the directory at `final` the caller checked (None: nothing may stand there). Replaced, with nothing lost,
    when a name leads elsewhere than expected; only the checked old version is deleted, after the swap, and
    only when `foreign(old)` (looked at again then, through its descriptor) says it holds nothing but the
    caller's (""): what was added to it since the caller's check (hours, for a prepare) is never deleted. Such
    an old version is left, at `keep_as` when that name is free: the Kept returned says where and why. `tmp` is
    closed once published."""
    fsync_tree(tmp.fd)
    if parent.identity_of(tmp_name) != tmp.identity:
        raise Replaced(f"{parent.path / tmp_name}: the temporary directory was replaced by another one")
    kept = None
    if replaces is None:
        if not parent.rename_new(tmp_name, final):
            raise Replaced(f"{parent.path / final}: appeared while this ran (it was not there when checked)")
        if parent.identity_of(final) != tmp.identity:  # swapped between the check and the rename: put back
            raise Replaced(f"{parent.path / tmp_name}: the temporary directory was replaced by another one; "
                           + _put_back(parent, final, tmp_name, "the directory found"))
    else:
        old = _replace(parent, tmp, tmp_name, final, replaces, aside)
        kept = _remove_old(parent, old, replaces, foreign, keep_as)
    os.fsync(parent.fd)
    tmp.close()  # published: no longer a temporary directory (discard leaves it)
    return kept


def _replace(parent: Dir, tmp: Dir, tmp_name: str, final: str, replaces: Identity, aside: str) -> str:
    """The swap: tmp at final, the old version (returned: its name now) beside it, both identities checked."""
    if parent.identity_of(final) != replaces:
        raise Replaced(f"{parent.path / final}: not the directory checked when this began (someone moved another "
                       "one there); nothing was replaced")
    if parent.exchange(tmp_name, final):
        old = tmp_name
    else:  # NFS: the old version aside first, put back if the second rename fails
        if not parent.rename_new(final, aside):
            raise Replaced(f"{parent.path / aside}: taken; nothing was replaced")
        if parent.identity_of(aside) != replaces:
            raise Replaced(f"{parent.path / final}: not the directory checked when this began; nothing was "
                           "replaced; " + _put_back(parent, aside, final, "the directory found"))
        try:
            parent.rename(tmp_name, parent, final)
        except BaseException:
            if not parent.rename_new(aside, final):
                raise Replaced(f"{parent.path / final}: the new version could not be put there, and the old one "
                               f"could not be put back: it is at {parent.path / aside}") from None
            raise
        old = aside
    if parent.identity_of(old) != replaces or parent.identity_of(final) != tmp.identity:
        put_back = _undo(parent, old, final)
        raise Replaced(f"{parent.path / final}: another directory was moved there while this ran; "
                       + ("it was put back and nothing was deleted" if put_back else
                          f"it could not be put back (it is at {parent.path / old}); nothing was deleted"))
    return old


def _put_back(parent: Dir, name: str, to: str, what: str) -> str:
    """`name` renamed back to `to`; the words that say whether it was."""
    if parent.rename_new(name, to):
        return f"{what} was put back"
    return f"{what} could not be put back (it is at {parent.path / name}, {parent.path / to} is taken)"


def _undo(parent: Dir, old: str, final: str) -> bool:
    """The swap undone: True when `old` is at `final` again."""
    try:
        if parent.exchange(old, final):
            return True
    except OSError:
        pass
    return parent.rename_new(old, final)


def _remove_old(parent: Dir, old: str, replaces: Identity, foreign: Callable[[Dir], str] | None,
                keep_as: str | None) -> Kept | None:
    """The old version `old` deleted when it still holds only the caller's (`foreign`); else left (at keep_as
    when free) and said. A tree that cannot be read, or is too deep for remove_tree, is left too."""
    why = ""
    try:
        with Dir.at(parent, old) as opened:
            if opened.identity != replaces:
                why = "not the directory checked when this began"
            elif foreign is not None:
                why = foreign(opened)
    except OSError as e:
        why = f"it cannot be looked at again ({e.strerror or e})"
    if not why:
        try:
            if parent.remove_tree(old, replaces):
                return None
            why = "it could not be removed whole"
        except OSError as e:  # a part it may not remove (another user's directory inside): the rest is left
            why = f"it could not be removed whole ({e.strerror or e})"
    if keep_as is not None and parent.rename_new(old, keep_as):
        old = keep_as
    return Kept(parent.path / old, why)
