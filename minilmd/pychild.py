"""How minilmd starts a Python process of its own: never with a directory someone else can write on its import path.

`python -m MODULE` puts the working directory first on sys.path (`python SCRIPT` the script's directory, `python
-c` the working directory too), ahead of site-packages. A supervisor started in /tmp or in a team's project
directory would then import another user's planted `minilmd/__init__.py` (or `torch/`, `numpy.py`) in every
trainer it launches, as itself: root's run ran her code as root, once per attempt. Every Python child minilmd
starts (the trainer, torchrun and its ranks, the Slurm node step, the orphan-kill helper, a demo's or a benchmark's
`minilmd` command) is built here, with three guards, each for what the others miss:

- `-P` (Python 3.11+, `sys.flags.safe_path`): no directory is prepended for this interpreter. Not on 3.10 (the
  option is unknown there and the interpreter would refuse to start), which pyproject still supports.
- PYTHONSAFEPATH=1 in the child's environment (`child_env`): the same for every Python the child starts in turn,
  which minilmd does not build: torchrun's ranks (`sys.executable -u -m minilmd.cli`), srun's steps on other nodes
  (`--export=ALL`). Ignored by 3.10.
- the working directory "/" (`CHILD_CWD`): on 3.10 the prepended directory is then "/", root's alone, and the
  ranks and srun's steps inherit it (srun's default --chdir is its own working directory). Nothing the children do
  depends on the supervisor's directory: the config's relative paths are made absolute against the config's own
  directory when it is read (config.absolute_paths) and a `--set`'s against the supervisor's before it is handed
  on (daemon/child/trainerwatch.py `attempt_command`); the run directory is absolute.

Every such child is started by `run` or `popen` here, which give the argv, the environment (`child_env`) and the
working directory together: the trainer, the helpers and the demos' commands run in "/" (their arguments are
absolute); a benchmark's or a device-check script's `minilmd` keeps the caller's directory (`keep_cwd=True`), where
its arguments may be relative: `-P` and PYTHONSAFEPATH only. Left on Python 3.10: what minilmd does not start
itself in "/" (prepare's spawned workers run `python -c` in the directory `minilmd prepare` was started from).
`python -I` (isolated) would drop the directory on 3.10 too, but it also ignores every PYTHON* variable
(PYTHONUNBUFFERED, which the attempt logs rely on; a site's PYTHONPATH) and the user's site-packages.

The `minilmd` console script is safe as it is: its sys.path[0] is the directory of the script itself (the venv's
bin/). scripts/setup.sh and deploy/minilmd-tmux.sh run their own `python` from "/". The Makefile's commands are left
as they are: they run in the checkout (make's directory), whose code is what they run anyway, and need it
(pytest's rootdir, the demos' default directories). tests/test_one_way_to_start_python.py fails on a Python started
anywhere else in minilmd/, daemon/, trainer/ and scripts/ (tests/source_tree.audited_files), and on a pychild argv
handed to subprocess (or os.exec*, asyncio) directly rather than to `run`/`popen`, and on multiprocessing (whose
spawn runs `python -c` where PYTHONSAFEPATH alone guards it) outside minilmd/corpus/workers.py; each use of the
interpreter's path the device-check scripts keep (the reference MiniMind's training scripts, run in their own
directory as their README says) is reviewed there with its reason.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

SAFE_PATH_ENV = "PYTHONSAFEPATH"
CHILD_CWD = "/"
"""The working directory of every Python child: root's, so that on 3.10 the one prepended to sys.path is too."""

SAFE_PATH_FLAGS: tuple[str, ...] = ("-P",) if sys.version_info >= (3, 11) else ()
"""`-P` where this interpreter knows it: the children run sys.executable, this same interpreter."""


def python_argv(*args: str) -> list[str]:
    """This interpreter with no unsafe directory on its path, then `args` (`"-m", MODULE, ...` or `"-c", CODE`)."""
    return [sys.executable, *SAFE_PATH_FLAGS, *args]


def module_argv(module: str, *args: str) -> list[str]:
    """`python -P -m MODULE ARGS...` (python_argv)."""
    return python_argv("-m", module, *args)


def guard_descendants() -> None:
    """PYTHONSAFEPATH=1 in this process's own environment (`minilmd`'s main): the Pythons that it starts in ways
    this module does not build inherit it. multiprocessing's spawn runs `python -c ...` in our working directory
    (prepare's workers: a planted `multiprocessing/` there ran in each); `-P` reaches them only where this process
    has it, and the console script's process does not."""
    os.environ[SAFE_PATH_ENV] = "1"


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (os.environ by default) with PYTHONSAFEPATH=1: the children of the child are guarded too."""
    return {**(os.environ if env is None else env), SAFE_PATH_ENV: "1"}


def _guarded(env: Mapping[str, str] | None, keep_cwd: bool, kwargs: dict[str, Any]) -> dict[str, Any]:
    if "cwd" in kwargs:
        raise TypeError("pychild: a child runs in CHILD_CWD, or in the caller's directory with keep_cwd=True")
    return {**kwargs, "env": child_env(env), **({} if keep_cwd else {"cwd": CHILD_CWD})}


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, keep_cwd: bool = False,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run of `argv` (python_argv/module_argv, or a trainer command) with child_env(env) in CHILD_CWD
    (the caller's own directory with `keep_cwd`: a benchmark's relative arguments); other keywords as subprocess's."""
    return subprocess.run(list(argv), **_guarded(env, keep_cwd, kwargs))


def popen(argv: Sequence[str], *, env: Mapping[str, str] | None = None, keep_cwd: bool = False,
          **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen of `argv` on run()'s terms."""
    return subprocess.Popen(list(argv), **_guarded(env, keep_cwd, kwargs))
