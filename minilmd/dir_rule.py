"""The rule one directory on the way to a place keeps, in words when it does not: the place rule's per-directory
judgement (minilmd/place_rule.py: place_problem judges each directory by path with it, the walk on its descriptor).

- `dir_rule_problem`: root's, ours or `owners'`; not rearrangeable by other users (a sticky one of root's or ours
  is, a group of this user's alone is no other user: perms.others_can_write); `closed`, the target itself (run.dir):
  writable by no one else, sticky or not, and passing on no default ACL that lets another user write what is made
  in it (`inherited_acl_problem`, also where a missing target would be made).
- `owner_problem`: `team_root`'s rule of a run.remote's own directory, its owner alone.
- `fix_words`: the chmod that fixes a directory of ours others can write, said first.
Torch-free.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Set
from pathlib import Path

from minilmd.perms import (
    default_acl_writers,
    others_can_rearrange,
    others_can_write,
    owned_by_me,
    owned_by_me_or_root,
    user_words,
)


def dir_rule_problem(st: os.stat_result, above: Path, where: str, what: str, advice: str, *, team_above: bool,
                      owners: Set[int], acl_at: Path | int | None = None, reading: bool = False,
                      closed: bool = False) -> str | None:
    """The rule one directory on the way keeps (`st` as lstat or fstat saw it, `above` its path; `acl_at`: where
    its ACL is looked at, its descriptor for the walk): root's, ours or `owners`', not rearrangeable by others
    (`reading`: perms.others_can_write's); `closed`: not writable by others at all, sticky or not (run_dir_problem
    says why)."""
    mode = stat.S_IMODE(st.st_mode)
    sticky = bool(st.st_mode & stat.S_ISVTX)
    owner = user_words(st.st_uid) if not owned_by_me(st) else "you"  # named only in a refusal (a passwd lookup)
    if not owned_by_me_or_root(st, also=owners):
        why = " (sticky or not: its owner may remove or rename anything in it)" if sticky else ""
        return (f"{where} belongs to {owner}, who could replace {what} by a link to your files "
                f"or by a directory of his{why}; {advice}")
    acl = above if acl_at is None else acl_at
    if not owned_by_me_or_root(st) and not sticky and others_can_write(st, acl):
        return (f"{where} belongs to {owner} (the owner this share gives new files) and can be written by "
                f"others than its owner (mode {mode:o}), who could replace {what}; {advice}")
    if others_can_rearrange(st, acl, team=team_above, reading=reading):  # group members: others
        if sticky:  # so `owners`' (a sticky one of root's or ours passes): its owner rearranges it, sticky or not
            return (f"{where} belongs to {owner} (the owner this share gives new files) and can be written "
                    f"by other users (mode {mode:o}: sticky, but only a sticky directory of root's or yours is "
                    f"trusted, since its owner may remove or rename anything in it), who could replace {what}; "
                    f"{advice}")
        return (f"{where} can be written by other users (mode {mode:o}, not sticky), who could replace {what} by a "
                f"link to your files or by a directory of theirs; {fix_words(st, above, advice)}")
    if closed and others_can_write(st, acl):  # sticky, root's or ours: others_can_rearrange let it pass
        return (f"{where} can be written by other users (mode {mode:o}: sticky, which keeps them from removing or "
                f"renaming its files, not from making them first), who could make {what} before the run does, "
                f"as theirs; {fix_words(st, above, advice)}")
    return inherited_acl_problem(st, acl, above, where, what, advice) if closed else None


def inherited_acl_problem(st: os.stat_result, acl: Path | int, above: Path, where: str, what: str,
                          advice: str) -> str | None:
    """`closed`'s rule of what is made in a directory (the target; or one a missing target is made in, which passes
    its default ACL on to it): no default ACL that lets another user write it (perms.default_acl_writers). That ACL,
    not the umask, gives what is made there its mode: under run.share's umask 077 and `setfacl -d -m o::rwx`, the
    attempt logs' directory was 0757 and TensorBoard's event files 0646. Refused rather than a mode set on each
    file: the run's files and directories are made by name by the supervisor, the trainer and the libraries they
    call, most through the umask alone, and one missed would be one another user could rewrite (the umask is
    perms.apply's one policy). A default ACL that lets others read only passes. The fix said: `setfacl -k` (the
    whole default ACL), and where only named entries let others write, `setfacl -x` of those alone (the words
    docs/operations.md's upgrade note gives: a run.dir a version before this rule accepted is refused at its next
    start, exit 2)."""
    if not (found := default_acl_writers(st, acl)):
        return None
    entries = ",".join(found.named)
    if found.nfs4:  # an NFSv4 ACL: setfacl does not change it
        fix = ("remove its entries that pass write on (nfs4_getfacl DIR lists them, those with an f or d flag; "
               "nfs4_setfacl -x ENTRY DIR removes one)").replace("DIR", str(above))
        fix = f"{fix} (it is yours)" if owned_by_me(st) else f"have its owner {fix}"
    elif owned_by_me(st):
        fix = f"setfacl -k {above} (it is yours)" + (f", or setfacl -x {entries} {above} (those entries alone)"
                                                      if entries else "")
    else:
        fix = "have its owner remove it (setfacl -k" + (f", or setfacl -x {entries}" if entries else "") + ")"
    # the fix before the why: a supervisor keeps a trainer's refusal cut to its first 400 characters (death.py
    # _last_lines) in state.json and supervisor.log, where "setfacl -k" after the why was cut away
    acl_words = "an NFSv4 ACL whose inheritable entries let" if found.nfs4 else "a default ACL that lets"
    return (f"{where} has {acl_words} {found.who} write what is made in it, whatever the umask says; "
            f"{fix}, or {advice} ({what}, made there or below it, would be theirs to change)")


def fix_words(st: os.stat_result, above: Path, advice: str) -> str:
    """What to do about a directory of the rule's that others can write: the one-step chmod first when it is ours."""
    return f"chmod go-w {above} (it is yours), or {advice}" if owned_by_me(st) else advice


def owner_problem(st: os.stat_result, where: str, label: str, what: str, owners: Set[int]) -> str | None:
    """`team_root`'s rule for the target's own directory, whatever its mode: root's, ours or `owners'`. Its owner
    may chmod 700, rename or empty it at will: what minilmd puts there (a run.remote's only copies of the
    checkpoints, once scratch is given back) would be his to take away."""
    if owned_by_me_or_root(st, also=owners):
        return None
    owner = user_words(st.st_uid)
    return (f"{where} belongs to {owner}, not to you: its owner may take away {what} at will (chmod 700, rename or "
            f"empty it), so minilmd puts nothing there; have {owner} remove it (it is not yours to remove), or "
            f"choose another {label.removeprefix('the directory of ')}")
