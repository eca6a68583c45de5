"""Real Unix groups (and users) for the tests of perms.private_group, made with groupadd/useradd/gpasswd as root
and removed again: `groups` is a fixture whose `group(members)` makes a group listing `members` (gr_mem) and
returns its gid, whose `user(gid)` makes a user with that primary group, and whose `upg_user()` a user with a
user private group. Skipped where the tests do not run as root or these tools are missing. The per-process cache
of perms.private_group is cleared before and after. `acl_letting(uid)`: the POSIX ACL that lets one more user write."""
from __future__ import annotations

import grp
import os
import pwd
import shutil
import struct
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

    def upg_user(self) -> tuple[str, int, int]:
        """A user with a user private group, as useradd -U makes one (the group named as the user, its primary
        group, listing no one): (name, uid, gid)."""
        name = self._name("p")
        subprocess.run(["useradd", "-M", "-U", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True,
                       timeout=30)
        self.made_users.append(name)
        self.made_groups.append(name)  # userdel removes it too, mostly: groupdel then finds none, said nowhere
        perms._private_to.cache_clear()
        entry = pwd.getpwnam(name)
        return name, entry.pw_uid, entry.pw_gid

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


def acl_letting(uid: int) -> bytes:
    """system.posix_acl_access granting `uid` rwx (what setfacl -m u:UID:rwx writes): owner rwx, that user rwx,
    the owning group r-x, mask rwx (the mode's group bits then show w), others r-x."""
    undefined = 0xFFFFFFFF
    entries = [(0x01, 7, undefined), (0x02, 7, uid), (0x04, 5, undefined), (0x10, 7, undefined), (0x20, 5, undefined)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, who) for tag, perm, who in entries)
