"""The place rule: where minilmd may create files that others must not redirect (scratch, the GPU lock directory,
an output's directory, a run.remote, run.dir), and the walk that opens such a directory under that same rule.

- `place_problem(label, target, ...)` judges by path: every directory on the way to `target` root's or this user's
  (or `owners`'), none that another user can rearrange (group members count as others, unless the group is this
  user's alone: perms.private_group; a sticky one of root's or ours is fine, like /tmp); a link on the way refused,
  or followed when root's or ours (`own_links`). Opt-ins: `group_share` waives target's own directory (a team
  directory, touched only through its descriptor), `team_above` lets the directories above be group-writable
  (still root's or ours): a run.remote's. A judgement by path alone is a moment's: a group member who may write a
  team directory above the target can rename a directory on the way and put his own there right after it.
- `open_walked(path, ...)` therefore opens the directory component by component from "/" (openat, no link
  followed), each directory judged again by the same rule on what its descriptor holds (fstat): a directory
  swapped in after place_problem passed is one of another owner, or a link now, and refused (PlaceRefused).
  minilmd/dirfd.py's Dir.open uses both. Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Set
from pathlib import Path

from minilmd.perms import others_can_rearrange, owned_by_me, owned_by_me_or_root

WALK_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How the walk opens each directory on the way: no link followed, no read permission needed (a 0711 home)."""


class PlaceRefused(ValueError):
    """A directory minilmd will not create files in (the message says why and what to do): a config error, exit 2."""


def user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _lstat(path: Path) -> os.stat_result | None:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        return os.lstat(path)
    return None


def _link_target(path: Path) -> str:
    with contextlib.suppress(OSError):
        return os.readlink(path)
    return "?"


def place_problem(label: str, target: str | os.PathLike, what: str, advice: str, *, dir_itself: bool = False,
                  own_links: bool = False, group_share: bool = False, team_above: bool = False,
                  links: int = 0, owners: Set[int] = frozenset()) -> str | None:
    """Why someone else could put another directory, or a link, where `target` is: a symbolic link on the way
    (followed only with `own_links`, and only a link of root's or ours), or a directory above it (and target
    itself with `dir_itself`) that another user owns or can write (sticky ones of root or of this user excepted).
    `what` names what is at stake in the message ("the scratch"), `advice` ends it. Missing directories are fine:
    the caller makes them. `group_share`: the last directory checked may be a team directory others write (its
    owner opted in). `team_above`: every directory checked may be group-writable (team directories on the way to a
    run.remote; still root's or ours, not world-writable unless sticky). `owners`: more uids counted as ours (as
    Dir.owners; a squashing share's), for a directory that no one but its owner may write (or sticky). None: the
    path stays where it is."""
    path = Path(os.path.abspath(target))
    chain = [*reversed(path.parents)] + ([path] if dir_itself else [])
    for above in chain:
        st = _lstat(above)
        if st is None:
            return None
        where = f"{label} {target}: the directory {above}" + ("" if above == path else " above it")
        if stat.S_ISLNK(st.st_mode):
            if own_links and (owned_by_me_or_root(st) or st.st_uid in owners) and links < 8:
                real = Path(os.path.realpath(above))
                rest = real if above == path else real / path.relative_to(above)
                return place_problem(label, rest, what, advice, dir_itself=dir_itself, own_links=True,
                                     group_share=group_share, team_above=team_above, links=links + 1, owners=owners)
            return (f"{where} is a symbolic link (to {_link_target(above)}): minilmd follows no link on the way to "
                    f"{what}, since whoever can change it chooses where the files go; {advice}")
        if not stat.S_ISDIR(st.st_mode):
            return None  # the caller says that a file is in the way
        if group_share and above == chain[-1]:
            continue
        if problem := _dir_rule_problem(st, above, where, what, advice, team_above=team_above, owners=owners):
            return problem
    return None


def dir_problem(label: str, path: str | os.PathLike, what: str) -> str | None:
    """place_problem for a directory minilmd writes files in (a Prometheus textfile directory): it and every
    directory above it root's or ours, none rearrangeable by other users (sticky is fine). A missing one is fine
    when what is above it is."""
    return place_problem(label, path, what, "choose a directory only you (and root) can change", dir_itself=True,
                         own_links=True)


RUN_DIR_ADVICE = ("set run.dir to a directory only you (and root) can change{home} (not in a team directory: the run "
                  "writes its files there by name; run.share = \"group\" lets your group read the run)")
"""run.dir's refusal's advice; `{home}` is ", such as one under your home" unless run.dir is under it already."""


def run_dir_problem(run_dir: str | os.PathLike) -> str | None:
    """place_problem for run.dir, at `run --check`, the supervisor's start and `minilmd train` (minilmd/probes.py
    path_problems), before anything is made: it and every directory above it root's or ours, none another user can
    rearrange (sticky is fine, a link of root's or ours followed). Else another user could put his directory, or a
    link to the victim's, at run.dir, whose files the supervisor, the trainer and `stop` write by name (a
    .space-reserve link truncated her file, an events.jsonl link got events appended). No team-directory opt-in as
    run.remote's (`team_above`, `group_share`): those writes go through a descriptor opened by the walk, run.dir's do
    not; teammates read a run through run.share = "group". No `owners` as run.remote's for a squashing share (NFS
    root_squash makes root's run.dir nobody's): those are learnt by writing a file in the directory
    (daemon/jobs/remote_write.py learn_own_uid), and run.dir is judged before anything is made (docs/operations.md
    says so: such a run.dir is refused)."""
    home = "" if _under_home(run_dir) else ", such as one under your home"
    return place_problem("run.dir", run_dir, "the run's files", RUN_DIR_ADVICE.format(home=home), dir_itself=True,
                         own_links=True)


def make_run_dir(run_dir: str | os.PathLike) -> None:
    """run.dir made (with the directories missing above it) and judged again once made (`run_dir_problem`), before a
    file is written in it: between the judgement of `run --check` or the launch and this, another user may have made
    it, or a directory above it, his own (he waited for the scratch to appear: the supervisor then wrote its files
    into his directory, and its attempt log through his link). PlaceRefused then. Once made and passed, no other user
    can rearrange it."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if problem := run_dir_problem(run_dir):
        raise PlaceRefused(problem)


def _under_home(path: str | os.PathLike) -> bool:
    """Whether `path` is in the user's home ($HOME, as Path.home() says): there "under your home" advises nothing."""
    with contextlib.suppress(RuntimeError, KeyError):
        home = Path.home()
        return home != Path("/") and (Path(os.path.abspath(path)).is_relative_to(home))
    return False


def _dir_rule_problem(st: os.stat_result, above: Path, where: str, what: str, advice: str, *, team_above: bool,
                      owners: Set[int], acl_at: Path | int | None = None) -> str | None:
    """The rule one directory on the way keeps (`st` as lstat or fstat saw it, `above` its path; `acl_at`: where
    its ACL is looked at, its descriptor for the walk): root's, ours or `owners`', not rearrangeable by others."""
    if not owned_by_me_or_root(st) and st.st_uid not in owners:
        return (f"{where} belongs to {user(st.st_uid)}, who could replace {what} by a link to your files "
                f"or by a directory of his; {advice}")
    if not owned_by_me_or_root(st) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (f"{where} belongs to {user(st.st_uid)} (the owner this share gives new files) and can be written by "
                f"others than its owner (mode {stat.S_IMODE(st.st_mode):o}), who could replace {what}; {advice}")
    if others_can_rearrange(st, above if acl_at is None else acl_at, team=team_above):  # group members: others
        fix = f"chmod go-w {above} (it is yours), or {advice}" if owned_by_me(st) else advice  # the one-step fix first
        return (f"{where} can be written by other users (mode {stat.S_IMODE(st.st_mode):o}, not sticky), who "
                f"could replace {what} by a link to your files or by a directory of theirs; {fix}")
    return None


def open_walked(path: str | os.PathLike, label: str, what: str, advice: str, *, group_share: bool = False,
                team_above: bool = False, owners: Set[int] = frozenset()) -> int:
    """A descriptor (O_RDONLY|O_DIRECTORY) of the directory at path's real path (os.path.realpath, once), reached
    from "/" one component at a time with openat (no link followed), each directory on the way and the last one
    judged on its descriptor by place_problem's rule (`group_share` waives the last, `team_above` as there): what
    a judgement by path cannot promise, since a directory on the way may be swapped right after it. PlaceRefused
    for a component that is a link or a file now, or that fails the rule; FileNotFoundError when one is gone."""
    real = Path(os.path.realpath(path))
    parts = real.parts[1:]
    fd = os.open("/", WALK_DIR)
    try:
        for depth in range(len(parts) + 1):
            here = Path("/", *parts[:depth])
            where = f"{label} {path}: the directory {here}" + ("" if here == real else " above it")
            if not (group_share and here == real):
                problem = _dir_rule_problem(os.fstat(fd), here, where, what, advice, team_above=team_above,
                                            owners=owners, acl_at=fd)
                if problem:
                    raise PlaceRefused(f"{problem} (found so when opened)")
            if depth == len(parts):
                return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                below = os.open(parts[depth], WALK_DIR, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PlaceRefused(f"{label} {path}: {here / parts[depth]} is a symbolic link or not a directory "
                                       f"now (never followed); {advice}") from None
                raise
            os.close(fd)
            fd = below
    finally:
        os.close(fd)
    raise AssertionError("unreachable")
