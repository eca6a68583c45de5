"""The run `minilmd status`, `logs`, `stop`, `plot` and `forget` are given: a run directory, or the config file that
names one.

One rule for these commands (daemon/views/status.py, stop.py, overview.py `forget`): a symbolic link on the way is
followed, and a config file read (as an untrusted config, minilmd/config.py: bounded, no link followed, never
blocking), only when it is the caller's, root's, or the run directory's owner's (it is then her own pointer to her
own run: root's `status current`, where nobody's `current` leads to her run; a teammate reading a run.share = "group"
run through its owner's config). The links are followed by place_rule.real_path's walk (place_rule.link_followed:
run.dir's link rule, nothing else of its place rule: the directories on the way are the run owner's to arrange); a
config's `run.dir` is resolved as `minilmd run` resolves it (relative to the config's directory) and walked the
same way. A third user's link or config chooses whose run the command reaches: root's `minilmd stop` of a user's
link to a third user's run stopped hers, and left root's stop request in her run directory. So it is refused (exit
2, nothing signalled, nothing written), naming the link or the config, its owner and the run directory it leads to,
which the caller may then name itself; where that does not exist (yet) or cannot be looked at, that is said (no owner
of it proves the link or config the run's). A directory must hold a run's files.

What is judged is handed on as one descriptor (`open_run`: the directory opened O_PATH, O_DIRECTORY, O_NOFOLLOW, a
dirfd.Dir whose `path` is its real path, for words and for the processes' proofs; its run files looked at through
it; its owner the descriptor's, `owner_of`). The views read everything of the run through it (status.py, stop.py,
overview.py `forget`, lastwords.py, liveness.py; a reader that takes a path is given `Dir.inside`, the directory the
descriptor holds), never by the path again: whoever can rename a directory above the run directory (its owner, a team
directory's members) could move it aside and put another run directory there between the judgement and a read. A
write or a signal (`stop`'s request, walked by the place rule; the supervisor's proof, its environment naming the
path) is done only while the path still leads to the directory judged (`moved`). `plot` holds each run it is given
open the same way while it reads them. A directory this user may not look into
(another user's run under the default `run.share = "private"`) is answered by its owner, from its own lstat, as
`stop` answers any other user's run: exit 1, the owner named. Every path said here is escaped
(minilmd/untrusted.py `printable`): others name them.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable, Set
from pathlib import Path

from minilmd import names, place_rule
from minilmd.dirfd import Dir
from minilmd.untrusted import printable

NOT_A_RUN = 2
"""Exit status: no run directory there (nor a config naming one), as protocol.STOP_NOT_A_RUN; also a third user's
link or config on the way to one (refused)."""
CANNOT_READ = 1
"""Exit status: a directory this user may not look into (another user's private run), as protocol.STOP_FAILED."""

JUDGED_DIR = place_rule.WALK_DIR
"""How the run directory is opened to be judged and read: no link followed (a real path's last name is none: one
now was put there since), search permission enough (a 0711 run directory), as the lookups by path were."""
MOVED = "no longer the run directory named a moment ago: moved or replaced since (by whoever can rename a directory " \
        "above it); nothing signalled, nothing written"


class RunProblem(Exception):
    """Why the argument is not a run directory this user can read; `exit` is the command's status,
    `run_dir` the directory when one was named (a config's run.dir), for `logs -f` to wait for."""

    def __init__(self, message: str, exit: int, run_dir: Path | None = None):
        super().__init__(message)
        self.exit = exit
        self.run_dir = run_dir


class Foreign(RunProblem):
    """Another user's link or config on the way (`owner`): followed only when it leads to a run directory of his."""

    def __init__(self, message: str, owner: int):
        super().__init__(message, NOT_A_RUN)
        self.owner = owner


def open_run(arg: str | os.PathLike, command: str = "status") -> Dir:
    """The run directory `arg` names (itself, or a config file's run.dir), opened once and judged on that
    descriptor (a Dir: `path` its real path, for words and the processes' proofs; `fd` an O_PATH descriptor): every
    link and config on the way the caller's, root's or the run directory's owner's, the directory itself opened
    without following a link, its run files looked at through it. RunProblem when it is none, or when a third
    user's link or config leads there. The caller closes it."""
    path = Path(arg)
    run_dir = _by_owner_rule(lambda owners: _named_run_dir(path, command, owners))
    try:
        run = Dir(os.open(run_dir, JUDGED_DIR), run_dir)
    except OSError:  # gone, a link or a file swapped in since, not ours to look at: said as by path
        raise run_problem(run_dir, command) or RunProblem(f"{printable(run_dir)}: {MOVED}", NOT_A_RUN) from None
    try:
        problem = run_problem(run_dir, command, run.fd)
    except BaseException:
        run.close()
        raise
    if problem:
        run.close()
        raise problem
    return run


def opened_run(arg: str | os.PathLike, command: str = "status") -> tuple[Dir | None, int]:
    """(open_run's Dir, 0), or (None, the exit status) once why it is none has been said on stderr."""
    try:
        return open_run(arg, command), 0
    except RunProblem as e:
        print(e, file=sys.stderr)
        return None, e.exit


def owner_of(run: Dir) -> int:
    """The owner of the run directory judged: its descriptor's, never what its name leads to now."""
    return os.fstat(run.fd).st_uid


def moved(run: Dir) -> str | None:
    """Why run.path no longer names the directory judged (renamed aside and another put there, by whoever can
    rename a directory above it), in words; None while it does. What is signalled is proven by path (the
    processes' environment names it) and a stop request is written where the place rule walks to by path: both are
    refused then, never done to what stands there now."""
    try:
        now = os.stat(run.path)
    except OSError as e:
        return f"{MOVED} ({printable(e.strerror or str(e))} there now)"
    return None if (now.st_dev, now.st_ino) == run.identity else f"{MOVED} (another directory there now)"


def real_path(path: Path, command: str) -> Path:
    """`path` with every link on the way followed, each only when it is the caller's, root's or the owner's of where
    it leads (forget's gone run directory, `logs -f`'s awaited one); Foreign (exit 2) for a third user's link."""
    return _by_owner_rule(lambda owners: _walk(path, command, owners))


def _by_owner_rule(resolve: Callable[[Set[int]], Path]) -> Path:
    """`resolve(owners)`'s path, followed past other users' links and configs only when they are the owner's of
    where it leads: tried with no other owner first, then with each other owner met on the way added; kept when
    every one of them owns the place reached, else refused naming the first link or config of another owner (he
    chose which run it is, even past her own links). Nothing reached (missing, not a run): the first refused."""
    refusals: dict[int, Foreign] = {}
    while True:
        try:
            found = resolve(frozenset(refusals))
            break
        except Foreign as e:
            if e.owner in refusals or len(refusals) > place_rule.MAX_LINKS:
                raise
            refusals[e.owner] = e
        except RunProblem:
            if refusals:
                raise next(iter(refusals.values())) from None
            raise
    if refusals:
        from minilmd.perms import owner_in

        try:
            reached: os.stat_result | None = os.lstat(found)  # a real path: its own owner, no link's
        except OSError:
            reached = None
        if wrong := [e for uid, e in refusals.items() if reached is None or not owner_in(reached, {uid})]:
            raise wrong[0]
    return found


def _named_run_dir(path: Path, command: str, owners: Set[int]) -> Path:
    """The run directory `path` names (itself or a config's run.dir), walked by `owners`' links too, unjudged."""
    real = _walk(path, command, owners)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise RunProblem(f"{printable(path)}: no such file or directory", NOT_A_RUN, real) from None
    except OSError as e:
        raise RunProblem(f"{printable(path)}: cannot be read ({e.strerror or e})", NOT_A_RUN) from None
    if stat.S_ISDIR(st.st_mode):
        return real
    return _walk(_config_run_dir(path, real, st, command, owners), command, owners, named_by=path)


def _walk(path: Path, command: str, owners: Set[int], named_by: Path | None = None) -> Path:
    """place_rule.real_path as a RunProblem: another's link (`named_by`: the config whose run.dir `path` is, for
    that message) or a loop. By path: open_run opens what it returns once, and judges that."""
    try:
        return place_rule.real_path(path, owners)
    except place_rule.ForeignLink as e:
        raise Foreign(_foreign(path, e.link, e.owner, "a symbolic link", command, None, named_by), e.owner) from None
    except place_rule.TooManyLinks as e:
        raise RunProblem(f"{printable(path)}: {printable(str(e))}", NOT_A_RUN) from None


def _foreign(arg: Path, what_path: Path, owner: int, what: str, command: str, leads_to: Path | None = None,
             named_by: Path | None = None) -> str:
    """The refusal of a third user's link or config on the way from `arg`: it, its owner, where it leads (whose run
    directory, or that it does not exist yet or cannot be looked at: then no owner proves it the run's)."""
    from minilmd.perms import own_uid, user_words

    rule = "minilmd follows another user's link or config only to that user's own run directory"
    target = arg if leads_to is None else leads_to
    try:
        target = Path(os.path.realpath(target))  # for the words only: never used
        where = f"leads to the run directory {printable(target)} of {user_words(os.stat(target).st_uid)}"
        why = f"whoever owns a link or config chooses which run it leads to, so {rule}"
    except FileNotFoundError:
        where = f"leads to {printable(target)}, which does not exist (yet)"
        why = f"whose run will be there cannot be told, and {rule}"
    except (OSError, ValueError) as e:
        said = printable(str(getattr(e, "strerror", None) or e))
        where = f"leads to {printable(target)}, which cannot be looked at ({said})"
        why = f"whose run is there cannot be told, and {rule}"
    via = "" if what_path == arg else f" (on the way from {printable(arg)})"
    via += f" (run.dir of {printable(named_by)})" if named_by is not None else ""
    me = own_uid()
    not_whose = "not root's" if me == 0 else f"neither yours, {user_words(me)}, nor root's"
    return (f"minilmd {command}: {printable(what_path)}{via} is {what} of {user_words(owner)}, {not_whose}: it "
            f"{where}; {why}; refused: nothing signalled, nothing written. Give the run directory itself if it is "
            f"the run you mean (`minilmd {command} {printable(target)}`)")


def _config_run_dir(path: Path, real: Path, st: os.stat_result, command: str, owners: Set[int]) -> Path:
    """run.dir of the config file `path` (at `real`; read untrusted: the caller's, root's or `owners'`, a regular
    file, bounded; another user's is read only to name the run it leads to, for _by_owner_rule). A config that no
    launch would accept still names its run when its run.dir is there and is a run: a user editing the config of a
    running run for its next restart may `stop`, `status` or `logs` it, told on stderr what the next launch will
    refuse."""
    from minilmd.config import MAX_CONFIG_BYTES, ConfigError, config_from_bytes, named_run_dir
    from minilmd.perms import own_uid, owned_by_me_or_root
    from minilmd.untrusted import Unreadable, read_bytes

    if not stat.S_ISREG(st.st_mode):
        raise RunProblem(f"{printable(path)}: neither a run directory nor a run config file", NOT_A_RUN)
    trusted = owned_by_me_or_root(st, also=owners)
    try:
        data = read_bytes(real, max_bytes=MAX_CONFIG_BYTES, owner=(own_uid(), 0, *owners) if trusted else st.st_uid)
    except Unreadable as e:
        raise RunProblem(f"{printable(path)}: cannot be read ({printable(e.why)})", NOT_A_RUN) from None
    if not trusted:
        named = named_run_dir(data, path)
        raise Foreign(_foreign(path, path, st.st_uid, "a run config", command, named), st.st_uid) if named is not None \
            else RunProblem(f"{printable(path)}: a run config of another user's naming no run.dir: refused", NOT_A_RUN)
    try:
        config = config_from_bytes(data, path)
    except ConfigError as e:
        return _run_dir_despite(path, data, e.problems, command, owners)
    if not config.run.dir:
        raise RunProblem(f"{printable(path)}: a config without run.dir names no run directory", NOT_A_RUN)
    if not os.path.lexists(config.run_dir):  # the run of a config never launched (not "no such directory")
        starting = "; a `minilmd run` of it begun this very moment makes it within a second: `minilmd stop` " \
            "again then stops that start" if command == "stop" else ""  # nothing to leave a request in before
        raise RunProblem(f"run {printable(config.run.name)} has not started yet (no run.dir at "
                         f"{printable(config.run_dir)}): `minilmd run {printable(path)}` starts it{starting}",
                         NOT_A_RUN, config.run_dir)
    return config.run_dir  # absolute: config_from_bytes resolved it against the config's directory, as for `run`


def _run_dir_despite(path: Path, data: bytes, problems: list[str], command: str, owners: Set[int]) -> Path:
    """The run directory an invalid config's run.dir names, when that is a run (a warning on stderr lists what the
    next launch will refuse); else RunProblem with the config's problems."""
    from minilmd.config import named_run_dir

    run_dir = named_run_dir(data, path)
    problem = run_problem(_walk(run_dir, command, owners, named_by=path)) if run_dir is not None else None
    said = printable("; ".join(problems))
    if run_dir is None or (problem is not None and problem.exit == NOT_A_RUN):  # another user's: said by its owner
        raise RunProblem(f"{printable(path)}: not a run directory, and not a run config that names one: {said}",
                         NOT_A_RUN)
    print(f"{printable(path)}: warning: the next launch of this config will refuse it ({len(problems)} problem(s)): "
          f"{said}", file=sys.stderr)
    return run_dir


def run_problem(run_dir: Path, command: str = "status", dir_fd: int | None = None) -> RunProblem | None:
    """Why run_dir is not a run directory this user can read (None: it is one); `dir_fd`: the directory opened
    (open_run), whose run files are looked at through it, not by path."""
    try:
        if dir_fd is None and not run_dir.exists():
            return RunProblem(f"{printable(run_dir)}: no such directory", NOT_A_RUN, run_dir)
        if dir_fd is None and not run_dir.is_dir():
            return RunProblem(f"{printable(run_dir)}: not a directory", NOT_A_RUN)
        found = any(_there(run_dir, name, dir_fd) for name in (names.STATE, names.RUN_CONFIG_COPY, names.LOCK))
    except OSError as e:  # a directory we may not look into: whose it is says why
        return _unreadable(run_dir, e, command)
    if not found and any(_there(run_dir, name, dir_fd) for name in (names.METRICS, names.HEARTBEAT)):
        return RunProblem(_trained_by_hand(run_dir, command), NOT_A_RUN, run_dir)
    if not found:
        return RunProblem(f"{printable(run_dir)}: not a minilmd run directory (no {names.STATE}, "
                          f"{names.RUN_CONFIG_COPY} or {names.LOCK}); give the run.dir of a run config, or the config "
                          f"itself, e.g. `minilmd {command} /path/to/run`", NOT_A_RUN, run_dir)
    return None


def _trained_by_hand(run_dir: Path, command: str) -> str:
    """What the views say of a run.dir a `minilmd train` by hand wrote (its metrics or heartbeat, no run files): the
    truth, and where its files are (before: "give ... the config itself", which was what the user gave: user8 #5)."""
    from minilmd.scratch_root import default_path

    return (f"{printable(run_dir)}: trained by hand (`minilmd train`, no supervisor ran it: no {names.STATE}, "
            f"{names.RUN_CONFIG_COPY} or {names.LOCK} here), and `minilmd {command}` follows only runs `minilmd run` "
            f"supervises. Its metrics are in {printable(run_dir / names.METRICS)}; its checkpoints in its "
            f"run.scratch's {names.CHECKPOINTS} directory ({default_path('RUN_NAME') / names.CHECKPOINTS} by "
            "default), which `minilmd sample` and `minilmd export` take, as they take the config itself")


def _there(run_dir: Path, name: str, dir_fd: int | None) -> bool:
    """Whether `name` is in the run directory (a link there followed, as Path.exists follows one: looked at only)."""
    if dir_fd is None:
        return (run_dir / name).exists()
    try:
        os.stat(name, dir_fd=dir_fd)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        if e.errno == errno.ELOOP:
            return False
        raise


def not_yours_line(run_dir: Path, owner: int, doing: str) -> str | None:
    """What `stop` and `forget` say before they act on a run of another user's (root's on a user's run): the run
    directory and its owner, so that no one acts on a run without being told whose it is. None for the caller's."""
    from minilmd.perms import is_own_uid, own_uid, user_words

    if is_own_uid(owner):
        return None
    return f"{printable(run_dir)}: a run directory of {user_words(owner)}, not yours, {user_words(own_uid())}: {doing}"


def _unreadable(run_dir: Path, error: OSError, command: str) -> RunProblem:
    """A run directory we cannot look into: another user's (named, from the directory's own lstat) or ours."""
    from minilmd.perms import own_uid, owned_by_me, user_words

    why = error.strerror or str(error)
    try:
        st = os.lstat(run_dir)
    except OSError:
        st = None
    me = own_uid()
    shown = printable(run_dir)
    if st is None or owned_by_me(st):
        return RunProblem(f"{shown}: cannot be read ({why})", CANNOT_READ)
    owner = st.st_uid
    then = ("nothing signalled; " if command == "stop" else "") + f"{user_words(owner)} can `minilmd {command}` it"
    return RunProblem(f"{shown}: a directory of {user_words(owner)}, not yours, {user_words(me)}, that only "
                      f"its owner may read ({why}; a run's default run.share = \"private\" makes it so): {then}",
                      CANNOT_READ)
