"""NFSv4 ACLs (minilmd/nfs4_acl.py): on an NFSv4 mount a directory's inheritable entries, not a POSIX default ACL,
give what is made in it its permissions, so run.dir's rule reads them too (perms.default_acl_writers). No file
system here takes a `system.nfs4_acl` xattr (ext4 and tmpfs answer EOPNOTSUPP; only the NFSv4 client shows one),
so the parser is tested on the bytes an NFSv4 client gives (RFC 7530's XDR), and the rule's reading of them
through a fake of the kernel's getxattr: the one limit of these tests, said here."""
from __future__ import annotations

import errno
import os
import struct

import pytest

from minilmd import nfs4_acl
from minilmd.nfs4_acl import (
    ALLOW,
    APPEND_DATA,
    DENY,
    DIRECTORY_INHERIT,
    FILE_INHERIT,
    IDENTIFIER_GROUP,
    INHERIT_ONLY,
    WRITE_DATA,
    Unknown,
)
from minilmd.place_rule import run_dir_problem

READ, EXECUTE = 0x1, 0x20
INHERIT = FILE_INHERIT | DIRECTORY_INHERIT


def ace(kind: int, flags: int, mask: int, who: str) -> bytes:
    """One nfsace4 in XDR: type, flag, access mask, who (length, bytes padded to 4)."""
    raw = who.encode()
    return struct.pack(">IIII", kind, flags, mask, len(raw)) + raw + b"\0" * (-len(raw) % 4)


def acl(*aces: bytes) -> bytes:
    return struct.pack(">I", len(aces)) + b"".join(aces)


def me(who: str) -> bool:
    return who.partition("@")[0] == "alice"


def writers(raw: bytes) -> list[str]:
    return nfs4_acl.inheritable_writers(raw, me, "group staff (gid 50)")


RWX = READ | WRITE_DATA | APPEND_DATA | EXECUTE
RX = READ | EXECUTE


def test_a_default_acl_letting_others_read_only_passes_as_knfsd_maps_it():
    """A POSIX default ACL u::rwx,g::r-x,o::r-x as a Linux server shows it over NFSv4 (inherit-only entries beside
    the directory's own), with the directory's own access entries letting everyone write (not passed on): none."""
    passed_on = INHERIT | INHERIT_ONLY
    raw = acl(ace(ALLOW, 0, RWX, "OWNER@"), ace(ALLOW, 0, RWX, "EVERYONE@"), ace(ALLOW, passed_on, RWX, "OWNER@"),
              ace(DENY, passed_on, WRITE_DATA, "GROUP@"), ace(ALLOW, passed_on, RX, "GROUP@"),
              ace(ALLOW, passed_on, RX, "EVERYONE@"))
    assert writers(raw) == []
    assert writers(acl()) == []


def test_inheritable_write_to_anyone_but_the_owner_is_said():
    raw = acl(ace(ALLOW, INHERIT, RWX, "OWNER@"), ace(ALLOW, FILE_INHERIT, APPEND_DATA, "EVERYONE@"),
              ace(ALLOW, DIRECTORY_INHERIT, WRITE_DATA, "GROUP@"), ace(ALLOW, INHERIT, RWX, "bob@example.org"),
              ace(ALLOW, INHERIT | IDENTIFIER_GROUP, WRITE_DATA, "team@example.org"),
              ace(ALLOW, INHERIT, RWX, "alice@example.org"), ace(ALLOW, INHERIT, 0x40000, "carol"))
    assert writers(raw) == ["every user", "the members of group staff (gid 50)", "user 'bob@example.org'",
                            "the members of group 'team@example.org'", "user 'carol'"]  # carol: WRITE_ACL


def test_a_deny_entry_is_not_weighed():
    """Order decides a DENY's effect, server by server: an inheritable ALLOW of write is said all the same."""
    raw = acl(ace(DENY, INHERIT, WRITE_DATA, "EVERYONE@"), ace(ALLOW, INHERIT, WRITE_DATA, "EVERYONE@"))
    assert writers(raw) == ["every user"]


@pytest.mark.parametrize("raw", [
    b"", b"\0\0\0", struct.pack(">I", 1), struct.pack(">I", 2) + ace(ALLOW, INHERIT, RX, "OWNER@"),
    acl(ace(7, INHERIT, RX, "OWNER@")), acl(ace(ALLOW, 0, RX, "OWNER@")) + b"\0\0\0\0",
    acl(ace(ALLOW, 0, RX, "OWNER@"))[:-1], struct.pack(">I", 1 << 20),
    acl(struct.pack(">IIII", ALLOW, 0, RX, 1 << 30)), acl(struct.pack(">IIII", ALLOW, 0, RX, 2) + b"\xff\xfe\0\0"),
], ids=["empty", "short count", "no entry", "one entry missing", "unknown type", "bytes left over", "cut padding",
        "too many entries", "who too long", "who not utf-8"])
def test_bytes_that_are_not_such_an_acl_are_unknown(raw):
    with pytest.raises(Unknown):
        writers(raw)


def test_run_dir_on_nfs4_with_inheritable_write_for_others_is_refused(tmp_path, monkeypatch):
    """The rule's reading (perms.default_acl_writers): no POSIX default ACL there (EOPNOTSUPP, as on an NFSv4
    mount), an NFSv4 ACL passing write on to every user: refused, with nfs4_setfacl's fix, not setfacl's; one that
    cannot be parsed is refused too; one passing only read on passes. The xattr comes from a fake of the kernel's
    getxattr (no file system here takes one)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    shown: dict[str, bytes] = {}
    real_getxattr = os.getxattr

    def nfs4_mount(path, name, *, follow_symlinks=True):
        if name in shown:
            return shown[name]
        if name.startswith("system.posix_acl_"):
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), str(path))
        return real_getxattr(path, name, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "getxattr", nfs4_mount)
    shown[nfs4_acl.XATTR] = acl(ace(ALLOW, INHERIT, RWX, "OWNER@"), ace(ALLOW, INHERIT, RX, "EVERYONE@"))
    assert run_dir_problem(run_dir) is None
    shown[nfs4_acl.XATTR] = acl(ace(ALLOW, INHERIT, RWX, "OWNER@"), ace(ALLOW, INHERIT, RWX, "EVERYONE@"))
    problem = run_dir_problem(run_dir)
    assert problem and problem.startswith(f"run.dir {run_dir}: the directory {run_dir} has an NFSv4 ACL whose "
                                          f"inheritable entries let every user write what is made in it"), problem
    assert f"nfs4_setfacl -x ENTRY {run_dir} removes one) (it is yours)" in problem and "setfacl -k" not in problem
    shown[nfs4_acl.XATTR] = b"\0\0\0\1garbage"
    assert "whoever its NFSv4 ACL names (not an ACL this reader knows" in (run_dir_problem(run_dir) or "")
