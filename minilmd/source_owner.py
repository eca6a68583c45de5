"""Whose is what a command loads from a place the user names: one rule for a prepared corpus (data.prepared,
corpus_meta.owner_note) and a checkpoint (init.from's, export's: checkpoint_note, false_claim; status's lineage:
owner_words).

Another user's corpus or checkpoint is loaded by design (a teammate's shared model), but said, with who owns it,
by `run --check`, the run's start (its log and state.json's notes, which `status` shows) and `export`: the place
itself when another user owns it, and every directory above it that another user owns or can rearrange (group
members count as others; a sticky one of root's or ours is fine, as the place rule has it: perms.others_can_rearrange),
since whoever can do either can put his own files at that name (audit 11 F2: a teammate renamed the victim's team
directory away and put a copy of her remote there with his own weights; init.from and export loaded it in silence,
where her own run refused that remote). Such a place is not refused: naming it is the opt-in, as for a corpus.

One thing is refused: a checkpoint whose trainer_state.json is another user's file while it names one of your own
run directories (its config.run.dir, a directory of yours): your run writes its checkpoints as you, so that is a
copy claiming to be your run's (false_claim). Root's files are trusted here as by every other rule. But not one owned
by a squash uid (perms.squash_uids: nobody's 65534, the kernel's overflow uid): a share that squashes every user
(NFS all_squash; root_squash for a run as root) gives the user's own synced checkpoint that owner, and a user
namespace shows it for any owner it does not map, so it proves no other user wrote the file: such a claim is
loaded, and the checkpoint's note says that who wrote it cannot be told (before: the user's own run's checkpoint on
an all_squash share was refused as another user's copy). Torch-free.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path

from minilmd.perms import (
    others_can_rearrange,
    owned_by_me,
    owned_by_me_or_root,
    owner_in,
    squash_uids,
    user_words,
)

MAX_ABOVE_SAID = 4
"""The most directories above a place one note names (a path is a handful deep)."""


def whose(st: os.stat_result) -> str:
    """"is yours" or "belongs to user X (uid N)"."""
    return "is yours" if owned_by_me(st) else f"belongs to {user_words(st.st_uid)}"


def whose_checkpoint(st: os.stat_result) -> str:
    """whose(), and for a squash uid's file why that names no one (a claim of it is not refused: false_claim)."""
    if squashed(st):
        return (f"{whose(st)}, the share's squash uid (or a user namespace's unmapped owner): who wrote it cannot be "
                f"told")
    return whose(st)


def owner_words(path: str | os.PathLike) -> str:
    """For a line naming a checkpoint (or .pth) whose trainer_state.json was read as another run's (status's
    lineage: daemon/phases/initwait.py): "belongs to user X (uid N)" where it is neither yours nor root's; "" otherwise
    and where it cannot be looked at (a recorded path gone, a NUL in it)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return ""
    return "" if owned_by_me_or_root(st) else whose(st)


def squashed(st: os.stat_result) -> bool:
    """The file's owner is a squash uid (perms.squash_uids): it says no one in particular wrote it."""
    return owner_in(st, squash_uids())


def above_words(path: str | os.PathLike, named: Collection[int] = ()) -> list[str]:
    """What another user could do above `path` (its real path: a link of the user's on the way is her word, the
    directories it leads through are judged): each directory above it of another user (once per user, the highest:
    he controls everything below it; none of `named`, already said) and each that another user can rearrange
    ("can be written by other users (mode 2775, not sticky)"). Missing or unreadable directories say nothing."""
    said: list[str] = []
    owners = set(named)
    real = Path(os.path.realpath(path))
    for above in reversed(real.parents):
        try:
            st = os.lstat(above)
        except OSError:
            return said
        if not stat.S_ISDIR(st.st_mode) or len(said) >= MAX_ABOVE_SAID:
            return said
        if not owned_by_me_or_root(st):
            if not owner_in(st, owners):
                said.append(f"the directory {above} above it belongs to {user_words(st.st_uid)}")
                owners.add(st.st_uid)
        elif others_can_rearrange(st, above):
            said.append(f"the directory {above} above it can be written by other users (mode "
                        f"{stat.S_IMODE(st.st_mode):o}, not sticky)")
    return said


def checkpoint_note(key: str, path: str | os.PathLike) -> str:
    """One line when the checkpoint at `path` (a step directory, or a .pth) is another user's or sits below a
    directory another user owns or can rearrange ("init.from = '/x': its checkpoint /x/step-00000300 belongs to user
    mal (uid 1002), the directory /x above it ...: loaded as it is ..."); "" when it and every directory above it
    are yours or root's, or it cannot be looked at (the checks say that). `key`: what names it ("init.from =
    '/x'"; "": none)."""
    try:
        top = os.stat(path)
    except OSError:
        return ""
    said = [] if owned_by_me_or_root(top) else [f"its checkpoint {path} {whose_checkpoint(top)}"]
    said += above_words(path, {top.st_uid})
    if not said:
        return ""
    return _keyed(key, f"{', '.join(said)}: loaded as it is (another user's checkpoint is allowed, as a teammate's "
            f"shared model is); whoever owns or can write these can put other weights there: check it is the one "
            f"you mean")


def false_claim(where, key: str) -> str:
    """Why the checkpoint directory `where` (an init_place Dir, the one resolve judged or export names) must not be
    loaded: its trainer_state.json is another user's file (not yours, not root's, not a squash uid's: `squashed`, whose
    writer cannot be told, said by checkpoint_note) and names as its run directory one of yours. "" otherwise, and
    when it cannot be read here (its readers say why)."""
    from minilmd.names import TRAINER_STATE
    from minilmd.names import TRAINER_STATE_MAX_BYTES as MAX_STATE
    from minilmd.untrusted import loads, open_regular, printable, read_open

    try:
        fd = open_regular(TRAINER_STATE, dir_fd=where.fd)
        try:
            st = os.fstat(fd)
            if owned_by_me_or_root(st) or squashed(st):
                return ""
            state = loads(read_open(fd, where.path / TRAINER_STATE, max_bytes=MAX_STATE))
        finally:
            os.close(fd)
    except (OSError, ValueError):  # Unreadable too
        return ""
    config = state.get("config")
    run = config.get("run") if isinstance(config, dict) else None
    run_dir = run.get("dir") if isinstance(run, dict) else None
    if not isinstance(run_dir, str) or not run_dir or not _your_directory(run_dir):
        return ""
    return _keyed(key, f"{where.path / TRAINER_STATE} {whose(st)}, yet it names your run directory "
            f"{printable(run_dir)}: a copy claiming to be your run's checkpoint (your run writes its checkpoints as "
            f"you), not loaded: see who put it at {where.path.parent}")


def _your_directory(path: str) -> bool:
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL in it
        return False
    return stat.S_ISDIR(st.st_mode) and owned_by_me(st)


def claim_checked(source):
    """init.from's resolved `source` (an init_kinds.InitSource), returned as it is unless it is a checkpoint in
    another user's place whose trainer_state.json is a false_claim: then InitSourceError saying so (final: the
    config check refuses it, staging and the trainer never load it). Read in the directory resolve judged
    (init_place.reopen); a source in a place of yours alone is not read again here."""
    from minilmd.init_kinds import InitSourceError
    from minilmd.init_place import reopen

    if source.kind != "checkpoint" or len(source.owners) < 2:  # owners_of: yours alone, or the place's owner too
        return source
    with reopen(source.path, source.identity) as ckpt:  # a Moved one: resolve's OSError, unreachable now
        if problem := false_claim(ckpt, ""):
            raise InitSourceError(problem)
    return source


def named_checkpoint_words(path: str | os.PathLike, key: str) -> tuple[str, str]:
    """(checkpoint_note, false_claim) of the checkpoint directory at `path` a command loads by its own name
    (`minilmd export`): the note to say, and "" or why it must not be loaded. Nothing to say of what cannot be
    opened here (the command's own read says why)."""
    from minilmd.init_place import open_named

    note = checkpoint_note(key, path)
    try:
        with open_named(path) as ckpt:
            return note, false_claim(ckpt, key)
    except OSError:
        return note, ""


def _keyed(key: str, words: str) -> str:
    return f"{key}: {words}" if key else words
