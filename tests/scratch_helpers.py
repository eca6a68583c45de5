"""Helpers for the tests of scratch and of `--check`: a second real Unix user (`nobody`), a directory both users
reach, and `minilmd` commands run as either of them; the fixture `shared` is that directory with a readable copy of
the session's corpus, where either user's run config is written (Shared.config).

pytest's tmp_path lies under a root-only (0700) directory, so what `nobody` must reach goes under `TwoUsers.root`:
a fresh directory in /tmp, 0755, removed with everything in it at the end of the test. `shm/` inside it stands for
/dev/shm (mode 1777, like the real one): `MINILMD_SCRATCH_BASE` points the default scratch there, so that the tests
never leave anything in the machine's /dev/shm.

The test interpreter may sit where nobody cannot reach it (a pyenv under /root); nobody then runs the same Python
version from the system, through a venv-like directory in `root` whose site-packages are this venv's.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from minilmd.names import SCRATCH_BASE_ENV
from supervisor_helpers import FAKE_TRAINER, env_for, write_config

NOBODY = pwd.getpwnam("nobody")
AS_NOBODY = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"]


def _nobody_can_run(python: str) -> bool:
    done = subprocess.run([*AS_NOBODY, "/bin/sh", "-c", 'exec "$0" -c "import minilmd"', python],
                          capture_output=True, env=env_for(fake=False, HOME="/tmp"))
    return done.returncode == 0


def _python_for_nobody(root: Path) -> str:
    if _nobody_can_run(sys.executable):
        return sys.executable
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    venv = root / "venv"
    site = venv / "lib" / system.name / "site-packages"
    site.parent.mkdir(parents=True)
    site.symlink_to(sysconfig.get_paths()["purelib"])
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(system)
    (venv / "pyvenv.cfg").write_text(f"home = {system.parent}\ninclude-system-site-packages = false\n")
    for path in [venv, *venv.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    python = str(venv / "bin" / "python")
    if not system.exists() or not _nobody_can_run(python):
        pytest.skip(f"no Python {system.name} that nobody may run")
    return python


@dataclass
class TwoUsers:
    root: Path
    """A directory root and nobody both reach (0755), removed after the test."""
    nobody_python: str

    @property
    def base(self) -> Path:
        """The stand-in for /dev/shm (1777) where the default scratch goes."""
        return self.root / "shm"

    def run(self, user: str, args: list[str], fake: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """`python ARGS` as root or as nobody (setpriv keeps the environment; HOME is /tmp for nobody), the default
        scratch under `base` and, if `fake`, the fake trainer behind `minilmd run`."""
        python = self.nobody_python if user == "nobody" else sys.executable
        env = env_for(fake=False, **{SCRATCH_BASE_ENV: str(self.base)})
        if fake:
            env["MINILMD_TRAINER_CMD"] = f"{python} {FAKE_TRAINER}"
        command = [python, *args]
        if user == "nobody":
            env["HOME"] = "/tmp"
            command = [*AS_NOBODY, *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)

    def minilmd(self, user: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run(user, ["-m", "minilmd.cli", *args], **kwargs)

    def python(self, user: str, code: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run(user, ["-c", code], fake=False, **kwargs)


@pytest.fixture
def two_users():
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as a second user (nobody)")
    root = Path(tempfile.mkdtemp(prefix="minilmd-test-", dir="/tmp"))
    try:
        root.chmod(0o755)
        (root / "shm").mkdir()
        (root / "shm").chmod(0o1777)
        yield TwoUsers(root, _python_for_nobody(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def readable_copy(src: Path, dest: Path) -> Path:
    """A copy of a directory tree that every user may read (pytest's fixtures are root-only)."""
    shutil.copytree(src, dest)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def owned_by_nobody(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return path


@dataclass
class Shared:
    """The directory both users reach (TwoUsers), with a readable copy of the corpus in it."""

    users: TwoUsers
    vocab: int

    @property
    def root(self) -> Path:
        return self.users.root

    @property
    def base(self) -> Path:
        return self.users.base

    def home(self, user: str) -> Path:
        home = self.root / user
        if user == "nobody":
            return owned_by_nobody(home)
        home.mkdir(exist_ok=True)
        return home

    def config(self, user: str, name: str = "same-name", where: str = "", scratch: str = "") -> Path:
        """A run of `user` (the default scratch unless `scratch`); its files under <root>/<user>/<where or name>/."""
        home = self.home(user) / (where or name)
        home.mkdir(exist_ok=True)
        if user == "nobody":
            os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
        config = write_config(home, (self.root / "prepared", self.vocab), name, remote=False,
                              run={"scratch": scratch})
        config.chmod(0o644)
        return config


@pytest.fixture
def shared(two_users, corpus):
    readable_copy(corpus[0], two_users.root / "prepared")
    return Shared(two_users, corpus[1])


def text_of(out) -> str:
    return out.stdout + out.stderr
