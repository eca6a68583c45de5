"""Her own run config in her own directory on a user-private-group system is read (review11b F2). Debian, Ubuntu,
Fedora and RHEL give each user a group named as she is (useradd -U) and umask 002, so `mkdir ~/configs` is 0775. Where
the passwd database cannot be listed (LDAP or sssd without enumeration: faked here as the review did, getpwall
returning no one), perms.private_group cannot prove the group hers alone, so config_file refused her config, exit 2,
and a systemd service restarted after an upgrade ended for good. For reading a run config, her directory whose group
is her primary group named as she is (perms.named_private_group) is hers; another group's writable directory, an ACL
naming another user, a private group listing another member, and every place minilmd writes, are refused as before.

A real user with a real private group (tests/real_groups.py upg_user), this process taken for her by faking
perms.own_uid (as tests/test_owner_rule.py does): the directories are chowned to her, root's above them."""
from __future__ import annotations

import os
import pwd
import subprocess

import pytest

from minilmd import config_file, perms
from minilmd.config_file import ConfigRefused, read_own_config
from minilmd.dirfd import place_problem
from real_groups import acl_letting, groups  # noqa: F401 - groups: a fixture
from second_user import second_user

REFUSED = "can be written by other users"
CONFIG = b'[run]\nname = "hers"\n'


def _her_configs(tmp_path, monkeypatch, owner: int, gid: int):
    """~/configs of hers (0775 in group `gid`) holding a.toml, this process taken for her, the user database not
    listable: (the config's path)."""
    home, configs = tmp_path / "home", tmp_path / "home" / "configs"
    configs.mkdir(parents=True)
    config = configs / "a.toml"
    config.write_bytes(CONFIG)
    for path, mode in ((home, 0o755), (configs, 0o775), (config, 0o664)):
        os.chown(path, owner, gid)
        os.chmod(path, mode)
    monkeypatch.setattr(perms, "own_uid", lambda: owner)
    monkeypatch.setattr(config_file, "own_uid", lambda: owner)
    monkeypatch.setattr(pwd, "getpwall", lambda: [])  # LDAP, sssd: no one listed
    perms._private_to.cache_clear()
    return config


def test_her_config_in_her_private_groups_directory_is_read_without_a_listable_user_database(tmp_path, monkeypatch,
                                                                                                groups):
    name, uid, gid = groups.upg_user()
    config = _her_configs(tmp_path, monkeypatch, uid, gid)
    assert not perms.private_group(gid)  # what made it a refusal: the group cannot be proven hers alone
    assert read_own_config(config, 1 << 20) == CONFIG
    # a place minilmd writes keeps the strict rule: the same directory is refused as an export's --out
    assert REFUSED in place_problem("--out", config.parent / "m.pth", "the export", "choose another")


def test_a_group_not_named_as_she_is_is_still_refused_without_a_listable_user_database(tmp_path, monkeypatch,
                                                                                           groups):
    name, uid, _ = groups.upg_user()
    gid = groups.group(members=(name,))  # hers too, but named otherwise: a team's, for all that can be told
    config = _her_configs(tmp_path, monkeypatch, uid, gid)
    with pytest.raises(ConfigRefused, match=f"{REFUSED} \\(mode 775, not sticky\\)"):
        read_own_config(config, 1 << 20)


def test_her_private_group_listing_another_member_or_an_acl_naming_another_user_is_refused(tmp_path, monkeypatch,
                                                                                           groups):
    name, uid, gid = groups.upg_user()
    config = _her_configs(tmp_path, monkeypatch, uid, gid)
    other, _ = second_user()
    try:
        os.setxattr(config.parent, "system.posix_acl_access", acl_letting(other))
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on {tmp_path}'s file system ({e})")
    with pytest.raises(ConfigRefused, match=REFUSED):
        read_own_config(config, 1 << 20)
    os.removexattr(config.parent, "system.posix_acl_access")
    os.chmod(config.parent, 0o775)
    assert read_own_config(config, 1 << 20) == CONFIG
    subprocess.run(["gpasswd", "-a", "nobody", name], check=True, capture_output=True, timeout=30)
    perms._private_to.cache_clear()
    with pytest.raises(ConfigRefused, match=REFUSED):
        read_own_config(config, 1 << 20)
