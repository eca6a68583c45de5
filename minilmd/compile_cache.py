"""Where torch.compile's caches go, for every process minilmd starts that may compile: never a place another user
can write. The one home of that rule: the supervisor's trainer (daemon/child/process.py `launch`), `minilmd train`
on its own (trainer/loop/entry.py `main`) and the benches that compile (minilmd/cli/bench.py) all use it.

Left to itself, inductor caches its compiled kernels (shared objects it loads) in `<tempdir>/torchinductor_<user>`
(torch/_inductor/runtime/cache_dir_utils.py `default_cache_dir`): a fixed name in /tmp, used without an owner check.
Another user who makes that directory (and its two-letter subdirectories, 0777) before a user's first compile can
later replace the kernels there, and the user's next cache hit runs his code. TORCHINDUCTOR_CACHE_DIR moves most of
the cache, but not all: inductor puts its precompiled C++ headers (the CPU's kernels include them) and its on-disk
memo caches (pickles, on the GPU) in `default_cache_dir()` whatever TORCHINDUCTOR_CACHE_DIR says, so TMPDIR moves
too. So the three variables of COMPILE_ENV are set, before torch reads them, to directories under a root of this
user's: the run's `<scratch>/compile-cache/` (`root_of`; kept across restarts, so that a restart reuses the kernels
of the last one) for a trainer, a fresh private directory removed after (`private_caches`) for a bench.

A value the user set is kept when it names a directory only this user can change (`user_dir_problem`: it, and every
directory above it, this user's or root's and not rearrangeable by others; it itself this user's, writable by no one
else; made 0700 when missing, and judged again once made): the user's explicit choice. One that is not (TMPDIR=/tmp:
root's, and the fixed name inside it is anyone's to take first) is not used, and the line that says which value was
chosen says why. Torch-free.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from minilmd import scratch
from minilmd.names import COMPILE_CACHE, SCRATCH_BASE_ENV
from minilmd.perms import others_can_write, owned_by_me
from minilmd.place_rule import walk_problem

CACHE_DIRS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
"""Each compile cache variable and its directory under the root: the caches whose damaged kernels the supervisor
clears (daemon/child/compilecache.py)."""
COMPILE_ENV = {**CACHE_DIRS, "TMPDIR": "tmp"}
"""Every variable set for a process that may compile, and its directory under the root: TMPDIR for inductor's
`default_cache_dir()`, which it uses beside TORCHINDUCTOR_CACHE_DIR (precompiled headers, memo caches)."""


@dataclass(frozen=True)
class Choice:
    """The value one variable gets, why, whether it is the root's own directory, and why a value the user set was not
    used (None: there was none, or it was)."""
    value: str
    why: str
    own: bool
    refused: str | None = None


def root_of(scratch_dir: str | os.PathLike) -> Path:
    """The run's own compile caches, under its scratch: kept across restarts. Absolute: the trainer names it in
    errors, and torch's compile workers start in other directories."""
    return Path(os.path.abspath(scratch_dir)) / COMPILE_CACHE


CACHE_ADVICE = "choose a directory only you (and root) can change"
"""How a refusal of a compile cache variable's directory ends."""


def user_dir_problem(var: str, value: str) -> str | None:
    """Why the directory a user set `var` to is not one of this user's alone (None: it is, or it is missing where
    only this user could make it). Judged by the place rule's walk (walk_problem), which goes where torch's opens
    by path go: by path, abspath read `~/link/../c` as `~/c`, where the kernel goes up from where the link leads."""
    if not os.path.isabs(value):
        return f"{var}={value} is not an absolute path"
    if problem := walk_problem(value, var, "the compile cache", CACHE_ADVICE):
        return problem
    try:
        st = os.stat(value)  # a link of ours or root's on the way was followed by the walk
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{var} {value}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{var} {value} is no directory"
    # the directory's real path for its ACL: a link of ours on the way was followed by the stat
    if not owned_by_me(st) or others_can_write(st, os.path.realpath(value)):
        return (f"{var} {value} is not a directory of yours that only you can write (mode "
                f"{stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): whoever else can write it can put kernels there "
                f"that you would load")
    return None


def choose(root: Path, environ: Mapping[str, str], set_for: str, own: str) -> dict[str, Choice]:
    """{variable: Choice} for a process that may compile: the user's value where `user_dir_problem` finds none
    (`set_for` names whom it was set for), else the directory under `root` (`own` says whose). Makes nothing."""
    chosen = {}
    for var in COMPILE_ENV:
        value = environ.get(var)
        problem = user_dir_problem(var, value) if value else None
        if value and problem is None:
            chosen[var] = Choice(value, f"set for {set_for}, kept", own=False)
        else:
            chosen[var] = _own(root, var, own, set_for, problem if value else None)
    return chosen


def _own(root: Path, var: str, own: str, set_for: str, refused: str | None) -> Choice:
    why = own if not refused else f"{own}; the {var} set for {set_for} is not used: {refused}"
    return Choice(str(root / COMPILE_ENV[var]), why, own=True, refused=refused)


def settle(root: Path, environ: Mapping[str, str], set_for: str, own: str) -> dict[str, Choice]:
    """`choose`, then every directory chosen made (0700; TMPDIR must exist for Python to take it), a user's judged
    again once made (someone else may have made it first): one that fails now gives way to the root's own. A TMPDIR
    moved pins the scratch base too (SCRATCH_BASE_ENV): in a Slurm job the default run.scratch is found under
    TMPDIR (minilmd/scratch.py `base`), and the trainer, which finds it again, would save its checkpoints under the
    compile cache instead, where the supervisor never looks."""
    chosen = choose(root, environ, set_for, own)
    for var, choice in chosen.items():
        if not choice.own:
            try:
                os.makedirs(choice.value, mode=0o700, exist_ok=True)
                problem = user_dir_problem(var, choice.value)
            except OSError as e:
                problem = f"{var} {choice.value}: {e.strerror}"
            if problem is None:
                continue
            chosen[var] = _own(root, var, own, set_for, problem)
        os.makedirs(chosen[var].value, mode=0o700, exist_ok=True)  # under the root: this user's alone
    if chosen["TMPDIR"].value != environ.get("TMPDIR"):  # a Slurm job's default scratch base is its TMPDIR: pinned
        chosen[SCRATCH_BASE_ENV] = Choice(scratch.base(environ), "pinned before TMPDIR moves: the default scratch "
                                          "stays where it was claimed (minilmd/scratch.py base)", own=False)
    return chosen


def own_dirs(root: Path, environ: Mapping[str, str]) -> list[Path]:
    """The cache directories under `root` that this run's trainers use: those the user did not point elsewhere."""
    chosen = choose(root, environ, "", "")
    return [root / sub for var, sub in CACHE_DIRS.items() if chosen[var].own]


def apply(chosen: Mapping[str, Choice]) -> None:
    """Set the chosen values in this process (before torch imports its compiler: inductor names its header
    directory then), for it and every process it starts; Python's own temporary directory is found again."""
    for var, choice in chosen.items():
        os.environ[var] = choice.value
    tempfile.tempdir = None  # gettempdir() remembers the first TMPDIR it saw


def refusals(chosen: Mapping[str, Choice]) -> list[str]:
    """A line for each value the user set that was not used."""
    return [f"{var}={c.value} ({c.why})" for var, c in chosen.items() if c.refused]


@contextlib.contextmanager
def private_caches(what: str) -> Iterator[dict[str, Choice]]:
    """For a process that compiles and has no run (a bench): the caches in a fresh private directory (tempfile's:
    0700, a random name made O_EXCL), removed after, unless the user set them to a directory of his own alone; the
    environment given back after."""
    before = {var: os.environ.get(var) for var in (*COMPILE_ENV, SCRATCH_BASE_ENV)}
    root = Path(tempfile.mkdtemp(prefix="minilmd-compile-cache-"))
    try:
        chosen = settle(root, os.environ, what, f"{what}'s own, removed after")
        apply(chosen)
        yield chosen
    finally:
        for var, value in before.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        tempfile.tempdir = None
        shutil.rmtree(root, ignore_errors=True)  # ours: made just above, filled by this process's compiles
