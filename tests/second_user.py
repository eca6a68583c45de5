"""A second real Unix user for the multi-user tests: `nobody`, reached from root through setpriv.

`second_user()` is the user's (uid, gid), or a pytest skip saying why there is none (not root, no `nobody`, no
setpriv). `as_user(argv)` runs argv as that user. `user_python(code, *args)` is an argv that runs Python code as
that user with minilmd importable: the test's own interpreter when that user can execute it, else a system
interpreter of the same version that adds this venv's site-packages (a pyenv interpreter under /root is not
reachable by another user). `shared_dir()` is a fresh directory under /tmp both users can reach (pytest's
tmp_path lives under a root-only 0700 directory); the caller removes it. The fixture `shared` is such a directory,
removed afterwards; `sh_as_user(script, cwd)` runs a shell script as that user.
"""
from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

USER = "nobody"
TESTS = Path(__file__).resolve().parent


def second_user() -> tuple[int, int]:
    """(uid, gid) of `nobody`; skips the test when it cannot act as that user."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test acts as a second Unix user (nobody) through setpriv")
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"needs a second Unix user: there is no user {USER!r} on this machine")
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to act as a second Unix user")
    return entry.pw_uid, entry.pw_gid


def as_user(argv: list[str]) -> list[str]:
    uid, gid = second_user()
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]


def _bootstrap() -> str:
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return (f"import site, sys\nfor d in {sorted(dirs)!r}: site.addsitedir(d)\n"
            f"sys.path.insert(0, {str(TESTS)!r})\n")


@functools.lru_cache(maxsize=1)
def _python_for_user() -> str | None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # the system's first: an interpreter under a home directory the user cannot enter may half work for it
    candidates = [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}", sys.executable,
                  os.path.realpath(sys.executable)]
    probe = _bootstrap() + "import minilmd.daemon.host.gpu, minilmd.daemon.child.process\n" \
                           f"assert sys.version_info[:2] == {tuple(sys.version_info[:2])}\n"
    for python in dict.fromkeys(candidates):
        if not os.path.exists(python):
            continue
        done = subprocess.run(as_user([python, "-c", probe]), capture_output=True, text=True, cwd="/", timeout=60)
        if done.returncode == 0:
            return python
    return None


def user_python(code: str, *args: str) -> list[str]:
    """argv running `code` (sys.argv[1:] = args) as the second user; skips when no interpreter works for it."""
    python = _python_for_user()
    if python is None:
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} interpreter that user {USER!r} "
                    f"can run with minilmd importable (the worktree or the venv is not readable by it?)")
    return as_user([python, "-c", _bootstrap() + code, *args])


def shared_dir() -> Path:
    """A new sticky, world-writable directory under /tmp (like /tmp itself): both users can create in it."""
    path = Path(tempfile.mkdtemp(prefix="minilmd-2users-", dir="/tmp"))
    path.chmod(0o1777)
    return path


@pytest.fixture
def teammate():
    """(uid, gid) of the second user and a shared directory both can reach, removed afterwards."""
    ids = second_user()
    where = shared_dir()
    yield ids, where
    shutil.rmtree(where, ignore_errors=True)


def as_teammate(script: str) -> None:
    """`sh -c script` as the second user; it must succeed (the attack's setup: a link planted, a file made)."""
    done = subprocess.run(as_user(["sh", "-c", script]), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def private_notes(tmp_path: Path, text: str = "the victim's own notes\n") -> Path:
    """The victim's notes.txt in a 0700 directory of hers (under pytest's root-only directory): what an attack
    must leave as it was."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    notes = private / "notes.txt"
    notes.write_text(text)
    return notes


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Everything under `path`, and `path`, given to uid:gid (no link followed): a tree made as root, now hers."""
    for here, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(os.path.join(here, name), uid, gid, follow_symlinks=False)
    os.chown(path, uid, gid, follow_symlinks=False)


@pytest.fixture
def shared():
    """shared_dir() for one test (skipped where there is no second user), removed afterwards."""
    second_user()
    path = shared_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def team(shared):
    """A team directory in `shared`: root's (the victim's), group-writable for the second user's group, not sticky
    (mode 0770): he may rename and unlink in it."""
    _, gid = second_user()
    path = shared / "team"
    path.mkdir()
    os.chown(path, 0, gid)
    path.chmod(0o770)
    return path


def sh_as_user(script: str, cwd: str | os.PathLike) -> None:
    subprocess.run(as_user(["sh", "-c", script]), check=True, cwd=cwd, timeout=30)


def group_dir(where: Path, gid: int, name: str) -> Path:
    """A directory of root's (the victim's) the second user may write through its group: 2770, his group (a team
    directory, a team's run.remote)."""
    made = where / name
    made.mkdir()
    os.chown(made, 0, gid)
    made.chmod(0o2770)
    return made
