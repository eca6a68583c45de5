"""Real Unix groups (and users) for the tests of perms.private_group, made with groupadd/useradd/gpasswd as root
and removed again: `groups` is a fixture whose `group(members)` makes a group listing `members` (gr_mem) and
returns its gid, and whose `user(gid)` makes a user with that primary group. Skipped where the tests do not run as
root or these tools are missing. The per-process cache of perms.private_group is cleared before and after."""
from __future__ import annotations

import grp
import os
import shutil
import subprocess

import pytest

from minilmd import perms

TOOLS = ("groupadd", "groupdel", "useradd", "userdel", "gpasswd")


class Groups:
    def __init__(self):
        self.made_groups: list[str] = []
        self.made_users: list[str] = []

    def _name(self, kind: str) -> str:
        return f"mlt{kind}{os.getpid() % 100000}{len(self.made_groups) + len(self.made_users)}"

    def group(self, members: tuple[str, ...] = ()) -> int:
        name = self._name("g")
        subprocess.run(["groupadd", name], check=True, capture_output=True, timeout=30)
        self.made_groups.append(name)
        for member in members:
            subprocess.run(["gpasswd", "-a", member, name], check=True, capture_output=True, timeout=30)
        perms._private_to.cache_clear()
        return grp.getgrnam(name).gr_gid

    def user(self, gid: int) -> str:
        name = self._name("u")
        subprocess.run(["useradd", "-M", "-N", "-g", str(gid), "-s", "/usr/sbin/nologin", name], check=True,
                       capture_output=True, timeout=30)
        self.made_users.append(name)
        perms._private_to.cache_clear()
        return name

    def remove(self) -> None:
        for name in reversed(self.made_users):
            subprocess.run(["userdel", name], capture_output=True, timeout=30)
        for name in reversed(self.made_groups):
            subprocess.run(["groupdel", name], capture_output=True, timeout=30)
        perms._private_to.cache_clear()


@pytest.fixture
def groups():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes real Unix groups and users (groupadd, useradd)")
    if missing := [tool for tool in TOOLS if shutil.which(tool) is None]:
        pytest.skip(f"needs {', '.join(missing)} to make real Unix groups")
    made = Groups()
    perms._private_to.cache_clear()
    try:
        yield made
    finally:
        made.remove()
