"""The place rule: where minilmd may create files that others must not redirect (scratch, the GPU lock directory,
an output's directory, a run.remote, run.dir), and the walk that opens such a directory under that same rule.

- `place_problem(label, target, ...)` judges by path: every directory on the way to `target` root's or this user's
  (or `owners`'), none that another user can rearrange (group members count as others, unless the group is this
  user's alone: perms.private_group; a sticky one of root's or ours is fine, like /tmp); a link on the way refused,
  or followed when root's or ours (`own_links`). Opt-ins: `group_share` waives target's own directory (a team
  directory, touched only through its descriptor), `team_above` lets the directories above be group-writable
  (still root's or ours): a run.remote's; `team_root`, a run.remote's too, waives only the mode of target's own
  directory (a team-shared remote), never its owner: a directory another user made first at run.remote's name is his
  to take away (chmod 700) with the run's only checkpoints in it, so it is refused, naming him. A judgement by
  path alone is a moment's: a group member who may write a team directory above the target can rename a directory
  on the way and put his own there right after it.
- `open_walked(path, ...)` therefore opens the directory component by component from "/" (openat, no link
  followed by the kernel), each directory judged by the same rule on what its descriptor holds (fstat): a
  directory swapped in after any earlier look is one of another owner, or a link now, and refused (PlaceRefused).
  minilmd/dirfd.py's Dir.open is that walk alone: by path, abspath read `a/link/../b` as `a/b`, where the walk,
  as the kernel, goes up from where the link leads.
- `walk_to(path, ..., mode)` is that walk, which also makes a missing directory (mkdirat at its judged parent) and
  follows a link of root's or ours itself: run.dir (`settle_run_dir`), an output's directory, prepare --out and the
  GPU lock directory (daemon/host/leases.py) are judged, made and resolved in this one step, their real path used
  after (never a resolve() or mkdir(parents=True) by path, which a link planted meanwhile would lead elsewhere).
  `walk_problem` is its judgement with nothing made: run.dir's check (`run_dir_problem`) is the launch's walk, an
  output's (fsio.out_parent_problem, prepare's check_out_place) the write's, the GPU lock directory's
  (leases.lock_dir_problem) the lease's, the demo directory's (daemon/demo.py fresh_start) the walk that makes it,
  scratch's way (minilmd/scratch.py) Dir.open's; a compile cache the user set (compile_cache.user_dir_problem) and
  a printed merge's base (init_model.own_base), opened by path by others (torch), the kernel's way: one answer
  however the place is spelled. place_problem is left where the use itself reads the path as abspath does
  (init_model.own_place: the pasted command's OWN_DIR_CODE).
- `real_path(path, owners)` follows the links of a path by the same link rule (`link_followed`) and judges nothing
  else, makes nothing: the path-based look daemon/views/runarg.py uses to find the run a view is given.
Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Set
from pathlib import Path

from minilmd.dir_rule import dir_rule_problem, inherited_acl_problem, owner_problem
from minilmd.perms import owned_by_me_or_root, user_words

WALK_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How the walk opens each directory on the way: no link followed, no read permission needed (a 0711 home)."""


IN_THE_WAY = "choose another {label}, or move that file out of the way"
"""What to do about a file where the walk needs a directory (no other place's advice: sharing a directory moves no
file out of the way)."""


NO_WAY_THROUGH = "choose another {label}, or have the owner of the directory above it let you through"
"""What to do about a directory on the way without search permission (sharing a directory opens none)."""


def another(label: str) -> str:
    """What IN_THE_WAY and NO_WAY_THROUGH ask to choose another of: "the directory of --out" and "the lock
    directory" are "--out" and "lock directory" there ("choose another lock directory", not "another the ...")."""
    return label.removeprefix("the directory of ").removeprefix("the ")


class PlaceRefused(ValueError):
    """A directory minilmd will not create files in (the message says why and what to do): a config error, exit 2."""


class InTheWay(PlaceRefused):
    """A file where the walk needs a directory: no place rule's refusal, so no advice to share a directory."""


def lstat_or_none(path: Path) -> os.stat_result | None:
    """os.lstat, None where nothing is there (a missing component, or a file where a directory is named)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        return os.lstat(path)
    return None


def _link_target(path: Path) -> str:
    with contextlib.suppress(OSError):
        return os.readlink(path)
    return "?"


def place_problem(label: str, target: str | os.PathLike, what: str, advice: str, *, dir_itself: bool = False,
                  own_links: bool = False, group_share: bool = False, team_above: bool = False,
                  team_root: bool = False, links: int = 0, owners: Set[int] = frozenset()) -> str | None:
    """Why someone else could put another directory, or a link, where `target` is: a symbolic link on the way
    (followed only with `own_links`, and only a link of root's or ours), or a directory above it (and target
    itself with `dir_itself`) that another user owns or can write (sticky ones of root or of this user excepted).
    `what` names what is at stake in the message ("the scratch"), `advice` ends it. Missing directories are fine:
    the caller makes them. `group_share`: the last directory checked may be a team directory others write (its
    owner opted in). `team_above`: every directory checked may be group-writable (team directories on the way to a
    run.remote; still root's or ours, not world-writable unless sticky). `team_root`: the last directory checked may
    be written by others, but is root's, ours or `owners'` (a run.remote's own directory). `owners`: more uids
    counted as ours (as Dir.owners; a squashing share's), for a directory that no one but its owner may write
    (sticky or not: only a sticky directory of root's or ours is trusted). None: the path stays where it is. A place
    that must be written by no one else, sticky or not (`closed`: run.dir, the Prometheus textfile's directory), is
    judged by the walk alone (walk_problem), whose ".." goes where the kernel's does."""
    path = Path(os.path.abspath(target))
    chain = [*reversed(path.parents)] + ([path] if dir_itself else [])
    for above in chain:
        try:
            st = lstat_or_none(above)
        except PermissionError as e:  # a directory above it without search permission (mode 644): no way through
            todo = NO_WAY_THROUGH.format(label=another(label))
            return f"{label} {target}: {above} cannot be looked at: {e.strerror or e}; {todo}"
        # any other OSError (EIO, ESTALE: a share gone) goes to the caller, which waits for a remote, says a source
        if st is None:
            return None
        where = f"{label} {target}: the directory {above}" + ("" if above == path else " above it")
        if stat.S_ISLNK(st.st_mode):
            if own_links and link_followed(st, owners) and links < 8:
                real = Path(os.path.realpath(above))
                rest = real if above == path else real / path.relative_to(above)
                return place_problem(label, rest, what, advice, dir_itself=dir_itself, own_links=True,
                                     group_share=group_share, team_above=team_above, team_root=team_root,
                                     links=links + 1, owners=owners)
            return (f"{where} is a symbolic link (to {_link_target(above)}): minilmd follows no link on the way to "
                    f"{what}, since whoever can change it chooses where the files go; {advice}")
        if not stat.S_ISDIR(st.st_mode):
            return None  # the caller says that a file is in the way
        if (group_share or team_root) and above == chain[-1]:
            if team_root and (problem := owner_problem(st, where, label, what, owners)):
                return problem
            continue
        if problem := dir_rule_problem(st, above, where, what, advice, team_above=team_above, owners=owners):
            return problem
    return None


RUN_DIR_ADVICE = ("set run.dir to a directory only you (and root) can change{home} (not in a team directory: the run "
                  "writes its files there by name; run.share = \"group\" lets your group read the run)")
"""run.dir's refusal's advice; `{home}` is ", such as one under your home" unless run.dir is under it already."""


def run_dir_problem(run_dir: str | os.PathLike) -> str | None:
    """The rule of run.dir, at `run --check`, the supervisor's start and `minilmd train` (minilmd/probes.py
    path_problems), before anything is made, judged by the very walk that makes and opens it at the launch
    (`walk_problem` of `_walk_run_dir`'s arguments: one rule, one answer; by path, abspath read `~/link/..` as `~`
    where the walk, as the kernel, ends where the link leads, up one): it and every directory above it root's or
    ours, none another user can rearrange (a sticky one above it is fine, a link of root's or ours followed). Else
    another user could put his directory, or a link to the victim's, at run.dir, whose files the supervisor, the
    trainer and `stop` write by name (a .space-reserve link truncated her file, an events.jsonl link got events
    appended). And run.dir itself one no other user can write, sticky or not (`closed`; a group of this user's alone
    is no other user, as perms.others_can_write says): a sticky bit keeps others from removing or renaming what is
    in a directory, not from making a name first, and the run makes its files there by name (before, another user's
    0666 events.jsonl made in a 1777 run.dir became the run's event log, his to read and rewrite, and his 0777
    `logs` the directory of its attempt logs); nor passing on a default ACL that lets another user write what is
    made in it, nor made in a directory that would pass one on (dir_rule.inherited_acl_problem: it takes run.share's
    umask's place). No team-directory opt-in as run.remote's (`team_above`, `group_share`): those writes go through
    a descriptor opened by the walk, run.dir's do not; teammates read a run through run.share = "group". No `owners`
    as run.remote's for a squashing share (NFS root_squash makes root's run.dir nobody's): those are learnt by
    writing a file in the directory (daemon/jobs/remote_write.py learn_own_uid), and run.dir is judged before
    anything is made (docs/operations.md says so: such a run.dir is refused)."""
    return walk_problem(run_dir, *_run_dir_words(run_dir), closed=True)


def settle_run_dir(run_dir: str | os.PathLike) -> Path:
    """run.dir made where missing and judged, in one step, once: its real path (`walk_to`, mode RUN_DIR_MADE less
    the umask), which everything after uses, never the configured path again. PlaceRefused as run_dir_problem words it.
    A judgement by path and a resolve() later were two looks: another user's link planted in between (at a missing
    /tmp/x on the way) chose another run directory of the victim's, which the supervisor then took over. Every
    directory on the returned path is root's or ours and no one else can rearrange it: that path stays where it is."""
    fd, real = _walk_run_dir(run_dir)
    os.close(fd)
    return real


def open_run_dir(run_dir: str | os.PathLike) -> int:
    """A descriptor of run.dir, made where missing and judged as settle_run_dir does (the run lock is taken through
    it: daemon/host/lock.py). PlaceRefused as run_dir_problem words it."""
    return _walk_run_dir(run_dir)[0]


SCRATCH_ADVICE = "set run.scratch to a place only you (and root) can change"
"""How a refusal of the way to run.scratch ends: scratch's check (minilmd/scratch.py) and the walk that makes it to
save in (minilmd/trainer_lock.py) alike, one set of words (beside run.dir's, its neighbour's)."""


RUN_DIR_MADE = 0o755
"""The mode run.dir (and a missing directory on the way) is made with, less the umask: never writable by the group
or others, whatever the umask. `minilmd run` and `minilmd train` set run.share's umask (perms.apply, always with
group and other write) before they make it, so this guards a caller that has not: 0o777 less a umask of 002, with a
primary group others are in, made a run.dir that the rule it is judged by right after refused."""


def _walk_run_dir(run_dir: str | os.PathLike) -> tuple[int, Path]:
    return walk_to(run_dir, *_run_dir_words(run_dir), RUN_DIR_MADE, closed=True)


def _run_dir_words(run_dir: str | os.PathLike) -> tuple[str, str, str]:
    """(label, what, advice) of run.dir's walk: the same words whether it judges (`run --check`) or makes."""
    home = "" if under_home(run_dir) else ", such as one under your home"
    return "run.dir", "the run's files", RUN_DIR_ADVICE.format(home=home)


def under_home(path: str | os.PathLike) -> bool:
    """Whether `path` is in the user's home ($HOME, as Path.home() says): there "under your home" advises nothing,
    and a missing remote's chain is made (path_checks.remote_parents_refused). The one home of both rules."""
    with contextlib.suppress(RuntimeError, KeyError):
        home = Path.home()
        return home != Path("/") and (Path(os.path.abspath(path)).is_relative_to(home))
    return False


def open_walked(path: str | os.PathLike, label: str, what: str, advice: str, *, group_share: bool = False,
                team_above: bool = False, team_root: bool = False, owners: Set[int] = frozenset()) -> int:
    """A descriptor (O_RDONLY|O_DIRECTORY) of the existing directory at `path`, reached by walk_to (nothing made):
    from "/" one component at a time with openat, a link followed by the walk only when root's, ours or `owners'`
    (never a realpath of the path first: a link planted after a judgement by path would choose the directory),
    each directory judged on its descriptor by place_problem's rule (`group_share` waives the last, `team_above` as
    there, `team_root` judges only the last one's owner). PlaceRefused for a component that is another's link or a
    file now, or that fails the rule; FileNotFoundError when one is missing."""
    fd, _ = walk_to(path, label, what, advice, None, group_share=group_share, team_above=team_above,
                    team_root=team_root, owners=owners)
    return fd


def walk_problem(path: str | os.PathLike, label: str, what: str, advice: str, *, closed: bool = False,
                 group_share: bool = False, in_the_way: bool = False) -> str | None:
    """Why walk_to (`closed`, `group_share` as there) would refuse `path`, judged by that walk itself with nothing
    made (`dry`): the answer of a check (`run --check`, an output's before the work) is the use's. A missing
    directory is no problem (the walk that makes it makes it under a directory judged); the walk goes on as that one
    would, a ".." after it back to the directory it would be made in. A file in the way is the caller's check to
    say, unless `in_the_way` (the GPU lock directory's: no other check says it). A directory on the way without
    search permission is said, not raised; any other OSError (EIO, ESTALE) goes to the caller."""
    try:
        os.close(walk_to(path, label, what, advice, None, dry=True, closed=closed, group_share=group_share)[0])
    except PlaceRefused as e:
        return str(e) if in_the_way or not isinstance(e, InTheWay) else None
    except PermissionError as e:  # a directory on the way without search permission (mode 644): no way through
        todo = NO_WAY_THROUGH.format(label=another(label))
        return f"{label} {path}: {e.filename} cannot be looked at: {e.strerror or e}; {todo}"
    return None


MAX_LINKS = 40
"""The links walk_to and real_path follow on one walk (the kernel's own limit for a path): a loop ends there."""


def link_followed(st: os.stat_result, owners: Set[int] = frozenset()) -> bool:
    """The one link rule of both walks: a link (`st`, its lstat) is followed only when it is root's, ours or
    `owners'`: anyone else's chooses where the path leads."""
    return owned_by_me_or_root(st, also=owners)


class ForeignLink(PlaceRefused):
    """real_path met a link link_followed refuses: `link` (its path, the links before it followed), `owner`."""

    def __init__(self, link: Path, owner: int):
        super().__init__(f"{link} is a symbolic link of {user_words(owner)}")
        self.link = link
        self.owner = owner


class TooManyLinks(PlaceRefused):
    """real_path met more than MAX_LINKS links: a loop."""


def real_path(path: str | os.PathLike, owners: Set[int] = frozenset()) -> Path:
    """`path` with every link on the way followed by link_followed's rule (ForeignLink for another's), by path and
    nothing made: what is missing (or cannot be looked at) is kept as given from there, for the caller to say. For
    reading another user's run (daemon/views/runarg.py): unlike walk_to, no directory on the way is judged (her
    run under her home is hers to arrange) and the last component may be a file (a run config). ".." after a link
    goes up from where the link led, as the kernel does. TooManyLinks for a loop."""
    given = Path(path) if os.path.isabs(path) else Path(os.getcwd(), path)
    pending = ["/", *given.parts[1:]][::-1]  # popped from the end: next component last
    real, links = Path("/"), 0
    while pending:
        name = pending.pop()
        if name == "/":
            real = Path("/")
        elif name == "..":
            real = real.parent
        elif name not in ("", "."):
            try:
                st = os.lstat(real / name)
            except OSError:  # missing, or not to be looked at: as given from here, said by the caller
                return Path(real / name, *reversed(pending))
            if not stat.S_ISLNK(st.st_mode):
                real = real / name
                continue
            links += 1
            if links > MAX_LINKS:
                raise TooManyLinks(f"more than {MAX_LINKS} symbolic links on the way (a loop at {real / name}?)")
            if not link_followed(st, owners):
                raise ForeignLink(real / name, st.st_uid)
            try:
                target = os.readlink(real / name)
            except OSError:  # removed or replaced since the lstat: looked at again (the count bounds the looks)
                pending.append(name)
                continue
            pending.extend(reversed(Path(target).parts))  # "/..." restarts
    return real


def walk_to(path: str | os.PathLike, label: str, what: str, advice: str, mode: int | None, *,
            group_share: bool = False, team_above: bool = False, team_root: bool = False,
            owners: Set[int] = frozenset(), exact_mode: bool = False,
            made: list[Path] | None = None, reading: bool = False, closed: bool = False,
            dry: bool = False) -> tuple[int, Path]:
    """The directory at `path` reached from "/" one component at a time by descriptor (openat, no link followed by
    the kernel), a missing one made there (mkdirat, `mode`; None: nothing made, FileNotFoundError) relative to its
    parent already judged, each judged on its descriptor by place_problem's rule (`group_share` waives the last,
    `team_above`, `team_root` and `owners` as there): (an O_RDONLY descriptor of it, its real path). A link on the
    way is followed by the walk itself, and only when it is root's, ours or `owners'` (in a directory already judged: no
    one else could have put it there); another's is refused. So the path is judged and resolved in one look: no
    link planted after a judgement by path leads a later resolve() or mkdir(parents=True) elsewhere, and nothing
    is made past a refusal. `exact_mode`: each directory made gets `mode` itself, whatever the umask (fchmod on it
    right after the mkdirat, before it is judged: the GPU lock directory's parents, which every user's runs must
    reach). `made`, when given, gets the real path of each directory made here, in order (one another process made
    meanwhile is judged as found, not listed). PlaceRefused for another's link, a file in the way ("is a file, not a
    directory") or a directory the rule refuses; any other OSError as it comes (a full file system, no search
    permission), its filename the full path of the component it met (never the bare name the *at call was given).
    `reading`: the walk only reads from there (a run config's directory): perms.others_can_write's `reading`.
    `closed`: the last directory may be written by no one else, sticky or not (run.dir: run_dir_problem says why),
    nor pass on a default ACL that lets another user write what is made in it: nor may one a missing directory
    would be made in (dir_rule.inherited_acl_problem; refused before anything is made). A path that ends in ".."
    ends at a directory first met above the target, judged then by the rule of the directories above: judged again
    there as the target (`~/link/..`, the link to /tmp/x: /tmp, not `~`).
    `dry` (with `mode` None): a missing component is walked as if made, nothing made (walk_problem: a check's
    answer is the making walk's); the descriptor is then the deepest directory there, the path the whole one."""
    # Not abspath: "a/link/.." is where the link leads, up one, as the kernel says. getcwd() only for a relative
    # path: a process whose working directory was removed still reaches an absolute one.
    given = Path(path) if os.path.isabs(path) else Path(os.getcwd(), path)
    pending = ["/", *given.parts[1:]][::-1]  # popped from the end: next component last
    chain: list[tuple[int, Path]] = []  # the directories walked so far, each open and judged: (descriptor, real path)
    missing: list[str] = []  # `dry`: the names walked below chain[-1] that are not there (the making walk's to make)
    links = [0]

    def judged(fd: int, here: Path) -> tuple[int, Path]:
        return _judged(fd, here, path, label, what, advice, not pending, group_share=group_share,
                       team_above=team_above, team_root=team_root, owners=owners, reading=reading,
                       closed=closed and not pending, dry=dry)

    def step(name: str) -> None:
        """One component: the walk restarted at "/", up one, or down into `name` (a link's target pending)."""
        if name == "/":
            _close_all(chain)
            missing.clear()
            chain.append(judged(os.open("/", WALK_DIR), Path("/")))
        elif name == "..":
            if missing:  # up from a directory the making walk would have made: back towards chain[-1]
                missing.pop()
            elif len(chain) > 1:
                os.close(chain.pop()[0])
            if not pending and not missing:  # the walk ends here, up one: judged again as the target (closed)
                chain.append(judged(*chain.pop()))
        elif name in ("", "."):
            return
        elif missing:  # below a directory not there: nothing more to judge on the way
            missing.append(name)
        else:
            fd, here = chain[-1]
            try:
                st, made_here = _lstat_at(fd, name, mode, exact_mode, lambda: before_making(fd, here))
            except FileNotFoundError:
                if not dry:
                    raise
                before_making(fd, here)
                missing.append(name)
                return
            if stat.S_ISLNK(st.st_mode):
                links[0] += 1
                pending.extend(reversed(Path(_own_link(fd, here, name, st, links[0])).parts))  # "/..." restarts
                return
            below = _open_below(fd, here, name)
            chain.append(judged(below, here / name))
            if made_here and made is not None:
                made.append(here / name)

    def before_making(fd: int, here: Path) -> None:
        """`closed`: a directory made in `here` (the target or one above it) gets here's default ACL, passed on."""
        where = f"{label} {path}: the directory {here} above it"
        if closed and (problem := inherited_acl_problem(os.fstat(fd), fd, here, where, what, advice)):
            raise PlaceRefused(problem)

    def _own_link(fd: int, here: Path, name: str, st: os.stat_result, count: int) -> str:
        """The target of the link `name`, when the walk may follow it."""
        if count > MAX_LINKS:
            raise PlaceRefused(f"{label} {path}: more than {MAX_LINKS} symbolic links on the way (a loop at "
                               f"{here / name}?); {advice}")
        if not link_followed(st, owners):
            raise PlaceRefused(f"{label} {path}: {here / name} is a symbolic link of {user_words(st.st_uid)} (to "
                               f"{_readlink_at(fd, name)}): minilmd follows no link of another user's on the way to "
                               f"{what}; {advice}")
        return os.readlink(name, dir_fd=fd)

    def _open_below(fd: int, here: Path, name: str) -> int:
        try:
            return os.open(name, WALK_DIR, dir_fd=fd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
        now = os.stat(name, dir_fd=fd, follow_symlinks=False)  # a file in the way, or swapped since the lstat
        if stat.S_ISLNK(now.st_mode):  # swapped since the lstat: someone's doing, the place's advice
            raise PlaceRefused(f"{label} {path}: {here / name} is a symbolic link now (never followed); {advice}")
        kind = "a file, not a directory" if stat.S_ISREG(now.st_mode) else "not a directory"
        todo = IN_THE_WAY.format(label=another(label))
        raise InTheWay(f"{label} {path}: {here / name} is {kind}; {todo}")

    try:
        while pending:
            name = pending.pop()
            try:
                step(name)
            except OSError as e:  # named by its full path: "(No space left on device: run)" said nothing
                where = Path("/") if name == "/" or not chain else chain[-1][1] / name
                raise OSError(e.errno, e.strerror, str(where)) from None
        fd, real = chain[-1]
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd), real.joinpath(*missing)
    finally:
        _close_all(chain)


def _lstat_at(fd: int, name: str, mode: int | None, exact_mode: bool,
              before_making: Callable[[], None]) -> tuple[os.stat_result, bool]:
    """`name` in the directory `fd`, looked at without following it, and whether it was made here: made (mkdirat,
    `mode`, exactly with `exact_mode`) when missing, unless `before_making` refuses it."""
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False), False
    except FileNotFoundError:
        if mode is None:
            raise
    before_making()
    try:
        os.mkdir(name, mode, dir_fd=fd)
    except FileExistsError:  # made meanwhile by another: judged as found
        return os.stat(name, dir_fd=fd, follow_symlinks=False), False
    if exact_mode:  # ours, just made in a directory already judged: no one else can have put another one there
        made = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        try:
            os.fchmod(made, mode)
        finally:
            os.close(made)
    return os.stat(name, dir_fd=fd, follow_symlinks=False), True


def _readlink_at(fd: int, name: str) -> str:
    with contextlib.suppress(OSError):
        return os.readlink(name, dir_fd=fd)
    return "?"


def _judged(fd: int, here: Path, path: str | os.PathLike, label: str, what: str, advice: str, last: bool, *,
            group_share: bool, team_above: bool, team_root: bool, owners: Set[int],
            reading: bool = False, closed: bool = False, dry: bool = False) -> tuple[int, Path]:
    """(fd, here) once the directory `fd` holds passes the rule (closed and PlaceRefused when it does not; `dry`: a
    check's words, not those of a walk that opens a directory to use it)."""
    where = f"{label} {path}: the directory {here}" + ("" if last else " above it")
    st = os.fstat(fd)
    if last and team_root:
        problem = owner_problem(st, where, label, what, owners)
    elif last and group_share:
        problem = None
    else:
        problem = dir_rule_problem(st, here, where, what, advice, team_above=team_above, owners=owners, acl_at=fd,
                                    reading=reading, closed=closed)
    if problem:
        os.close(fd)
        raise PlaceRefused(problem if dry else f"{problem} (found so when opened)")
    return fd, here


def _close_all(chain: list[tuple[int, Path]]) -> None:
    while chain:
        os.close(chain.pop()[0])
