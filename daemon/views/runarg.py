"""The run `minilmd status`, `logs`, `stop` and `plot` are given: a run directory, or the config file that names one.

One rule for the three commands (daemon/views/status.py, stop.py): a config file is read as an untrusted config
(minilmd/config.py `load_config(untrusted=True)`: bounded, no link followed, never blocking) and its `run.dir`
resolved as `minilmd run` resolves it (relative to the config's directory); a directory must hold a run's files.
A directory this user may not look into (another user's run under the default `run.share = "private"`) is
answered by its owner, from its own lstat, as `stop` answers any other user's run: exit 1, the owner named.
"""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from minilmd import names

NOT_A_RUN = 2
"""Exit status: no run directory there (nor a config naming one), as protocol.STOP_NOT_A_RUN."""
CANNOT_READ = 1
"""Exit status: a directory this user may not look into (another user's private run), as protocol.STOP_FAILED."""


class RunProblem(Exception):
    """Why the argument is not a run directory this user can read; `exit` is the command's status,
    `run_dir` the directory when one was named (a config's run.dir), for `logs -f` to wait for."""

    def __init__(self, message: str, exit: int, run_dir: Path | None = None):
        super().__init__(message)
        self.exit = exit
        self.run_dir = run_dir


def run_dir_of(arg: str | os.PathLike, command: str = "status") -> Path:
    """The run directory `arg` names (itself, or a config file's run.dir); RunProblem when it is none."""
    path = Path(arg)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RunProblem(f"{path}: no such file or directory", NOT_A_RUN, path) from None
    except OSError as e:
        raise RunProblem(f"{path}: cannot be read ({e.strerror or e})", NOT_A_RUN) from None
    run_dir = path if stat.S_ISDIR(st.st_mode) else _config_run_dir(path, st)
    problem = run_problem(run_dir, command)
    if problem:
        raise problem
    return run_dir


def resolve_run(arg: str | os.PathLike, command: str = "status") -> tuple[Path | None, int]:
    """(the run directory, 0), or (None, the exit status) once why it is none has been said on stderr."""
    try:
        return run_dir_of(arg, command), 0
    except RunProblem as e:
        print(e, file=sys.stderr)
        return None, e.exit


def _config_run_dir(path: Path, st: os.stat_result) -> Path:
    """run.dir of the config file `path` (read untrusted: its owner's or ours, a regular file, bounded). A config
    that no launch would accept still names its run when its run.dir is there and is a run: a user editing the
    config of a running run for its next restart may `stop`, `status` or `logs` it, told on stderr what the next
    launch will refuse."""
    from minilmd.config import MAX_CONFIG_BYTES, ConfigError, config_from_bytes
    from minilmd.perms import own_uid
    from minilmd.untrusted import Unreadable, read_bytes

    if not stat.S_ISREG(st.st_mode):
        raise RunProblem(f"{path}: neither a run directory nor a run config file", NOT_A_RUN)
    try:
        data = read_bytes(path, max_bytes=MAX_CONFIG_BYTES, owner=(own_uid(), st.st_uid))
    except Unreadable as e:
        raise RunProblem(f"{path}: cannot be read ({e.why})", NOT_A_RUN) from None
    try:
        config = config_from_bytes(data, path)
    except ConfigError as e:
        return _run_dir_despite(path, data, e.problems)
    if not config.run.dir:
        raise RunProblem(f"{path}: a config without run.dir names no run directory", NOT_A_RUN)
    return config.run_dir  # absolute: config_from_bytes resolved it against the config's directory, as for `run`


def _run_dir_despite(path: Path, data: bytes, problems: list[str]) -> Path:
    """The run directory an invalid config's run.dir names, when that is a run (a warning on stderr lists what the
    next launch will refuse); else RunProblem with the config's problems."""
    from minilmd.config import named_run_dir

    run_dir = named_run_dir(data, path)
    problem = run_problem(run_dir) if run_dir is not None else None
    if run_dir is None or (problem is not None and problem.exit == NOT_A_RUN):  # another user's: said by its owner
        raise RunProblem(f"{path}: not a run directory, and not a run config that names one: {'; '.join(problems)}",
                         NOT_A_RUN)
    print(f"{path}: warning: the next launch of this config will refuse it ({len(problems)} problem(s)): "
          f"{'; '.join(problems)}", file=sys.stderr)
    return run_dir


def run_problem(run_dir: Path, command: str = "status") -> RunProblem | None:
    """Why run_dir is not a run directory this user can read (None: it is one)."""
    try:
        if not run_dir.exists():
            return RunProblem(f"{run_dir}: no such directory", NOT_A_RUN, run_dir)
        if not run_dir.is_dir():
            return RunProblem(f"{run_dir}: not a directory", NOT_A_RUN)
        found = any((run_dir / name).exists() for name in (names.STATE, names.RUN_CONFIG_COPY, names.LOCK))
    except OSError as e:  # a directory we may not look into: whose it is says why
        return _unreadable(run_dir, e, command)
    if not found:
        return RunProblem(f"{run_dir}: not a minilmd run directory (no {names.STATE}, {names.RUN_CONFIG_COPY} or "
                          f"{names.LOCK}); give the run.dir of a run config, or the config itself, e.g. "
                          f"`minilmd {command} /path/to/run`", NOT_A_RUN, run_dir)
    return None


def _unreadable(run_dir: Path, error: OSError, command: str) -> RunProblem:
    """A run directory we cannot look into: another user's (named, from the directory's own lstat) or ours."""
    from minilmd.perms import own_uid, user_words

    why = error.strerror or str(error)
    try:
        owner: int | None = os.lstat(run_dir).st_uid
    except OSError:
        owner = None
    me = own_uid()
    if owner is None or owner == me:
        return RunProblem(f"{run_dir}: cannot be read ({why})", CANNOT_READ)
    then = ("nothing signalled; " if command == "stop" else "") + f"{user_words(owner)} can `minilmd {command}` it"
    return RunProblem(f"{run_dir}: a directory of {user_words(owner)}, not yours, {user_words(me)}, that only "
                      f"its owner may read ({why}; a run's default run.share = \"private\" makes it so): {then}",
                      CANNOT_READ)
