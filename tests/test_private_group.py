"""A group whose only member is this user is no "other users" (perms.private_group): Debian and Ubuntu give every
user a group of its own (user private groups) and a umask of 002, so a plain `mkdir ~/exports` is 0775, and the
place rule (minilmd/dirfd.py place_problem) refused it as writable by others. Real groups, made for the test
(tests/real_groups.py): one listing only this user, one another user has as primary group, one listing another
user, one this user is not in; the passwd database not enumerable; an ACL naming another user."""
from __future__ import annotations

import os
import pwd

import pytest

from minilmd import perms
from minilmd.dirfd import Dir, PlaceRefused, place_problem
from real_groups import acl_letting, groups  # noqa: F401 - groups: a fixture
from second_user import second_user

REFUSED = "can be written by other users"


def _team_dir(tmp_path, gid: int, mode: int = 0o2775, name: str = "exports"):
    folder = tmp_path / name
    folder.mkdir()
    os.chown(folder, -1, gid)
    folder.chmod(mode)
    return folder


def _problem(folder) -> str | None:
    return place_problem("--out", folder / "m.pth", "the export", "choose another")


def test_a_directory_writable_by_a_group_of_this_user_alone_is_not_refused(tmp_path, groups):
    me = pwd.getpwuid(os.geteuid()).pw_name
    folder = _team_dir(tmp_path, groups.group(members=(me,)))
    assert _problem(folder) is None
    Dir.open(folder, "the directory of --out").close()
    folder.chmod(0o2777)  # but not when everyone may write it
    assert REFUSED in _problem(folder)


@pytest.mark.parametrize("who", ["another user's primary group", "a group listing another user too",
                                 "a group this user is not in"])
def test_a_directory_writable_by_a_group_with_other_members_is_refused(tmp_path, groups, who):
    """Beside one of this user's own group, which is not."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert _problem(_team_dir(tmp_path, groups.group(members=(me,)), name="mine")) is None
    if who == "another user's primary group":
        gid = groups.group(members=(me,))
        groups.user(gid)
    elif who == "a group listing another user too":
        second_user()
        gid = groups.group(members=(me, "nobody"))
    else:
        gid = groups.group()
    folder = _team_dir(tmp_path, gid)
    assert f"the directory {folder} above it {REFUSED} (mode 2775, not sticky)" in _problem(folder)


def test_without_an_enumerable_passwd_database_the_group_counts_as_shared(tmp_path, groups, monkeypatch):
    """LDAP or sssd without enumeration: getpwall lists no one (or not this user), so another user with this group
    as primary group cannot be ruled out: refused, as before."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    folder = _team_dir(tmp_path, groups.group(members=(me,)))
    assert _problem(folder) is None
    perms._private_to.cache_clear()  # decided once per group and process: a new process, as it were
    monkeypatch.setattr(pwd, "getpwall", lambda: [])
    assert REFUSED in _problem(folder)


def test_a_private_group_directory_whose_acl_lets_another_user_write_is_refused(tmp_path, groups):
    me = pwd.getpwuid(os.geteuid()).pw_name
    uid, _ = second_user()
    folder = _team_dir(tmp_path, groups.group(members=(me,)), 0o775)
    assert _problem(folder) is None
    try:
        os.setxattr(folder, "system.posix_acl_access", acl_letting(uid))
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on {tmp_path}'s file system ({e})")
    assert perms.has_acl(folder)
    assert REFUSED in _problem(folder)


def test_a_group_whose_gid_another_group_entry_shares_with_another_member_is_refused(tmp_path, groups):
    """Two /etc/group entries with one gid (groupadd -o): the kernel grants the gid, so the members of both write.
    getgrgid shows only the first entry; on main the second one's member was not seen and the directory counted as
    this user's alone. Now the members of every entry with that gid count (grp.getgrall)."""
    import subprocess

    me = pwd.getpwuid(os.geteuid()).pw_name
    second_user()
    gid = groups.group(members=(me,))
    folder = _team_dir(tmp_path, gid)
    assert _problem(folder) is None
    twin = f"{groups._name('g')}t"
    subprocess.run(["groupadd", "-o", "-g", str(gid), twin], check=True, capture_output=True, timeout=30)
    groups.made_groups.append(twin)
    subprocess.run(["gpasswd", "-a", "nobody", twin], check=True, capture_output=True, timeout=30)
    perms._private_to.cache_clear()
    assert REFUSED in _problem(folder)
    (folder / "run1").mkdir()
    with pytest.raises(PlaceRefused, match=REFUSED):
        Dir.open(folder / "run1", "the directory of --out")


def test_the_gpu_lock_directory_is_judged_by_the_same_rule(tmp_path, groups):
    """The lock directory itself was judged by a rule of leases.py's own, which counted every group as others: a
    0775 lock directory of this user's own group was refused ("writable by other users") where the place rule,
    which judged the directories above it, accepts the same mode. One rule now, as the walk that opens it keeps."""
    from minilmd.daemon.host import leases

    me = pwd.getpwuid(os.geteuid()).pw_name
    locks = _team_dir(tmp_path, groups.group(members=(me,)), mode=0o775, name="locks")
    assert leases.lock_dir_problem(locks) is None
    leases.open_lease(locks, "gpu-a.lock").close()
    second_user()
    os.chown(locks, -1, groups.group(members=(me, "nobody")))  # a group of others too: refused, by both
    assert f"the directory {locks} {REFUSED} (mode 775, not sticky)" in (leases.lock_dir_problem(locks) or "")
    with pytest.raises(leases.LeaseUnsafe, match=REFUSED):
        leases.open_lease(locks, "gpu-a.lock")


def test_a_compile_cache_and_a_scratch_in_a_private_group_are_kept_by_the_same_rule(tmp_path, groups):
    """compile_cache, scratch, the squash-root remote and the place rule each wrote "others can write" again as
    `st_mode & 0o022`, which counts every group as others: a 0775 TORCHINDUCTOR_CACHE_DIR of this user's own group
    (Ubuntu's umask 002) was refused ("whoever else can write it can put kernels there") and the run compiled cold,
    where the place rule accepts the same directory. perms.others_can_write is the one rule now: a group of others
    too is still refused, by both."""
    from minilmd import compile_cache, scratch

    me = pwd.getpwuid(os.geteuid()).pw_name
    cache = _team_dir(tmp_path, groups.group(members=(me,)), mode=0o775, name="inductor")
    space = _team_dir(tmp_path, groups.group(members=(me,)), mode=0o775, name="scratch")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert compile_cache.user_dir_problem("TORCHINDUCTOR_CACHE_DIR", str(cache)) is None
    assert scratch.problems(space, run_dir, is_default=False) == []
    second_user()
    shared = groups.group(members=(me, "nobody"))
    for folder in (cache, space):
        os.chown(folder, -1, shared)
    assert REFUSED in (compile_cache.user_dir_problem("TORCHINDUCTOR_CACHE_DIR", str(cache)) or "")
    assert REFUSED in " ".join(scratch.problems(space, run_dir, is_default=False))
