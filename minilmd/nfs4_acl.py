"""Who an NFSv4 ACL lets write what is made in a directory: its inheritable entries, read from the `system.nfs4_acl`
xattr the Linux NFSv4 client shows (RFC 7530 fattr4_acl, XDR: a count, then per entry its type, flags, access mask
and who, a length-prefixed string padded to 4 bytes, all big-endian).

On an NFSv4 mount a POSIX default ACL is not there to read (`system.posix_acl_default` is ENOTSUP there): the
server's ACL is, and an entry with FILE_INHERIT or DIRECTORY_INHERIT is what every file or directory made in the
directory gets, in the umask's place, as a POSIX default ACL is (a knfsd server maps a POSIX default ACL to such
entries; a NetApp or a Windows-style server sets them itself). So run.dir's rule (minilmd/dir_rule.py
inherited_acl_problem, through perms.default_acl_writers) reads them: an inheritable ALLOW entry that grants
writing (data, append, the ACL, the owner, deleting) to anyone but OWNER@ lets that one write what the run makes.
Bounded, and strict: the xattr is the kernel's (at most 64 KiB), but whatever does not parse as this format
(a short entry, an unknown entry type, bytes left over) counts as letting someone write: refused, never guessed.
DENY entries are not weighed (their order decides, server by server): an inheritable ALLOW of write to another is
refused even where a DENY before it takes that write away. Torch-free, no minilmd import.
"""
from __future__ import annotations

import struct
from collections.abc import Callable

XATTR = "system.nfs4_acl"

ALLOW, DENY, AUDIT, ALARM = 0, 1, 2, 3  # ACE4_*_ACE_TYPE
FILE_INHERIT, DIRECTORY_INHERIT, INHERIT_ONLY, IDENTIFIER_GROUP = 0x1, 0x2, 0x8, 0x40  # ACE4_*  flags
WRITE_DATA, APPEND_DATA, DELETE_CHILD, DELETE, WRITE_ACL, WRITE_OWNER = 0x2, 0x4, 0x40, 0x10000, 0x40000, 0x80000
WRITES = WRITE_DATA | APPEND_DATA | DELETE_CHILD | DELETE | WRITE_ACL | WRITE_OWNER
"""What lets the one named change a file or directory made in the directory: its data, its ACL (and so all of it),
its owner, or remove it or what is in it."""

MAX_ENTRIES = 1024
"""More entries than any ACL a person set: beyond it the xattr is not one this reader takes."""
MAX_WHO = 1024
"""The longest `who` read (a user@domain); a longer one is no ACL this reader takes."""

_HEAD = struct.Struct(">I")
_ENTRY = struct.Struct(">IIII")  # type, flags, access mask, who's length


class Unknown(ValueError):
    """Bytes that are not an NFSv4 ACL this reader takes: counts as one that lets someone write."""


def entries(raw: bytes) -> list[tuple[int, int, int, str]]:
    """The ACL's entries (type, flags, access mask, who), in order. Unknown for anything else."""
    if len(raw) < _HEAD.size:
        raise Unknown("shorter than its count")
    (count,) = _HEAD.unpack_from(raw)
    if count > MAX_ENTRIES:
        raise Unknown(f"{count} entries")
    found, at = [], _HEAD.size
    for _ in range(count):
        if at + _ENTRY.size > len(raw):
            raise Unknown("an entry cut short")
        kind, flags, mask, length = _ENTRY.unpack_from(raw, at)
        at += _ENTRY.size
        padded = (length + 3) & ~3
        if kind > ALARM or length > MAX_WHO or at + padded > len(raw):
            raise Unknown(f"an entry of type {kind}, who of {length} bytes")
        try:
            who = raw[at:at + length].decode("utf-8")
        except UnicodeDecodeError:
            raise Unknown("a who that is not UTF-8") from None
        found.append((kind, flags, mask, who))
        at += padded
    if at != len(raw):
        raise Unknown(f"{len(raw) - at} bytes after its entries")
    return found


def inheritable_writers(raw: bytes, is_me: Callable[[str], bool], owning_group: str) -> list[str]:
    """Who, in words, an inheritable ALLOW entry of the ACL `raw` lets write what is made in the directory, but
    its owner (OWNER@) and this user (`is_me(who)`: this user's name, name@domain or uid, or root's); `owning_group`
    words GROUP@. Empty: none. Unknown for bytes this reader does not take."""
    who_said: list[str] = []
    for kind, flags, mask, who in entries(raw):
        if kind != ALLOW or not flags & (FILE_INHERIT | DIRECTORY_INHERIT) or not mask & WRITES:
            continue
        if who == "OWNER@" or (not flags & IDENTIFIER_GROUP and is_me(who)):
            continue
        if who == "EVERYONE@":
            words = "every user"
        elif who == "GROUP@":
            words = f"the members of {owning_group}"
        elif flags & IDENTIFIER_GROUP:
            words = f"the members of group {who!r}"
        else:
            words = f"user {who!r}"
        if words not in who_said:
            who_said.append(words)
    return who_said
